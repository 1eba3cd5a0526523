//! The engine's ports: what a request brings ([`Request`]) and what the engine asks of the
//! world it cannot compute itself ([`Data`]: CLI values, ConfigMaps, API calls, global context,
//! namespaces, and the registry side of image verification, [`ImageVerifier`]). Everything
//! above imports these; they import nothing of the engine's behaviour.

use crate::matching::RequestUser;
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;
use verno_api::Operation;
use verno_api::images::{Attestor, RegistryCredentials};

/// What a context loader found.
pub enum Loaded {
    Value(Value),
    /// The source is not available here (no cluster, no mock): the entry is not loaded.
    Unavailable,
    Error(String),
}

/// The engine's port to data it cannot compute itself: CLI values, ConfigMaps, API calls,
/// global context entries. The CLI answers from files; the server will answer from the cluster.
pub trait Data: Sync {
    /// Values injected for a rule (the CLI's `policies[].rules[].values`).
    fn rule_values(&self, _policy: &str, _rule: &str) -> Vec<(String, Value)> {
        Vec::new()
    }
    /// Values injected for a policy on one resource, by the resource's name (the CLI's
    /// `policies[].resources[].values`); they hold while that policy runs.
    fn resource_values(&self, _policy: &str, _resource: &str) -> Vec<(String, Value)> {
        Vec::new()
    }
    /// Labels of a namespace, for `namespaceSelector`s, when the policy set does not know them.
    fn namespace_labels(&self, _namespace: &str) -> Option<BTreeMap<String, String>> {
        None
    }
    /// Per-element values for foreach (`foreachValues`).
    fn foreach_values(&self, _policy: &str, _rule: &str) -> BTreeMap<String, Vec<Value>> {
        BTreeMap::new()
    }
    fn config_map(&self, _namespace: &str, _name: &str) -> Loaded {
        Loaded::Unavailable
    }
    /// An API call: a Kubernetes API path (`/api/...`, `/apis/...`) or an external service URL;
    /// `data` is the request body (the object `apiCall.data`'s key/value pairs make).
    fn api_call(&self, _method: &str, _url_path: &str, _data: Option<&Value>) -> Loaded {
        Loaded::Unavailable
    }
    /// An API call to a service (`apiCall.service`): its URL, with the service's CA bundle and
    /// headers. By default, [`Data::api_call`] (the CLI answers by URL from its mocks).
    fn service_call(&self, method: &str, url: &str, data: Option<&Value>, service: &Service<'_>) -> Loaded {
        let _ = service;
        self.api_call(method, url, data)
    }
    fn global_reference(&self, _name: &str) -> Loaded {
        Loaded::Unavailable
    }
    /// An image's data from its registry (`imageRegistry` context entries; Kyverno's
    /// ImageData). Unavailable unless the caller reads registries (Kyverno's CLI only with
    /// `--registry`).
    fn image_data(&self, _image: &str, _credentials: Option<&verno_api::images::RegistryCredentials>) -> Loaded {
        Loaded::Unavailable
    }
    /// The Namespace object CEL policies see as `namespaceObject`.
    fn namespace_object(&self, _name: &str) -> Option<Value> {
        None
    }
    /// The Roles (`namespace:name`) and ClusterRoles bound to a user or one of its groups, as
    /// Kyverno works them out from RoleBindings and ClusterRoleBindings for every admission
    /// request (`roles`/`clusterRoles` in match and exclude, `request.roles`,
    /// `request.clusterRoles`); `None`: not known here.
    fn user_roles(&self, _username: &str, _groups: &[String]) -> Option<(Vec<String>, Vec<String>)> {
        None
    }
    /// `namespaceObject` as a policy of this view sees it. In a cluster every kind sees the
    /// Namespace itself (the default); Kyverno's CLI builds it differently per kind (see
    /// [`NamespaceView`]), so the CLI's data answers each view.
    fn namespace_object_as(&self, view: NamespaceView, name: &str) -> Option<Value> {
        let _ = view;
        self.namespace_object(name)
    }
    /// One object from the cluster (clone sources).
    fn resource(&self, _api_version: &str, _kind: &str, _namespace: &str, _name: &str) -> Option<Value> {
        None
    }
    /// Objects of a kind (`apiVersion` may be empty: any version) in a namespace (empty: all).
    fn list(&self, _api_version: &str, _kind: &str, _namespace: &str) -> Vec<Value> {
        Vec::new()
    }
    /// What answers the Kyverno CEL libraries (`resource.*`, `http.*`, `globalContext.Get`,
    /// `image.GetMetadata`, `time.now()`); none: they report that they are not available.
    fn cel_host(&self) -> Option<std::sync::Arc<dyn verno_cel::Host>> {
        None
    }
    /// What verifies image signatures and attestations against registries (`verifyImages`);
    /// none: such rules report that verification is not available here.
    fn image_verifier(&self) -> Option<std::sync::Arc<dyn ImageVerifier>> {
        None
    }
    /// Whether objects of a kind live in namespaces (generated objects of cluster-scoped kinds
    /// get none). By default, every kind but Kubernetes' own cluster-scoped ones.
    fn is_namespaced(&self, api_version: &str, kind: &str) -> bool {
        !cluster_scoped(api_version, kind)
    }
    /// Objects of a resource (plural) and apiVersion, in a namespace (empty: all): the
    /// candidates of a MutatingPolicy's mutate-existing targets. By default, the
    /// [`Data::targets`] of that resource.
    fn resource_objects(&self, api_version: &str, resource: &str, namespace: &str) -> Vec<Value> {
        self.targets("", "", namespace)
            .into_iter()
            .filter(|o| {
                let kind = str_at(o, "/kind");
                (crate::matching::is_plural_of(resource, kind) || resource == "*")
                    && (api_version.is_empty()
                        || str_at(o, "/apiVersion") == api_version
                        || api_version.ends_with("/*"))
            })
            .collect()
    }
    /// Candidates for mutate-existing targets; the cluster by default.
    fn targets(&self, api_version: &str, kind: &str, namespace: &str) -> Vec<Value> {
        self.list(api_version, kind, namespace)
    }
}

