//! `verno serve`: the admission webhook server on policies read from files.
//! The server is `verno_server`; this only turns flags and files into its configuration.

use crate::load::{self, load_exceptions, load_policies};
use serde_json::Value;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use verno_engine::PolicySet;
use verno_engine::string_map;
use verno_server::{Config, Loader, TlsSource};

#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// ClusterPolicy / Policy / PolicyException files or directories (an empty directory is
    /// valid: everything is allowed). Watched: changes are compiled and swapped in.
    #[arg(long = "policies", num_args = 1.., required_unless_present = "kube")]
    pub policies: Vec<PathBuf>,
    /// Run in a cluster: policies, exceptions and namespace labels come from the API server,
    /// the certificate from its Secrets; the Lease holder manages webhook rules and status.
    #[arg(long, conflicts_with_all = ["policies", "tls_cert", "namespace_labels"])]
    pub kube: bool,
    /// In-cluster: Verno's namespace.
    #[arg(long, env = "POD_NAMESPACE", default_value = "verno")]
    pub namespace: String,
    /// In-cluster: this replica's name.
    #[arg(long, env = "POD_NAME", default_value = "verno-0")]
    pub identity: String,
    /// In-cluster: the webhook Service (the serving certificate is made for its DNS names and
    /// names its Secrets). Default: `verno-svc`, or Kyverno's `kyverno-svc` with
    /// `--kyverno-names true` (the Service `verno manifests` renders for each).
    #[arg(long)]
    pub service: Option<String>,
    /// In-cluster, run outside the cluster (Kyverno's --serverIP): the `https://HOST:PORT` the
    /// webhooks call (see `verno manifests --server-url`); the serving certificate is made for
    /// HOST too. Serve on it with --addr.
    #[arg(long = "server-url", requires = "kube", value_parser = crate::cluster_cmd::parse_server_url)]
    pub server_url: Option<String>,
    /// In-cluster: Verno's Deployment; deleted or scaled to zero, the webhook rules are emptied.
    #[arg(long)]
    pub deployment: Option<String>,
    /// In-cluster: the ClusterRole the webhook configurations name as owner.
    #[arg(long = "owner-cluster-role")]
    pub owner_cluster_role: Option<String>,
    /// In-cluster: PolicyViolation events waiting to be written, per replica (Kyverno's
    /// --maxQueuedEvents); more are dropped and counted. 0 turns admission events off.
    #[arg(long = "max-queued-events", default_value_t = 1000)]
    pub max_queued_events: usize,
    /// In-cluster: event reasons never written, comma-separated (Kyverno's --omitEvents, whose
    /// chart default this is): PolicyViolation, PolicyApplied, PolicyError, PolicySkipped.
    /// An empty value writes them all.
    #[arg(long = "omit-events", default_value = "PolicyApplied,PolicySkipped", value_parser = parse_omit_events)]
    pub omit_events: std::collections::BTreeSet<String>,
    /// In-cluster: write PolicyReports from admission results (Kyverno's --admissionReports).
    #[arg(long = "admission-reports", default_value_t = true, action = clap::ArgAction::Set)]
    pub admission_reports: bool,
    /// In-cluster: write `openreports.io/v1alpha1` Reports and ClusterReports instead of
    /// `wgpolicyk8s.io` PolicyReports (Kyverno's --openreportsEnabled).
    #[arg(long = "openreports", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub openreports: bool,
    /// In-cluster: the leader scans stored objects against background policies and keeps their
    /// PolicyReports (Kyverno's --backgroundScan).
    #[arg(long = "background-scan", default_value_t = true, action = clap::ArgAction::Set)]
    pub background_scan: bool,
    /// In-cluster: the leader applies generate and mutate-existing rules (Kyverno's background
    /// controller), level-based, without UpdateRequests.
    #[arg(long = "background-controller", default_value_t = true, action = clap::ArgAction::Set)]
    pub background_controller: bool,
    /// In-cluster: the leader runs cleanup and deleting policies on their schedules and deletes
    /// objects whose cleanup.kyverno.io/ttl label expired (Kyverno's cleanup controller).
    #[arg(long = "cleanup-controller", default_value_t = true, action = clap::ArgAction::Set)]
    pub cleanup_controller: bool,
    /// In-cluster: the ServiceAccount (in --namespace) the background controller acts as, by
    /// impersonation, so that it holds only its own permissions as in Kyverno; "" acts as
    /// Verno's own account.
    #[arg(long = "background-account", default_value = verno_controller::manifests::BACKGROUND_ACCOUNT)]
    pub background_account: String,
    /// In-cluster: the ServiceAccount the cleanup and TTL controllers act as (as above).
    #[arg(long = "cleanup-account", default_value = verno_controller::manifests::CLEANUP_ACCOUNT)]
    pub cleanup_account: String,
    /// In-cluster: cleanup and deleting policies never delete objects labelled
    /// app.kubernetes.io/managed-by=kyverno (Kyverno's --protectManagedResources).
    #[arg(long = "protect-managed-resources", default_value_t = false, action = clap::ArgAction::Set)]
    pub protect_managed_resources: bool,
    /// In-cluster: seconds between re-discoveries of the resources the TTL controller watches
    /// (Kyverno's --ttlReconciliationInterval, 1 minute).
    #[arg(long = "ttl-reconciliation-interval-seconds", default_value_t = 60)]
    pub ttl_reconciliation_interval_seconds: u64,
    /// In-cluster: deletions per second of the cleanup and TTL controllers.
    #[arg(long = "cleanup-deletes-per-second", default_value_t = 100.0)]
    pub cleanup_deletes_per_second: f64,
    /// In-cluster: the background controller's writes per second (creates, updates, deletes).
    #[arg(long = "background-writes-per-second", default_value_t = 300.0)]
    pub background_writes_per_second: f64,
    /// In-cluster: seconds between full rescans of every watched kind (Kyverno's
    /// --backgroundScanInterval, there an hour); 0, the default, evaluates only changes.
    #[arg(long = "background-scan-interval-seconds", default_value_t = 0)]
    pub background_scan_interval_seconds: u64,
    /// In-cluster: the ConfigMap in Verno's namespace with Kyverno's dynamic configuration keys
    /// (Verno reads `generateSuccessEvents` and `successEventActions`), followed live.
    #[arg(long = "config-map", default_value = "verno-config")]
    pub config_map: String,
    /// In-cluster: seconds between end-to-end probes (the leader's update of the verno-health
    /// Lease through the monitor webhook); 0 turns the probe off.
    #[arg(long = "probe-interval-seconds", default_value_t = 30)]
    pub probe_interval_seconds: u64,
    /// In-cluster: answer `configMap` context entries for ConfigMaps labelled
    /// `cache.kyverno.io/enabled` from a watch (Kyverno's `--enableConfigMapCaching`).
    #[arg(long = "config-map-caching", default_value_t = true, action = clap::ArgAction::Set)]
    pub config_map_caching: bool,
    /// In-cluster: write a ValidatingAdmissionPolicy and its binding for each ClusterPolicy
    /// whose single rule is `validate.cel` with `generate: true`, and each ValidatingPolicy with
    /// `autogen.validatingAdmissionPolicy.enabled`; the API server then enforces it and Verno
    /// does not (Kyverno's `--generateValidatingAdmissionPolicy`).
    #[arg(long = "generate-validating-admission-policy", default_value_t = true, action = clap::ArgAction::Set)]
    pub generate_validating_admission_policy: bool,
    /// In-cluster: the webhook configurations carry Kyverno's names
    /// (`kyverno-resource-validating-webhook-cfg`, `kyverno-resource-mutating-webhook-cfg`), as
    /// the installer rendered them (the chart's `kyvernoNames`).
    #[arg(long = "kyverno-names", default_value_t = false, action = clap::ArgAction::Set)]
    pub kyverno_names: bool,
    /// In-cluster: every policy is fail-open whatever its `failurePolicy` (Kyverno's
    /// `--forceFailurePolicyIgnore`, the chart's `features.forceFailurePolicyIgnore.enabled`).
    #[arg(long = "force-failure-policy-ignore", default_value_t = false, action = clap::ArgAction::Set)]
    pub force_failure_policy_ignore: bool,
    /// In-cluster: background scans also report the MutatingAdmissionPolicies labelled
    /// `reports.kyverno.io/enabled: "true"` (Kyverno's `--mutatingAdmissionPolicyReports`, the
    /// chart's `features.mutatingAdmissionPolicyReports.enabled`).
    #[arg(long = "mutating-admission-policy-reports", default_value_t = false, action = clap::ArgAction::Set)]
    pub mutating_admission_policy_reports: bool,
    /// Cache passing image verifications (Kyverno's `--imageVerifyCacheEnabled`).
    #[arg(long = "image-verify-cache", default_value_t = true, action = clap::ArgAction::Set)]
    pub image_verify_cache: bool,
    /// How long a cached image verification holds (Kyverno's `--imageVerifyCacheTTLDuration`,
    /// 60 minutes; 0: the default).
    #[arg(long = "image-verify-cache-ttl-seconds", default_value_t = 3600)]
    pub image_verify_cache_ttl_seconds: u64,
    /// The most cached image verifications (Kyverno's `--imageVerifyCacheMaxSize`).
    #[arg(long = "image-verify-cache-max-size", default_value_t = 1000)]
    pub image_verify_cache_max_size: usize,
    /// Put PolicyExceptions (kyverno.io and policies.kyverno.io) in force (Kyverno's
    /// `--enablePolicyException`; off by default, as in Kyverno's chart).
    #[arg(long = "enable-policy-exception", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub enable_policy_exception: bool,
    /// The namespace PolicyExceptions are read from (Kyverno's `--exceptionNamespace`); empty or
    /// `*`: every namespace.
    #[arg(long = "exception-namespace", default_value = "")]
    pub exception_namespace: String,
    /// Hostnames and address ranges CEL's `http.Get/Post` may not reach, comma-separated
    /// (Kyverno's `--httpBlocklist`); replaces the default, Kyverno's: the cloud metadata
    /// addresses and names, and loopback.
    #[arg(long = "http-blocklist", value_delimiter = ',', default_values_t = verno_controller::cel_http::DEFAULT_BLOCKLIST.iter().map(|s| s.to_string()))]
    pub http_blocklist: Vec<String>,
    /// URL prefixes (scheme, host, optional path) CEL's `http.Get/Post` is held to,
    /// comma-separated (Kyverno's `--httpAllowlist`); none: any URL the blocklist lets through.
    #[arg(long = "http-allowlist", value_delimiter = ',')]
    pub http_allowlist: Vec<String>,
    /// HTTPS address for the webhook endpoints and health probes.
    #[arg(long, default_value = "0.0.0.0:9443")]
    pub addr: SocketAddr,
    /// Plain-HTTP address for `/metrics` (`off` disables it).
    #[arg(long = "metrics-addr", default_value = "0.0.0.0:8000")]
    pub metrics_addr: String,
    /// Serving certificate (PEM); reloaded when the file changes.
    #[arg(long = "tls-cert", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// Serving key (PEM).
    #[arg(long = "tls-key", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Without --tls-cert: where the self-made CA and serving pair are kept across restarts.
    #[arg(long = "tls-dir", default_value = "verno-tls")]
    pub tls_dir: PathBuf,
    /// Names (and IPs) for the self-made serving certificate.
    #[arg(long = "dns-name", default_values_t = ["localhost".to_string(), "127.0.0.1".to_string()])]
    pub dns_names: Vec<String>,
    /// Namespace labels for namespaceSelector: Namespace objects, or a map name → labels.
    #[arg(long = "namespace-labels")]
    pub namespace_labels: Option<PathBuf>,
    /// Largest request body in bytes (413 above). The API server sends the object (up to its
    /// own 3 MiB request limit) and, on UPDATE, the stored old object (up to etcd's 1.5 MiB):
    /// a review it can send is never refused for its size.
    #[arg(long = "max-body-bytes", default_value_t = 6 * 1024 * 1024)]
    pub max_body_bytes: usize,
    /// Evaluation deadline per request, in milliseconds (keep it below the webhook timeout).
    #[arg(long = "deadline-ms", default_value_t = 8000)]
    pub deadline_ms: u64,
    /// Evaluations running at once (default: twice the CPUs).
    #[arg(long = "max-concurrency")]
    pub max_concurrency: Option<usize>,
    /// Requests up to this many bytes are evaluated where they arrive, without a hand-off to
    /// the blocking pool, when every policy that answers them is self-contained (ClusterPolicy
    /// and Policy rules without apiCall, configMap, globalReference or imageRegistry context,
    /// image verification, generate or CEL); 0 sends every request to the pool.
    #[arg(long = "inline-max-body-bytes", default_value_t = verno_server::INLINE_BODY_MAX)]
    pub inline_max_body_bytes: usize,
    /// Seconds a connection may take for its TLS handshake or a request's headers, and the
    /// HTTP/2 keep-alive interval; idle connections are closed after it.
    #[arg(long = "idle-timeout-seconds", default_value_t = 10)]
    pub idle_timeout_seconds: u64,
    /// Log format: text or json.
    #[arg(long = "log-format", default_value = "text")]
    pub log_format: String,
}

