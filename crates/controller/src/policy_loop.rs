//! Every replica: policies and exceptions from the API server → a compiled set in force in the
//! admission server, and the statuses the leader writes.
//!
//! One reflector per watched kind; a burst of changes (a GitOps sync of many policies) is
//! built once per debounce, each build taking in everything that arrived meanwhile (compiles
//! are cached per policy), while a policy applied alone is in force within milliseconds.

use crate::events::PolicyStores;
use crate::policies::{self, Compiler, PolicyStatus};
use crate::runtime::{Kick, Shared};
use crate::serving::ReadyPart;
use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use kube::api::{Api, DynamicObject};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use verno_engine::{Kind, LiveNamespaces};

/// How long a change after a quiet spell waits for the ones arriving with it.
pub const QUICK: Duration = Duration::from_millis(5);

/// The kinds of `wanted` this cluster serves. `kyverno.io` kinds are always kept (their CRDs
/// are Verno's own, and dropping them on a discovery hiccup would empty every rule); a
/// `policies.kyverno.io` kind is kept when discovery lists it, and when discovery keeps
/// failing for another reason than "not found" (the watch then waits, and readiness with it).
pub async fn served_kinds(client: &kube::Client, wanted: &[Kind]) -> Vec<Kind> {
    let mut listed: HashMap<String, Option<Vec<String>>> = HashMap::new();
    let mut out = Vec::new();
    for &kind in wanted {
        if kind.group() == verno_api::Group::Kyverno {
            out.push(kind);
            continue;
        }
        let ar = policies::resource(kind);
        if !listed.contains_key(&ar.api_version) {
            let mut found = None;
            for attempt in 0..5u32 {
                match client.list_api_group_resources(&ar.api_version).await {
                    Ok(list) => {
                        found = Some(list.resources.into_iter().map(|r| r.name).collect());
                        break;
                    }
                    Err(kube::Error::Api(e)) if e.code == 404 => {
                        found = Some(Vec::new());
                        break;
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, api_version = %ar.api_version, "discovery failed (retrying)");
                        tokio::time::sleep(Duration::from_millis(200 << attempt)).await;
                    }
                }
            }
            listed.insert(ar.api_version.clone(), found);
        }
        match listed.get(&ar.api_version) {
            Some(Some(names)) if !names.contains(&ar.plural) => {
                tracing::info!(kind = %kind, api_version = %ar.api_version, "not served by this cluster (no CRD): not watched until Verno restarts");
            }
            _ => out.push(kind),
        }
    }
    out
}

/// What the policy loop hands on after each build.
pub struct Outputs {
    pub installed: watch::Sender<u64>,
    pub statuses: watch::Sender<Arc<Vec<PolicyStatus>>>,
    pub synced: watch::Sender<bool>,
    /// Wakes the leader pass.
    pub kick: Kick,
}

/// The policy and exception watches.
pub struct PolicyWatch {
    stores: Vec<(Kind, Store<DynamicObject>)>,
    streams: Vec<BoxStream<'static, ()>>,
}

impl PolicyWatch {
    /// Watches `kinds` (admission policies at `map_version` for the MutatingAdmissionPolicy
    /// kinds).
    pub fn new(client: &kube::Client, kinds: Vec<Kind>, map_version: Option<&str>) -> PolicyWatch {
        let mut stores = Vec::new();
        let mut streams = Vec::new();
        for kind in kinds {
            let ar = policies::resource_at(kind, map_version.unwrap_or("v1"));
            let writer = reflector::store::Writer::<DynamicObject>::new(ar.clone());
            stores.push((kind, writer.as_reader()));
            let stream = watcher(Api::<DynamicObject>::all_with(client.clone(), &ar), watcher::Config::default())
                .default_backoff()
                .reflect(writer)
                .map(|_| ());
            streams.push(stream.boxed());
        }
        PolicyWatch { stores, streams }
    }

    /// Where events find a policy's object.
    pub fn stores(&self) -> PolicyStores {
        PolicyStores(self.stores.clone())
    }

    /// Builds and installs a set whenever the policies change, until Verno stops.
    pub async fn run(
        self,
        shared: Shared,
        mut compiler: Compiler,
        namespaces: Arc<LiveNamespaces>,
        out: Outputs,
        debounce: Duration,
    ) {
        let PolicyWatch { stores, streams } = self;
        let mut events = futures_util::stream::select_all(streams);
        let mut stop = shared.stop.clone();
        let mut generation = 0u64;
        // Never publish from an unsynced cache: an empty set would drop every rule.
        tokio::select! {
            r = futures_util::future::join_all(stores.iter().map(|(_, s)| s.wait_until_ready())) => { let _ = r; }
            _ = async { while events.next().await.is_some() {} } => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        loop {
            let (mut ps, mut es, mut bs) = (Vec::new(), Vec::new(), Vec::new());
            for (kind, store) in &stores {
                let into = if kind.is_exception() {
                    &mut es
                } else if kind.is_binding() {
                    &mut bs
                } else {
                    &mut ps
                };
                into.extend(store.state().into_iter().map(|o| (*kind, o)));
            }
            let (set, statuses) = compiler.build_with(&ps, &es, &bs, namespaces.clone());
            shared.server.install(set);
            shared.server.set_ready(ReadyPart::Policies, true);
            generation += 1;
            let _ = out.installed.send(generation);
            let _ = out.statuses.send(Arc::new(statuses));
            let _ = out.synced.send(true);
            out.kick.bump();
            let built = tokio::time::Instant::now();
            // Wait for a change, then gather what arrives with it: at most one build per
            // `debounce` (50 ms at most).
            tokio::select! {
                ev = events.next() => if ev.is_none() { return },
                _ = stop.wait_for(|s| *s) => return,
            }
            let next = (tokio::time::Instant::now() + QUICK.min(debounce))
                .max(built + debounce.min(Duration::from_millis(50)));
            loop {
                tokio::select! {
                    ev = events.next() => if ev.is_none() { return },
                    _ = tokio::time::sleep_until(next) => break,
                    _ = stop.wait_for(|s| *s) => return,
                }
            }
        }
    }
}
