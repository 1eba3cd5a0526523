//! The JSON document variables are evaluated against: `request.*`, `serviceAccountName`,
//! `images`, `element`, context entries and caller-supplied values. Scopes (foreach elements,
//! rule context entries) are set and restored explicitly.

use crate::ports::Request;
use serde_json::{Map, Value};
use std::borrow::Cow;
use verno_jmespath::{Env, Expression, RuntimeError};

/// What [`Context::query_list`] found (shared by the policies of the request).
#[derive(Clone)]
pub enum ForeachList<'e> {
    /// The list's elements, borrowed from the request's object where they are there.
    Items(std::rc::Rc<Vec<Cow<'e, Value>>>),
    /// The query's result, shared with the other policies of the request.
    Shared(std::rc::Rc<Value>),
}

impl<'e> ForeachList<'e> {
    /// The elements to iterate: a list's, none for null, the value itself otherwise.
    pub fn elements(&self) -> Vec<ForeachElement<'_, 'e>> {
        match self {
            ForeachList::Items(l) => l
                .iter()
                .map(|c| match c {
                    Cow::Borrowed(b) => ForeachElement::Lent(b),
                    Cow::Owned(o) => ForeachElement::Held(o),
                })
                .collect(),
            ForeachList::Shared(v) => match &**v {
                Value::Array(a) => a.iter().map(ForeachElement::Held).collect(),
                Value::Null => Vec::new(),
                other => vec![ForeachElement::Held(other)],
            },
        }
    }
}

/// One element of a [`ForeachList`]: one that lives as long as the context is lent to it as
/// `element` ([`Context::enter_element`]), another is copied in.
#[derive(Clone, Copy)]
pub enum ForeachElement<'l, 'e> {
    Lent(&'e Value),
    Held(&'l Value),
}

impl<'l, 'e: 'l> ForeachElement<'l, 'e> {
    pub fn value(self) -> &'l Value {
        match self {
            ForeachElement::Lent(v) => v,
            ForeachElement::Held(v) => v,
        }
    }
}

pub struct Context<'e> {
    /// In a cell so that an expression needing the whole of `request` can take the lent object
    /// in (see `lent`) while the context is shared.
    root: std::cell::RefCell<Value>,
    /// The request's object, lent by the caller instead of copied into `request.object` (the
    /// largest part of the context, copied and dropped per request otherwise): while it is
    /// lent, `request` has no `object` entry; expressions reading only through
    /// `request.object` are evaluated against it, those that never read it against the root,
    /// and anything else (or any change to `request`) first copies it in
    /// ([`Context::take_in`]).
    lent: std::cell::Cell<Option<&'e Value>>,
    /// The foreach element, lent the same way (see [`Context::enter_element`]): while it is,
    /// the root has no `element` entry; expressions reading the root only through `element`
    /// are evaluated against it, and anything else reading `element` (or setting it) first
    /// copies it in ([`Context::take_in_element`]).
    lent_element: std::cell::Cell<Option<&'e Value>>,
    /// The foreach element's index, held aside the same way (see [`Context::enter_element`]):
    /// while it is, the root has no `elementIndex` entry, and an expression that may read it
    /// (any but those reading a single other root field) first puts it in
    /// ([`Context::take_in_index`]). Entering and leaving an element then changes no map.
    lent_index: std::cell::Cell<Option<usize>>,
    /// Where `request`'s fields come from when they are filled in as expressions read them
    /// (see [`Context::lend_request`]); `filled` has a bit per field of [`REQUEST_FIELDS`]
    /// already in `request`.
    pending: Option<RequestFields<'e>>,
    filled: std::cell::Cell<u16>,
    delete: bool,
    env: &'e dyn Env,
    /// The request's CEL variables, converted once and reused by every CEL rule until
    /// `request` changes.
    cel: std::cell::RefCell<Option<verno_cel::Vars>>,
    /// Whose `namespaceObject` those variables carry (the policy being evaluated decides).
    ns_view: crate::ports::NamespaceView,
    /// The namespace the policy being evaluated is held to (see `crate::confine`): the cached
    /// CEL variables carry a host held to it, so they are rebuilt when it changes.
    confined: Option<Box<str>>,
    /// Whether the `images` variable is kept (no policy of the set reads it: not worked out).
    images: bool,
    /// Whether a passing validation rule's message is left unwritten: nobody reads it (a
    /// webhook call that keeps no responses and reports nothing).
    quiet_passes: bool,
    /// The request's Namespace as the caller already holds it (a cluster's namespace watch):
    /// CEL's `namespaceObject` without asking the data port.
    live_namespace: Option<std::sync::Arc<Value>>,
    /// Bumped whenever the `request` entry changes (a mutation patched the object, a scope
    /// set or restored it).
    request_version: u64,
    /// Results of queries that read only `request`, by source, for `shared_version` of it:
    /// foreach lists (`request.object.spec.[…][]`, which many policies iterate) and scalar
    /// results (`request.operation || 'BACKGROUND'`, many policies' precondition); see
    /// [`Context::query`] and [`Context::query_list`].
    shared: std::cell::RefCell<Vec<(String, ForeachList<'e>)>>,
    shared_version: std::cell::Cell<u64>,
    /// Whether a context entry ever failed to load in this context (then the root's
    /// [`FAILED_KEY`] entry is looked at before each query; see [`Context::fail_entry`]).
    failures: bool,
}

/// Where the errors of context entries that failed to load wait, by entry name, for an
/// expression that reads them; a name no JMESPath or template can reach.
const FAILED_KEY: &str = "@failed";

