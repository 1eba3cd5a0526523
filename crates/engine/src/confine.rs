//! A namespaced policy's reach: what it may read or write through the [`Data`] port.
//!
//! Whoever may create a `Policy` (or a namespaced CEL policy) in a namespace must not make
//! Verno act with its own identity anywhere else (Kyverno's CVE-2026-22039 for `apiCall`, its
//! ConfigMap loader fix, and its namespaced CEL `resource` library). Everything a namespaced
//! policy names is judged after variables are substituted:
//! - `apiCall` URL paths must address the policy's namespace (`/api/v1/namespaces/NS/…`,
//!   `/apis/GROUP/VERSION/namespaces/NS/…`), judged on the path as it will be sent: percent
//!   escapes decoded and `.`/`..` segments resolved first ([`api_path`]), and `configMap`
//!   entries read only its namespace — both where context entries load (`context_entry`), with
//!   Kyverno's messages, before an `apiCall`'s `default` could stand in for a refusal;
//! - clone sources, `cloneList` and mutate-existing targets only the policy's namespace, CEL
//!   `resource.Get/List` too ([`ConfinedHost`]), `namespaceObject` only the policy's own
//!   Namespace, image verification only its Secrets ([`ConfinedVerifier`]): the [`Reach`] every
//!   other data access of the policy goes through.
//!
//! Independently of the policy's kind, an API call may only GET or POST ([`METHODS`]: Kyverno's
//! CRD allows no other method; the compiler refuses others), and a POST made for a dry-run
//! admission request is sent with `dryRun=All` ([`Reach`]), so the API server persists nothing
//! (reviews such as SubjectAccessReview still answer).

use crate::ports::{Data, Loaded, NamespaceView};
use crate::ports::{ImageError, ImageVerifier, SignatureCheck, Verified};
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::Arc;
use verno_api::images::{Attestor, RegistryCredentials};
use verno_cel::HostError;

/// The methods an `apiCall` may use.
pub(crate) const METHODS: [&str; 2] = ["GET", "POST"];

/// A Kubernetes API path as it will be sent: the path part percent-decoded and lexically
/// cleaned (empty and `.` segments dropped, `..` resolved, never above the root, as Go's
/// `path.Clean` and Kubernetes' REST client do), the query kept. For a namespaced policy
/// (`namespace`), the cleaned path must address that namespace; the errors are Kyverno's.
pub(crate) fn api_path(url: &str, namespace: Option<&str>) -> Result<String, String> {
    let (path, query) = match url.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (url, None),
    };
    let decoded;
    let path = match namespace {
        // Judged as the API server will read it: escapes decoded (`%2F` is a `/` to it).
        Some(_) => {
            decoded = percent_decode(path).ok_or_else(|| format!("path {path} is not a valid URL path"))?;
            if let Some(c) = decoded.chars().find(|c| !allowed_in_path(*c)) {
                return Err(format!("path {path} holds {c:?}, which a Kubernetes API path does not hold"));
            }
            decoded.as_str()
        }
        None => path,
    };
    let mut cleaned = clean(path);
    if let Some(ns) = namespace {
        match namespace_segment(&cleaned) {
            Some(found) if found == ns => {}
            Some(found) => {
                return Err(format!(
                    "path {cleaned} refers to namespace {found}, which is different from the policy namespace {ns}"
                ));
            }
            None => {
                return Err(format!(
                    "path {cleaned} does not contain a namespace segment, which is required for namespaced policies"
                ));
            }
        }
    }
    if let Some(q) = query {
        cleaned.push('?');
        cleaned.push_str(q);
    }
    Ok(cleaned)
}

/// `path` with `dryRun=All` added to its query.
pub(crate) fn dry_run(path: &str) -> String {
    if path.contains('?') { format!("{path}&dryRun=All") } else { format!("{path}?dryRun=All") }
}

