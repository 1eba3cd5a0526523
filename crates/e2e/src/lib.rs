//! What the end-to-end tools share with the tests: a real control plane with Verno in it
//! ([`real`]).

pub mod real;