/// The fields of `request` filled in as they are read ([`Context::lend_request`]), in the
/// order of [`RequestFields::value`].
const REQUEST_FIELDS: [&str; 9] =
    ["operation", "oldObject", "namespace", "name", "kind", "userInfo", "roles", "clusterRoles", "subResource"];

/// What the fields of the context's `request` are made from (see [`Context::lend_request`]).
#[derive(Clone, Copy)]
pub(crate) struct RequestFields<'e> {
    pub operation: verno_api::Operation,
    pub old_object: Option<&'e Value>,
    /// The object the request is about (`request.namespace` and `request.name` are its).
    pub subject: &'e Value,
    /// group, version, kind
    pub kind: (&'e str, &'e str, &'e str),
    pub asker: crate::ports::Asker<'e>,
    pub subresource: &'e str,
}

impl RequestFields<'_> {
    fn bit(field: &str) -> u16 {
        REQUEST_FIELDS.iter().position(|f| *f == field).map_or(0, |i| 1 << i)
    }

    /// The value of [`REQUEST_FIELDS`]' `i`th; `None`: `request` has no such entry.
    fn value(&self, i: usize) -> Option<Value> {
        let strings =
            |v: Option<&Vec<String>>| Value::Array(v.into_iter().flatten().map(|s| Value::String(s.clone())).collect());
        Some(match i {
            0 => Value::String(self.operation.as_str().into()),
            1 => self.old_object.cloned().unwrap_or(Value::Null),
            2 => Value::String(crate::ports::str_at(self.subject, "/metadata/namespace").into()),
            3 => Value::String(crate::ports::str_at(self.subject, "/metadata/name").into()),
            4 => {
                let (group, version, kind) = self.kind;
                let mut m = Map::new();
                m.insert("group".into(), Value::String(group.into()));
                m.insert("version".into(), Value::String(version.into()));
                m.insert("kind".into(), Value::String(kind.into()));
                Value::Object(m)
            }
            5 => self.asker.info.to_value(),
            6 => strings(self.asker.user.map(|u| &u.roles)),
            7 => strings(self.asker.user.map(|u| &u.cluster_roles)),
            8 if !self.subresource.is_empty() => Value::String(self.subresource.into()),
            _ => return None,
        })
    }
}

/// How many shared results a context keeps (oldest dropped first): each holds at most a copy
/// of part of the request.
const MAX_SHARED: usize = 16;

