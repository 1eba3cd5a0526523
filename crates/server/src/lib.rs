//! `verno serve`: Kyverno's admission webhook endpoints over HTTPS (axum + rustls).
//!
//! Policies come from a [`Loader`] (the CLI reads files); the compiled set is swapped as a
//! whole when the files change or on SIGHUP, and a broken set never replaces a working one.
//! A set of self-contained policies (no I/O: microseconds of CPU) is evaluated on the executor
//! for requests of bounded size; anything else runs on the blocking pool, bounded by a
//! semaphore, under a deadline. A panic or a timeout becomes an answer governed by the
//! webhook's failure policy, never a dead server.

pub mod admission;
pub mod guard;
pub mod metrics;
pub mod tls;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::Semaphore;
use verno_engine::{Filter, Hook, Notice, PolicySet, Route};

pub use tls::TlsSource;

/// Loads and compiles the policy set; the error says which file and field is wrong.
pub type Loader = Arc<dyn Fn() -> Result<PolicySet, LoadError> + Send + Sync>;

/// What a [`Loader`] fails with: reading the files, parsing or compiling a policy. Its message
/// names the file and field; a loader with a typed error (I/O, a compile error) keeps it here
/// for callers to inspect, one with only text gives that (`String` converts).
pub type LoadError = Box<dyn std::error::Error + Send + Sync>;

/// Why a reload left the previous policies in force: the loader refused the new ones.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ReloadError(#[source] pub LoadError);

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The loader's message names the file and field.
    #[error("{0}")]
    Policies(#[source] LoadError),
    #[error("loading the policies panicked: {0}")]
    LoaderPanicked(#[source] tokio::task::JoinError),
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    #[error("could not listen on {0}")]
    Listen(SocketAddr),
    #[error("metrics address {addr}: {source}")]
    Metrics { addr: SocketAddr, source: std::io::Error },
}

#[derive(Debug, Clone)]
pub struct Config {
    pub addr: SocketAddr,
    /// Plain-HTTP `/metrics`; `None` disables it.
    pub metrics_addr: Option<SocketAddr>,
    pub tls: TlsSource,
    /// Largest accepted body (413 above).
    pub body_limit: usize,
    /// Per-request evaluation deadline (shorter than the API server's webhook timeout).
    pub deadline: Duration,
    /// Evaluations running at once (on the blocking pool).
    pub max_concurrency: usize,
    /// Requests up to this many bytes whose policies are all self-contained are evaluated on
    /// the executor, without the hand-off to the blocking pool (0: every request takes the pool).
    pub inline_body_max: usize,
    /// How long a connection may take to finish its TLS handshake or send a request's headers
    /// (also between requests on a kept-alive HTTP/1 connection), and the HTTP/2 keep-alive
    /// ping interval and timeout: idle connections are closed instead of holding descriptors.
    pub idle_timeout: Duration,
    /// Files whose changes trigger a reload (policies); polled.
    pub watch: Vec<PathBuf>,
    pub poll_interval: Duration,
}

/// `verno serve`'s defaults but for the address (loopback, any free port) and the certificate
/// (none: set `tls`); no metrics endpoint, no watched files.
impl Default for Config {
    fn default() -> Config {
        Config {
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            metrics_addr: None,
            tls: TlsSource::Pem { cert: Vec::new(), key: Vec::new() },
            body_limit: 6 * 1024 * 1024,
            deadline: Duration::from_secs(8),
            max_concurrency: 4,
            inline_body_max: INLINE_BODY_MAX,
            idle_timeout: Duration::from_secs(10),
            watch: Vec::new(),
            poll_interval: Duration::from_secs(2),
        }
    }
}

struct AppState {
    set: RwLock<Arc<PolicySet>>,
    /// `/health/readiness` answers 503 while parts are missing (in-cluster: policies synced
    /// and a serving certificate loaded): a bit per missing [`ReadyPart`].
    missing: std::sync::atomic::AtomicU8,
    metrics: metrics::Metrics,
    permits: Arc<Semaphore>,
    deadline: Duration,
    inline_body_max: usize,
    /// Requests waiting for an evaluation slot, and how many may wait before the rest are shed.
    waiting: std::sync::atomic::AtomicUsize,
    max_waiting: usize,
    /// Where failed rules and applied policies go for events (in-cluster only); bounded, and
    /// a full queue drops (counted) rather than slowing admission.
    notices: std::sync::OnceLock<tokio::sync::mpsc::Sender<Notice>>,
    /// Where admission results go for PolicyReports (in-cluster only); bounded like `notices`.
    reports: std::sync::OnceLock<tokio::sync::mpsc::Sender<verno_engine::report::ReportNotice>>,
    /// Requests made as the background controller's account (in-cluster only), for Kyverno's
    /// `skipBackgroundRequests`.
    background: std::sync::OnceLock<BackgroundRequests>,
    /// Where context entries read the cluster (ConfigMaps, API calls); none: they are not
    /// available (`verno serve --policies`).
    data: std::sync::OnceLock<Arc<dyn verno_engine::Data + Send + Sync>>,
    /// The set (its address) that took longer than [`INLINE_SLOW`] on the executor once: its
    /// requests go to the blocking pool from then on.
    slow_set: std::sync::atomic::AtomicUsize,
    /// The requests Kyverno's ConfigMap says to leave alone (its chart's defaults until a
    /// ConfigMap is read): admitted without evaluation.
    filters: RwLock<Arc<verno_engine::filters::RequestFilters>>,
    /// The webhook configurations follow Kyverno's layout (`--kyverno-names`): its
    /// `/validate/fail` and `/validate/ignore` entries carry the policies by their
    /// `failurePolicy` alone ([`Filter::SpecFail`]), Audit-only ones included.
    kyverno_layout: std::sync::atomic::AtomicBool,
    /// Cancels evaluations on the executor at their deadline.
    watchdog: Arc<Watchdog>,
    /// Where the policy validation webhook asks the cluster about the controllers' permissions
    /// (in-cluster only).
    access: std::sync::OnceLock<Arc<dyn AccessReview>>,
    /// Whether PolicyExceptions are in force and from which namespace (in-cluster; set once):
    /// the policy webhook warns about exceptions that would be ignored, as Kyverno's does.
    exception_scope: std::sync::OnceLock<(bool, String)>,
}

pub use verno_engine::access_checks::AccessReview;

/// Evaluations running on the executor, each with its deadline and cancel flag. A thread of its
/// own (not a task: the executor's workers may all be busy evaluating) sets the flags of those
/// past their deadline every few milliseconds; the evaluation stops at its next check. It ends
/// when the server is dropped.
#[derive(Default)]
struct Watchdog {
    running: std::sync::Mutex<Vec<(u64, Instant, Arc<std::sync::atomic::AtomicBool>)>>,
    next: std::sync::atomic::AtomicU64,
}

impl Watchdog {
    fn start() -> Arc<Watchdog> {
        let dog = Arc::new(Watchdog::default());
        let weak = Arc::downgrade(&dog);
        let spawned = std::thread::Builder::new().name("verno-watchdog".into()).spawn(move || {
            while let Some(dog) = weak.upgrade() {
                let now = Instant::now();
                if let Ok(running) = dog.running.lock() {
                    for (_, _, flag) in running.iter().filter(|(_, d, _)| *d <= now) {
                        flag.store(true, std::sync::atomic::Ordering::Relaxed);
                    }
                }
                drop(dog);
                std::thread::sleep(Duration::from_millis(10));
            }
        });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "the evaluation watchdog could not start: evaluations on the executor have no deadline");
        }
        dog
    }

    /// Watches an evaluation until the guard is dropped.
    fn watch(&self, deadline: Instant, flag: Arc<std::sync::atomic::AtomicBool>) -> Watched<'_> {
        let id = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if let Ok(mut running) = self.running.lock() {
            running.push((id, deadline, flag));
        }
        Watched { dog: self, id }
    }
}

