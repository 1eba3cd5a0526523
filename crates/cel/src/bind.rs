//! cel-go's `cel.bind(name, init, expr)` (its `ext.Bindings`, which every Kyverno CEL kind
//! has): `expr` with `name` bound to the value of `init`, evaluated once. Expanded, as cel-go
//! expands it, into a comprehension over an empty list whose accumulator is the binding.

use cel::common::ast::{ComprehensionExpr, Expr as Ast, ListExpr, LiteralValue};
use cel::parser::Macro;
use cel::{DeclarationError, Env};

pub fn register(env: &mut Env) -> Result<(), DeclarationError> {
    env.add_macro(Macro::receiver_var_arg("bind", |helper, target, args| {
        if !matches!(target.as_ref().map(|t| &t.expr), Some(Ast::Ident(n)) if n == "cel") || args.len() != 3 {
            return Ok(None);
        }
        let name = match args.first().map(|a| &a.expr) {
            Some(Ast::Ident(n)) => n.clone(),
            _ => return Ok(None),
        };
        let mut args = std::mem::take(args).into_iter().skip(1);
        let (Some(init), Some(body)) = (args.next(), args.next()) else { return Ok(None) };
        let range = helper.next_expr(Ast::List(ListExpr { elements: Vec::new(), optional_indices: Vec::new() }));
        let cond = helper.next_expr(Ast::Literal(LiteralValue::Boolean(false.into())));
        let step = helper.next_expr(Ast::Ident(name.clone()));
        Ok(Some(helper.next_expr(Ast::Comprehension(Box::new(ComprehensionExpr {
            iter_range: range,
            iter_var: "#unused".to_string(),
            iter_var2: None,
            accu_var: name,
            accu_init: init,
            loop_cond: cond,
            loop_step: step,
            result: body,
        })))))
    }))?;
    Ok(())
}
