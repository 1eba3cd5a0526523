//! Struct literals of Kubernetes' mutation types, rewritten to map literals at compile time.
//!
//! MutatingAdmissionPolicy and Kyverno's MutatingPolicy build their results with typed struct
//! literals: `Object{spec: Object.spec{replicas: 2}}` (an apply configuration) and
//! `JSONPatch{op: "add", path: "/x", value: 1}`. Kubernetes type-checks these against the
//! resource's schema; offline we have no schema, so each such literal becomes the map it
//! serialises to (`{"spec": {"replicas": 2}}`), which the engine then merges or applies. Field
//! selection on the result (`p.op`) works the same on a map.

use cel::common::ast::{EntryExpr, Expr, IdedEntryExpr, IdedExpr, LiteralValue, MapEntryExpr, MapExpr};
use cel::common::types::CelString;

/// Is `name` one of the struct types we build as maps?
fn is_mutation_type(name: &str) -> bool {
    let name = name.strip_prefix('.').unwrap_or(name);
    name == "Object" || name.starts_with("Object.") || name == "JSONPatch"
}

/// The direct subexpressions of `e`.
pub(crate) fn children(e: &IdedExpr) -> Vec<&IdedExpr> {
    fn entry(en: &IdedEntryExpr) -> Vec<&IdedExpr> {
        match &en.expr {
            EntryExpr::MapEntry(me) => vec![&me.key, &me.value],
            EntryExpr::StructField(f) => vec![&f.value],
        }
    }
    match &e.expr {
        Expr::Call(c) => c.target.as_deref().into_iter().chain(c.args.iter()).collect(),
        Expr::Comprehension(c) => vec![&c.iter_range, &c.accu_init, &c.loop_cond, &c.loop_step, &c.result],
        Expr::List(l) => l.elements.iter().collect(),
        Expr::Map(m) => m.entries.iter().flat_map(entry).collect(),
        Expr::Struct(st) => st.entries.iter().flat_map(entry).collect(),
        Expr::Select(s) => vec![&s.operand],
        _ => Vec::new(),
    }
}

/// The direct subexpressions of `e`, to rewrite.
pub(crate) fn children_mut(e: &mut IdedExpr) -> Vec<&mut IdedExpr> {
    fn entry(en: &mut IdedEntryExpr) -> Vec<&mut IdedExpr> {
        match &mut en.expr {
            EntryExpr::MapEntry(me) => vec![&mut me.key, &mut me.value],
            EntryExpr::StructField(f) => vec![&mut f.value],
        }
    }
    match &mut e.expr {
        Expr::Call(c) => c.target.as_deref_mut().into_iter().chain(c.args.iter_mut()).collect(),
        Expr::Comprehension(c) => {
            vec![&mut c.iter_range, &mut c.accu_init, &mut c.loop_cond, &mut c.loop_step, &mut c.result]
        }
        Expr::List(l) => l.elements.iter_mut().collect(),
        Expr::Map(m) => m.entries.iter_mut().flat_map(entry).collect(),
        Expr::Struct(st) => st.entries.iter_mut().flat_map(entry).collect(),
        Expr::Select(s) => vec![&mut s.operand],
        _ => Vec::new(),
    }
}

/// Rewrites every `Object…{…}` and `JSONPatch{…}` literal below `e` into a map literal.
pub fn structs_to_maps(e: &mut IdedExpr) {
    children_mut(e).into_iter().for_each(structs_to_maps);
    if let Expr::Struct(s) = &mut e.expr
        && is_mutation_type(&s.type_name)
    {
        let entries = std::mem::take(&mut s.entries)
            .into_iter()
            .map(|mut entry| {
                if let EntryExpr::StructField(f) = entry.expr {
                    let key =
                        IdedExpr { id: entry.id, expr: Expr::Literal(LiteralValue::String(CelString::from(f.field))) };
                    entry.expr = EntryExpr::MapEntry(MapEntryExpr { key, value: f.value, optional: f.optional });
                }
                entry
            })
            .collect();
        e.expr = Expr::Map(MapExpr { entries });
    }
}

/// Does `e` read the identifier `name` anywhere?
pub fn mentions(e: &IdedExpr, name: &str) -> bool {
    matches!(&e.expr, Expr::Ident(n) if n == name) || children(e).into_iter().any(|c| mentions(c, name))
}

/// Does `e` read an identifier `pred` accepts anywhere (bound by a loop or not)?
pub fn reads_any(e: &IdedExpr, pred: &dyn Fn(&str) -> bool) -> bool {
    matches!(&e.expr, Expr::Ident(n) if pred(n)) || children(e).into_iter().any(|c| reads_any(c, pred))
}

