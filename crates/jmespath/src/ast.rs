//! The expression tree produced by the parser. Functions are resolved at parse time.

use crate::functions::Function;
use serde_json::Value;

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Comparator {
    Eq,
    Ne,
    Lt,
    Lte,
    Gt,
    Gte,
}

#[derive(Debug, Clone)]
pub enum Ast {
    Identity,
    Field(String),
    /// `$name`: a variable of the caller's (community dialect; see `Env::variable`).
    Variable(String),
    Index(i64),
    Slice {
        start: Option<i64>,
        stop: Option<i64>,
        step: Option<i64>,
    },
    Subexpr(Box<Ast>, Box<Ast>),
    /// `lhs[*].rhs`, `lhs[].rhs` (lhs already wrapped in Flatten), slices.
    Projection(Box<Ast>, Box<Ast>),
    /// `lhs.*.rhs`
    ValueProjection(Box<Ast>, Box<Ast>),
    /// `lhs[?cond].rhs`
    FilterProjection {
        lhs: Box<Ast>,
        rhs: Box<Ast>,
        cond: Box<Ast>,
    },
    Flatten(Box<Ast>),
    Literal(Value),
    MultiList(Vec<Ast>),
    MultiHash(Vec<(String, Ast)>),
    Call(&'static Function, Vec<Ast>),
    Expref(Box<Ast>),
    Not(Box<Ast>),
    And(Box<Ast>, Box<Ast>),
    Or(Box<Ast>, Box<Ast>),
    Compare(Comparator, Box<Ast>, Box<Ast>),
    Pipe(Box<Ast>, Box<Ast>),
}

impl Ast {
    /// A copy where every node `f` replaces is replaced (the replacement is not visited
    /// again), or `None` when `f` replaced nothing.
    pub fn rewrite(&self, f: &dyn Fn(&Ast) -> Option<Ast>) -> Option<Ast> {
        if let Some(new) = f(self) {
            return Some(new);
        }
        // Children rewritten; `changed` says whether any was.
        let one = |a: &Ast| a.rewrite(f);
        let pair = |a: &Ast, b: &Ast| -> Option<(Box<Ast>, Box<Ast>)> {
            match (one(a), one(b)) {
                (None, None) => None,
                (x, y) => Some((Box::new(x.unwrap_or_else(|| a.clone())), Box::new(y.unwrap_or_else(|| b.clone())))),
            }
        };
        let list = |xs: &[Ast]| -> Option<Vec<Ast>> {
            let new: Vec<Option<Ast>> = xs.iter().map(one).collect();
            new.iter()
                .any(Option::is_some)
                .then(|| new.into_iter().zip(xs).map(|(n, x)| n.unwrap_or_else(|| x.clone())).collect())
        };
        match self {
            Ast::Identity | Ast::Field(_) | Ast::Variable(_) | Ast::Index(_) | Ast::Slice { .. } | Ast::Literal(_) => {
                None
            }
            Ast::Subexpr(a, b) => pair(a, b).map(|(a, b)| Ast::Subexpr(a, b)),
            Ast::Projection(a, b) => pair(a, b).map(|(a, b)| Ast::Projection(a, b)),
            Ast::ValueProjection(a, b) => pair(a, b).map(|(a, b)| Ast::ValueProjection(a, b)),
            Ast::FilterProjection { lhs, rhs, cond } => {
                let (l, r, c) = (one(lhs), one(rhs), one(cond));
                if l.is_none() && r.is_none() && c.is_none() {
                    return None;
                }
                Some(Ast::FilterProjection {
                    lhs: Box::new(l.unwrap_or_else(|| (**lhs).clone())),
                    rhs: Box::new(r.unwrap_or_else(|| (**rhs).clone())),
                    cond: Box::new(c.unwrap_or_else(|| (**cond).clone())),
                })
            }
            Ast::Flatten(a) => one(a).map(|a| Ast::Flatten(Box::new(a))),
            Ast::MultiList(xs) => list(xs).map(Ast::MultiList),
            Ast::MultiHash(xs) => {
                let values: Vec<Ast> = xs.iter().map(|(_, v)| v.clone()).collect();
                list(&values).map(|new| Ast::MultiHash(xs.iter().map(|(k, _)| k.clone()).zip(new).collect()))
            }
            Ast::Call(func, args) => list(args).map(|args| Ast::Call(func, args)),
            Ast::Expref(a) => one(a).map(|a| Ast::Expref(Box::new(a))),
            Ast::Not(a) => one(a).map(|a| Ast::Not(Box::new(a))),
            Ast::And(a, b) => pair(a, b).map(|(a, b)| Ast::And(a, b)),
            Ast::Or(a, b) => pair(a, b).map(|(a, b)| Ast::Or(a, b)),
            Ast::Compare(c, a, b) => pair(a, b).map(|(a, b)| Ast::Compare(*c, a, b)),
            Ast::Pipe(a, b) => pair(a, b).map(|(a, b)| Ast::Pipe(a, b)),
        }
    }

    /// A readable S-expression form, used by `verno jp parse`.
    pub fn sexpr(&self) -> String {
        match self {
            Ast::Identity => "(current)".into(),
            Ast::Field(f) => format!("(field {f:?})"),
            Ast::Variable(v) => format!("(variable {v:?})"),
            Ast::Index(i) => format!("(index {i})"),
            Ast::Slice { start, stop, step } => format!("(slice {start:?} {stop:?} {step:?})"),
            Ast::Subexpr(a, b) => format!("(subexpression {} {})", a.sexpr(), b.sexpr()),
            Ast::Projection(a, b) => format!("(projection {} {})", a.sexpr(), b.sexpr()),
            Ast::ValueProjection(a, b) => format!("(value-projection {} {})", a.sexpr(), b.sexpr()),
            Ast::FilterProjection { lhs, rhs, cond } => {
                format!("(filter-projection {} {} {})", lhs.sexpr(), cond.sexpr(), rhs.sexpr())
            }
            Ast::Flatten(a) => format!("(flatten {})", a.sexpr()),
            Ast::Literal(v) => format!("(literal {v})"),
            Ast::MultiList(xs) => format!("(multi-list {})", xs.iter().map(Ast::sexpr).collect::<Vec<_>>().join(" ")),
            Ast::MultiHash(xs) => format!(
                "(multi-hash {})",
                xs.iter().map(|(k, v)| format!("({k:?} {})", v.sexpr())).collect::<Vec<_>>().join(" ")
            ),
            Ast::Call(f, args) => {
                format!("(function {} {})", f.name, args.iter().map(Ast::sexpr).collect::<Vec<_>>().join(" "))
            }
            Ast::Expref(a) => format!("(expref {})", a.sexpr()),
            Ast::Not(a) => format!("(not {})", a.sexpr()),
            Ast::And(a, b) => format!("(and {} {})", a.sexpr(), b.sexpr()),
            Ast::Or(a, b) => format!("(or {} {})", a.sexpr(), b.sexpr()),
            Ast::Compare(c, a, b) => format!("(comparator {c:?} {} {})", a.sexpr(), b.sexpr()),
            Ast::Pipe(a, b) => format!("(pipe {} {})", a.sexpr(), b.sexpr()),
        }
    }
}