struct Watched<'a> {
    dog: &'a Watchdog,
    id: u64,
}

impl Drop for Watched<'_> {
    fn drop(&mut self) {
        if let Ok(mut running) = self.dog.running.lock()
            && let Some(i) = running.iter().position(|(id, _, _)| *id == self.id)
        {
            running.swap_remove(i);
        }
    }
}

/// The default largest body evaluated on the executor (larger ones take the blocking pool): the
/// cost of a self-contained set grows with the object.
pub const INLINE_BODY_MAX: usize = 128 * 1024;
/// An evaluation on the executor that took longer than this sends the set's later requests to
/// the blocking pool (generous: on a busy machine a thread is also descheduled for milliseconds).
const INLINE_SLOW: Duration = Duration::from_millis(50);

impl AppState {
    /// What context entries read (the cluster in-cluster; nothing for `serve --policies`).
    fn data(&self) -> &dyn verno_engine::Data {
        match self.data.get() {
            Some(d) => &**d,
            None => &verno_engine::NoData,
        }
    }

    /// Whether a review works out report results and event notices: only when something
    /// publishes them, and never for a dry run (it changes nothing, so it leaves no trace).
    fn wants(&self, dry_run: bool) -> (bool, bool) {
        (!dry_run && self.reports.get().is_some(), !dry_run && self.notices.get().is_some())
    }

