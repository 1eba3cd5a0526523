//! The compiled form of a cleanup policy's rule: data only; it is compiled and evaluated in
//! [`crate::cleanup`].

use crate::condition::CompiledConditions;
use crate::cron::Schedule;

/// What decides whether a matched object is deleted.
#[derive(Debug, Clone)]
pub enum Decision {
    /// CleanupPolicy `conditions` (any/all), the object read as `target`; none: always.
    Conditions(Option<CompiledConditions>),
    /// DeletingPolicy: `variables`, then every `conditions` expression must hold.
    Cel { variables: Vec<(String, verno_cel::Expr)>, conditions: Vec<(String, verno_cel::Expr)> },
}

/// The body of a cleanup policy's rule.
#[derive(Debug, Clone)]
pub struct CompiledCleanup {
    pub schedule: Schedule,
    /// `Foreground`, `Background` or `Orphan`; `None`: the API server's default.
    pub propagation: Option<&'static str>,
    pub decision: Decision,
}