/// Why [`load_set`] refused the policies; the text names the file and field.
#[derive(Debug, thiserror::Error)]
pub enum LoadSetError {
    /// Reading or parsing a file, or an exception in it (the error with its context).
    #[error("{0:#}")]
    Read(anyhow::Error),
    #[error("policy {name} is invalid: {why}")]
    Invalid { name: String, why: String },
    /// Two documents for one policy: which one is in force would depend on file order.
    #[error("{kind} {key} is defined more than once")]
    Duplicate { kind: String, key: String },
}

/// Each namespace's labels.
type NamespaceLabels = BTreeMap<String, BTreeMap<String, String>>;

fn namespace_labels(path: &Path) -> anyhow::Result<NamespaceLabels> {
    let docs = load::read_docs(path)?;
    let mut out = BTreeMap::new();
    let strings = |v: Option<&Value>| string_map(v.and_then(Value::as_object));
    for d in docs {
        if load::kind(&d.value) == "Namespace" {
            let name = d.value.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("").to_string();
            out.insert(name, strings(d.value.pointer("/metadata/labels")));
        } else if let Some(m) = d.value.as_object() {
            for (ns, labels) in m {
                out.insert(ns.clone(), strings(Some(labels)));
            }
        }
    }
    Ok(out)
}

/// Reads and compiles every policy and exception under `paths`.
pub fn load_set(paths: &[PathBuf], ns_labels: Option<&Path>) -> Result<PolicySet, LoadSetError> {
    let mut docs = Vec::new();
    for p in paths {
        if p.is_dir() && std::fs::read_dir(p).map(|mut d| d.next().is_none()).unwrap_or(false) {
            continue;
        }
        docs.extend(load::read_docs(p).map_err(LoadSetError::Read)?);
    }
    let exceptions = load_exceptions(&docs).map_err(LoadSetError::Read)?;
    let loaded = load_policies(docs);
    if let Some(i) = loaded.invalid.first() {
        return Err(LoadSetError::Invalid { name: i.key.clone(), why: i.reason.clone() });
    }
    // Two documents for one policy: which one is in force would depend on file order.
    let mut seen = std::collections::BTreeSet::new();
    for p in &loaded.compiled {
        if !seen.insert((p.kind, p.key())) {
            return Err(LoadSetError::Duplicate { kind: p.kind.to_string(), key: p.key().to_string() });
        }
    }
    for (name, why) in &loaded.unsupported {
        tracing::warn!(policy = %name, "{why}");
    }
    let namespace_labels = match ns_labels {
        Some(p) => namespace_labels(p).map_err(LoadSetError::Read)?,
        None => BTreeMap::new(),
    };
    Ok(PolicySet::new(loaded.compiled, exceptions).with_namespace_labels(namespace_labels))
}