    fn current(&self) -> Arc<PolicySet> {
        match self.set.read() {
            Ok(g) => g.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    fn filters(&self) -> Arc<verno_engine::filters::RequestFilters> {
        match self.filters.read() {
            Ok(g) => g.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    fn swap(&self, new: PolicySet) {
        self.metrics.policies_swapped(&self.current(), &new);
        let new = Arc::new(new);
        match self.set.write() {
            Ok(mut g) => *g = new,
            Err(p) => *p.into_inner() = new,
        }
    }
}

fn json_response(status: StatusCode, body: &impl serde::Serialize) -> Response {
    json_bytes(status, serde_json::to_vec(body).unwrap_or_default())
}

/// An AdmissionReview answer (200), written by [`admission::answer_json`].
fn review_response(review: &verno_api::AdmissionReview) -> Response {
    json_bytes(StatusCode::OK, admission::answer_json(review))
}

fn json_bytes(status: StatusCode, body: Vec<u8>) -> Response {
    // Built in place: the tuple's way checks the header's text and copies it for every answer.
    let mut r = Response::new(Body::from(body));
    *r.status_mut() = status;
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json; charset=utf-8"));
    r
}

fn text(status: StatusCode, msg: &str) -> Response {
    (status, [(header::CONTENT_TYPE, "text/plain; charset=utf-8")], msg.to_string()).into_response()
}

/// One request among those waiting for a slot, for as long as it waits: the count goes down when
/// this is dropped, also when the client goes away and the handler is dropped mid-wait (a bare
/// decrement after the wait leaked then, until every request was shed as overloaded).
struct Waiting<'a> {
    count: &'a std::sync::atomic::AtomicUsize,
    /// Requests that were waiting when this one joined.
    ahead: usize,
}

impl<'a> Waiting<'a> {
    fn join(count: &'a std::sync::atomic::AtomicUsize) -> Waiting<'a> {
        Waiting { count, ahead: count.fetch_add(1, std::sync::atomic::Ordering::AcqRel) }
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.count.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

/// Cancels an evaluation once nobody waits for its answer: the deadline passed, or the client
/// went away and the handler was dropped. Harmless after the evaluation has finished.
struct CancelOnDrop(Arc<std::sync::atomic::AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

async fn handle(
    state: Arc<AppState>,
    route: Route,
    webhook: &'static str,
    content_type: Option<HeaderValue>,
    body: Bytes,
) -> Response {
    let started = Instant::now();
    let ct = content_type.as_ref().and_then(|v| v.to_str().ok()).unwrap_or("");
    if ct.split(';').next().map(str::trim) != Some("application/json") {
        return text(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            &format!("invalid Content-Type {ct:?}, expected application/json"),
        );
    }
    let set = state.current();
    // A set of self-contained policies (no I/O, CPU in proportion to the request: microseconds)
    // is evaluated right here: a hand-off to the blocking pool would cost more than the work.
    if body.len() <= state.inline_body_max
        && set.self_contained(&route)
        && state.slow_set.load(std::sync::atomic::Ordering::Relaxed) != Arc::as_ptr(&set) as usize
        && let Some(answer) = inline(&state, set.clone(), route.clone(), webhook, started, &body)
    {
        return answer;
    }
    // Only the identity is read before the request waits: the full document is built once it
    // has a slot, so a burst holds bodies, not parsed trees.
    let (api_version, uid) = match admission::identify(&body) {
        Ok(id) => id,
        Err(e) => return text(StatusCode::BAD_REQUEST, &e.to_string()),
    };
    // On failure the webhook's failure policy decides: `/…/ignore` allows, `/…/fail` denies,
    // and a CEL policy path allows only when every policy it names is failurePolicy Ignore.
    let allow_on_error = admission::allows_on_error(&set, &route);
    let answer = |msg: &str| review_response(&admission::error_review(&api_version, &uid, allow_on_error, msg));
    // The deadline runs from arrival: waiting for a slot counts. A queue longer than can be
    // served in time is shed at once, answered by the failure policy.
    let queued = Waiting::join(&state.waiting);
    if queued.ahead >= state.max_waiting {
        tracing::warn!(uid = %uid, waiting = queued.ahead, "overloaded: request shed");
        return answer(&format!(
            "verno: overloaded ({} requests waiting); the request was not evaluated",
            queued.ahead
        ));
    }
    let permit = tokio::time::timeout(state.deadline, state.permits.clone().acquire_owned()).await;
    drop(queued);
    let permit = match permit {
        Ok(Ok(p)) => p,
        Ok(Err(_)) => return text(StatusCode::SERVICE_UNAVAILABLE, "server is shutting down"),
        Err(_) => {
            tracing::warn!(uid = %uid, "no evaluation slot within the deadline: request shed");
            let msg = format!("verno: no evaluation slot within the {} ms deadline", state.deadline.as_millis());
            return answer(&msg);
        }
    };
    // The slot is held by the work, not by the wait for it: past the deadline the work is
    // cancelled (it stops at its next check) and the slot frees only when it has stopped, so
    // the concurrency bound holds for work the answer no longer waits for.
    let cancel = CancelOnDrop(Arc::new(std::sync::atomic::AtomicBool::new(false)));
    let flag = cancel.0.clone();
    let st = state.clone();
    let job = tokio::task::spawn_blocking(move || {
        let _permit = permit;
        let review = admission::parse(&body)?;
        st.note_background(&review);
        if let Some(skip) = admission::filtered(&st.filters(), &review, st.data()) {
            return Ok(Err(skip));
        }
        let dry_run = review.request.as_ref().is_some_and(|r| r.dry_run);
        let (reports, notices) = st.wants(dry_run);
        let opts = admission::ReviewOptions { cancel: flag, data: st.data(), reports, notices };
        let o = admission::review_with(&set, route, &review, opts);
        Ok::<_, admission::ParseError>(Ok((o, dry_run, set)))
    });
    let outcome = tokio::time::timeout(state.deadline.saturating_sub(started.elapsed()), job).await;
    drop(cancel);
    match outcome {
        Ok(Ok(Err(e))) => text(StatusCode::BAD_REQUEST, &e.to_string()),
        Ok(Ok(Ok(Ok((o, dry_run, set))))) => reviewed(&state, webhook, started, &o, dry_run, &set),
        Ok(Ok(Ok(Err(skip)))) => review_response(&skip),
        Ok(Err(join)) => {
            tracing::error!(uid = %uid, error = %join, "evaluation panicked");
            answer("verno: internal error while evaluating policies")
        }
        Err(_) => {
            tracing::warn!(uid = %uid, "evaluation deadline exceeded");
            answer(&format!("verno: policy evaluation exceeded the {} ms deadline", state.deadline.as_millis()))
        }
    }
}

/// Evaluates a request on the executor (a self-contained set, a body of bounded size): no
/// slot, no hand-off — the work is microseconds of CPU; a watchdog thread still cancels it at
/// the deadline. An evaluation that took long sends the set to the blocking pool. A panic sends
/// the set there too, and this request with it (`None`: evaluate it on the pool, where a panic
/// becomes the failure policy's answer): evaluating has no effect outside its answer, and
/// something the set does may not belong on the executor after all (a blocking read). A
/// request whose Namespace the set does not hold (CEL may read it) goes to the pool as well
/// (`None`).
fn inline(
    state: &AppState,
    set: Arc<PolicySet>,
    route: Route,
    webhook: &'static str,
    started: Instant,
    body: &[u8],
) -> Option<Response> {
    let review = match admission::parse(body) {
        Ok(r) => r,
        Err(e) => return Some(text(StatusCode::BAD_REQUEST, &e.to_string())),
    };
    state.note_background(&review);
    if let Some(skip) = admission::filtered(&state.filters(), &review, state.data()) {
        return Some(review_response(&skip));
    }
    // CEL expressions read the request's Namespace: one the watch has not delivered yet is
    // read from the API server, on the pool.
    if review.request.as_ref().is_some_and(|r| !set.holds_namespace_of(r)) {
        return None;
    }
    let allow_on_error = admission::allows_on_error(&set, &route);
    let dry_run = review.request.as_ref().is_some_and(|r| r.dry_run);
    let (reports, notices) = state.wants(dry_run);
    let data = state.data();
    let cancel = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let evaluated = {
        let _watched = state.watchdog.watch(started + state.deadline, cancel.clone());
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let opts = admission::ReviewOptions { cancel: cancel.clone(), data, reports, notices };
            admission::review_with(&set, route, &review, opts)
        }))
    };
    if started.elapsed() > INLINE_SLOW || evaluated.is_err() {
        tracing::warn!(
            ms = started.elapsed().as_millis(),
            panicked = evaluated.is_err(),
            "an evaluation took long or panicked on the executor: this policy set's requests go to the blocking pool from now on"
        );
        state.slow_set.store(Arc::as_ptr(&set) as usize, std::sync::atomic::Ordering::Relaxed);
    }
    let uid = review.request.as_ref().map_or("", |r| r.uid.as_str());
    match evaluated {
        Ok(_) if cancel.load(std::sync::atomic::Ordering::Relaxed) => {
            tracing::warn!(uid = %uid, "evaluation deadline exceeded");
            let msg = format!("verno: policy evaluation exceeded the {} ms deadline", state.deadline.as_millis());
            Some(review_response(&admission::error_review(&review.api_version, uid, allow_on_error, &msg)))
        }
        Ok(o) => Some(reviewed(state, webhook, started, &o, dry_run, &set)),
        Err(_) => None,
    }
}

/// The answer of an evaluated request, with its metrics, report results and events.
fn reviewed(
    state: &AppState,
    webhook: &'static str,
    started: Instant,
    o: &admission::Outcome,
    dry_run: bool,
    set: &PolicySet,
) -> Response {
    state.metrics.observe(webhook, o, started.elapsed().as_secs_f64(), dry_run, set);
    // A dry run changes nothing, so it leaves no events (as Kyverno).
    if let (false, Some(tx), Some(report)) = (dry_run, state.reports.get(), &o.report)
        && tx.try_send(report.clone()).is_err()
    {
        state.metrics.reports_dropped.inc();
    }
    if let (false, Some(tx)) = (dry_run, state.notices.get()) {
        for v in &o.notices {
            if tx.try_send(v.clone()).is_err() {
                state.metrics.events_dropped.inc();
            }
        }
    }
    tracing::debug!(kind = %o.kind, namespace = %o.namespace, allowed = o.allowed, "reviewed");
    review_response(&o.review)
}

/// Reads the whole body before the handlers see it, within `timeout` and `limit`: a client that
/// sends its headers and then trickles (or never finishes) its body is answered 408 and its
/// connection's memory freed, instead of holding up to the body limit until it gives up.
async fn body_in_time(req: Request, next: Next, limit: usize, timeout: Duration) -> Response {
    let (parts, body) = req.into_parts();
    match read_body(body, limit, timeout).await {
        Ok(bytes) => next.run(Request::from_parts(parts, Body::from(bytes))).await,
        Err(answer) => answer,
    }
}

fn too_large(limit: usize) -> Response {
    text(StatusCode::PAYLOAD_TOO_LARGE, &format!("the request body is over {limit} bytes"))
}

/// The whole body, read within `timeout` and `limit`, or the answer to a body that is too
/// large (413), unreadable (400) or late (408). (Generic over the body: the front door hands
/// hyper's own body here without boxing it into axum's.)
async fn read_body<B>(body: B, limit: usize, timeout: Duration) -> Result<Bytes, Response>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    use http_body_util::BodyExt;
    // A body declared larger than the limit (its Content-Length) is refused before any of it
    // is read: the answer then goes out before the client has sent its window's worth, which
    // an HTTP/2 client that is still sending reads as the answer, not a stream reset.
    if body.size_hint().lower() > limit as u64 {
        return Err(too_large(limit));
    }
    match tokio::time::timeout(timeout, http_body_util::Limited::new(body, limit).collect()).await {
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(e)) => Err(if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() {
            too_large(limit)
        } else {
            text(StatusCode::BAD_REQUEST, "the request body could not be read")
        }),
        Err(_) => Err(text(
            StatusCode::REQUEST_TIMEOUT,
            &format!("the request body did not arrive within {} s", timeout.as_secs_f64()),
        )),
    }
}

/// A webhook call: its body read here, with the same limit, timeout and answers as
/// [`body_in_time`] gives the other routes. Going through that middleware (a request rebuilt
/// around the read body, read again by an extractor, futures boxed at each layer, the headers
/// copied for the handler) cost ~5 k instructions and a dozen allocations a request.
async fn webhook_call<B>(
    state: Arc<AppState>,
    route: Route,
    webhook: &'static str,
    req: http::Request<B>,
    (limit, timeout): (usize, Duration),
) -> Response
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let (parts, body) = req.into_parts();
    // The one header a webhook reads; the rest of the request is not held while it is served.
    let content_type = parts.headers.get(header::CONTENT_TYPE).cloned();
    drop(parts);
    match read_body(body, limit, timeout).await {
        Ok(body) => handle(state, route, webhook, content_type, body).await,
        Err(answer) => answer,
    }
}

/// The Kyverno webhook paths with nothing in them to extract, with the hook, the policies and
/// the webhook's metrics label of each: served by the router and by [`Front`] alike.
const KYVERNO_PATHS: [(&str, Hook, Filter, &str); 6] = [
    ("/validate", Hook::Validate, Filter::All, "validate"),
    ("/validate/fail", Hook::Validate, Filter::Fail, "validate-fail"),
    ("/validate/ignore", Hook::Validate, Filter::Ignore, "validate-ignore"),
    ("/mutate", Hook::Mutate, Filter::All, "mutate"),
    ("/mutate/fail", Hook::Mutate, Filter::Fail, "mutate-fail"),
    ("/mutate/ignore", Hook::Mutate, Filter::Ignore, "mutate-ignore"),
];

/// The route of a Kyverno webhook path. In Kyverno's layout (`kyverno_layout`) the
/// failure-policy paths pick policies by their `failurePolicy` alone, and a policy's own entry
/// (`/validate/fail/finegrained/<name>`) is served as its failure policy's path, as Kyverno
/// serves it.
fn kyverno_path(path: &str, kyverno_layout: bool) -> Option<(Route, &'static str)> {
    let path = match path.find("/finegrained/") {
        Some(i) if kyverno_layout => &path[..i],
        _ => path,
    };
    KYVERNO_PATHS.iter().find(|p| p.0 == path).map(|&(_, hook, filter, webhook)| {
        let filter = match filter {
            Filter::Fail if kyverno_layout => Filter::SpecFail,
            Filter::Ignore if kyverno_layout => Filter::SpecIgnore,
            f => f,
        };
        (Route::Kyverno(hook, filter), webhook)
    })
}

/// The server's front door: a POST to one of the Kyverno webhook paths ([`kyverno_path`]) goes
/// straight to [`webhook_call`] with hyper's body; every other request goes to the router. The
/// router's way for those calls (its path lookup, the URL-parameter map in the request's
/// extensions, the route's boxed service cloned for each call, the handler's boxed future, the
/// body boxed into axum's) cost ~3 k instructions and ~8 allocations a request (callgrind,
/// docs/benchmarks.md, eighteenth pass); the answers are the same either way (test
/// `the_front_door_answers_as_the_router_does`).
#[derive(Clone)]
struct Front {
    state: Arc<AppState>,
    router: Router,
    limits: (usize, Duration),
}

impl<B> tower_service::Service<http::Request<B>> for Front
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Response = Response;
    type Error = std::convert::Infallible;
    type Future =
        std::pin::Pin<Box<dyn std::future::Future<Output = Result<Response, std::convert::Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        if req.method() == http::Method::POST
            && let Some((route, webhook)) =
                kyverno_path(req.uri().path(), self.state.kyverno_layout.load(std::sync::atomic::Ordering::Relaxed))
        {
            let state = self.state.clone();
            let limits = self.limits;
            return Box::pin(async move { Ok(webhook_call(state, route, webhook, req, limits).await) });
        }
        Box::pin(tower_service::Service::call(&mut self.router, req))
    }
}

