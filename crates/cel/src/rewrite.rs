//! Struct literals of Kubernetes' mutation types, rewritten to map literals at compile time.
//!
//! MutatingAdmissionPolicy and Kyverno's MutatingPolicy build their results with typed struct
//! literals: `Object{spec: Object.spec{replicas: 2}}` (an apply configuration) and
//! `JSONPatch{op: "add", path: "/x", value: 1}`. Kubernetes type-checks these against the
//! resource's schema; offline we have no schema, so each such literal becomes the map it
//! serialises to (`{"spec": {"replicas": 2}}`), which the engine then merges or applies. Field
//! selection on the result (`p.op`) works the same on a map.

use cel::common::ast::{EntryExpr, Expr, IdedExpr, LiteralValue, MapEntryExpr, MapExpr};
use cel::common::types::CelString;

/// Is `name` one of the struct types we build as maps?
fn is_mutation_type(name: &str) -> bool {
    let name = name.strip_prefix('.').unwrap_or(name);
    name == "Object" || name.starts_with("Object.") || name == "JSONPatch"
}

/// Rewrites every `Object…{…}` and `JSONPatch{…}` literal below `e` into a map literal.
pub fn structs_to_maps(e: &mut IdedExpr) {
    match &mut e.expr {
        Expr::Call(c) => {
            if let Some(t) = c.target.as_deref_mut() {
                structs_to_maps(t);
            }
            c.args.iter_mut().for_each(structs_to_maps);
        }
        Expr::Comprehension(c) => {
            for x in [&mut c.iter_range, &mut c.accu_init, &mut c.loop_cond, &mut c.loop_step, &mut c.result] {
                structs_to_maps(x);
            }
        }
        Expr::List(l) => l.elements.iter_mut().for_each(structs_to_maps),
        Expr::Map(m) => {
            for entry in &mut m.entries {
                if let EntryExpr::MapEntry(me) = &mut entry.expr {
                    structs_to_maps(&mut me.key);
                    structs_to_maps(&mut me.value);
                }
            }
        }
        Expr::Select(s) => structs_to_maps(&mut s.operand),
        Expr::Struct(s) => {
            for entry in &mut s.entries {
                if let EntryExpr::StructField(f) = &mut entry.expr {
                    structs_to_maps(&mut f.value);
                }
            }
            if is_mutation_type(&s.type_name) {
                let entries = std::mem::take(&mut s.entries)
                    .into_iter()
                    .map(|mut entry| {
                        if let EntryExpr::StructField(f) = entry.expr {
                            let key = IdedExpr { id: entry.id, expr: Expr::Literal(LiteralValue::String(CelString::from(f.field))) };
                            entry.expr = EntryExpr::MapEntry(MapEntryExpr { key, value: f.value, optional: f.optional });
                        }
                        entry
                    })
                    .collect();
                e.expr = Expr::Map(MapExpr { entries });
            }
        }
        _ => {}
    }
}

/// Does `e` read the identifier `name` anywhere?
pub fn mentions(e: &IdedExpr, name: &str) -> bool {
    match &e.expr {
        Expr::Ident(n) => n == name,
        Expr::Call(c) => c.target.as_deref().is_some_and(|t| mentions(t, name)) || c.args.iter().any(|a| mentions(a, name)),
        Expr::Comprehension(c) => [&c.iter_range, &c.accu_init, &c.loop_cond, &c.loop_step, &c.result].into_iter().any(|x| mentions(x, name)),
        Expr::List(l) => l.elements.iter().any(|x| mentions(x, name)),
        Expr::Map(m) => m.entries.iter().any(|en| match &en.expr {
            EntryExpr::MapEntry(me) => mentions(&me.key, name) || mentions(&me.value, name),
            EntryExpr::StructField(f) => mentions(&f.value, name),
        }),
        Expr::Struct(s) => s.entries.iter().any(|en| match &en.expr {
            EntryExpr::MapEntry(me) => mentions(&me.key, name) || mentions(&me.value, name),
            EntryExpr::StructField(f) => mentions(&f.value, name),
        }),
        Expr::Select(s) => mentions(&s.operand, name),
        _ => false,
    }
}

/// The identifier `variables.<name>` reads become: the evaluation serves each composition
/// variable directly, without building the `variables` map (still there for other uses).
pub fn variable_ident(name: &str) -> String {
    format!("@var:{name}")
}

/// Rewrites `variables.<name>` (not inside `has()`) into [`variable_ident`].
pub fn variables_to_idents(e: &mut IdedExpr) {
    if let Expr::Select(s) = &e.expr {
        if !s.test && matches!(&s.operand.expr, Expr::Ident(n) if n == "variables") {
            e.expr = Expr::Ident(variable_ident(&s.field));
            return;
        }
    }
    match &mut e.expr {
        Expr::Call(c) => {
            if let Some(t) = c.target.as_deref_mut() {
                variables_to_idents(t);
            }
            c.args.iter_mut().for_each(variables_to_idents);
        }
        Expr::Comprehension(c) => {
            for x in [&mut c.iter_range, &mut c.accu_init, &mut c.loop_cond, &mut c.loop_step, &mut c.result] {
                variables_to_idents(x);
            }
        }
        Expr::List(l) => l.elements.iter_mut().for_each(variables_to_idents),
        Expr::Map(m) => {
            for entry in &mut m.entries {
                if let EntryExpr::MapEntry(me) = &mut entry.expr {
                    variables_to_idents(&mut me.key);
                    variables_to_idents(&mut me.value);
                }
            }
        }
        Expr::Struct(st) => {
            for entry in &mut st.entries {
                if let EntryExpr::StructField(f) = &mut entry.expr {
                    variables_to_idents(&mut f.value);
                }
            }
        }
        Expr::Select(s) => variables_to_idents(&mut s.operand),
        _ => {}
    }
}

/// How deeply comprehensions (`all`, `exists`, `map`, `filter`, ...) nest in `e`.
pub fn loop_depth(e: &IdedExpr) -> usize {
    let max = |xs: &mut dyn Iterator<Item = &IdedExpr>| xs.map(loop_depth).max().unwrap_or(0);
    match &e.expr {
        Expr::Call(c) => max(&mut c.target.as_deref().into_iter().chain(c.args.iter())),
        Expr::Comprehension(c) => {
            let body = max(&mut [&c.loop_cond, &c.loop_step, &c.result].into_iter());
            let outside = max(&mut [&c.iter_range, &c.accu_init].into_iter());
            // `cel.bind`-style comprehensions over an empty range do not loop.
            let loops = !matches!(&c.iter_range.expr, Expr::List(l) if l.elements.is_empty());
            outside.max(body + usize::from(loops))
        }
        Expr::List(l) => max(&mut l.elements.iter()),
        Expr::Map(m) => max(&mut m.entries.iter().flat_map(|en| match &en.expr {
            EntryExpr::MapEntry(me) => vec![&me.key, &me.value],
            EntryExpr::StructField(f) => vec![&f.value],
        })),
        Expr::Struct(st) => max(&mut st.entries.iter().flat_map(|en| match &en.expr {
            EntryExpr::MapEntry(me) => vec![&me.key, &me.value],
            EntryExpr::StructField(f) => vec![&f.value],
        })),
        Expr::Select(s) => loop_depth(&s.operand),
        _ => 0,
    }
}
