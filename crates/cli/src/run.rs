//! Evaluating loaded policies on loaded resources, shared by `verno test` and `verno apply`.
//! All evaluation happens in the engine; this only prepares requests.

use crate::data::CliData;
use serde_json::Value;
use verno_engine::context::Saved;
use verno_engine::{
    CompiledException, CompiledPolicy, Phase, PolicyResponse, Request, RequestUser, Sequence, build_context,
};

/// The clock and DNS the CLI offers to JMESPath functions.
pub struct CliEnv;

impl verno_jmespath::Env for CliEnv {
    fn now(&self) -> Option<chrono::DateTime<chrono::FixedOffset>> {
        Some(chrono::Local::now().fixed_offset())
    }
    fn random_seed(&self) -> Option<u64> {
        use std::hash::{BuildHasher, Hasher};
        // A fresh randomly keyed hasher per call: random enough for `random()`, no extra crate.
        Some(std::collections::hash_map::RandomState::new().build_hasher().finish())
    }
    fn resolve_host(&self, host: &str) -> Option<Vec<std::net::IpAddr>> {
        use std::net::ToSocketAddrs;
        (host, 80).to_socket_addrs().ok().map(|it| it.map(|a| a.ip()).collect())
    }
}

pub struct Runner<'a> {
    pub policies: &'a [CompiledPolicy],
    pub exceptions: &'a [CompiledException],
    pub data: &'a CliData,
    pub user: Option<&'a RequestUser>,
    pub user_info: Option<&'a Value>,
    /// `--set` and global values, applied to every request.
    pub globals: &'a [(String, Value)],
}

fn resource_name(r: &Value) -> &str {
    r.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("")
}

impl<'a> Runner<'a> {
    pub fn new(
        policies: &'a [CompiledPolicy],
        exceptions: &'a [CompiledException],
        data: &'a CliData,
        user: Option<&'a (RequestUser, Value)>,
        globals: &'a [(String, Value)],
    ) -> Self {
        Runner { policies, exceptions, data, user: user.map(|u| &u.0), user_info: user.map(|u| &u.1), globals }
    }

    /// Runs every policy on one resource with one operation.
    pub fn run(&self, resource: &Value, operation: &str) -> Vec<PolicyResponse> {
        let op = operation.to_uppercase();
        let (object, old): (&Value, Option<&Value>) = match op.as_str() {
            "DELETE" => (&Value::Null, Some(resource)),
            "UPDATE" => (resource, Some(resource)),
            _ => (resource, None),
        };
        let ns = resource.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or("");
        let ns_labels = self.data.namespace_labels(ns);
        let globals: Vec<(String, Value)> =
            self.globals.iter().filter(|(k, _)| k != "request.operation").cloned().collect();
        let req = Request {
            operation: &op,
            object,
            old_object: old,
            user: self.user,
            user_info: self.user_info,
            namespace_labels: ns_labels.as_ref(),
            subresource: "",
            variables: &globals,
        };
        let env = CliEnv;
        // One context per request; each policy's resource values are set and then restored.
        // As Kyverno's CLI does: every policy mutates in turn (each sees the previous result),
        // then every policy validates the mutated resource, then generate rules run.
        let mut ctx = build_context(&req, &env);
        let mut out: Vec<PolicyResponse> = Vec::with_capacity(self.policies.len());
        let mut seq = Sequence::new(req.clone());
        for phase in [Phase::Mutate, Phase::Validate, Phase::Generate] {
            for (i, p) in self.policies.iter().enumerate() {
                let mut saved = Saved::default();
                for (k, v) in self.data.resource_values(&p.name, resource_name(resource)) {
                    if k != "request.operation" {
                        saved.absorb(ctx.set_path(&k, v));
                    }
                }
                let r = seq.evaluate(p, phase, self.exceptions, &mut ctx, self.data);
                seq.restore(&mut ctx, saved);
                match out.get_mut(i) {
                    Some(prev) => prev.merge(r),
                    None => out.push(r),
                }
            }
        }
        out
    }

    /// The operation for a resource: `request.operation` from per-resource values, then globals.
    pub fn operation_for(&self, policy: Option<&str>, resource: &Value) -> String {
        if let Some(p) = policy
            && let Some((_, v)) = self
                .data
                .resource_values(p, resource_name(resource))
                .into_iter()
                .find(|(k, _)| k == "request.operation")
            && let Some(s) = v.as_str()
        {
            return s.to_string();
        }
        self.globals
            .iter()
            .find(|(k, _)| k == "request.operation")
            .and_then(|(_, v)| v.as_str().map(str::to_string))
            .unwrap_or_else(|| "CREATE".into())
    }
}