/// Saved top-level entries, restored by [`Context::restore`].
#[must_use]
#[derive(Default)]
pub struct Saved(smallvec::SmallVec<[(Cow<'static, str>, Option<Value>); 2]>);

impl Saved {
    /// Adds what `other` must restore; restoring undoes both, latest first.
    pub fn absorb(&mut self, other: Saved) {
        self.0.extend(other.0);
    }
}

impl<'e> Context<'e> {
    pub fn new(root: Map<String, Value>, delete: bool, env: &'e dyn Env) -> Self {
        Context {
            root: std::cell::RefCell::new(Value::Object(root)),
            lent: std::cell::Cell::new(None),
            lent_element: std::cell::Cell::new(None),
            lent_index: std::cell::Cell::new(None),
            pending: None,
            filled: std::cell::Cell::new(0),
            delete,
            env,
            cel: std::cell::RefCell::new(None),
            ns_view: crate::ports::NamespaceView::default(),
            confined: None,
            images: true,
            quiet_passes: false,
            live_namespace: None,
            request_version: 0,
            shared: std::cell::RefCell::new(Vec::new()),
            shared_version: std::cell::Cell::new(0),
            failures: false,
        }
    }

    /// Sets a loaded context entry (see [`Context::set_path`]); an earlier failure to load an
    /// entry of that name no longer stands.
    pub fn set_entry(&mut self, name: &str, v: Value) -> Saved {
        let mut saved = Saved::default();
        if self.failures {
            let failed = self.root.get_mut().get(FAILED_KEY).and_then(Value::as_object).cloned();
            if let Some(mut failed) = failed
                && failed.remove(name).is_some()
            {
                saved.absorb(self.set(FAILED_KEY, Value::Object(failed)));
            }
        }
        saved.absorb(self.set_path(name, v));
        saved
    }

    /// Records that the context entry `name` could not be loaded. Like Kyverno's deferred
    /// loaders, the error is raised only by an expression that reads the entry
    /// ([`Context::query`]): an entry nothing reads refuses nothing.
    pub fn fail_entry(&mut self, name: &str, error: String) -> Saved {
        self.failures = true;
        let mut failed = self.root.get_mut().get(FAILED_KEY).and_then(Value::as_object).cloned().unwrap_or_default();
        failed.insert(name.to_string(), Value::String(error));
        self.set(FAILED_KEY, Value::Object(failed))
    }

    /// The load error of a failed context entry that the expression `source` reads, found the
    /// way Kyverno finds which deferred entry a query needs: the name at an ASCII word
    /// boundary, not after a `.` (so `cm` is read by `cm.data.x` and `to_string(cm)`, not by
    /// `request.object.cm`).
    fn failed_read(&self, source: &str) -> Option<RuntimeError> {
        if !self.failures {
            return None;
        }
        let root = self.root.borrow();
        let failed = root.get(FAILED_KEY)?.as_object()?;
        failed
            .iter()
            .find(|(name, _)| names(source, name))
            .map(|(_, e)| RuntimeError::Other(e.as_str().unwrap_or_default().to_string()))
    }

    pub fn set_serves_images(&mut self, images: bool) {
        self.images = images;
    }

    /// Leaves passing validation rules' messages empty (see [`Context::quiet_passes`]).
    pub fn set_quiet_passes(&mut self, quiet: bool) {
        self.quiet_passes = quiet;
    }

    /// Whether passing validation rules' messages are left empty: nobody reads them.
    pub fn quiet_passes(&self) -> bool {
        self.quiet_passes
    }

    /// Whether the `images` variable is served (see [`crate::context::build_context_with`]).
    pub fn serves_images(&self) -> bool {
        self.images
    }

    pub fn is_delete(&self) -> bool {
        self.delete
    }

    pub fn env(&self) -> &'e dyn Env {
        self.env
    }

    /// The whole data (the lent object and element copied in first). Not to be held across a
    /// query.
    pub fn root(&self) -> std::cell::Ref<'_, Value> {
        self.fill(None);
        self.take_in();
        self.take_in_element();
        self.take_in_index();
        self.root.borrow()
    }

    /// `f` on the data as it is: `request` without its `object` while that is lent, no
    /// `element` while that is.
    pub fn read<R>(&self, f: impl FnOnce(&Value) -> R) -> R {
        self.fill(None);
        f(&self.root.borrow())
    }

    pub fn has_key(&self, k: &str) -> bool {
        self.root.borrow().get(k).is_some()
    }

    /// Lends the request's object: `request.object` reads it where it is (see `lent`); an
    /// `object` entry `request` had is dropped.
    pub fn lend_object(&mut self, object: &'e Value) {
        if let Some(r) = self.root.get_mut().get_mut("request").and_then(Value::as_object_mut) {
            r.remove("object");
        }
        self.lent.set(Some(object));
    }

    /// Lends what `request`'s fields are made from: the root's `request` (a map, empty but
    /// for what the caller put there) gets each field when an expression first reads it, all
    /// of them before anything reads or changes `request` as a whole. Building every field of
    /// every request (a map entry, a key and a value each, dropped again) showed in profiles,
    /// and most requests' policies read one or two of them.
    pub(crate) fn lend_request(&mut self, fields: RequestFields<'e>) {
        self.pending = Some(fields);
        self.filled.set(0);
    }

    /// Puts into `request` those of `fields` (all with `None`) that are lent and not there yet.
    fn fill(&self, fields: Option<&[String]>) {
        let Some(pending) = &self.pending else { return };
        let want = match fields {
            None => u16::MAX,
            Some(fields) => fields.iter().fold(0, |m, f| m | RequestFields::bit(f)),
        };
        let missing = want & !self.filled.get();
        if missing == 0 {
            return;
        }
        self.filled.set(self.filled.get() | missing);
        let mut root = self.root.borrow_mut();
        let Some(request) = root.get_mut("request").and_then(Value::as_object_mut) else { return };
        for (i, name) in REQUEST_FIELDS.iter().enumerate() {
            if missing & (1 << i) != 0
                && let Some(v) = pending.value(i)
            {
                request.insert((*name).to_string(), v);
            }
        }
    }

    /// Copies the lent object into `request.object` (once): before `request` changes or is
    /// read as a whole.
    fn take_in(&self) {
        let Some(object) = self.lent.take() else { return };
        let mut root = self.root.borrow_mut();
        if let Some(r) = root.get_mut("request").and_then(Value::as_object_mut) {
            r.insert("object".into(), object.clone());
        }
    }

    /// Copies the lent element into the root's `element` (once): before it is set or read as
    /// part of something else.
    fn take_in_element(&self) {
        let Some(element) = self.lent_element.take() else { return };
        if let Some(m) = self.root.borrow_mut().as_object_mut() {
            m.insert("element".into(), element.clone());
        }
    }

    /// Puts the held foreach index into the root's `elementIndex` (once): before it is set or
    /// may be read.
    fn take_in_index(&self) {
        let Some(index) = self.lent_index.take() else { return };
        if let Some(m) = self.root.borrow_mut().as_object_mut() {
            m.insert("elementIndex".into(), Value::from(index as i64));
        }
    }

    /// Evaluates `e` against the context. A query that reads only `request` and gives a
    /// scalar is evaluated once per version of `request` and shared.
    pub fn query(&self, e: &Expression) -> Result<Value, RuntimeError> {
        if let Some(err) = self.failed_read(e.source()) {
            return Err(err);
        }
        if !Self::shareable(e) {
            return self.search(e);
        }
        if let Some(ForeachList::Shared(v)) = self.shared_result(e.source()) {
            return Ok(Value::clone(&v));
        }
        let v = self.search(e)?;
        if !matches!(v, Value::Array(_) | Value::Object(_)) {
            self.keep_shared(e.source(), ForeachList::Shared(std::rc::Rc::new(v.clone())));
        }
        Ok(v)
    }

    fn search(&self, e: &Expression) -> Result<Value, RuntimeError> {
        use verno_jmespath::ObjectReads;
        // What is lent, how `e` reads it, and what copies it in.
        let loans: [(_, _, fn(&Self)); 2] = [
            (self.lent.get(), e.request_object(), Self::take_in),
            (self.lent_element.get(), e.element(), Self::take_in_element),
        ];
        for (lent, reads, take_in) in loans {
            let Some(lent) = lent else { continue };
            match reads {
                ObjectReads::Only(at) => return at.search(lent, self.env).map(std::borrow::Cow::into_owned),
                ObjectReads::No => {}
                ObjectReads::Whole => take_in(self),
            }
        }
        // Only an expression reading a single root field other than `elementIndex` (`request`,
        // `element`, ...) is sure not to read it.
        if self.lent_index.get().is_some() && e.sole_root_field().is_none_or(|f| f == "elementIndex") {
            self.take_in_index();
        }
        self.fill(e.request_fields());
        let root = self.root.borrow();
        e.search(&root, self.env).map(std::borrow::Cow::into_owned)
    }

    /// A foreach list. Elements the expression picks from the lent object (`request.object.
    /// spec.[initContainers, containers][]`) are borrowed there rather than copied. An
    /// expression that reads only `request` gives the same list until `request` changes, so
    /// the policies of a request that iterate the same list evaluate it once.
    pub fn query_list(&self, e: &Expression) -> Result<ForeachList<'e>, RuntimeError> {
        if let Some(err) = self.failed_read(e.source()) {
            return Err(err);
        }
        let shareable = Self::shareable(e);
        if shareable && let Some(l) = self.shared_result(e.source()) {
            return Ok(l);
        }
        let l = match (self.lent.get(), e.request_object()) {
            (Some(object), verno_jmespath::ObjectReads::Only(at)) => {
                ForeachList::Items(std::rc::Rc::new(match at.search_items(object, self.env)? {
                    verno_jmespath::Items::List(l) => l,
                    verno_jmespath::Items::Other(v) if v.is_null() => Vec::new(),
                    verno_jmespath::Items::Other(v) => vec![v],
                }))
            }
            _ => ForeachList::Shared(std::rc::Rc::new(self.search(e)?)),
        };
        if shareable {
            self.keep_shared(e.source(), l.clone());
        }
        Ok(l)
    }

    fn shareable(e: &Expression) -> bool {
        e.sole_root_field() == Some("request")
    }

    fn shared_result(&self, src: &str) -> Option<ForeachList<'e>> {
        if self.shared_version.get() != self.request_version {
            return None;
        }
        self.shared.borrow().iter().find(|(s, _)| s == src).map(|(_, v)| v.clone())
    }

    fn keep_shared(&self, src: &str, v: ForeachList<'e>) {
        let mut shared = self.shared.borrow_mut();
        if self.shared_version.get() != self.request_version {
            shared.clear();
            self.shared_version.set(self.request_version);
        }
        if shared.len() >= MAX_SHARED {
            shared.remove(0);
        }
        shared.push((src.to_string(), v));
    }

    /// Sets a top-level key, returning a handle that restores the previous value.
    pub fn set(&mut self, key: &str, v: Value) -> Saved {
        let mut saved = Saved::default();
        self.put(&mut saved, Cow::Owned(key.to_string()), v);
        saved
    }

    /// Sets a top-level entry, noting in `saved` what restores it. An entry that exists is
    /// replaced in place (its key is not allocated again).
    fn put(&mut self, saved: &mut Saved, key: Cow<'static, str>, v: Value) {
        self.touch(&key);
        let Some(m) = self.root.get_mut().as_object_mut() else { return };
        let old = match m.get_mut(&*key) {
            Some(slot) => Some(std::mem::replace(slot, v)),
            None => {
                m.insert(key.to_string(), v);
                None
            }
        };
        saved.0.push((key, old));
    }

    /// Sets a dotted path (`request.operation`, `a.b.c`), creating objects on the way.
    /// Returns what must be restored (the whole top-level entry it touched).
    pub fn set_path(&mut self, path: &str, v: Value) -> Saved {
        let segs = split_dotted(path);
        let Some(first) = segs.first().cloned() else { return Saved::default() };
        self.touch(&first);
        let root = self.root.get_mut();
        let old = root.get(&first).cloned();
        if let Some(m) = root.as_object_mut() {
            let slot = m.entry(first.clone()).or_insert(Value::Null);
            set_in(slot, segs.get(1..).unwrap_or_default(), v);
        }
        Saved(smallvec::smallvec![(Cow::Owned(first), old)])
    }

    /// Sets a foreach element: `element`, `elementIndex` and, when `numbered`, their
    /// `element<N>` / `elementIndex<N>` forms for the nesting level. An element that lives as
    /// long as the context is lent rather than copied (its `element<N>` form is copied).
    pub fn enter_element(
        &mut self,
        element: ForeachElement<'_, 'e>,
        index: usize,
        nesting: usize,
        numbered: bool,
    ) -> Saved {
        let mut saved = Saved::default();
        match element {
            ForeachElement::Lent(v) => {
                // An outer element still lent is copied in, to be saved and restored as an entry.
                self.touch("element");
                let old = self.root.get_mut().as_object_mut().and_then(|m| m.remove("element"));
                saved.0.push((Cow::Borrowed("element"), old));
                self.lent_element.set(Some(v));
            }
            ForeachElement::Held(v) => self.put(&mut saved, Cow::Borrowed("element"), v.clone()),
        }
        // The index is held aside likewise (an outer one still held is put in first).
        self.touch("elementIndex");
        let old = self.root.get_mut().as_object_mut().and_then(|m| m.remove("elementIndex"));
        saved.0.push((Cow::Borrowed("elementIndex"), old));
        self.lent_index.set(Some(index));
        if !numbered {
            return saved;
        }
        const ELEMENT: [&str; 4] = ["element0", "element1", "element2", "element3"];
        const INDEX: [&str; 4] = ["elementIndex0", "elementIndex1", "elementIndex2", "elementIndex3"];
        let (e, i): (Cow<'static, str>, Cow<'static, str>) = match (ELEMENT.get(nesting), INDEX.get(nesting)) {
            (Some(e), Some(i)) => (Cow::Borrowed(*e), Cow::Borrowed(*i)),
            _ => (Cow::Owned(format!("element{nesting}")), Cow::Owned(format!("elementIndex{nesting}"))),
        };
        self.put(&mut saved, e, element.value().clone());
        self.put(&mut saved, i, Value::from(index as i64));
        saved
    }

    /// [`Context::enter_element`] for an element that is copied in.
    pub fn set_element(&mut self, element: &Value, index: usize, nesting: usize, numbered: bool) -> Saved {
        self.enter_element(ForeachElement::Held(element), index, nesting, numbered)
    }

    /// Makes the CEL variables carry `namespaceObject` as policies of `view` see it.
    pub fn set_namespace_view(&mut self, view: crate::ports::NamespaceView) {
        if self.ns_view != view {
            self.ns_view = view;
            *self.cel.get_mut() = None;
        }
    }

    /// Which namespace the data the next CEL variables are built from is held to.
    pub fn set_confinement(&mut self, namespace: Option<&str>) {
        if self.confined.as_deref() != namespace {
            self.confined = namespace.map(Into::into);
            *self.cel.get_mut() = None;
        }
    }

    pub fn namespace_view(&self) -> crate::ports::NamespaceView {
        self.ns_view
    }

    /// The request's Namespace, held by the caller (see [`crate::LiveNamespaces`]).
    pub fn set_live_namespace(&mut self, namespace: Option<std::sync::Arc<Value>>) {
        self.live_namespace = namespace;
        *self.cel.get_mut() = None;
    }

    pub fn live_namespace(&self) -> Option<&Value> {
        self.live_namespace.as_deref()
    }

    /// The cached CEL variables, or those `build` makes (then cached) from the data and the
    /// lent object (`None`: `request.object` is in the data).
    pub fn cel_vars(&self, build: impl FnOnce(&Value, Option<&Value>) -> verno_cel::Vars) -> verno_cel::Vars {
        if let Some(v) = self.cel.borrow().as_ref() {
            return v.clone();
        }
        self.fill(None);
        let v = build(&self.root.borrow(), self.lent.get());
        *self.cel.borrow_mut() = Some(v.clone());
        v
    }

    fn touch(&mut self, key: &str) {
        if key == "element" {
            self.take_in_element();
        }
        if key == "elementIndex" {
            self.take_in_index();
        }
        if key == "request" {
            // What is saved for restoring, and what is changed, is the whole of it.
            self.fill(None);
            self.take_in();
            self.request_version += 1;
        }
        if key == "request" || key == crate::context::EXCEPTIONS_KEY {
            *self.cel.get_mut() = None;
        }
    }

    pub fn restore(&mut self, saved: Saved) {
        // Most rules change nothing (a policy and a rule restore once each).
        if saved.0.is_empty() {
            return;
        }
        if saved.0.iter().any(|(k, _)| k == "request") {
            *self.cel.get_mut() = None;
            self.request_version += 1;
        }
        // What was saved had no element lent (entering one copies an outer one in first).
        if saved.0.iter().any(|(k, _)| k == "element") {
            self.lent_element.set(None);
        }
        if saved.0.iter().any(|(k, _)| k == "elementIndex") {
            self.lent_index.set(None);
        }
        if let Some(m) = self.root.get_mut().as_object_mut() {
            for (k, old) in saved.0.into_iter().rev() {
                match (old, m.get_mut(&*k)) {
                    (Some(v), Some(slot)) => *slot = v,
                    (Some(v), None) => {
                        m.insert(k.into_owned(), v);
                    }
                    (None, _) => {
                        m.remove(&*k);
                    }
                }
            }
        }
    }
}