fn router(state: Arc<AppState>, body_limit: usize, body_timeout: Duration) -> Router {
    let validate_state = state.clone();
    let limits = (body_limit, body_timeout);
    let route = |hook: Hook, filter: Filter, webhook: &'static str| {
        let st = state.clone();
        post(move |req: Request| webhook_call(st, Route::Kyverno(hook, filter), webhook, req, limits))
    };
    // Kyverno's CEL policy paths: `/vpol/<name>/<name>…` names the policies an entry serves.
    let policies = |hook: Hook, namespaced: bool, image: bool, webhook: &'static str| {
        let pick = move |path: &str| {
            if image {
                admission::image_route(hook, namespaced, path)
            } else {
                admission::cel_route(hook, namespaced, path)
            }
        };
        let st = state.clone();
        let named =
            post(move |Path(path): Path<String>, req: Request| webhook_call(st, pick(&path), webhook, req, limits));
        let st = state.clone();
        let all = post(move |req: Request| webhook_call(st, pick(""), webhook, req, limits));
        (all, named)
    };
    let cel = |hook: Hook, namespaced: bool, webhook: &'static str| policies(hook, namespaced, false, webhook);
    // Kyverno's ImageValidatingPolicy paths: `/ivpol/validate/…` verifies, `/ivpol/mutate/…`
    // pins digests.
    let (ivpol_v, ivpol_v_named) = policies(Hook::Validate, false, true, "ivpol-validate");
    let (nivpol_v, nivpol_v_named) = policies(Hook::Validate, true, true, "nivpol-validate");
    let (ivpol_m, ivpol_m_named) = policies(Hook::Mutate, false, true, "ivpol-mutate");
    let (nivpol_m, nivpol_m_named) = policies(Hook::Mutate, true, true, "nivpol-mutate");
    let (vpol, vpol_named) = cel(Hook::Validate, false, "vpol");
    let (nvpol, nvpol_named) = cel(Hook::Validate, true, "nvpol");
    let (mpol, mpol_named) = cel(Hook::Mutate, false, "mpol");
    let (nmpol, nmpol_named) = cel(Hook::Mutate, true, "nmpol");
    let gpol = {
        let st = state.clone();
        post(move |req: Request| {
            let route = Route::Cel {
                hook: Hook::Validate,
                namespaced: false,
                names: Vec::new(),
                filter: Filter::Nothing,
                image: false,
            };
            webhook_call(st, route, "gpol", req, limits)
        })
    };
    let kyverno = KYVERNO_PATHS
        .iter()
        .fold(Router::new(), |r, &(path, hook, filter, webhook)| r.route(path, route(hook, filter, webhook)));
    kyverno
        .route("/vpol", vpol)
        .route("/vpol/{*policies}", vpol_named)
        .route("/nvpol", nvpol)
        .route("/nvpol/{*policies}", nvpol_named)
        .route("/mpol", mpol)
        .route("/mpol/{*policies}", mpol_named)
        .route("/nmpol", nmpol)
        .route("/nmpol/{*policies}", nmpol_named)
        // Kyverno's GeneratingPolicy entries: generation runs in the background controller
        // from its watches, so the call is answered without evaluating anything.
        .route("/gpol", gpol.clone())
        .route("/gpol/{*policies}", gpol.clone())
        .route("/ngpol", gpol.clone())
        .route("/ngpol/{*policies}", gpol)
        .route("/ivpol/validate", ivpol_v)
        .route("/ivpol/validate/{*policies}", ivpol_v_named)
        .route("/nivpol/validate", nivpol_v)
        .route("/nivpol/validate/{*policies}", nivpol_v_named)
        .route("/ivpol/mutate", ivpol_m)
        .route("/ivpol/mutate/{*policies}", ivpol_m_named)
        .route("/nivpol/mutate", nivpol_m)
        .route("/nivpol/mutate/{*policies}", nivpol_m_named)
        // The other routes read their bodies through the middleware (the webhooks above read
        // theirs themselves, with the same limit and timeout).
        .merge(
            Router::new()
                .route("/verifymutate", post(verify))
                .route("/policyvalidate", post(move |body: Bytes| policy_validate(validate_state.clone(), body)))
                .route("/health/liveness", get(|| async { "ok" }))
                .route("/health/readiness", get(move || readiness(state.clone())))
                .layer(DefaultBodyLimit::max(body_limit))
                .layer(axum::middleware::from_fn(move |req: Request, next: Next| {
                    body_in_time(req, next, body_limit, body_timeout)
                })),
        )
        .with_state(())
}

/// The end-to-end probe's webhook: stamps the time on the probe Lease (no policy involved).
async fn verify(body: Bytes) -> Response {
    match admission::parse(&body) {
        Ok(review) => {
            let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
            json_response(StatusCode::OK, &admission::verify_review(&review, &now))
        }
        Err(e) => text(StatusCode::BAD_REQUEST, &e.to_string()),
    }
}

/// The policy validation webhook: refuses policies and exceptions that do not compile, and
/// (in-cluster) ClusterPolicies and Policies whose generate or mutate-existing rules the
/// controllers would lack the permissions for, as Kyverno's does.
async fn policy_validate(state: Arc<AppState>, body: Bytes) -> Response {
    let review = match admission::parse(&body) {
        Ok(r) => r,
        Err(e) => return text(StatusCode::BAD_REQUEST, &e.to_string()),
    };
    let (mut answer, review) =
        match tokio::task::spawn_blocking(move || (admission::validate_policy_review(&review), review)).await {
            Ok(done) => done,
            Err(e) => return text(StatusCode::INTERNAL_SERVER_ERROR, &format!("policy validation failed: {e}")),
        };
    let allowed = answer.response.as_ref().is_some_and(|r| r.allowed);
    if let (true, Some((enabled, namespace)), Some(req), Some(r)) =
        (allowed, state.exception_scope.get(), review.request.as_ref(), answer.response.as_mut())
        && req.kind.kind == "PolicyException"
        && matches!(req.operation, verno_api::Operation::Create | verno_api::Operation::Update)
    {
        r.warnings.extend(admission::exception_warnings(*enabled, namespace, &req.namespace));
    }
    if let (true, Some(access), Some(req)) = (allowed, state.access.get().cloned(), review.request.as_ref())
        && matches!(req.kind.kind.as_str(), "ClusterPolicy" | "Policy")
        && req.kind.group == "kyverno.io"
        && matches!(req.operation, verno_api::Operation::Create | verno_api::Operation::Update)
        && let Some(refusal) = access_refusal(&*access, &req.object).await
    {
        let warnings = answer.response.as_ref().map(|r| r.warnings.clone()).unwrap_or_default();
        answer = admission::error_review(&review.api_version, &req.uid, false, &refusal);
        if let Some(r) = answer.response.as_mut() {
            r.warnings = warnings;
        }
    }
    json_response(StatusCode::OK, &answer)
}