pub fn run(args: &ServeArgs) -> i32 {
    let metrics_addr = if args.metrics_addr == "off" {
        None
    } else {
        match args.metrics_addr.parse::<SocketAddr>() {
            Ok(a) => Some(a),
            Err(e) => {
                eprintln!("Error: --metrics-addr {:?}: {e}", args.metrics_addr);
                return 2;
            }
        }
    };
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => TlsSource::Files { cert: cert.clone(), key: key.clone() },
        _ => TlsSource::Dir { dir: args.tls_dir.clone(), dns_names: args.dns_names.clone() },
    };
    let mut watch = args.policies.clone();
    watch.extend(args.namespace_labels.iter().cloned());
    let cfg = Config {
        addr: args.addr,
        metrics_addr,
        tls,
        body_limit: args.max_body_bytes,
        deadline: Duration::from_millis(args.deadline_ms),
        max_concurrency: args
            .max_concurrency
            .unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get() * 2).unwrap_or(4)),
        inline_body_max: args.inline_max_body_bytes,
        idle_timeout: Duration::from_secs(args.idle_timeout_seconds.max(1)),
        watch,
        poll_interval: Duration::from_secs(2),
    };
    if args.kube {
        verno_server::init_logging(args.log_format == "json");
        let http_rules = match verno_controller::cel_http::HttpRules::new(&args.http_blocklist, &args.http_allowlist) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("Error: invalid CEL http configuration: {e}");
                return 2;
            }
        };
        let mut opts = verno_controller::Options::new(&args.namespace, &args.identity);
        opts.http_rules = std::sync::Arc::new(http_rules);
        opts.exceptions = verno_controller::policies::ExceptionScope {
            enabled: args.enable_policy_exception,
            namespace: args.exception_namespace.clone(),
        };
        opts.service = args.service_name().to_string();
        opts.serving_names = args.server_url.iter().map(|u| crate::cluster_cmd::server_host(u)).collect();
        opts.deployment = args.deployment.clone();
        opts.owner_cluster_role = args.owner_cluster_role.clone();
        opts.max_queued_events = args.max_queued_events;
        opts.omit_events = args.omit_events.clone();
        if !args.admission_reports {
            opts.admission_reports = None;
        }
        opts.openreports = args.openreports;
        opts.background_scan = args.background_scan.then(|| verno_controller::scan::ScanOptions {
            rescan: (args.background_scan_interval_seconds > 0)
                .then(|| Duration::from_secs(args.background_scan_interval_seconds)),
            ..Default::default()
        });
        opts.background = args.background_controller.then(|| verno_controller::background::BackgroundOptions {
            writes_per_second: args.background_writes_per_second.max(1.0),
            burst: args.background_writes_per_second.max(1.0),
            ..Default::default()
        });
        let deletes = args.cleanup_deletes_per_second.max(1.0);
        opts.cleanup = args.cleanup_controller.then(|| verno_controller::cleanup::CleanupOptions {
            protect_managed: args.protect_managed_resources,
            deletes_per_second: deletes,
            burst: deletes * 2.0,
            ..Default::default()
        });
        opts.ttl = args.cleanup_controller.then(|| verno_controller::ttl::TtlOptions {
            interval: Duration::from_secs(args.ttl_reconciliation_interval_seconds.max(1)),
            deletes_per_second: deletes,
            burst: deletes * 2.0,
            ..Default::default()
        });
        opts.config_map = (!args.config_map.is_empty()).then(|| args.config_map.clone());
        opts.image_verify_cache = image_cache(args);
        opts.config_map_cache = args.config_map_caching;
        opts.generate_validating_admission_policies = args.generate_validating_admission_policy;
        opts.webhook_names = verno_controller::webhooks::ConfigNames::of(args.kyverno_names);
        opts.force_failure_policy_ignore = args.force_failure_policy_ignore;
        opts.mutating_admission_policy_reports = args.mutating_admission_policy_reports;
        opts.probe_interval =
            (args.probe_interval_seconds > 0).then(|| Duration::from_secs(args.probe_interval_seconds));
        let rt = match verno_server::runtime() {
            Ok(rt) => rt,
            Err(e) => {
                eprintln!("Error: cannot start the runtime: {e}");
                return 2;
            }
        };
        let accounts = crate::in_cluster::Accounts {
            background: args.background_account.clone(),
            cleanup: args.cleanup_account.clone(),
        };
        return match rt.block_on(crate::in_cluster::run(cfg, opts, accounts)) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("Error: {e:#}");
                2
            }
        };
    }
    let paths = args.policies.clone();
    let ns = args.namespace_labels.clone();
    let loader: Loader = Arc::new(move || load_set(&paths, ns.as_deref()).map_err(verno_server::LoadError::from));
    // verifyImages rules talk to registries; passes are cached as in a cluster (no Secrets
    // here: registry credentials and `keys.secret` need `--kube`). The registry client starts
    // on the first image to verify.
    let data: Arc<dyn verno_engine::Data + Send + Sync> =
        Arc::new(ImagesOnly { cache: image_cache(args), verifier: std::sync::OnceLock::new() });
    verno_server::run_with(cfg, loader, args.log_format == "json", Some(data))
}