fn set_in(cur: &mut Value, rest: &[String], v: Value) {
    let Some((head, tail)) = rest.split_first() else {
        *cur = v;
        return;
    };
    if !cur.is_object() {
        *cur = Value::Object(Map::new());
    }
    if let Some(obj) = cur.as_object_mut() {
        let next = obj.entry(head.clone()).or_insert(Value::Null);
        set_in(next, tail, v);
    }
}

/// Splits `a.b."c.d"` style keys (Kyverno allows quoted segments).
/// Whether `source` names `name` as Kyverno's deferred loaders match a query: the name preceded
/// by the start, whitespace or a character other than `.`, an ASCII letter or digit, and
/// followed by the end or a character that is not a word character. (Hand-written: the one
/// pattern is simple, and the `regex` crate is not a dependency of the engine.)
fn names(source: &str, name: &str) -> bool {
    let word = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    if name.is_empty() {
        return false;
    }
    let bytes = source.as_bytes();
    source.match_indices(name).any(|(at, _)| {
        let before = at.checked_sub(1).and_then(|i| bytes.get(i).copied());
        let after = bytes.get(at + name.len()).copied();
        let ends_in_word = name.as_bytes().last().copied().is_some_and(word);
        before.is_none_or(|c| !(c == b'.' || c.is_ascii_alphanumeric()))
            && if ends_in_word { after.is_none_or(|c| !word(c)) } else { after.is_some_and(word) }
    })
}