/// The namespace a cleaned API path addresses: the segment after `namespaces` where the
/// Kubernetes API puts it (`/api/VERSION/namespaces/NS…`, `/apis/GROUP/VERSION/namespaces/NS…`);
/// for any other shape, the segment after the first `namespaces` (so the error can name it),
/// or none.
fn namespace_segment(path: &str) -> Option<&str> {
    let segs: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let at = match segs.first() {
        Some(&"api") => 2,
        Some(&"apis") => 3,
        _ => usize::MAX,
    };
    if segs.get(at) == Some(&"namespaces") {
        return segs.get(at + 1).copied().filter(|s| !s.is_empty());
    }
    // Another shape (`/api/v1/nodes/namespaces/x`): not a namespaced path, whatever it names.
    None
}

/// Go's `path.Clean` on an absolute path (a relative one is made absolute).
fn clean(path: &str) -> String {
    let mut out: Vec<&str> = Vec::new();
    for seg in path.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                out.pop();
            }
            s => out.push(s),
        }
    }
    let mut s = String::with_capacity(path.len() + 1);
    for seg in &out {
        s.push('/');
        s.push_str(seg);
    }
    if s.is_empty() {
        s.push('/');
    }
    s
}

/// What a decoded Kubernetes API path may hold: RFC 3986's unreserved and sub-delimiter
/// characters, `:`, `@` and `/` (anything else would have to be escaped to be sent).
fn allowed_in_path(c: char) -> bool {
    c.is_ascii_alphanumeric() || "-._~!$&'()*+,;=:@/".contains(c)
}

/// `s` with its `%XX` escapes decoded; `None` for a broken escape or bytes that are not UTF-8.
fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while let Some(&c) = b.get(i) {
        if c == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(c);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The [`Data`] a policy sees: the caller's, held to the policy's namespace (for namespaced
/// kinds) and to dry runs (for dry-run requests). See the module's comment.
pub(crate) struct Reach<'a> {
    inner: &'a dyn Data,
    namespace: Option<&'a str>,
    dry_run: bool,
}

impl<'a> Reach<'a> {
    /// The reach of a policy confined to `namespace` (see [`CompiledPolicy::confined_to`],
    /// `None`: cluster-wide) for a request (`dry_run`: a dry-run admission request); `None`
    /// when nothing needs holding back (a cluster-wide policy, no dry run): then the caller's
    /// data is used as it is.
    ///
    /// [`CompiledPolicy::confined_to`]: crate::policy::CompiledPolicy::confined_to
    pub(crate) fn of(namespace: Option<&'a str>, dry_run: bool, inner: &'a dyn Data) -> Option<Reach<'a>> {
        (namespace.is_some() || dry_run).then_some(Reach { inner, namespace, dry_run })
    }

    /// Whether a namespaced policy may address `namespace` (always, for a cluster-wide one).
    fn within(&self, namespace: &str) -> bool {
        self.namespace.is_none_or(|own| own == namespace)
    }

    /// The namespace to read when the policy names `namespace` (empty: every namespace, which
    /// for a namespaced policy is its own); `None`: outside its reach.
    fn read_in<'n>(&self, namespace: &'n str) -> Option<&'n str>
    where
        'a: 'n,
    {
        match self.namespace {
            Some(own) if namespace.is_empty() => Some(own),
            Some(own) if own != namespace => None,
            _ => Some(namespace),
        }
    }
}