/// At most this many permission checks per policy, and this long for all of them: a policy
/// that names more, or a cluster that answers slower, is admitted (its controllers' writes
/// fail and say so) rather than holding the API server's request.
const MAX_ACCESS_CHECKS: usize = 32;
const ACCESS_CHECK_BUDGET: Duration = Duration::from_secs(5);

/// Kyverno's refusal for the first rule whose permission checks fail
/// ([`verno_engine::access_checks::verdict`]); `None`: all granted (or not answerable in
/// time: logged, and the policy admitted).
async fn access_refusal(access: &dyn AccessReview, policy: &serde_json::Value) -> Option<String> {
    use verno_engine::access_checks::{access_checks, verdict};
    let mut checks = access_checks(policy);
    checks.truncate(MAX_ACCESS_CHECKS);
    let mut scopes = verno_engine::scope_questions(policy);
    scopes.truncate(MAX_ACCESS_CHECKS);
    let ask = async {
        // Generate targets of custom kinds: placed as their scope (from discovery) requires.
        for q in &scopes {
            match access.cluster_scoped(&q.api_version, &q.kind).await {
                Ok(cluster) => {
                    if let Some(refusal) = q.refusal(cluster) {
                        return Some(refusal);
                    }
                }
                Err(e) => {
                    tracing::warn!(kind = %q.kind, error = %e, "scope of a generate target not known; not refused for it")
                }
            }
        }
        let mut lacking = Vec::with_capacity(checks.len());
        for c in &checks {
            lacking.push(match access.lacking(c).await {
                Ok(verbs) => Some(verbs),
                Err(e) => {
                    tracing::warn!(resource = %c.resource(), error = %e, "permission check not answered; not refused for it");
                    None
                }
            });
        }
        verdict(&checks, &lacking, |a| access.user(a))
    };
    match tokio::time::timeout(ACCESS_CHECK_BUDGET, ask).await {
        Ok(r) => r,
        Err(_) => {
            tracing::warn!("permission checks of a policy took over {ACCESS_CHECK_BUDGET:?}; admitted unchecked");
            None
        }
    }
}

async fn readiness(state: Arc<AppState>) -> Response {
    match state.missing.load(std::sync::atomic::Ordering::Relaxed) {
        0 => text(StatusCode::OK, "ok"),
        m => {
            let mut what = Vec::new();
            if m & ReadyPart::Policies as u8 != 0 {
                what.push("policies not synced");
            }
            if m & ReadyPart::Certificate as u8 != 0 {
                what.push("no serving certificate");
            }
            text(StatusCode::SERVICE_UNAVAILABLE, &format!("not ready: {}", what.join(", ")))
        }
    }
}