pub fn split_dotted(path: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    for c in path.chars() {
        match c {
            '"' => quoted = !quoted,
            '.' if !quoted => out.push(std::mem::take(&mut cur)),
            _ => cur.push(c),
        }
    }
    out.push(cur);
    out
}

/// Where a rule's partial CEL exceptions wait for the CEL variables (`exceptions`); a name no
/// JMESPath or template can reach.
pub(crate) const EXCEPTIONS_KEY: &str = "@exceptions";

/// Builds the variable context for a request (shared by all policies of one evaluation).
#[cfg(test)]
pub fn build_context<'e>(req: &Request<'e>, env: &'e dyn Env) -> Context<'e> {
    build_context_with(req, env, true)
}

/// [`build_context`]; without `images` the `images` variable (the request's images, parsed) is
/// not worked out — for a set no policy of which reads it.
pub fn build_context_with<'e>(req: &Request<'e>, env: &'e dyn Env, images: bool) -> Context<'e> {
    let subject = req.subject();
    let (group, version, kind) = req.group_version_kind();
    let username = req.asker.info.username();
    let (sa_ns, sa_name) = match username.strip_prefix("system:serviceaccount:").and_then(|r| r.split_once(':')) {
        Some((ns, n)) => (ns.to_string(), n.to_string()),
        None => (String::new(), String::new()),
    };
    // `request`'s fields are filled in as expressions read them (`Context::lend_request`).
    let mut root = Map::new();
    root.insert("request".into(), Value::Object(Map::new()));
    root.insert("serviceAccountName".into(), Value::String(sa_name));
    root.insert("serviceAccountNamespace".into(), Value::String(sa_ns));
    if images {
        root.insert("images".into(), crate::images::extract(subject));
    }
    let mut ctx = Context::new(root, req.is_delete(), env);
    ctx.lend_request(crate::context::RequestFields {
        operation: req.operation,
        old_object: req.old_object,
        subject,
        kind: (group, version, kind),
        asker: req.asker,
        subresource: req.subresource,
    });
    ctx.lend_object(req.object);
    ctx.set_serves_images(images);
    for (k, v) in req.variables {
        // Values are permanent for this request: nothing to restore.
        let _kept: Saved = ctx.set_path(k, v.clone());
    }
    ctx
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn expr(s: &str) -> Expression {
        Expression::compile(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    /// A foreach list's elements as one list.
    fn listed(l: Result<ForeachList<'_>, RuntimeError>) -> Result<Value, RuntimeError> {
        l.map(|l| Value::Array(l.elements().into_iter().map(|e| e.value().clone()).collect()))
    }

    #[test]
    fn shared_results_follow_the_request() {
        let root = json!({"request": {"operation": "CREATE", "object": {"spec": {"containers": [{"name": "a"}]}}}});
        let mut ctx = Context::new(root.as_object().cloned().unwrap_or_default(), false, &verno_jmespath::NoEnv);
        let op = expr("request.operation || 'BACKGROUND'");
        let list = expr("request.object.spec.containers[].name");
        assert_eq!(ctx.query(&op), Ok(json!("CREATE")));
        assert_eq!(listed(ctx.query_list(&list)), Ok(json!(["a"])));
        // A patch of the object, a scope that sets `request` and its restoring: each is seen.
        let _kept = ctx.set_path("request.object.spec.containers", json!([{"name": "b"}]));
        assert_eq!(listed(ctx.query_list(&list)), Ok(json!(["b"])));
        let saved = ctx.set_path("request.operation", json!("UPDATE"));
        assert_eq!(ctx.query(&op), Ok(json!("UPDATE")));
        ctx.restore(saved);
        assert_eq!(ctx.query(&op), Ok(json!("CREATE")));
        // An expression that also reads the element is never shared.
        let mixed = expr("request.operation == element");
        let saved = ctx.set("element", json!("CREATE"));
        assert_eq!(ctx.query(&mixed), Ok(json!(true)));
        ctx.restore(saved);
        let _e = ctx.set("element", json!("x"));
        assert_eq!(ctx.query(&mixed), Ok(json!(false)));
    }

    /// A context that is lent the request's object answers every kind of expression as one
    /// that holds a copy: reads only through `request.object`, reads that never touch it,
    /// reads of `request` as a whole or mixed with other entries; and a change to `request`
    /// (a mutation's patched object, a scope's restore) is seen as with a copy.
    #[test]
    fn a_lent_object_is_read_as_a_copied_one() {
        let object = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "a"}, {"name": "b"}]}});
        let root = json!({"request": {"operation": "CREATE", "name": "p"}, "element": {"name": "a"}});
        let mut copied_root = root.clone();
        if let Some(r) = copied_root.get_mut("request").and_then(Value::as_object_mut) {
            r.insert("object".into(), object.clone());
        }
        let new = |r: &Value| Context::new(r.as_object().cloned().unwrap_or_default(), false, &verno_jmespath::NoEnv);
        let copied = new(&copied_root);
        let lending = || {
            let mut c = new(&root);
            c.lend_object(&object);
            c
        };
        let lent = lending();
        let sources = [
            "request.object.spec.containers[].name",
            "request.object.metadata.name",
            "request.operation || 'BACKGROUND'",
            "element.name",
            "request.object.spec.containers[?name == element.name] | length(@)",
            "request.object.metadata.name == request.name",
            "keys(request)",
            "request.object.spec.containers[0].request.object",
        ];
        for src in sources {
            assert_eq!(lent.query(&expr(src)), copied.query(&expr(src)), "{src}");
        }
        // Foreach lists: the elements picked from the lent object are borrowed there (`lent`
        // has taken its object in by now: `keys(request)` reads `request` whole).
        let lent = lending();
        let borrowed = |src: &str| match lent.query_list(&expr(src)) {
            Ok(ForeachList::Items(l)) => l.iter().all(|c| matches!(c, Cow::Borrowed(_))),
            _ => false,
        };
        assert!(borrowed("request.object.spec.[initContainers, containers][]"));
        assert!(borrowed("request.object.spec.containers"));
        assert!(!borrowed("request.object.spec.containers[].name"));
        assert!(!borrowed("[request.object.spec.containers, element][]"));
        let lent = lending();
        let lists = [
            "request.object.spec.[ephemeralContainers, initContainers, containers][]",
            "request.object.spec.containers",
            "request.object.spec.containers[].name",
            "request.object.metadata",
            "request.object.spec.nothing",
            "request.object.spec.containers[?name == element.name]",
        ];
        for src in lists {
            assert_eq!(listed(lent.query_list(&expr(src))), listed(copied.query_list(&expr(src))), "{src}");
        }
        let mut lent = lending();
        assert_eq!(lent.query(&expr("keys(request)")), Ok(json!(["name", "object", "operation"])));
        // A patched object replaces the lent one; restoring a scope that set `request` keeps it.
        let _kept = lent.set_path("request.object.metadata.name", json!("q"));
        assert_eq!(lent.query(&expr("request.object.metadata.name")), Ok(json!("q")));
        assert_eq!(lent.query(&expr("request.object.spec.containers[].name")), Ok(json!(["a", "b"])));
        let saved = lent.set_path("request.operation", json!("UPDATE"));
        lent.restore(saved);
        assert_eq!(lent.query(&expr("request.object.metadata.name")), Ok(json!("q")));
        assert_eq!(lent.query(&expr("request.operation")), Ok(json!("CREATE")));
        // Restoring a change made while the object was still lent gives the object back.
        let mut lent = lending();
        let saved = lent.set_path("request.operation", json!("UPDATE"));
        lent.restore(saved);
        assert_eq!(lent.query(&expr("request.object.metadata.name")), Ok(json!("p")));
        assert_eq!(lent.root().pointer("/request/object/metadata/name"), Some(&json!("p")));
    }

    /// A context lent a foreach element answers as one it was copied into, through nesting,
    /// a scope that sets `element`, and restoring.
    #[test]
    fn a_lent_element_is_read_as_a_copied_one() {
        let outer = json!({"name": "a", "ports": [{"p": 1}, {"p": 2}], "sc": {"drop": ["ALL"]}});
        let inner = json!({"p": 2});
        let root = json!({"request": {"operation": "CREATE", "object": {"metadata": {"name": "a"}}}});
        let new = || Context::new(root.as_object().cloned().unwrap_or_default(), false, &verno_jmespath::NoEnv);
        let sources = [
            "element.sc.drop[] || `[]`",
            "element.name",
            "element",
            "elementIndex",
            "element.name == request.object.metadata.name",
            "keys(@)",
            "request.operation",
            "element.ports[?p == `2`] | length(@)",
        ];
        let (mut lent, mut copied) = (new(), new());
        let answers = |lent: &Context, copied: &Context| {
            for src in sources {
                assert_eq!(lent.query(&expr(src)), copied.query(&expr(src)), "{src}");
            }
        };
        let saved_lent = lent.enter_element(ForeachElement::Lent(&outer), 0, 0, false);
        let saved_copied = copied.set_element(&outer, 0, 0, false);
        assert!(!lent.read(|r| r.get("element").is_some()), "lent, not copied");
        assert_eq!(lent.query(&expr("element.name")), Ok(json!("a")));
        assert!(!lent.read(|r| r.get("element").is_some()), "an element-only read copies nothing");
        assert!(!lent.read(|r| r.get("elementIndex").is_some()), "nor puts the index in");
        assert_eq!(lent.query(&expr("request.operation")), Ok(json!("CREATE")));
        assert!(!lent.read(|r| r.get("elementIndex").is_some()), "nor does a read of `request` alone");
        // A nested element, then the outer one back.
        let lent_inner = lent.enter_element(ForeachElement::Lent(&inner), 1, 1, true);
        let copied_inner = copied.set_element(&inner, 1, 1, true);
        assert_eq!(lent.query(&expr("element.p")), Ok(json!(2)));
        assert_eq!(lent.query(&expr("element1.p")), Ok(json!(2)));
        lent.restore(lent_inner);
        copied.restore(copied_inner);
        assert_eq!(lent.query(&expr("element.name")), Ok(json!("a")));
        answers(&lent, &copied);
        let lent_inner = lent.enter_element(ForeachElement::Lent(&inner), 1, 1, false);
        let copied_inner = copied.set_element(&inner, 1, 1, false);
        answers(&lent, &copied);
        lent.restore(lent_inner);
        copied.restore(copied_inner);
        answers(&lent, &copied);
        // A scope that sets `element` itself, restored.
        let mut lent2 = new();
        let outer_saved = lent2.enter_element(ForeachElement::Lent(&outer), 0, 0, false);
        let scope = lent2.set_path("element.name", json!("z"));
        assert_eq!(lent2.query(&expr("element.name")), Ok(json!("z")));
        assert_eq!(lent2.query(&expr("element.sc.drop[0]")), Ok(json!("ALL")));
        lent2.restore(scope);
        assert_eq!(lent2.query(&expr("element.name")), Ok(json!("a")));
        lent2.restore(outer_saved);
        assert_eq!(lent2.query(&expr("element")), copied_after_restore());
        // Leaving the element leaves nothing behind.
        lent.restore(saved_lent);
        copied.restore(saved_copied);
        answers(&lent, &copied);
        assert_eq!(*lent.root(), *copied.root());
        let held = lent.enter_element(ForeachElement::Held(&inner), 0, 0, false);
        assert!(lent.read(|r| r.get("element") == Some(&inner)), "a held element is copied in");
        lent.restore(held);
        assert_eq!(*lent.root(), *copied.root());
    }

    /// The foreach index, held aside while no expression reads it, answers as one put in the
    /// root: read first inside a nested element, after leaving it, and after leaving both.
    #[test]
    fn a_held_index_is_read_as_one_put_in() {
        let (outer, inner) = (json!({"name": "a"}), json!({"p": 2}));
        let new = || Context::new(Map::new(), false, &verno_jmespath::NoEnv);
        let (mut held, mut copied) = (new(), new());
        // The baseline puts every entry in the root, as `set` does.
        let set_element = |c: &mut Context, el: &Value, i: usize, nesting: usize, numbered: bool| {
            let mut saved = c.set("element", el.clone());
            saved.absorb(c.set("elementIndex", json!(i)));
            if numbered {
                saved.absorb(c.set(&format!("element{nesting}"), el.clone()));
                saved.absorb(c.set(&format!("elementIndex{nesting}"), json!(i)));
            }
            saved
        };
        let sources = ["elementIndex", "elementIndex1", "[elementIndex, element]", "keys(@)", "element.name"];
        let answers = |held: &Context, copied: &Context| {
            for src in sources {
                assert_eq!(held.query(&expr(src)), copied.query(&expr(src)), "{src}");
            }
        };
        let held_outer = held.enter_element(ForeachElement::Lent(&outer), 3, 0, false);
        let copied_outer = set_element(&mut copied, &outer, 3, 0, false);
        let held_inner = held.enter_element(ForeachElement::Lent(&inner), 1, 1, true);
        let copied_inner = set_element(&mut copied, &inner, 1, 1, true);
        answers(&held, &copied);
        held.restore(held_inner);
        copied.restore(copied_inner);
        answers(&held, &copied);
        held.restore(held_outer);
        copied.restore(copied_outer);
        answers(&held, &copied);
        assert_eq!(*held.root(), *copied.root());
        // Set by a scope while held, then restored.
        let held_outer = held.enter_element(ForeachElement::Lent(&outer), 2, 0, false);
        let scope = held.set("elementIndex", json!(9));
        assert_eq!(held.query(&expr("elementIndex")), Ok(json!(9)));
        held.restore(scope);
        assert_eq!(held.query(&expr("elementIndex")), Ok(json!(2)));
        held.restore(held_outer);
        assert_eq!(*held.root(), *copied.root());
    }

    /// `element` once no foreach element is set: Kyverno's missing-key error.
    fn copied_after_restore() -> Result<Value, RuntimeError> {
        let ctx = Context::new(Map::new(), false, &verno_jmespath::NoEnv);
        ctx.query(&expr("element"))
    }

    /// A context whose `request` fields are filled in as they are read answers every kind of
    /// expression as one that has them all, in any order of reading and after changes.
    #[test]
    fn request_fields_filled_when_read_answer_as_all_there() {
        use crate::context::build_context_with;
        use crate::ports::Request;
        let object = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ns"}});
        let old = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ns", "labels": {"a": "b"}}});
        let user_info = json!({"username": "system:serviceaccount:ns:sa", "groups": ["g"]});
        let user = crate::matching::RequestUser {
            username: "system:serviceaccount:ns:sa".into(),
            groups: vec!["g".into()],
            roles: vec!["ns:r".into()],
            cluster_roles: vec!["cr".into()],
        };
        let req = Request {
            old_object: Some(&old),
            asker: crate::ports::Asker { user: Some(&user), info: crate::ports::UserInfoRef::Json(&user_info) },
            subresource: "status",
            ..Request::new(crate::Operation::Update, &object)
        };
        let env = verno_jmespath::NoEnv;
        let full = build_context_with(&req, &env, true);
        let all = full.root().clone();
        for field in REQUEST_FIELDS {
            assert!(all.pointer(&format!("/request/{field}")).is_some(), "{field}: {all}");
        }
        let sources = [
            "request.operation || 'BACKGROUND'",
            "request.name",
            "request.namespace",
            "request.kind.kind",
            "request.oldObject.metadata.labels",
            "request.userInfo.username",
            "request.roles",
            "request.clusterRoles",
            "request.subResource",
            "request.uid",
            "keys(request)",
            "request",
            "[request.name, request.operation]",
            "length(request.object.metadata.name) > `0` && request.operation == 'UPDATE'",
            "serviceAccountName",
            "serviceAccountNamespace",
            "@",
            "keys(@)",
        ];
        for first in sources {
            for then in sources {
                let ctx = build_context_with(&req, &env, true);
                for src in [first, then] {
                    assert_eq!(ctx.query(&expr(src)), full.query(&expr(src)), "{first} then {src}");
                }
            }
        }
        // Changing `request` (a variable, a patched object) keeps the fields not read yet.
        let mut ctx = build_context_with(&req, &env, true);
        assert_eq!(ctx.query(&expr("request.operation")), Ok(json!("UPDATE")));
        let saved = ctx.set_path("request.operation", json!("CREATE"));
        assert_eq!(ctx.query(&expr("request.name")), Ok(json!("p")));
        assert_eq!(ctx.query(&expr("request.operation")), Ok(json!("CREATE")));
        ctx.restore(saved);
        assert_eq!(ctx.query(&expr("request.operation")), Ok(json!("UPDATE")));
        assert_eq!(ctx.query(&expr("request.clusterRoles")), Ok(json!(["cr"])));
        let ctx = build_context_with(&req, &env, true);
        assert_eq!(*ctx.root(), all);
        let ctx = build_context_with(&req, &env, true);
        // `read` sees the data as it is: everything but the object, which stays lent.
        let mut request = all.get("request").cloned().unwrap_or_default();
        request.as_object_mut().map(|r| r.remove("object"));
        assert_eq!(ctx.read(|root| root.get("request").cloned()), Some(request));
    }
}
