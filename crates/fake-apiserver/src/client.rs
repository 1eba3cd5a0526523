//! A real `kube::Client` on the fake, and the few steps every cluster test repeats: apply
//! documents as `kubectl apply --server-side` does, and wait for something to become true.

use crate::FakeApiServer;
use anyhow::{Result, anyhow, bail};
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use serde_json::Value;
use std::future::Future;
use std::time::Duration;

impl FakeApiServer {
    /// A client talking HTTP to this server, impersonating `user` when given.
    pub fn client(&self, user: Option<&str>) -> Result<kube::Client> {
        // kube's error text as it was, without its sources repeated after it.
        kube::Client::try_from(self.config(user)?).map_err(|e| anyhow!("{e}"))
    }

    /// The client configuration of [`FakeApiServer::client`].
    pub fn config(&self, user: Option<&str>) -> Result<kube::Config> {
        let url = self.url().parse()?;
        let mut config = kube::Config::new(url);
        config.auth_info.impersonate = user.map(str::to_string);
        Ok(config)
    }

    /// Applies `doc` through `client` as `kubectl apply --server-side --force-conflicts`
    /// (field manager `kubectl`); its kind must be one this server serves.
    pub async fn apply(&self, client: &kube::Client, doc: &Value) -> Result<()> {
        let s = |p: &str| doc.pointer(p).and_then(Value::as_str).unwrap_or("");
        let (api_version, kind, name) = (s("/apiVersion"), s("/kind"), s("/metadata/name"));
        let r = self
            .inner
            .resources()
            .into_iter()
            .find(|r| r.api_version() == api_version && r.kind == kind)
            .ok_or_else(|| anyhow!("{api_version} {kind} is not served by the fake"))?;
        let ar = kube::discovery::ApiResource {
            group: r.group.into(),
            version: r.version.into(),
            api_version: api_version.into(),
            kind: kind.into(),
            plural: r.plural.into(),
        };
        let api: Api<DynamicObject> = match doc.pointer("/metadata/namespace").and_then(Value::as_str) {
            Some(ns) if r.namespaced => Api::namespaced_with(client.clone(), ns, &ar),
            _ => Api::all_with(client.clone(), &ar),
        };
        api.patch(name, &PatchParams::apply("kubectl").force(), &Patch::Apply(doc))
            .await
            .map(|_| ())
            .map_err(|e| anyhow!("{kind} {name}: {e}"))
    }
}

/// Polls `f` until it returns `Some`, for up to 20 s; the error names `what`.
pub async fn eventually<T, F, Fut>(what: &str, f: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    eventually_within(what, Duration::from_secs(20), f).await
}

/// [`eventually`] with its own limit (work whose size, not its speed, is under test).
pub async fn eventually_within<T, F, Fut>(what: &str, limit: Duration, mut f: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if let Some(v) = f().await {
            return Ok(v);
        }
        if tokio::time::Instant::now() > deadline {
            bail!("timed out waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