async fn metrics_handler(State(state): State<Arc<AppState>>) -> Response {
    (StatusCode::OK, [(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], state.metrics.encode())
        .into_response()
}

pub use verno_api::ReadyPart;

/// A started server: where it listens, and how to stop it.
pub struct Running {
    pub addr: SocketAddr,
    pub metrics_addr: Option<SocketAddr>,
    /// The CA bundle to put in a webhook's `caBundle` (self-made certificates only).
    pub ca_path: Option<PathBuf>,
    handle: axum_server::Handle<SocketAddr>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
    state: Arc<AppState>,
    loader: Loader,
    rustls: axum_server::tls_rustls::RustlsConfig,
}

impl Running {
    /// Puts a compiled set in force (in-cluster mode: built from the policy watch).
    pub fn install(&self, set: PolicySet) {
        tracing::info!(policies = set.policies().len(), "policy set swapped");
        self.state.swap(set);
    }

    /// The set in force.
    pub fn current(&self) -> Arc<PolicySet> {
        self.state.current()
    }

    /// Replaces the serving certificate (PEM); new handshakes use it, open connections keep
    /// theirs. A bad pair is refused and the previous one stays.
    pub fn set_certificate(&self, cert_pem: &[u8], key_pem: &[u8]) -> Result<(), tls::TlsError> {
        let cfg = tls::server_config_pem(cert_pem, key_pem)?;
        self.rustls.reload_from_config(cfg);
        Ok(())
    }

    /// Sends what each non-dry-run request leaves for events (failed rules, applied policies)
    /// to `tx` (once; later calls are ignored). A full channel drops the notice and counts it
    /// in `verno_events_dropped_total`.
    pub fn report_events(&self, tx: tokio::sync::mpsc::Sender<Notice>) {
        let _ = self.state.notices.set(tx);
    }

    /// Where context entries read the cluster from now on (set once, in-cluster).
    pub fn set_data(&self, data: Arc<dyn verno_engine::Data + Send + Sync>) {
        let _ = self.state.data.set(data);
    }

    /// Where the policy validation webhook checks the controllers' permissions (set once,
    /// in-cluster).
    pub fn set_access(&self, access: Arc<dyn AccessReview>) {
        let _ = self.state.access.set(access);
    }

    /// Whether PolicyExceptions are in force (`--enable-policy-exception`) and from which
    /// namespace (`--exception-namespace`): the policy webhook warns about exceptions that
    /// would be ignored (set once).
    pub fn set_exception_scope(&self, enabled: bool, namespace: &str) {
        let _ = self.state.exception_scope.set((enabled, namespace.to_string()));
    }

    /// Sends what each non-dry-run request leaves for its resource's PolicyReport to `tx`
    /// (once; later calls are ignored). A full channel drops it and counts it in
    /// `verno_reports_dropped_total`.
    pub fn report_results(&self, tx: tokio::sync::mpsc::Sender<verno_engine::report::ReportNotice>) {
        let _ = self.state.reports.set(tx);
    }

    /// Hands results the controllers produce for a resource's report (a GeneratingPolicy's
    /// generation) to the same writer as admission results; dropped and counted when it is
    /// full, and nothing when reports are off.
    pub fn submit_report(&self, notice: verno_engine::report::ReportNotice) {
        if let Some(tx) = self.state.reports.get()
            && tx.try_send(notice).is_err()
        {
            self.state.metrics.reports_dropped.inc();
        }
    }

    /// Remembers the requests `user` (the background controller's account) makes, for
    /// [`Server::made_by_background`] (once; later calls are ignored).
    pub fn set_background_user(&self, user: String) {
        let _ = self.state.background.set(BackgroundRequests { user, seen: Default::default() });
    }

    /// Whether the background controller's account made the change of the object `uid` from
    /// `resource_version` (empty: its creation), as its admission request showed.
    pub fn made_by_background(&self, uid: &str, resource_version: &str) -> bool {
        self.state.background.get().is_some_and(|b| {
            b.seen.lock().is_ok_and(|g| g.0.contains(&(uid.to_string(), resource_version.to_string())))
        })
    }

    /// The counters of dropped event notices and report results, which the controllers count
    /// into as well.
    pub fn dropped_counters(
        &self,
    ) -> (prometheus_client::metrics::counter::Counter, prometheus_client::metrics::counter::Counter) {
        (self.state.metrics.events_dropped.clone(), self.state.metrics.reports_dropped.clone())
    }

    /// Registers another component's metrics (the controllers') to be served at `/metrics`.
    pub fn register_metrics(&self, add: impl FnOnce(&mut prometheus_client::registry::Registry)) {
        self.state.metrics.register(add);
    }

    /// The `/metrics` text, as the metrics endpoint serves it.
    pub fn metrics_text(&self) -> String {
        self.state.metrics.encode()
    }

    /// Replaces the requests left alone (Kyverno's ConfigMap `resourceFilters` and
    /// `exclude*` keys).
    pub fn set_request_filters(&self, filters: verno_engine::filters::RequestFilters) {
        let filters = Arc::new(filters);
        match self.state.filters.write() {
            Ok(mut g) => *g = filters,
            Err(p) => *p.into_inner() = filters,
        }
    }

    /// The webhook configurations follow Kyverno's layout from now on (see
    /// `verno_engine::webhookgen`): its failure-policy paths pick policies as Kyverno's do.
    pub fn use_kyverno_layout(&self) {
        self.state.kyverno_layout.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Records the rule results of a background scan evaluation.
    pub fn scan_results(
        &self,
        kind: &str,
        namespace: &str,
        set: &PolicySet,
        responses: &[(usize, verno_engine::PolicyResponse)],
    ) {
        self.state.metrics.observe_scan(kind, namespace, set, responses);
    }

    /// Marks one part of readiness done (or not) for `/health/readiness`.
    pub fn set_ready_part(&self, part: ReadyPart, done: bool) {
        let bit = part as u8;
        if done {
            self.state.missing.fetch_and(!bit, std::sync::atomic::Ordering::Relaxed);
        } else {
            self.state.missing.fetch_or(bit, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Recompiles the policies now; a broken set is reported and the previous one stays.
    pub fn reload(&self) -> Result<(), ReloadError> {
        reload(&self.state, &self.loader)
    }

    /// Stops accepting, lets in-flight requests finish (up to `grace`), then returns.
    pub async fn shutdown(self, grace: Duration) {
        self.handle.graceful_shutdown(Some(grace));
        let _ = self.task.await;
    }
}

fn reload(state: &AppState, loader: &Loader) -> Result<(), ReloadError> {
    match loader() {
        Ok(set) => {
            tracing::info!(policies = set.policies().len(), "policies loaded");
            state.swap(set);
            Ok(())
        }
        Err(e) => {
            tracing::error!(error = %e, "policy reload failed; the previous policies stay in force");
            Err(ReloadError(e))
        }
    }
}

/// A fingerprint of the watched files (names, sizes, modification times).
fn fingerprint(paths: &[PathBuf]) -> Vec<(PathBuf, u64, Option<SystemTime>)> {
    let mut out = Vec::new();
    let mut stack: Vec<PathBuf> = paths.to_vec();
    while let Some(p) = stack.pop() {
        if p.is_dir() {
            for e in std::fs::read_dir(&p).into_iter().flatten().flatten() {
                stack.push(e.path());
            }
        } else if let Ok(m) = std::fs::metadata(&p) {
            out.push((p, m.len(), m.modified().ok()));
        }
    }
    out.sort();
    out
}

/// Requests made as the background controller's account, remembered by the object's uid and
/// the resourceVersion it had before (empty for a CREATE): the background controller, which
/// works from watches, asks whether a change it sees came from one (Kyverno's
/// `skipBackgroundRequests`). The oldest are forgotten past [`BackgroundRequests::MAX`].
struct BackgroundRequests {
    user: String,
    seen: std::sync::Mutex<Remembered>,
}

/// (object uid, resourceVersion before) pairs, and the order they came in.
type Remembered = (std::collections::HashSet<(String, String)>, std::collections::VecDeque<(String, String)>);

impl BackgroundRequests {
    const MAX: usize = 4096;

    fn note(&self, key: (String, String)) {
        let Ok(mut g) = self.seen.lock() else { return };
        let (set, order) = &mut *g;
        if set.insert(key.clone()) {
            order.push_back(key);
            while order.len() > Self::MAX {
                if let Some(old) = order.pop_front() {
                    set.remove(&old);
                }
            }
        }
    }
}

impl AppState {
    /// Remembers a request made as the background controller's account.
    fn note_background(&self, review: &verno_api::AdmissionReview) {
        let (Some(b), Some(req)) = (self.background.get(), review.request.as_ref()) else { return };
        if req.user_info.username != b.user {
            return;
        }
        let s =
            |v: &serde_json::Value, p: &str| v.pointer(p).and_then(serde_json::Value::as_str).unwrap_or("").to_string();
        let uid = match s(&req.object, "/metadata/uid") {
            u if u.is_empty() => s(&req.old_object, "/metadata/uid"),
            u => u,
        };
        if !uid.is_empty() {
            b.note((uid, s(&req.old_object, "/metadata/resourceVersion")));
        }
    }
}

/// The state the handlers share, with `initial` in force and `missing` parts for readiness.
fn new_state(cfg: &Config, initial: PolicySet, missing: u8) -> Arc<AppState> {
    let metrics = metrics::Metrics::default();
    metrics.policies_swapped(&PolicySet::default(), &initial);
    Arc::new(AppState {
        set: RwLock::new(Arc::new(initial)),
        missing: std::sync::atomic::AtomicU8::new(missing),
        metrics,
        permits: Arc::new(Semaphore::new(cfg.max_concurrency.max(1))),
        deadline: cfg.deadline,
        inline_body_max: cfg.inline_body_max,
        waiting: std::sync::atomic::AtomicUsize::new(0),
        // Enough for a burst (an evaluation takes tens of microseconds), small enough that the
        // bodies held stay bounded (body limit × this).
        max_waiting: cfg.max_concurrency.max(1) * 64,
        notices: std::sync::OnceLock::new(),
        reports: std::sync::OnceLock::new(),
        background: std::sync::OnceLock::new(),
        data: std::sync::OnceLock::new(),
        access: std::sync::OnceLock::new(),
        exception_scope: std::sync::OnceLock::new(),
        slow_set: std::sync::atomic::AtomicUsize::new(0),
        filters: RwLock::new(Arc::new(verno_engine::filters::RequestFilters::kyverno_defaults())),
        kyverno_layout: std::sync::atomic::AtomicBool::new(false),
        watchdog: Watchdog::start(),
    })
}

/// Loads the policies, binds the ports and starts serving.
pub async fn start(cfg: Config, loader: Loader) -> Result<Running, ServerError> {
    let first = loader.clone();
    let initial = tokio::task::spawn_blocking(move || first())
        .await
        .map_err(ServerError::LoaderPanicked)?
        .map_err(ServerError::Policies)?;
    tracing::info!(policies = initial.policies().len(), "policies loaded");
    let ca_path = match &cfg.tls {
        TlsSource::Dir { dir, dns_names } => Some(tls::ensure_dir(dir, dns_names)?),
        TlsSource::Files { .. } | TlsSource::Pem { .. } => None,
    };
    let (cert, key) = cfg.tls.files();
    let server_cfg = match &cfg.tls {
        TlsSource::Pem { cert, key } => tls::server_config_pem(cert, key)?,
        _ => tls::server_config(&cert, &key)?,
    };
    let rustls_cfg = axum_server::tls_rustls::RustlsConfig::from_config(server_cfg);
    // In-memory certificates mean in-cluster mode: not ready until the controller has synced
    // the policies and loaded the certificate from its Secret.
    let missing = if matches!(cfg.tls, TlsSource::Pem { .. }) {
        ReadyPart::Policies as u8 | ReadyPart::Certificate as u8
    } else {
        0
    };
    let state = new_state(&cfg, initial, missing);
    let app = router(state.clone(), cfg.body_limit, cfg.idle_timeout);
    let handle: axum_server::Handle<SocketAddr> = axum_server::Handle::new();
    let acceptor = axum_server::tls_rustls::RustlsAcceptor::new(rustls_cfg.clone())
        .handshake_timeout(cfg.idle_timeout)
        .acceptor(axum_server::accept::NoDelayAcceptor::new());
    let acceptor = guard::Guard::new(acceptor, cfg.idle_timeout);
    let mut server = axum_server::bind(cfg.addr).acceptor(acceptor).handle(handle.clone());
    server.http_builder().http1().timer(hyper_util::rt::TokioTimer::new()).header_read_timeout(cfg.idle_timeout);
    server
        .http_builder()
        .http2()
        .timer(hyper_util::rt::TokioTimer::new())
        .keep_alive_interval(cfg.idle_timeout)
        .keep_alive_timeout(cfg.idle_timeout);
    let front = Front { state: state.clone(), router: app, limits: (cfg.body_limit, cfg.idle_timeout) };
    // A clone of the front door for each connection (axum's make-service; the request type named
    // only picks the impl: `Front` serves hyper's requests as well).
    let front = axum::ServiceExt::<Request>::into_make_service(front);
    let task = tokio::spawn(async move { server.serve(front).await });
    let addr = handle.listening().await.ok_or(ServerError::Listen(cfg.addr))?;
    let metrics_addr = match cfg.metrics_addr {
        Some(a) => {
            let metrics_err = |source| ServerError::Metrics { addr: a, source };
            let listener = tokio::net::TcpListener::bind(a).await.map_err(metrics_err)?;
            let bound = listener.local_addr().map_err(metrics_err)?;
            let app = Router::new().route("/metrics", get(metrics_handler)).with_state(state.clone());
            tokio::spawn(async move { axum::serve(listener, app).await });
            Some(bound)
        }
        None => None,
    };
    // Watch policy and certificate files.
    let file_certs = !matches!(cfg.tls, TlsSource::Pem { .. });
    {
        let state = state.clone();
        let loader = loader.clone();
        let watch = cfg.watch.clone();
        let certs = if file_certs { vec![cert.clone(), key.clone()] } else { Vec::new() };
        let rustls_cfg = rustls_cfg.clone();
        let interval = cfg.poll_interval;
        // File system work (listing, reading, compiling) runs on the blocking pool, one round
        // at a time: a slow or odd file can delay a reload, never an admission request.
        let watcher = Arc::new(std::sync::Mutex::new((fingerprint(&watch), fingerprint(&certs))));
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(interval).await;
                let (state, loader, watch, certs, rustls_cfg, watcher) =
                    (state.clone(), loader.clone(), watch.clone(), certs.clone(), rustls_cfg.clone(), watcher.clone());
                let round = tokio::task::spawn_blocking(move || {
                    let mut seen = watcher.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                    let now = fingerprint(&watch);
                    if now != seen.0 {
                        seen.0 = now;
                        let _ = reload(&state, &loader);
                    }
                    let now = fingerprint(&certs);
                    if now != seen.1
                        && let (Some(c), Some(k)) = (certs.first(), certs.get(1))
                    {
                        seen.1 = now;
                        match tls::server_config(c, k) {
                            Ok(c) => {
                                rustls_cfg.reload_from_config(c);
                                tracing::info!("serving certificate reloaded");
                            }
                            Err(e) => {
                                tracing::error!(error = %e, "certificate reload failed; keeping the previous one")
                            }
                        }
                    }
                });
                if round.await.is_err() {
                    tracing::error!("the policy and certificate watch panicked; retrying");
                }
            }
        });
    }
    Ok(Running { addr, metrics_addr, ca_path, handle, task, state, loader, rustls: rustls_cfg })
}

/// Runs until SIGTERM or Ctrl-C, reloading policies on SIGHUP; drains in-flight requests.
pub async fn serve(cfg: Config, loader: Loader) -> Result<(), ServerError> {
    serve_with(cfg, loader, None).await
}

/// [`serve`], with what the engine reads from outside (image verification, for one).
pub async fn serve_with(
    cfg: Config,
    loader: Loader,
    data: Option<Arc<dyn verno_engine::Data + Send + Sync>>,
) -> Result<(), ServerError> {
    let running = start(cfg, loader).await?;
    if let Some(d) = data {
        running.set_data(d);
    }
    tracing::info!(addr = %running.addr, metrics = ?running.metrics_addr, "verno admission server listening");
    if let Some(ca) = &running.ca_path {
        eprintln!("CA bundle for the webhook caBundle: {}", ca.display());
    }
    wait_for_signals(&running).await;
    tracing::info!("shutting down: draining in-flight requests");
    running.shutdown(Duration::from_secs(10)).await;
    Ok(())
}

#[cfg(unix)]
async fn wait_for_signals(running: &Running) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut hup)) = (signal(SignalKind::terminate()), signal(SignalKind::hangup())) else {
        let _ = tokio::signal::ctrl_c().await;
        return;
    };
    loop {
        tokio::select! {
            _ = term.recv() => return,
            _ = tokio::signal::ctrl_c() => return,
            _ = hup.recv() => {
                let (state, loader) = (running.state.clone(), running.loader.clone());
                let _ = tokio::task::spawn_blocking(move || reload(&state, &loader)).await;
            }
        }
    }
}