impl Data for Reach<'_> {
    fn rule_values(&self, policy: &str, rule: &str) -> Vec<(String, Value)> {
        self.inner.rule_values(policy, rule)
    }
    fn resource_values(&self, policy: &str, resource: &str) -> Vec<(String, Value)> {
        self.inner.resource_values(policy, resource)
    }
    fn namespace_labels(&self, namespace: &str) -> Option<BTreeMap<String, String>> {
        self.inner.namespace_labels(namespace)
    }
    fn user_roles(&self, username: &str, groups: &[String]) -> Option<(Vec<String>, Vec<String>)> {
        self.inner.user_roles(username, groups)
    }
    fn foreach_values(&self, policy: &str, rule: &str) -> BTreeMap<String, Vec<Value>> {
        self.inner.foreach_values(policy, rule)
    }
    /// The namespace was judged where the entry loads (see the module's comment).
    fn config_map(&self, namespace: &str, name: &str) -> Loaded {
        self.inner.config_map(namespace, name)
    }
    /// The path was cleaned and judged where the entry loads; a dry run's POST persists nothing.
    fn api_call(&self, method: &str, url_path: &str, data: Option<&Value>) -> Loaded {
        if self.dry_run && method == "POST" && url_path.starts_with('/') {
            return self.inner.api_call(method, &dry_run(url_path), data);
        }
        self.inner.api_call(method, url_path, data)
    }
    fn service_call(&self, method: &str, url: &str, data: Option<&Value>, service: &crate::Service<'_>) -> Loaded {
        self.inner.service_call(method, url, data, service)
    }
    fn global_reference(&self, name: &str) -> Loaded {
        self.inner.global_reference(name)
    }
    fn namespace_object(&self, name: &str) -> Option<Value> {
        if !self.within(name) {
            return None;
        }
        self.inner.namespace_object(name)
    }
    fn namespace_object_as(&self, view: NamespaceView, name: &str) -> Option<Value> {
        if !self.within(name) {
            return None;
        }
        self.inner.namespace_object_as(view, name)
    }
    fn resource(&self, api_version: &str, kind: &str, namespace: &str, name: &str) -> Option<Value> {
        // A namespaced policy reads no cluster-wide object (an empty namespace) either.
        if self.namespace.is_some() && !self.within(namespace) {
            return None;
        }
        self.inner.resource(api_version, kind, namespace, name)
    }
    fn list(&self, api_version: &str, kind: &str, namespace: &str) -> Vec<Value> {
        match self.read_in(namespace) {
            Some(ns) => self.inner.list(api_version, kind, ns),
            None => Vec::new(),
        }
    }
    fn cel_host(&self) -> Option<Arc<dyn verno_cel::Host>> {
        let inner = self.inner.cel_host()?;
        match self.namespace {
            Some(own) => Some(Arc::new(ConfinedHost { inner, namespace: own.to_string() })),
            None => Some(inner),
        }
    }
    /// A namespaced policy's registry credentials come from its own namespace.
    fn image_data(&self, image: &str, credentials: Option<&RegistryCredentials>) -> Loaded {
        if let Some(e) = self.namespace.and_then(|own| credentials_outside(own, credentials)) {
            return Loaded::Error(e.message().to_string());
        }
        self.inner.image_data(image, credentials)
    }
    fn image_verifier(&self) -> Option<Arc<dyn ImageVerifier>> {
        let inner = self.inner.image_verifier()?;
        match self.namespace {
            Some(own) => Some(Arc::new(ConfinedVerifier { inner, namespace: own.to_string() })),
            None => Some(inner),
        }
    }
    fn is_namespaced(&self, api_version: &str, kind: &str) -> bool {
        self.inner.is_namespaced(api_version, kind)
    }
    fn resource_objects(&self, api_version: &str, resource: &str, namespace: &str) -> Vec<Value> {
        match self.read_in(namespace) {
            Some(ns) => self.inner.resource_objects(api_version, resource, ns),
            None => Vec::new(),
        }
    }
    fn targets(&self, api_version: &str, kind: &str, namespace: &str) -> Vec<Value> {
        match self.read_in(namespace) {
            Some(ns) => self.inner.targets(api_version, kind, ns),
            None => Vec::new(),
        }
    }
}

/// The CEL libraries of a namespaced policy: `resource.Get/List` read only its namespace
/// (Kyverno's namespaced `resource` library, whose calls name no namespace: see
/// [`verno_cel::Host::confined_to`]); the rest as the caller's host answers.
pub(crate) struct ConfinedHost {
    inner: Arc<dyn verno_cel::Host>,
    namespace: String,
}

impl ConfinedHost {
    fn check(&self, f: &str, namespace: &str) -> Result<(), HostError> {
        if namespace == self.namespace {
            return Ok(());
        }
        let what = if namespace.is_empty() {
            "cluster-wide resources".to_string()
        } else {
            format!("namespace {namespace:?}")
        };
        Err(HostError::OutOfReach(format!("{f}: a policy in namespace {:?} cannot read {what}", self.namespace)))
    }
}

