//! `verno manifests`, `verno break-glass`, `verno doctor`: flags in, the controller crate's
//! functions out.

use std::path::PathBuf;
use verno_controller::{manifests, ops};

#[derive(Debug, Clone, clap::Args)]
pub struct ManifestsArgs {
    /// The namespace to install into.
    #[arg(long, short = 'n', default_value = "verno")]
    pub namespace: String,
    /// A values file in the chart's shape, as `helm -f` (repeatable; later files win). Kyverno's
    /// `config.webhooks.namespaceSelector`, `objectSelector` and `config.matchConditions` work.
    #[arg(long = "values", short = 'f')]
    pub values: Vec<PathBuf>,
    /// Chart values, e.g. `admissionController.replicas=3` (repeatable; applied after -f).
    #[arg(long = "set")]
    pub set: Vec<String>,
    /// Write to this file instead of stdout.
    #[arg(long, short = 'o')]
    pub output: Option<PathBuf>,
    /// Print only the CustomResourceDefinitions (ClusterPolicy, Policy, PolicyException,
    /// PolicyReport, ClusterPolicyReport). They are kept apart so that deleting the install
    /// never deletes the CRDs, and with them every policy.
    #[arg(long)]
    pub crds: bool,
    /// Verno runs outside the cluster at this `https://HOST:PORT` (Kyverno's --serverIP): the
    /// webhooks call that URL, and no Deployment or Service is rendered. Run
    /// `verno serve --kube --server-url URL --addr HOST:PORT` with the ServiceAccount's
    /// credentials.
    #[arg(long = "server-url", value_parser = parse_server_url)]
    pub server_url: Option<String>,
}

/// Why a `--server-url` is refused.
#[derive(Debug, thiserror::Error)]
pub enum ServerUrlError {
    #[error("the server URL must start with https://")]
    NotHttps,
    /// The URL as given, which has no host or more than a host and port.
    #[error("{0:?}: expected https://HOST[:PORT] with no path")]
    NotHostPort(String),
}

/// An `https://` URL with a host and nothing after the port.
pub fn parse_server_url(s: &str) -> Result<String, ServerUrlError> {
    let rest = s.strip_prefix("https://").ok_or(ServerUrlError::NotHttps)?;
    let rest = rest.trim_end_matches('/');
    if rest.is_empty() || rest.contains(['/', '?', '#', '@']) {
        return Err(ServerUrlError::NotHostPort(s.to_string()));
    }
    Ok(format!("https://{rest}"))
}

/// The host of a server URL as the serving certificate names it (no port, no brackets).
pub fn server_host(url: &str) -> String {
    let rest = url.trim_start_matches("https://");
    if let Some(v6) = rest.strip_prefix('[') {
        return v6.split(']').next().unwrap_or("").to_string();
    }
    rest.rsplit_once(':').map_or(rest, |(h, _)| h).to_string()
}

#[derive(Debug, Clone, clap::Args)]
pub struct BreakGlassArgs {
    /// Put back the failure policies saved when break-glass was applied.
    #[arg(long)]
    pub restore: bool,
    /// Say what would change without changing it.
    #[arg(long = "dry-run")]
    pub dry_run: bool,
}

#[derive(Debug, Clone, clap::Args)]
pub struct DoctorArgs {
    /// Verno's namespace (where its Lease is).
    #[arg(long, short = 'n', default_value = "verno")]
    pub namespace: String,
}

pub fn manifests(a: &ManifestsArgs) -> i32 {
    let mut values =
        manifests::Values { namespace: a.namespace.clone(), server_url: a.server_url.clone(), ..Default::default() };
    for f in &a.values {
        match values.apply_file(f) {
            Ok(notes) => notes.iter().for_each(|n| eprintln!("note: {n}")),
            Err(e) => {
                eprintln!("Error: {e}");
                return 2;
            }
        }
    }
    for kv in &a.set {
        if let Err(e) = values.set(kv) {
            eprintln!("Error: {e}");
            return 2;
        }
    }
    let docs = if a.crds { verno_controller::crds::all() } else { manifests::render(&values) };
    let yaml = match manifests::to_yaml(&docs) {
        Ok(y) => y,
        Err(e) => {
            eprintln!("Error: rendering the manifests: {e}");
            return 2;
        }
    };
    match &a.output {
        Some(p) => match std::fs::write(p, yaml) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("Error: writing {}: {e}", p.display());
                2
            }
        },
        None => {
            print!("{yaml}");
            0
        }
    }
}

/// Why `break-glass` or `doctor` failed; printed after `Error: `.
#[derive(Debug, thiserror::Error)]
enum ClusterError {
    #[error("cannot start the runtime: {0}")]
    Runtime(std::io::Error),
    #[error("cannot reach the Kubernetes API (kubeconfig or in-cluster config): {0}")]
    Connect(kube::Error),
    /// What the operation's API calls answered.
    #[error("{0}")]
    Api(#[from] kube::Error),
}

fn with_client<T>(f: impl AsyncFnOnce(kube::Client) -> Result<T, kube::Error>) -> Result<T, ClusterError> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(ClusterError::Runtime)?;
    rt.block_on(async {
        let client = kube::Client::try_default().await.map_err(ClusterError::Connect)?;
        Ok(f(client).await?)
    })
}

pub fn break_glass(a: &BreakGlassArgs) -> i32 {
    let mode = if a.restore { ops::Mode::Restore } else { ops::Mode::Ignore };
    match with_client(async |c| ops::break_glass(&c, mode, a.dry_run).await) {
        Ok(lines) => {
            for l in lines {
                println!("{}{l}", if a.dry_run { "(dry run) " } else { "" });
            }
            0
        }
        Err(e) => {
            eprintln!("Error: {e}");
            1
        }
    }
}

pub fn doctor(a: &DoctorArgs) -> i32 {
    match with_client(async |c| ops::doctor(&c, &a.namespace, "verno-controller").await) {
        Ok(report) => {
            print!("{report}");
            0
        }
        Err(e) => {
            eprintln!("Error: {e}");
            1
        }
    }
}