/// How to reach a service an `apiCall` names: the PEM CA bundle that verifies it (empty: the
/// system's roots) and the headers sent.
#[derive(Debug, Clone, Copy)]
pub struct Service<'a> {
    pub ca_bundle: &'a str,
    pub headers: &'a [(String, String)],
}

/// Whose `namespaceObject` a CEL expression reads: Kyverno builds it per policy kind, and the
/// kinds differ where the request has no namespace and (in its CLI) where the namespace is not
/// described by the test's values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NamespaceView {
    /// `validate.cel` in a ClusterPolicy / Policy: null for cluster-scoped requests; offline, a
    /// Namespace carrying only the request's namespace name.
    #[default]
    Rule,
    /// ValidatingAdmissionPolicy: an empty Namespace (not null) for cluster-scoped requests;
    /// offline, the name and the labels the values give it.
    ValidatingAdmission,
    /// MutatingAdmissionPolicy: as ValidatingAdmissionPolicy, but null for cluster-scoped
    /// requests.
    MutatingAdmission,
    /// The `policies.kyverno.io` kinds: null for cluster-scoped requests; offline, only a
    /// namespace the values describe (`namespaces` or `namespaceSelector`), null otherwise.
    Policy,
}

impl NamespaceView {
    pub fn of(kind: verno_api::Kind) -> Self {
        use verno_api::Kind;
        match kind {
            Kind::ClusterPolicy | Kind::Policy | Kind::CleanupPolicy | Kind::ClusterCleanupPolicy => {
                NamespaceView::Rule
            }
            Kind::ValidatingAdmissionPolicy | Kind::ValidatingAdmissionPolicyBinding => {
                NamespaceView::ValidatingAdmission
            }
            Kind::MutatingAdmissionPolicy | Kind::MutatingAdmissionPolicyBinding => NamespaceView::MutatingAdmission,
            _ => NamespaceView::Policy,
        }
    }