/// The image verification cache the flags ask for (TTL, entries).
fn image_cache(args: &ServeArgs) -> Option<(Duration, usize)> {
    args.image_verify_cache
        .then(|| (Duration::from_secs(args.image_verify_cache_ttl_seconds), args.image_verify_cache_max_size))
}

/// `verno serve --policies`: the engine's data port knows registries only.
struct ImagesOnly {
    cache: Option<(Duration, usize)>,
    verifier: std::sync::OnceLock<Option<Arc<verno_images::Verifier>>>,
}

impl verno_engine::Data for ImagesOnly {
    fn image_verifier(&self) -> Option<Arc<dyn verno_engine::verify_images::ImageVerifier>> {
        self.verifier
            .get_or_init(|| match verno_images::Verifier::new() {
                Ok(v) => Some(Arc::new(match self.cache {
                    Some((ttl, size)) => v.with_cache(verno_images::Cache::new(ttl, size)),
                    None => v,
                })),
                Err(e) => {
                    tracing::warn!("image verification is not available: {e}");
                    None
                }
            })
            .clone()
            .map(|v| v as Arc<dyn verno_engine::verify_images::ImageVerifier>)
    }
}

/// An `--omit-events` entry that is none of Kyverno's event reasons.
#[derive(Debug, thiserror::Error)]
#[error("unknown event reason {reason:?} (known: {})", known.join(", "))]
struct UnknownReason {
    reason: String,
    known: &'static [&'static str],
}