/// The fields of `request` as a webhook's match conditions see it (Kubernetes'
/// `AdmissionRequest` CEL type: no `object` or `oldObject`, which are variables of their own),
/// with the fields their own types have (`None`: a scalar; `Some([])`: any field, `options`).
fn request_field(name: &str) -> Option<Option<&'static [&'static str]>> {
    const GVK: &[&str] = &["group", "version", "kind"];
    const GVR: &[&str] = &["group", "version", "resource"];
    Some(match name {
        "kind" | "requestKind" => Some(GVK),
        "resource" | "requestResource" => Some(GVR),
        "userInfo" => Some(&["username", "uid", "groups", "extra"]),
        "options" => Some(&[]),
        "subResource" | "requestSubResource" | "name" | "namespace" | "operation" | "dryRun" => None,
        _ => return None,
    })
}

/// The fields selected from `request` by a chain of selections ending at `e`
/// (`request.userInfo.username` → `[userInfo, username]`); `None` when `e` is not one.
fn request_path(e: &IdedExpr) -> Option<Vec<&str>> {
    match &e.expr {
        Expr::Ident(n) if n == "request" => Some(Vec::new()),
        Expr::Select(s) => {
            let mut path = request_path(&s.operand)?;
            path.push(s.field.as_str());
            Some(path)
        }
        _ => None,
    }
}

/// Whether every use of `request` in `e` selects fields Kubernetes' webhook match conditions
/// have (`request.object` is Kyverno's, not the API server's: a webhook configuration holding
/// it is refused whole).
pub fn request_selects_ok(e: &IdedExpr) -> bool {
    if let Some(path) = request_path(e) {
        return match path.as_slice() {
            [] => false,
            [first, rest @ ..] => match request_field(first) {
                None => false,
                Some(None) => rest.is_empty(),
                Some(Some([])) => true,
                Some(Some(fields)) => rest.first().is_none_or(|f| fields.contains(f)) && rest.len() <= 1,
            },
        };
    }
    children(e).into_iter().all(request_selects_ok)
}

/// The variables the loops (comprehensions) in `e` bind.
pub fn loop_vars(e: &IdedExpr, out: &mut Vec<String>) {
    if let Expr::Comprehension(c) = &e.expr {
        out.push(c.iter_var.clone());
        out.extend(c.iter_var2.clone());
        out.push(c.accu_var.clone());
    }
    children(e).into_iter().for_each(|c| loop_vars(c, out));
}

/// The names of the global functions `e` calls.
pub fn global_calls(e: &IdedExpr, out: &mut Vec<String>) {
    if let Expr::Call(c) = &e.expr
        && c.target.is_none()
    {
        out.push(c.func_name.clone());
    }
    children(e).into_iter().for_each(|c| global_calls(c, out));
}

/// The argument counts of every call of the global function `name` in `e` (host calls count
/// the host argument the macro adds).
pub fn call_arities(e: &IdedExpr, name: &str, out: &mut Vec<usize>) {
    if let Expr::Call(c) = &e.expr
        && c.target.is_none()
        && c.func_name == name
    {
        out.push(c.args.len());
    }
    children(e).into_iter().for_each(|c| call_arities(c, name, out));
}

/// The identifier `variables.<name>` reads become: the evaluation serves each composition
/// variable directly, without building the `variables` map (still there for other uses).
pub fn variable_ident(name: &str) -> String {
    format!("@var:{name}")
}

/// Rewrites `variables.<name>` (not inside `has()`) into [`variable_ident`].
pub fn variables_to_idents(e: &mut IdedExpr) {
    if let Expr::Select(s) = &e.expr
        && !s.test
        && matches!(&s.operand.expr, Expr::Ident(n) if n == "variables")
    {
        e.expr = Expr::Ident(variable_ident(&s.field));
        return;
    }
    children_mut(e).into_iter().for_each(variables_to_idents);
}

/// How deeply comprehensions (`all`, `exists`, `map`, `filter`, ...) nest in `e`.
pub fn loop_depth(e: &IdedExpr) -> usize {
    let deepest = |xs: &[&IdedExpr]| xs.iter().map(|x| loop_depth(x)).max().unwrap_or(0);
    match &e.expr {
        Expr::Comprehension(c) => {
            let body = deepest(&[&c.loop_cond, &c.loop_step, &c.result]);
            let outside = deepest(&[&c.iter_range, &c.accu_init]);
            // `cel.bind`-style comprehensions over an empty range do not loop.
            let loops = !matches!(&c.iter_range.expr, Expr::List(l) if l.elements.is_empty());
            outside.max(body + usize::from(loops))
        }
        _ => deepest(&children(e)),
    }
}