    /// A Namespace as Kubernetes' typed object turns into JSON: what Kyverno hands CEL when it
    /// makes one up from a name (and labels) rather than reading it.
    pub fn made_up(name: &str, labels: Option<&std::collections::BTreeMap<String, String>>) -> Value {
        let mut meta = Map::new();
        if !name.is_empty() {
            meta.insert("name".into(), Value::String(name.into()));
        }
        if let Some(l) = labels.filter(|l| !l.is_empty()) {
            meta.insert("labels".into(), json!(l));
        }
        meta.insert("creationTimestamp".into(), Value::Null);
        json!({"metadata": meta, "spec": {}, "status": {}})
    }
}

/// A `Data` that knows nothing.
pub struct NoData;
impl Data for NoData {}

/// `request.userInfo` as the caller has it.
#[derive(Debug, Clone, Copy, Default)]
pub enum UserInfoRef<'a> {
    /// Nobody said (an empty `userInfo`).
    #[default]
    Unknown,
    /// As JSON (username, groups, …): the CLI's user file, a test's.
    Json(&'a Value),
    /// As the API server sent it: turned into JSON only if an expression reads it, which few
    /// policies do.
    Sent(&'a verno_api::admission::UserInfo),
}

impl<'a> UserInfoRef<'a> {
    pub fn username(self) -> &'a str {
        match self {
            UserInfoRef::Unknown => "",
            UserInfoRef::Json(u) => u.get("username").and_then(Value::as_str).unwrap_or(""),
            UserInfoRef::Sent(u) => u.username.as_str(),
        }
    }

    /// `request.userInfo` as expressions read it.
    pub fn to_value(self) -> Value {
        match self {
            UserInfoRef::Unknown => Value::Object(Map::new()),
            UserInfoRef::Json(u) => u.clone(),
            UserInfoRef::Sent(u) => serde_json::to_value(u).unwrap_or_else(|_| Value::Object(Map::new())),
        }
    }
}

/// Who asks. Two views that may differ: the user that match/exclude blocks see (with its
/// resolved roles; also `request.roles` and `request.clusterRoles`) and `request.userInfo`.
/// They differ where Kyverno matches as someone else than the requester (an update's old
/// object is matched as nobody, its variables stay the request's).
#[derive(Debug, Clone, Copy, Default)]
pub struct Asker<'a> {
    /// `None`: matching sees no user (a block naming subjects, roles or cluster roles does
    /// not match).
    pub user: Option<&'a RequestUser>,
    pub info: UserInfoRef<'a>,
}

/// One admission-style request: the resource and who asks for what.
#[derive(Debug, Clone)]
pub struct Request<'a> {
    pub operation: Operation,
    /// The new object (`Value::Null` on DELETE).
    pub object: &'a Value,
    /// The old object (UPDATE and DELETE).
    pub old_object: Option<&'a Value>,
    pub asker: Asker<'a>,
    pub namespace_labels: Option<&'a BTreeMap<String, String>>,
    pub subresource: &'a str,
    /// The kind the API server says the request is about (`request.kind`); `None` (the CLI):
    /// the object's own `apiVersion` and `kind`. Matching trusts this, not the object, so a
    /// Pod that calls itself a Deployment is still a Pod.
    pub kind: Option<&'a verno_api::admission::GroupVersionKind>,
    /// Extra variables (dotted keys allowed), applied after the request context.
    pub variables: &'a [(String, Value)],
    /// Whether mutate-existing rules patch their targets in this evaluation (the CLI and the
    /// background controller; never a webhook). Set from the [`crate::Scope`].
    pub existing: bool,
    /// A dry-run admission request (`request.dryRun`): API calls it makes must persist
    /// nothing, so a POST is sent with `dryRun=All`.
    pub dry_run: bool,
}

impl<'a> Request<'a> {
    /// `operation` on `object` and nothing else known: no old object, user, namespace labels,
    /// subresource, requested kind or extra variables. Set the rest with struct update syntax.
    pub fn new(operation: Operation, object: &'a Value) -> Request<'a> {
        Request {
            operation,
            object,
            old_object: None,
            asker: Asker::default(),
            namespace_labels: None,
            subresource: "",
            kind: None,
            variables: &[],
            existing: false,
            dry_run: false,
        }
    }

    /// The object policies match and validate: the old object on DELETE.
    pub fn subject(&self) -> &'a Value {
        if self.object.is_null() { self.old_object.unwrap_or(self.object) } else { self.object }
    }
    /// (group, version, kind) the request is about.
    pub fn group_version_kind(&self) -> (&'a str, &'a str, &'a str) {
        match self.kind.filter(|k| !k.kind.is_empty()) {
            Some(k) => (&k.group, &k.version, &k.kind),
            None => {
                let subject = self.subject();
                let (group, version) = group_version(str_at(subject, "/apiVersion"));
                (group, version, str_at(subject, "/kind"))
            }
        }
    }