/// `--omit-events`: a comma-separated list of Kyverno's event reasons.
fn parse_omit_events(v: &str) -> Result<std::collections::BTreeSet<String>, UnknownReason> {
    const REASONS: [&str; 4] = ["PolicyViolation", "PolicyApplied", "PolicyError", "PolicySkipped"];
    v.split(',')
        .map(str::trim)
        .filter(|r| !r.is_empty())
        .map(|r| {
            if REASONS.contains(&r) {
                Ok(r.to_string())
            } else {
                Err(UnknownReason { reason: r.to_string(), known: &REASONS })
            }
        })
        .collect()
}

impl ServeArgs {
    /// The webhook Service: `--service`, else the one `verno manifests` renders (Kyverno's
    /// name with `--kyverno-names true`). A certificate made for another name than the one the
    /// webhook configurations call fails every call (a fail-closed webhook then denies).
    fn service_name(&self) -> &str {
        match &self.service {
            Some(s) => s,
            None if self.kyverno_names => verno_controller::manifests::KYVERNO_SERVICE,
            None => verno_controller::manifests::SERVICE,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_service_follows_the_names_unless_given() {
        use clap::Parser as _;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            serve: ServeArgs,
        }
        let parse = |args: &[&str]| {
            let mut all = vec!["verno", "--kube"];
            all.extend_from_slice(args);
            Cli::try_parse_from(all).unwrap_or_else(|e| panic!("{e}")).serve
        };
        assert_eq!(parse(&[]).service_name(), "verno-svc");
        assert_eq!(parse(&["--kyverno-names", "true"]).service_name(), "kyverno-svc");
        assert_eq!(parse(&["--kyverno-names", "true", "--service", "mine"]).service_name(), "mine");
    }

    /// Issue 14, item 7: two ClusterPolicies with one name both loaded, so which one enforced
    /// depended on file order.
    #[test]
    fn a_policy_defined_twice_is_refused() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let policy = |msg: &str| {
            format!(
                "apiVersion: kyverno.io/v1\nkind: ClusterPolicy\nmetadata:\n  name: team\nspec:\n  rules:\n  - name: r\n    match:\n      any:\n      - resources:\n          kinds: [Pod]\n    validate:\n      message: {msg}\n      deny: {{}}\n"
            )
        };
        for (file, msg) in [("a.yaml", "one"), ("b.yaml", "two")] {
            std::fs::write(dir.path().join(file), policy(msg)).unwrap_or_else(|e| panic!("{e}"));
        }
        let err = load_set(&[dir.path().to_path_buf()], None).err().map(|e| e.to_string());
        assert_eq!(err.as_deref(), Some("ClusterPolicy team is defined more than once"));
        std::fs::remove_file(dir.path().join("b.yaml")).unwrap_or_else(|e| panic!("{e}"));
        assert!(load_set(&[dir.path().to_path_buf()], None).is_ok());
    }
}
