//! A watch that keeps working where RBAC grants `list` but not `watch`.
//!
//! Kyverno's background controller learns of triggers and clone sources from admission
//! requests, so the permissions users grant it for generate rules often say `get, list, create,
//! update, delete` and no `watch` (Kyverno's own CI does so for Secrets). Verno's background
//! controller is level-based and watches what it acts on; where the watch is forbidden after
//! the first list succeeded, this stream lists again every `every` and turns the differences
//! into the watch events the consumer already handles (`Apply` for a new or changed
//! resourceVersion, `Delete` for an object no longer listed). kube-runtime's watcher would
//! otherwise retry the forbidden watch forever and nothing after the first list would be seen.
//!
//! While the watch works only each object's key and resourceVersion are kept (what the first
//! poll compares with). The fallback costs one paged list per period and keeps the last listed
//! objects (what the consumer needs in a `Delete`); it is logged once, with what to grant to
//! avoid it. An object deleted between the watch's last event and the first poll is reported
//! with its metadata only (name, namespace, uid, resourceVersion).

use futures_util::stream::{BoxStream, StreamExt};
use kube::Api;
use kube::api::{ApiResource, DynamicObject, ListParams};
use kube::runtime::{WatchStreamExt, watcher};
use std::collections::{HashMap, VecDeque};
use std::time::Duration;

/// How often a kind whose watch is forbidden is listed again.
pub const POLL_EVERY: Duration = Duration::from_secs(10);

type Events = BoxStream<'static, watcher::Result<watcher::Event<DynamicObject>>>;

/// Whether a watcher error is the API server refusing the `watch` verb.
fn forbidden(e: &watcher::Error) -> bool {
    match e {
        watcher::Error::WatchStartFailed(kube::Error::Api(s)) | watcher::Error::WatchFailed(kube::Error::Api(s)) => {
            s.code == 403
        }
        watcher::Error::WatchError(s) => s.code == 403,
        _ => false,
    }
}

fn key(o: &DynamicObject) -> (String, String) {
    (o.metadata.namespace.clone().unwrap_or_default(), o.metadata.name.clone().unwrap_or_default())
}

struct State {
    /// The watch, until it is found forbidden.
    watch: Option<Events>,
    api: Api<DynamicObject>,
    resource: ApiResource,
    params: ListParams,
    every: Duration,
    what: String,
    /// The objects as last seen, by (namespace, name): while watching, their metadata only
    /// (`Seen::Meta`); once polling, the whole objects.
    seen: HashMap<(String, String), Seen>,
    /// Whether the watcher's first list completed (only then is polling a fallback for watch).
    listed: bool,
    out: VecDeque<watcher::Event<DynamicObject>>,
}

enum Seen {
    /// uid and resourceVersion, while the watch works.
    Meta(Option<String>, Option<String>),
    Object(Box<DynamicObject>),
}

impl Seen {
    fn resource_version(&self) -> Option<&String> {
        match self {
            Seen::Meta(_, rv) => rv.as_ref(),
            Seen::Object(o) => o.metadata.resource_version.as_ref(),
        }
    }

    /// The object a `Delete` carries: the whole last listed one, or its metadata.
    fn into_object(self, (ns, name): (String, String), resource: &ApiResource) -> DynamicObject {
        match self {
            Seen::Object(o) => *o,
            Seen::Meta(uid, rv) => {
                let mut o = DynamicObject::new(&name, resource);
                o.metadata.namespace = (!ns.is_empty()).then_some(ns);
                o.metadata.uid = uid;
                o.metadata.resource_version = rv;
                o
            }
        }
    }
}

impl State {
    fn track(&mut self, ev: &watcher::Event<DynamicObject>) {
        match ev {
            watcher::Event::Init => self.seen.clear(),
            watcher::Event::InitApply(o) | watcher::Event::Apply(o) => {
                let meta = Seen::Meta(o.metadata.uid.clone(), o.metadata.resource_version.clone());
                self.seen.insert(key(o), meta);
            }
            watcher::Event::Delete(o) => {
                self.seen.remove(&key(o));
            }
            watcher::Event::InitDone => self.listed = true,
        }
    }

    /// Lists the kind (paged) and queues the differences with what was seen.
    async fn poll(&mut self) -> Result<(), kube::Error> {
        let mut now: HashMap<(String, String), DynamicObject> = HashMap::new();
        let mut params = self.params.clone();
        loop {
            let page = self.api.list(&params).await?;
            let more = page.metadata.continue_.clone().filter(|c| !c.is_empty());
            for o in page.items {
                now.insert(key(&o), o);
            }
            match more {
                Some(c) => params.continue_token = Some(c),
                None => break,
            }
        }
        for (k, o) in &now {
            let changed =
                self.seen.get(k).is_none_or(|old| old.resource_version() != o.metadata.resource_version.as_ref());
            if changed {
                self.out.push_back(watcher::Event::Apply(o.clone()));
            }
        }
        let gone: Vec<(String, String)> = self.seen.keys().filter(|k| !now.contains_key(*k)).cloned().collect();
        for k in gone {
            if let Some(o) = self.seen.remove(&k) {
                self.out.push_back(watcher::Event::Delete(o.into_object(k, &self.resource)));
            }
        }
        self.seen = now.into_iter().map(|(k, o)| (k, Seen::Object(Box::new(o)))).collect();
        Ok(())
    }

    async fn next(&mut self) -> Option<watcher::Result<watcher::Event<DynamicObject>>> {
        loop {
            if let Some(ev) = self.out.pop_front() {
                return Some(Ok(ev));
            }
            if let Some(w) = self.watch.as_mut() {
                match w.next().await {
                    None => return None,
                    Some(Ok(ev)) => {
                        self.track(&ev);
                        return Some(Ok(ev));
                    }
                    Some(Err(e)) if self.listed && forbidden(&e) => {
                        tracing::warn!(kind = %self.what, every_s = self.every.as_secs(), error = %e,
                            "watching this kind is forbidden (RBAC grants list, not watch): listing it periodically instead; grant watch to see changes at once");
                        self.watch = None;
                    }
                    Some(Err(e)) => return Some(Err(e)),
                }
                continue;
            }
            tokio::time::sleep(self.every).await;
            if let Err(e) = self.poll().await {
                return Some(Err(watcher::Error::InitialListFailed(e)));
            }
        }
    }
}

/// `watcher(api, cfg)` with the default backoff, falling back to listing every `every` when the
/// watch is forbidden after a successful first list.
pub fn watch_or_poll(
    api: Api<DynamicObject>,
    resource: &ApiResource,
    cfg: watcher::Config,
    every: Duration,
    what: String,
) -> Events {
    let params = ListParams {
        label_selector: cfg.label_selector.clone(),
        field_selector: cfg.field_selector.clone(),
        limit: cfg.page_size,
        ..ListParams::default()
    };
    let watch = watcher(api.clone(), cfg).default_backoff().boxed();
    let state = State {
        watch: Some(watch),
        api,
        resource: resource.clone(),
        params,
        every,
        what,
        seen: HashMap::new(),
        listed: false,
        out: VecDeque::new(),
    };
    futures_util::stream::unfold(state, |mut s| async move { s.next().await.map(|ev| (ev, s)) }).boxed()
}