    pub fn is_delete(&self) -> bool {
        self.operation == Operation::Delete
    }
}

/// A string at a `/`-separated path (no JSON-pointer escapes, no allocation).
pub(crate) fn str_at<'v>(v: &'v Value, p: &str) -> &'v str {
    let mut cur = v;
    // Segments found byte by byte, not with `split('/')`: the searcher's set-up cost more than
    // these short paths' whole walk (hundreds of instructions per call, several per request).
    let mut rest = p;
    while !rest.is_empty() {
        let (seg, tail) = match rest.bytes().position(|b| b == b'/') {
            Some(i) => (rest.get(..i).unwrap_or_default(), rest.get(i + 1..).unwrap_or_default()),
            None => (rest, ""),
        };
        rest = tail;
        if seg.is_empty() {
            continue;
        }
        match member(cur, seg) {
            Some(x) => cur = x,
            None => return "",
        }
    }
    cur.as_str().unwrap_or("")
}

/// `apps/v1` → (`apps`, `v1`); `v1` → (``, `v1`).
fn group_version(api_version: &str) -> (&str, &str) {
    api_version.split_once('/').unwrap_or(("", api_version))
}

pub(crate) fn obj_at<'v>(v: &'v Value, a: &str, b: &str) -> Option<&'v Map<String, Value>> {
    member(member(v, a)?, b)?.as_object()
}

/// `v[k]` when `v` is an object (the key compared in line, see `verno_jmespath::value::Key`).
pub(crate) fn member<'v>(v: &'v Value, k: &str) -> Option<&'v Value> {
    v.as_object().and_then(|m| verno_jmespath::value::get(m, k))
}

/// One attestor entry checked against one image: what the engine asks the port.
#[derive(Debug, Clone, Copy)]
pub struct SignatureCheck<'a> {
    /// The image as Kyverno names it (`registry/path:tag` or `registry/path@digest`).
    pub image: &'a str,
    /// A leaf entry: `keys` (one public key, a secret or a KMS reference), `certificates` or
    /// `keyless`; never a nested set.
    pub attestor: &'a Attestor,
    /// Where the signatures live: the entry's `repository`, else the rule's; empty: next to the
    /// image.
    pub repository: &'a str,
    /// Every `key: value` must equal the signature payload's `optional` field.
    pub annotations: &'a BTreeMap<String, String>,
    pub credentials: Option<&'a RegistryCredentials>,
    /// The resource's namespace (where `imageRegistryCredentials.secrets` without one live).
    pub namespace: &'a str,
    /// `Cosign`, `Notary` or `SigstoreBundle`.
    pub kind: &'a str,
    pub cosign_oci11: bool,
    /// Attestations of this statement type instead of signatures.
    pub attestation: Option<&'a str>,
    /// Set when the caller gives up (the request's deadline passed): a verifier checks it
    /// between registry exchanges and stops.
    pub cancel: Option<&'a std::sync::atomic::AtomicBool>,
}

/// What a verified entry yields.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Verified {
    /// The image digest the signatures are about.
    pub digest: String,
    /// In-toto statements (attestations only), each with its `predicate`.
    pub statements: Vec<Value>,
}

/// Why an entry did not verify.
#[derive(Debug, Clone, PartialEq)]
pub enum ImageError {
    /// The registry could not be reached (the rule's result is `error`, as Kyverno's for a
    /// network error).
    Unreachable(String),
    /// The image or its signatures were read and did not satisfy the attestor.
    Failed(String),
}

impl ImageError {
    pub fn message(&self) -> &str {
        match self {
            ImageError::Unreachable(m) | ImageError::Failed(m) => m,
        }
    }
}