#[cfg(not(unix))]
async fn wait_for_signals(_running: &Running) {
    let _ = tokio::signal::ctrl_c().await;
}

/// Resolves on SIGTERM or Ctrl-C.
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}

/// Logging to stderr: `RUST_LOG` (default info), JSON when asked; colours only on a terminal
/// (a Pod's log or a file gets plain text).
pub fn init_logging(json_logs: bool) {
    use std::io::IsTerminal as _;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    let _ = if json_logs { builder.json().try_init() } else { builder.try_init() };
}

/// Sets up logging (`RUST_LOG`, default info; JSON when asked) and runs the server on a
/// multi-threaded runtime. Returns the process exit code.
pub fn run(cfg: Config, loader: Loader, json_logs: bool) -> i32 {
    run_with(cfg, loader, json_logs, None)
}

/// The stack of each of the runtime's threads. The engine walks values recursively (patterns,
/// merges, diffs, comparisons), one frame or a few per level of nesting, and requests carry
/// objects up to [`admission::MAX_DEPTH`] levels deep: tokio's 2 MiB default does not hold that
/// in a debug build. Untouched stack pages cost no memory.
pub const THREAD_STACK: usize = 32 << 20;

/// The runtime the webhook server runs on (and the in-cluster controllers beside it): threads
/// with [`THREAD_STACK`] stacks.
pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread().enable_all().thread_stack_size(THREAD_STACK).build()
}