impl verno_cel::Host for ConfinedHost {
    fn confined_to(&self) -> Option<&str> {
        Some(&self.namespace)
    }
    fn resource_get(&self, api_version: &str, resource: &str, namespace: &str, name: &str) -> Result<Value, HostError> {
        self.check("resource.Get", namespace)?;
        self.inner.resource_get(api_version, resource, namespace, name)
    }
    fn resource_list(&self, api_version: &str, resource: &str, namespace: &str) -> Result<Vec<Value>, HostError> {
        self.check("resource.List", namespace)?;
        self.inner.resource_list(api_version, resource, namespace)
    }
    fn to_gvr(&self, api_version: &str, kind: &str) -> Result<Value, HostError> {
        self.inner.to_gvr(api_version, kind)
    }
    /// Kyverno refuses `http.*` in namespaced policies unless its
    /// `--allowHTTPInNamespacedPolicies` is set (CVE-2026-4789: a tenant's policy would call
    /// out from the controller's network position); Verno has no such switch. Such a policy is
    /// refused when created; one stored before is refused here, at the call.
    fn http(&self, _call: &verno_cel::HttpCall<'_>) -> Result<Value, HostError> {
        Err(HostError::OutOfReach(
            "http calls are not allowed in namespaced policies: set --allowHTTPInNamespacedPolicies to enable".into(),
        ))
    }
    fn global_context(&self, name: &str, projection: &str) -> Result<Value, HostError> {
        self.inner.global_context(name, projection)
    }
    fn image_metadata(&self, reference: &str) -> Result<Value, HostError> {
        self.inner.image_metadata(reference)
    }
    fn authorize(&self, review: &Value) -> Result<Value, HostError> {
        self.inner.authorize(review)
    }
    fn now(&self) -> Option<i64> {
        self.inner.now()
    }
    fn random_seed(&self) -> Option<u64> {
        self.inner.random_seed()
    }
    fn verify_image_signatures(&self, image: &str, attestors: &[Value]) -> Result<i64, HostError> {
        self.inner.verify_image_signatures(image, attestors)
    }
    fn verify_attestation_signatures(
        &self,
        image: &str,
        attestation: &str,
        attestors: &[Value],
    ) -> Result<i64, HostError> {
        self.inner.verify_attestation_signatures(image, attestation, attestors)
    }
    fn extract_payload(&self, image: &str, attestation: &str) -> Result<Value, HostError> {
        self.inner.extract_payload(image, attestation)
    }
    fn generate(&self, namespace: Option<&str>, resources: Vec<Value>) -> Result<(), HostError> {
        self.inner.generate(namespace, resources)
    }
}

/// Image verification for a namespaced policy: the Secrets it names (`keys.secret`, and
/// `imageRegistryCredentials.secrets` written `namespace/name`) must be in its namespace.
/// Secrets named without a namespace are Verno's own registry credentials, as Kyverno's are
/// its own.
pub(crate) struct ConfinedVerifier {
    inner: Arc<dyn ImageVerifier>,
    namespace: String,
}

impl ConfinedVerifier {
    fn outside(&self, namespace: &str, name: &str) -> ImageError {
        ImageError::Failed(format!(
            "a policy in namespace {:?} cannot read the secret {namespace}/{name}",
            self.namespace
        ))
    }

    fn check_attestor(&self, a: &Attestor) -> Result<(), ImageError> {
        match a.keys.as_ref().and_then(|k| k.secret.as_ref()) {
            Some(s) if s.namespace != self.namespace => Err(self.outside(&s.namespace, &s.name)),
            _ => Ok(()),
        }
    }

    fn check_credentials(&self, c: Option<&RegistryCredentials>) -> Result<(), ImageError> {
        credentials_outside(&self.namespace, c).map_or(Ok(()), Err)
    }
}