/// The registry side of image verification: what the CLI and the server plug in. The engine
/// never talks to a registry itself.
pub trait ImageVerifier: Send + Sync {
    /// Verifies one leaf attestor entry on one image.
    fn verify(&self, check: &SignatureCheck) -> Result<Verified, ImageError>;
    /// The digest of an image's manifest (for `mutateDigest` when nothing was verified).
    fn digest(
        &self,
        image: &str,
        credentials: Option<&RegistryCredentials>,
        namespace: &str,
    ) -> Result<String, ImageError>;
    /// Checks a detached signature over `message` by one leaf attestor entry (signed
    /// manifests); `certificate` is the PEM the signature carries, if any. Returns the signer's
    /// name (empty for a key).
    fn verify_blob(
        &self,
        attestor: &Attestor,
        message: &[u8],
        signature: &[u8],
        certificate: Option<&str>,
    ) -> Result<String, ImageError> {
        let _ = (attestor, message, signature, certificate);
        Err(ImageError::Unreachable("signature verification is not available here".into()))
    }
    /// An image's data as Kyverno's `imageRegistry` context entry reads it: `image`,
    /// `resolvedImage`, `registry`, `repository`, `identifier`, `manifestList` (an index, or
    /// null), `manifest` (the linux/amd64 image's) and `configData`.
    fn image_data(
        &self,
        image: &str,
        credentials: Option<&RegistryCredentials>,
        namespace: &str,
    ) -> Result<serde_json::Value, ImageError> {
        let _ = (image, credentials, namespace);
        Err(ImageError::Unreachable("image registries cannot be read here".into()))
    }
    /// The digest a passing verification remembered under this key (Kyverno's
    /// `policyUID;resourceVersion;rule;image`) verified, if one is remembered. The CLI keeps no
    /// cache.
    fn cached(&self, key: &str) -> Option<String> {
        let _ = key;
        None
    }
    /// Remembers a passing verification of the image whose manifest has `digest`.
    fn remember(&self, key: &str, digest: &str) {
        let _ = (key, digest);
    }
}

/// Kinds Kubernetes serves cluster-scoped (the built-in API groups); any other kind is taken to
/// be namespaced unless the caller's data says otherwise.
pub fn cluster_scoped(api_version: &str, kind: &str) -> bool {
    let group = api_version.rsplit_once('/').map_or("", |(g, _)| g);
    matches!(
        (group, kind),
        ("", "Namespace" | "Node" | "PersistentVolume" | "ComponentStatus")
            | ("rbac.authorization.k8s.io", "ClusterRole" | "ClusterRoleBinding")
            | (
                "storage.k8s.io",
                "StorageClass" | "CSIDriver" | "CSINode" | "VolumeAttachment" | "VolumeAttributesClass"
            )
            | ("apiextensions.k8s.io", "CustomResourceDefinition")
            | ("scheduling.k8s.io", "PriorityClass")
            | ("node.k8s.io", "RuntimeClass")
            | ("networking.k8s.io", "IngressClass" | "IPAddress" | "ServiceCIDR")
            | (
                "admissionregistration.k8s.io",
                "ValidatingWebhookConfiguration"
                    | "MutatingWebhookConfiguration"
                    | "ValidatingAdmissionPolicy"
                    | "ValidatingAdmissionPolicyBinding"
                    | "MutatingAdmissionPolicy"
                    | "MutatingAdmissionPolicyBinding"
            )
            | ("apiregistration.k8s.io", "APIService")
            | ("certificates.k8s.io", "CertificateSigningRequest" | "ClusterTrustBundle")
            | ("flowcontrol.apiserver.k8s.io", "FlowSchema" | "PriorityLevelConfiguration")
            | (
                "policies.kyverno.io",
                "ValidatingPolicy" | "MutatingPolicy" | "GeneratingPolicy" | "DeletingPolicy" | "ImageValidatingPolicy"
            )
            | ("kyverno.io", "ClusterPolicy" | "ClusterCleanupPolicy" | "GlobalContextEntry")
            | ("wgpolicyk8s.io", "ClusterPolicyReport")
    )
}