/// [`run`], with what the engine reads from outside.
pub fn run_with(
    cfg: Config,
    loader: Loader,
    json_logs: bool,
    data: Option<Arc<dyn verno_engine::Data + Send + Sync>>,
) -> i32 {
    init_logging(json_logs);
    let rt = match runtime() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("Error: cannot start the runtime: {e}");
            return 2;
        }
    };
    match rt.block_on(serve_with(cfg, loader, data)) {
        Ok(()) => 0,
        Err(e) => {
            // Each error's message carries its cause.
            eprintln!("Error: {e}");
            2
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)] // a test fails by panicking

    use super::*;
    use http_body_util::{BodyExt, Full};
    use serde_json::json;

    /// A validate policy (Enforce) and a mutate policy, both for Pods.
    fn set() -> PolicySet {
        let docs = [
            json!({"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy", "metadata": {"name": "require-team"},
                "spec": {"validationFailureAction": "Enforce", "rules": [{"name": "check-team",
                    "match": {"any": [{"resources": {"kinds": ["Pod"]}}]},
                    "validate": {"message": "label 'team' is required",
                        "pattern": {"metadata": {"labels": {"team": "?*"}}}}}]}}),
            json!({"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy", "metadata": {"name": "add-tier"},
                "spec": {"rules": [{"name": "default-tier",
                    "match": {"any": [{"resources": {"kinds": ["Pod"]}}]},
                    "mutate": {"patchStrategicMerge": {"metadata": {"labels": {"+(tier)": "standard"}}}}}]}}),
        ];
        let policies = docs
            .iter()
            .map(|d| match verno_engine::compile(d, &[]).unwrap() {
                verno_engine::Compiled::Policy(p) => Arc::new(p),
                verno_engine::Compiled::Exception(_) => panic!("not a policy"),
            })
            .collect();
        PolicySet::new(policies, Vec::new())
    }

    fn review(uid: &str, labels: serde_json::Value) -> Vec<u8> {
        serde_json::to_vec(&json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
            "uid": uid, "kind": {"group": "", "version": "v1", "kind": "Pod"}, "operation": "CREATE",
            "namespace": "shop", "name": "web", "userInfo": {"username": "alice"},
            "object": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "namespace": "shop", "labels": labels},
                "spec": {"containers": [{"name": "web", "image": "nginx:1.27"}]}}}}))
        .unwrap()
    }

    fn config() -> Config {
        Config {
            tls: TlsSource::Dir { dir: PathBuf::new(), dns_names: Vec::new() },
            body_limit: 4096,
            deadline: Duration::from_secs(5),
            max_concurrency: 2,
            poll_interval: Duration::from_secs(1),
            ..Config::default()
        }
    }

    /// Status, headers (but the length, which the router sets and hyper writes either way) and
    /// body of the answer.
    async fn answer<S>(svc: &mut S, method: &str, path: &str, ct: &str, body: Vec<u8>) -> (u16, String, Bytes)
    where
        S: tower_service::Service<http::Request<Full<Bytes>>, Response = Response, Error = std::convert::Infallible>,
    {
        let req = http::Request::builder()
            .method(method)
            .uri(path)
            .header(header::CONTENT_TYPE, ct)
            .body(Full::new(Bytes::from(body)))
            .unwrap();
        let resp = svc.call(req).await.unwrap();
        let status = resp.status().as_u16();
        let headers =
            format!("{:?}", resp.headers().iter().filter(|(k, _)| *k != header::CONTENT_LENGTH).collect::<Vec<_>>());
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        (status, headers, body)
    }

    /// The counters of the metrics (histograms' buckets and sums hold times, which differ).
    fn counts(state: &AppState) -> Vec<String> {
        state
            .metrics
            .encode()
            .lines()
            .filter(|l| !l.contains("_bucket") && !l.contains("_sum"))
            .map(String::from)
            .collect()
    }

    #[tokio::test]
    async fn the_front_door_answers_as_the_router_does() {
        let cfg = config();
        let (by_router, by_front) = (new_state(&cfg, set(), 0), new_state(&cfg, set(), 0));
        let limits = (cfg.body_limit, cfg.idle_timeout);
        let mut front = Front { state: by_front.clone(), router: router(by_front.clone(), limits.0, limits.1), limits };
        let mut router = router(by_router.clone(), limits.0, limits.1);
        let json = "application/json";
        let cases: Vec<(&str, &str, &str, Vec<u8>)> = vec![
            ("POST", "/validate", json, review("u-1", json!({}))),
            (
                "POST",
                "/validate/fail?timeout=10s",
                "application/json; charset=utf-8",
                review("u-2", json!({"team": "a"})),
            ),
            ("POST", "/validate/ignore", json, review("u-3", json!({}))),
            ("POST", "/validate/ignore", "text/plain", review("u-4", json!({}))),
            ("POST", "/mutate", json, review("u-5", json!({"team": "a"}))),
            ("POST", "/mutate/fail", json, b"{\"request\": ".to_vec()),
            ("POST", "/mutate/ignore", json, vec![b' '; 5000]),
            ("POST", "/mutate/ignore", json, br#"{"request": {"uid": ""}}"#.to_vec()),
            ("GET", "/validate", json, Vec::new()),
            ("POST", "/validate/", json, review("u-6", json!({}))),
            ("POST", "/vpol", json, review("u-7", json!({}))),
            ("POST", "/health/liveness", json, Vec::new()),
        ];
        for (method, path, ct, body) in cases {
            let want = answer(&mut router, method, path, ct, body.clone()).await;
            let got = answer(&mut front, method, path, ct, body).await;
            assert_eq!(got, want, "{method} {path} ({ct})");
        }
        // The same requests were counted under the same webhooks.
        assert_eq!(counts(&by_front), counts(&by_router));
        assert!(counts(&by_front).iter().any(|l| l.contains("validate-fail")), "{:?}", counts(&by_front));
    }

    /// A reload the loader refuses says what the loader said, keeps the loader's error as its
    /// source (a caller can tell I/O from a broken policy), and leaves the set in force.
    #[test]
    fn a_refused_reload_keeps_the_loaders_error_and_the_old_set() {
        let state = new_state(&Config::default(), PolicySet::default(), 0);
        let loader: Loader =
            Arc::new(|| Err(std::io::Error::new(std::io::ErrorKind::NotFound, "policies/a.yaml: missing").into()));
        let e = reload(&state, &loader).unwrap_err();
        assert_eq!(e.to_string(), "policies/a.yaml: missing");
        let io = std::error::Error::source(&e).and_then(|s| s.downcast_ref::<std::io::Error>());
        assert_eq!(io.map(std::io::Error::kind), Some(std::io::ErrorKind::NotFound));
        assert!(state.set.read().unwrap().policies().is_empty());
    }

    #[test]
    fn the_kyverno_paths_are_routed_by_their_hook_and_failure_policy() {
        let route = |p: &str| kyverno_path(p, false).map(|(r, w)| (format!("{r:?}"), w));
        assert_eq!(
            route("/validate/fail"),
            Some((format!("{:?}", Route::Kyverno(Hook::Validate, Filter::Fail)), "validate-fail"))
        );
        assert_eq!(
            route("/mutate/ignore"),
            Some((format!("{:?}", Route::Kyverno(Hook::Mutate, Filter::Ignore)), "mutate-ignore"))
        );
        assert_eq!(route("/mutate"), Some((format!("{:?}", Route::Kyverno(Hook::Mutate, Filter::All)), "mutate")));
        for other in ["/validate/", "/validate/fail/x", "/vpol", "/Validate", ""] {
            assert_eq!(route(other), None, "{other}");
        }
    }

    /// The cluster's answers to Kyverno's policy-admission permission checks: the first rule
    /// whose account lacks a verb refuses the policy in Kyverno's words; a check the cluster
    /// cannot answer refuses nothing.
    #[tokio::test]
    async fn a_policy_whose_controller_lacks_permissions_is_refused_in_kyvernos_words() {
        use verno_engine::access_checks::{AccessCheck, Account};
        struct Cluster;
        impl AccessReview for Cluster {
            fn user(&self, _: Account) -> String {
                "system:serviceaccount:kyverno:kyverno-background-controller".into()
            }
            fn lacking<'a>(&'a self, check: &'a AccessCheck) -> verno_engine::access_checks::Answer<'a> {
                Box::pin(async move {
                    match check.kind.as_str() {
                        "ConfigMap" => Ok(Vec::new()),
                        "Secret" => Ok(check.verbs.iter().copied().filter(|v| *v != "get").collect()),
                        _ => Err("no such kind".to_string()),
                    }
                })
            }
        }
        let policy = |kind: &str| {
            serde_json::json!({"spec": {"rules": [{"name": "g", "generate": {"apiVersion": "v1", "kind": kind,
                "namespace": "team", "name": "x", "data": {}}}]}})
        };
        assert_eq!(access_refusal(&Cluster, &policy("ConfigMap")).await, None);
        assert_eq!(access_refusal(&Cluster, &policy("Unknown")).await, None);
        assert_eq!(
            access_refusal(&Cluster, &policy("Secret")).await.as_deref(),
            Some(
                "path: spec.rules[0].generate..: system:serviceaccount:kyverno:kyverno-background-controller requires permissions create for resource v1/Secret in namespace team"
            )
        );
    }
}
