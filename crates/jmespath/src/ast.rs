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
    /// A readable S-expression form, used by `verno jp parse`.
    pub fn sexpr(&self) -> String {
        match self {
            Ast::Identity => "(current)".into(),
            Ast::Field(f) => format!("(field {f:?})"),
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