/// Why a namespaced policy may not use these registry credentials (a Secret of another
/// namespace), if it may not.
fn credentials_outside(own: &str, c: Option<&RegistryCredentials>) -> Option<ImageError> {
    for s in c.map(|c| c.secrets.as_slice()).unwrap_or_default() {
        if let Some((ns, name)) = s.split_once('/')
            && ns != own
        {
            return Some(ImageError::Failed(format!(
                "a policy in namespace {own:?} cannot read the secret {ns}/{name}"
            )));
        }
    }
    None
}

impl ImageVerifier for ConfinedVerifier {
    fn verify(&self, check: &SignatureCheck) -> Result<Verified, ImageError> {
        self.check_attestor(check.attestor)?;
        self.check_credentials(check.credentials)?;
        self.inner.verify(check)
    }
    fn digest(
        &self,
        image: &str,
        credentials: Option<&RegistryCredentials>,
        namespace: &str,
    ) -> Result<String, ImageError> {
        self.check_credentials(credentials)?;
        self.inner.digest(image, credentials, namespace)
    }
    fn verify_blob(
        &self,
        attestor: &Attestor,
        message: &[u8],
        signature: &[u8],
        certificate: Option<&str>,
    ) -> Result<String, ImageError> {
        self.check_attestor(attestor)?;
        self.inner.verify_blob(attestor, message, signature, certificate)
    }
    fn cached(&self, key: &str) -> Option<String> {
        self.inner.cached(key)
    }
    fn remember(&self, key: &str, digest: &str) {
        self.inner.remember(key, digest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_paths_are_cleaned_as_the_rest_client_cleans_them() {
        assert_eq!(api_path("/api/v1/namespaces/a/../b/pods", None).unwrap(), "/api/v1/namespaces/b/pods");
        assert_eq!(api_path("/api//v1/./nodes/", None).unwrap(), "/api/v1/nodes");
        assert_eq!(api_path("/../../api/v1?x=/../", None).unwrap(), "/api/v1?x=/../");
        assert_eq!(api_path("", None).unwrap(), "/");
    }

    #[test]
    fn a_namespaced_policy_reaches_only_its_namespace() {
        let ns = Some("tenant-a");
        assert_eq!(
            api_path("/api/v1/namespaces/tenant-a/configmaps?limit=1", ns).unwrap(),
            "/api/v1/namespaces/tenant-a/configmaps?limit=1"
        );
        assert_eq!(
            api_path("/apis/apps/v1/namespaces/tenant-a/deployments/x", ns).unwrap(),
            "/apis/apps/v1/namespaces/tenant-a/deployments/x"
        );
        assert_eq!(api_path("/api/v1/namespaces/tenant-a", ns).unwrap(), "/api/v1/namespaces/tenant-a");
        for (path, why) in [
            ("/api/v1/namespaces/kube-system/secrets/x", "refers to namespace kube-system"),
            ("/api/v1/namespaces/tenant-a/../kube-system/secrets", "refers to namespace kube-system"),
            ("/api/v1/namespaces/tenant-a%2F..%2F..%2Fv1%2Fnamespaces%2Fkube-system/secrets", "kube-system"),
            ("/api/v1/namespaces/tenant-a/%2e%2e/kube-system/secrets", "kube-system"),
            ("/api/v1/nodes", "does not contain a namespace segment"),
            ("/api/v1/namespaces", "does not contain a namespace segment"),
            ("/api/v1/nodes/namespaces/tenant-a", "does not contain a namespace segment"),
            ("/apis/authorization.k8s.io/v1/subjectaccessreviews", "does not contain a namespace segment"),
            ("/api/v1/namespaces/tenant-a/pods/x%00", "holds"),
            ("/api/v1/namespaces/tenant-a/pods/%zz", "not a valid URL path"),
            ("/apis/namespaces/tenant-a/pods", "does not contain a namespace segment"),
        ] {
            let e = api_path(path, ns).unwrap_err();
            assert!(e.contains(why), "{path}: {e}");
        }
    }

    #[test]
    fn dry_run_posts_persist_nothing() {
        assert_eq!(dry_run("/apis/x/v1/things"), "/apis/x/v1/things?dryRun=All");
        assert_eq!(dry_run("/apis/x/v1/things?a=b"), "/apis/x/v1/things?a=b&dryRun=All");
    }
}
