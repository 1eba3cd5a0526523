//! What every replica keeps of the cluster for context entries and matching, read per request
//! instead of asking the API server: Namespaces (labels for namespaceSelectors, objects for
//! CEL's `namespaceObject`), the RoleBindings and ClusterRoleBindings the requesting users'
//! roles are worked out from (Kyverno's RBAC informers), the ConfigMaps labelled for caching
//! (Kyverno's `--enableConfigMapCaching`) and GlobalContextEntries' data.

use crate::cluster_data::{CACHE_LABEL, ClusterData};
use crate::global_context::GlobalStore;
use crate::runtime::reflect;
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleBinding};
use kube::api::Api;
use kube::runtime::reflector::store::Writer;
use kube::runtime::{WatchStreamExt, watcher};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use verno_engine::LiveNamespaces;

/// The caches, before they are followed.
pub struct Caches {
    config_maps: Option<Writer<ConfigMap>>,
    role_bindings: Writer<RoleBinding>,
    cluster_role_bindings: Writer<ClusterRoleBinding>,
    pub global: Arc<GlobalStore>,
    pub namespaces: Arc<LiveNamespaces>,
}

impl Caches {
    /// The caches; ConfigMaps only with `config_map_cache`.
    pub fn new(config_map_cache: bool) -> Caches {
        Caches {
            config_maps: config_map_cache.then(Writer::default),
            role_bindings: Writer::default(),
            cluster_role_bindings: Writer::default(),
            global: Arc::default(),
            namespaces: Arc::default(),
        }
    }

    /// Context entries' view of the cluster through `client`, reading these caches, with the
    /// image verifier (cache `image_cache`) reading Secrets in `namespace`.
    pub fn cluster_data(
        &self,
        client: &kube::Client,
        namespace: &str,
        image_cache: Option<(Duration, usize)>,
    ) -> ClusterData {
        let mut data = ClusterData::new(client.clone()).with_image_verifier(namespace, image_cache);
        if let Some(writer) = &self.config_maps {
            data = data.with_config_map_cache(writer.as_reader());
        }
        data.with_bindings(self.role_bindings.as_reader(), self.cluster_role_bindings.as_reader())
            .with_global_context(self.global.clone())
            .with_namespaces(self.namespaces.clone())
    }

    /// Starts following the cluster until `stop` (GlobalContextEntries are followed by
    /// [`crate::global_context::run`]).
    pub fn follow(self, client: &kube::Client, stop: &watch::Receiver<bool>) -> Vec<JoinHandle<()>> {
        let mut tasks = vec![
            reflect(
                Api::all(client.clone()),
                watcher::Config::default(),
                self.role_bindings,
                stop.clone(),
                "RoleBinding",
            ),
            reflect(
                Api::all(client.clone()),
                watcher::Config::default(),
                self.cluster_role_bindings,
                stop.clone(),
                "ClusterRoleBinding",
            ),
            tokio::spawn(follow_namespaces(Api::all(client.clone()), self.namespaces, stop.clone())),
        ];
        // Kyverno's informer has the same label selector.
        if let Some(writer) = self.config_maps {
            let config = watcher::Config::default().labels(CACHE_LABEL);
            tasks.push(reflect(Api::all(client.clone()), config, writer, stop.clone(), "cached ConfigMap"));
        }
        tasks
    }
}

/// Keeps `live` in step with the cluster's Namespaces until `stop`.
async fn follow_namespaces(api: Api<Namespace>, live: Arc<LiveNamespaces>, mut stop: watch::Receiver<bool>) {
    let mut s = watcher(api, watcher::Config::default()).default_backoff().boxed();
    // The names a (re-)list delivered: what it did not list was deleted meanwhile.
    let mut listed: Option<HashSet<String>> = None;
    loop {
        tokio::select! {
            ev = s.next() => match ev {
                Some(Ok(watcher::Event::Init)) => listed = Some(Default::default()),
                Some(Ok(watcher::Event::InitApply(ns))) => {
                    if let (Some(l), Some(name)) = (listed.as_mut(), ns.metadata.name.clone()) {
                        l.insert(name);
                    }
                    live.upsert(serde_json::to_value(&ns).unwrap_or_default());
                }
                Some(Ok(watcher::Event::InitDone)) => {
                    if let Some(l) = listed.take() {
                        live.retain(|name| l.contains(name));
                    }
                }
                Some(Ok(watcher::Event::Apply(ns))) => live.upsert(serde_json::to_value(&ns).unwrap_or_default()),
                Some(Ok(watcher::Event::Delete(ns))) => {
                    if let Some(name) = ns.metadata.name.as_deref() {
                        live.remove(name);
                    }
                }
                Some(Err(e)) => tracing::debug!(error = %e, "namespace watch error (retrying)"),
                None => return,
            },
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}
