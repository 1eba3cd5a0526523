//! Seeded generators of ClusterPolicies and resources that sit near the boundaries: fields
//! missing, null, empty or of another type; quantities, wildcards, anchors, every `deny`
//! operator, Pod Security levels with exclusions, `foreach`, preconditions, Pod controllers
//! (autogen). The same seed gives the same cases.

// Values are built here as objects (`json!({...})`) and then filled by key (`c["env"] = …`),
// which on an object inserts and cannot panic; reads by key on a non-object give Null.
#![allow(clippy::indexing_slicing)]

use rand::rngs::StdRng;
use rand::seq::IndexedRandom as _;
use rand::{Rng as _, SeedableRng as _};
use serde_json::{Map, Value, json};

pub struct Gen {
    rng: StdRng,
}

/// Images around the boundaries of the usual wildcard patterns (`*:latest`, `nginx*`, digests,
/// registries with ports, no tag).
const IMAGES: &[&str] = &[
    "nginx",
    "nginx:latest",
    "nginx:1.25",
    "docker.io/library/nginx:1.25",
    "ghcr.io/acme/api:v2",
    "registry.local:5000/team/app:latest",
    "busybox@sha256:0000000000000000000000000000000000000000000000000000000000000000",
    "Nginx:Latest",
    "",
];
const MEMORY: &[&str] = &["64Mi", "1Gi", "1024Mi", "2G", "512M", "100", "0", "1.5Gi"];
const CPU: &[&str] = &["500m", "1", "2.5", "0.1", "1000m", "0"];
const CAPS: &[&str] = &["NET_ADMIN", "NET_BIND_SERVICE", "SYS_ADMIN", "CHOWN", "ALL", "KILL", "AUDIT_WRITE"];
const NAMESPACES: &[&str] = &["default", "team-a", "team-b", "kube-system", "prod"];
const LABEL_VALUES: &[&str] = &["web", "db", "Web", "", "web-1", "prod", "dev"];

impl Gen {
    pub fn new(seed: u64) -> Gen {
        Gen { rng: StdRng::seed_from_u64(seed) }
    }

    fn chance(&mut self, p: f64) -> bool {
        self.rng.random_bool(p)
    }

    fn pick<T: Clone>(&mut self, xs: &[T]) -> T {
        xs.choose(&mut self.rng).cloned().unwrap_or_else(|| unreachable!("pick from an empty list"))
    }

    fn upto(&mut self, n: usize) -> usize {
        self.rng.random_range(0..=n)
    }

    /// A boolean, or (rarely) a string or null where a boolean belongs.
    fn boolish(&mut self) -> Value {
        match self.upto(9) {
            0 => Value::Null,
            1 => json!("true"),
            n => json!(n % 2 == 0),
        }
    }

    // ----- resources -----

    fn labels(&mut self) -> Value {
        let mut m = Map::new();
        for key in ["app", "tier", "env", "team"] {
            if self.chance(0.45) {
                m.insert(key.into(), json!(self.pick(LABEL_VALUES)));
            }
        }
        Value::Object(m)
    }

    fn security_context(&mut self) -> Value {
        let mut m = Map::new();
        if self.chance(0.4) {
            m.insert("privileged".into(), self.boolish());
        }
        if self.chance(0.4) {
            m.insert("allowPrivilegeEscalation".into(), self.boolish());
        }
        if self.chance(0.4) {
            m.insert("runAsNonRoot".into(), self.boolish());
        }
        if self.chance(0.3) {
            m.insert("runAsUser".into(), json!(self.pick(&[0, 1000, 65534])));
        }
        if self.chance(0.2) {
            m.insert("readOnlyRootFilesystem".into(), self.boolish());
        }
        if self.chance(0.35) {
            let mut caps = Map::new();
            if self.chance(0.6) {
                let n = self.upto(2);
                let add: Vec<Value> = (0..n).map(|_| json!(self.pick(CAPS))).collect();
                caps.insert("add".into(), Value::Array(add));
            }
            if self.chance(0.6) {
                let drop = if self.chance(0.7) { json!(["ALL"]) } else { json!([self.pick(CAPS)]) };
                caps.insert("drop".into(), drop);
            }
            m.insert("capabilities".into(), Value::Object(caps));
        }
        if self.chance(0.3) {
            let ty = self.pick(&["RuntimeDefault", "Unconfined", "Localhost"]);
            let mut sp = json!({"type": ty});
            if ty == "Localhost" && self.chance(0.7) {
                sp["localhostProfile"] = json!("profiles/audit.json");
            }
            m.insert("seccompProfile".into(), sp);
        }
        Value::Object(m)
    }

    fn container(&mut self, i: usize) -> Value {
        let mut c = json!({"name": format!("c{i}"), "image": self.pick(IMAGES)});
        if self.chance(0.1) {
            c.as_object_mut().map(|m| m.remove("image"));
        }
        if self.chance(0.55) {
            c["securityContext"] = if self.chance(0.1) { Value::Null } else { self.security_context() };
        }
        if self.chance(0.5) {
            let mut res = Map::new();
            for part in ["limits", "requests"] {
                if self.chance(0.6) {
                    let mut q = Map::new();
                    if self.chance(0.7) {
                        q.insert("memory".into(), json!(self.pick(MEMORY)));
                    }
                    if self.chance(0.6) {
                        let cpu = if self.chance(0.15) { json!(2) } else { json!(self.pick(CPU)) };
                        q.insert("cpu".into(), cpu);
                    }
                    res.insert(part.into(), Value::Object(q));
                }
            }
            c["resources"] = Value::Object(res);
        }
        if self.chance(0.3) {
            let mut port = json!({"containerPort": self.pick(&[80, 443, 8080])});
            if self.chance(0.6) {
                port["hostPort"] = json!(self.pick(&[0, 80, 8080]));
            }
            c["ports"] = json!([port]);
        }
        if self.chance(0.3) {
            c["imagePullPolicy"] = json!(self.pick(&["Always", "IfNotPresent", "Never"]));
        }
        if self.chance(0.15) {
            c["env"] = json!([{"name": "MODE", "value": self.pick(&["a", "", "prod"])}]);
        }
        c
    }

    fn pod_spec(&mut self) -> Value {
        let n = if self.chance(0.05) { 0 } else { 1 + self.upto(2) };
        let containers: Vec<Value> = (0..n).map(|i| self.container(i)).collect();
        let mut spec = json!({"containers": containers});
        if self.chance(0.25) {
            spec["initContainers"] = json!([self.container(9)]);
        }
        for key in ["hostNetwork", "hostPID", "hostIPC"] {
            if self.chance(0.15) {
                spec[key] = self.boolish();
            }
        }
        if self.chance(0.35) {
            let mut sc = Map::new();
            if self.chance(0.5) {
                sc.insert("runAsNonRoot".into(), self.boolish());
            }
            if self.chance(0.3) {
                sc.insert("runAsUser".into(), json!(self.pick(&[0, 1000])));
            }
            if self.chance(0.4) {
                sc.insert("seccompProfile".into(), json!({"type": self.pick(&["RuntimeDefault", "Unconfined"])}));
            }
            spec["securityContext"] = Value::Object(sc);
        }
        if self.chance(0.3) {
            let vol = match self.upto(3) {
                0 => json!({"name": "host", "hostPath": {"path": self.pick(&["/var/log", "/etc"])}}),
                1 => json!({"name": "scratch", "emptyDir": {}}),
                2 => json!({"name": "cfg", "configMap": {"name": "cfg"}}),
                _ => json!({"name": "data", "persistentVolumeClaim": {"claimName": "data"}}),
            };
            spec["volumes"] = json!([vol]);
        }
        if self.chance(0.1) {
            spec["automountServiceAccountToken"] = self.boolish();
        }
        spec
    }

    fn metadata(&mut self, name: &str) -> Value {
        let mut m = json!({"name": name, "namespace": self.pick(NAMESPACES)});
        if self.chance(0.8) {
            m["labels"] = self.labels();
        }
        if self.chance(0.15) {
            m["annotations"] = json!({"team": self.pick(LABEL_VALUES)});
        }
        m
    }

    /// A resource: mostly Pods, and the Pod controllers autogen reaches, and a ConfigMap.
    pub fn resource(&mut self, name: &str) -> Value {
        let meta = self.metadata(name);
        match self.upto(9) {
            0..=5 => json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": self.pod_spec()}),
            6 | 7 => {
                let labels = meta.get("labels").cloned().unwrap_or_else(|| json!({}));
                json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta,
                    "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                        "template": {"metadata": {"labels": labels}, "spec": self.pod_spec()}}})
            }
            8 => json!({"apiVersion": "batch/v1", "kind": "CronJob", "metadata": meta,
                "spec": {"schedule": "*/5 * * * *", "jobTemplate": {"spec": {"template": {"spec": self.pod_spec()}}}}}),
            _ => {
                let mut data = Map::new();
                for key in ["mode", "level", "replicas"] {
                    if self.chance(0.5) {
                        data.insert(key.into(), json!(self.pick(&["a", "", "3", "debug", "prod"])));
                    }
                }
                json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data})
            }
        }
    }

    // ----- policies -----

    /// A pattern leaf: wildcards, operators, ranges, alternatives, quantities, literals.
    fn leaf(&mut self) -> Value {
        let s = self.pick(&[
            "?*",
            "*",
            "nginx*",
            "!*:latest",
            "*:*",
            "!*",
            ">0",
            ">=1000",
            "<=1Gi",
            "<2",
            "1-10",
            "!0",
            "web | db",
            "RuntimeDefault | Localhost",
            "",
            "null",
            "!null",
            "Always",
            "true",
            "false",
            "*-1",
            "!web",
        ]);
        match self.upto(11) {
            0 => json!(true),
            1 => json!(false),
            2 => json!(0),
            3 => Value::Null,
            _ => json!(s),
        }
    }

    /// A pattern for a Pod (or, for `on_element`, a container): a few fragments, each with its
    /// anchors, merged.
    fn pod_pattern(&mut self) -> Value {
        let mut out = json!({});
        for _ in 0..1 + self.upto(2) {
            let frag = match self.upto(10) {
                0 => json!({"metadata": {"labels": {"app": self.leaf()}}}),
                1 => json!({"metadata": {"=(labels)": {"=(env)": self.leaf()}}}),
                2 => json!({"spec": {"containers": [{"image": self.leaf()}]}}),
                3 => {
                    json!({"spec": {"containers": [{"name": "*", "=(securityContext)": {"=(privileged)": self.leaf()}}]}})
                }
                4 => json!({"spec": {"containers": [{"(name)": self.pick(&["c0", "c*", "x"]), "image": self.leaf()}]}}),
                5 => json!({"spec": {"containers": [{"resources": {"limits": {"memory": self.leaf()}}}]}}),
                6 => json!({"spec": {"=(hostNetwork)": self.leaf(), "=(hostPID)": false}}),
                7 => json!({"spec": {"=(volumes)": [{"X(hostPath)": "null"}]}}),
                8 => json!({"spec": {"^(containers)": [{"image": self.leaf()}]}}),
                9 => json!({"spec": {"containers": [{"<(name)": "c0", "imagePullPolicy": self.leaf()}]}}),
                _ => json!({"spec": {"=(securityContext)": {"=(runAsNonRoot)": self.leaf()}}}),
            };
            merge(&mut out, frag);
        }
        out
    }

    fn container_pattern(&mut self) -> Value {
        let mut out = json!({});
        for _ in 0..1 + self.upto(1) {
            let frag = match self.upto(4) {
                0 => json!({"image": self.leaf()}),
                1 => json!({"=(securityContext)": {"=(allowPrivilegeEscalation)": self.leaf()}}),
                2 => json!({"resources": {"=(limits)": {"=(cpu)": self.leaf()}}}),
                3 => json!({"(name)": "c*", "=(imagePullPolicy)": self.leaf()}),
                _ => json!({"name": self.leaf()}),
            };
            merge(&mut out, frag);
        }
        out
    }

    /// A `deny`/precondition key: JMESPath over the request, some of which can be missing.
    fn key(&mut self, element: bool) -> Value {
        let mut keys = vec![
            "{{ request.object.metadata.labels.app || '' }}",
            "{{ request.object.metadata.labels.app }}",
            "{{ request.object.spec.containers[].image }}",
            "{{ length(request.object.spec.containers || `[]`) }}",
            "{{ request.object.spec.hostNetwork || `false` }}",
            "{{ request.operation }}",
            "{{ request.object.metadata.name }}",
            "{{ request.object.metadata.namespace }}",
            "{{ request.object.spec.containers[0].resources.limits.memory || '0' }}",
            "{{ request.object.data.mode || '' }}",
            "{{ request.object.metadata.labels }}",
            "{{ to_upper(request.object.metadata.labels.tier || 'none') }}",
            "{{ request.object.spec.containers[?securityContext.privileged == `true`].name }}",
        ];
        if element {
            keys.extend([
                "{{ element.image }}",
                "{{ element.name }}",
                "{{ element.securityContext.runAsNonRoot || `false` }}",
                "{{ element.resources.limits.memory || '0' }}",
                "{{ contains(element.image || '', ':') }}",
            ]);
        }
        json!(self.pick(&keys))
    }

    fn value(&mut self) -> Value {
        match self.upto(14) {
            0 => json!(["web", "db"]),
            1 => json!(["nginx*", "ghcr.io/*"]),
            2 => json!(0),
            3 => json!(1),
            4 => json!(true),
            5 => json!(false),
            6 => json!("1Gi"),
            7 => json!("CREATE"),
            8 => json!([]),
            9 => json!("web"),
            10 => json!("*"),
            11 => json!(["CREATE", "UPDATE"]),
            12 => json!(""),
            13 => json!("512Mi"),
            _ => json!("?*"),
        }
    }

    fn conditions(&mut self, element: bool) -> Value {
        let ops = [
            "Equals",
            "NotEquals",
            "In",
            "NotIn",
            "AnyIn",
            "AllIn",
            "AnyNotIn",
            "AllNotIn",
            "GreaterThan",
            "GreaterThanOrEquals",
            "LessThan",
            "LessThanOrEquals",
        ];
        let n = 1 + self.upto(2);
        let list: Vec<Value> = (0..n)
            .map(|_| json!({"key": self.key(element), "operator": self.pick(&ops), "value": self.value()}))
            .collect();
        let block = self.pick(&["any", "all"]);
        json!({ block: list })
    }

    fn validate(&mut self) -> Value {
        let message = json!(self.pick(&["bad {{ request.object.metadata.name }}", "not allowed", ""]));
        let mut v = match self.upto(9) {
            0..=2 => json!({"pattern": self.pod_pattern()}),
            3 => json!({"anyPattern": [self.pod_pattern(), self.pod_pattern()]}),
            4 | 5 => json!({"deny": {"conditions": self.conditions(false)}}),
            6 | 7 => {
                let level = self.pick(&["baseline", "restricted"]);
                // Versions Kyverno 1.19's CRD schema allows (v1.19 to v1.32, latest): its CLI
                // applies a policy outside its schema with no rules (docs/compat.md).
                let mut ps =
                    json!({"level": level, "version": self.pick(&["latest", "v1.22", "v1.25", "v1.29", "v1.32"])});
                if self.chance(0.5) {
                    let ex = match self.upto(3) {
                        0 => json!({"controlName": "Capabilities", "images": ["nginx*"]}),
                        1 => json!({"controlName": "Running as Non-root", "images": ["*"]}),
                        2 => json!({"controlName": "Host Ports", "images": ["*"],
                            "restrictedField": "spec.containers[*].ports[*].hostPort", "values": ["80"]}),
                        _ => json!({"controlName": "Privileged Containers", "images": ["ghcr.io/*"],
                            "restrictedField": "spec.containers[*].securityContext.privileged", "values": ["true"]}),
                    };
                    ps["exclude"] = json!([ex]);
                }
                json!({"podSecurity": ps})
            }
            _ => {
                let body = if self.chance(0.5) {
                    json!({"pattern": self.container_pattern()})
                } else {
                    json!({"deny": {"conditions": self.conditions(true)}})
                };
                let mut fe = body;
                fe["list"] =
                    json!(self.pick(&["request.object.spec.containers", "request.object.spec.initContainers"]));
                json!({"foreach": [fe]})
            }
        };
        if v.get("podSecurity").is_none() && self.chance(0.8) {
            v["message"] = message;
        }
        v
    }

    fn match_block(&mut self) -> Value {
        let kinds = match self.upto(5) {
            0..=2 => json!(["Pod"]),
            3 => json!(["Pod", "ConfigMap"]),
            4 => json!(["Deployment"]),
            _ => json!(["ConfigMap"]),
        };
        let mut res = json!({"kinds": kinds});
        match self.upto(6) {
            0 => res["namespaces"] = json!(["team-*"]),
            1 => res["selector"] = json!({"matchLabels": {"app": "web"}}),
            2 => res["names"] = json!(["r-1*", "r-2*"]),
            _ => {}
        }
        json!({"any": [{"resources": res}]})
    }

    /// A label or annotation value for a patch: plain, a variable, or (rarely) not a string.
    fn patch_value(&mut self) -> Value {
        match self.upto(9) {
            0 => json!("{{request.object.metadata.name}}"),
            1 => json!("{{request.object.metadata.labels.app || 'none'}}"),
            2 => json!("{{request.namespace}}"),
            3 if self.chance(0.3) => json!(7),
            _ => json!(self.pick(LABEL_VALUES)),
        }
    }

    /// A key of a strategic merge patch, plain or with an anchor.
    fn patch_key(&mut self, key: &str) -> String {
        match self.upto(5) {
            0 | 1 => format!("+({key})"),
            _ => key.to_string(),
        }
    }

    /// A strategic merge patch for a Pod (autogen moves it under the controllers' templates).
    fn merge_patch(&mut self) -> Value {
        let mut patch = json!({});
        let parts = 1 + self.upto(2);
        for _ in 0..parts {
            let part = match self.upto(9) {
                0 | 1 => {
                    let label = self.pick(&["team", "app", "env", "tier"]);
                    let key = self.patch_key(label);
                    let value = if self.chance(0.1) { Value::Null } else { self.patch_value() };
                    json!({"metadata": {"labels": {key: value}}})
                }
                2 => {
                    let key = self.patch_key("owner");
                    json!({"metadata": {"annotations": {key: self.patch_value()}}})
                }
                3 | 4 => {
                    let mut c = Map::new();
                    let select = self.pick(&["*", "c0", "c*", "c1"]);
                    c.insert("(name)".into(), json!(select));
                    if self.chance(0.3) {
                        c.insert("(image)".into(), json!(self.pick(&["*:latest", "nginx*", "!*:latest", "*"])));
                    }
                    let pull = self.patch_key("imagePullPolicy");
                    c.insert(pull, json!(self.pick(&["IfNotPresent", "Always"])));
                    json!({"spec": {"containers": [Value::Object(c)]}})
                }
                5 => {
                    let key = self.patch_key("securityContext");
                    let inner = self.patch_key("runAsNonRoot");
                    json!({"spec": {key: {inner: true}}})
                }
                6 => {
                    let key = self.patch_key("resources");
                    let mem = self.pick(MEMORY);
                    json!({"spec": {"containers": [{"(name)": "*", key: {"limits": {"memory": mem}}}]}})
                }
                7 => {
                    // A global anchor: the whole patch only where some container's image fits.
                    let img = self.pick(&["*nginx*", "*:latest", "busybox*"]);
                    let sa = self.patch_key("serviceAccountName");
                    json!({"spec": {"containers": [{"<(image)": img}], sa: "restricted"}})
                }
                8 => {
                    let sc = self.patch_key("allowPrivilegeEscalation");
                    json!({"spec": {"containers": [{"(name)": "*", "securityContext": {sc: false}}]}})
                }
                _ => {
                    let name = self.pick(&["cache", "data"]);
                    json!({"spec": {"volumes": [{"name": name, "emptyDir": {}}]}})
                }
            };
            merge(&mut patch, part);
        }
        patch
    }

    /// An RFC 6902 patch, as the YAML text Kyverno reads.
    fn json_patch(&mut self) -> Value {
        let n = 1 + self.upto(2);
        let mut ops = Vec::new();
        for _ in 0..n {
            let op = match self.upto(11) {
                0 => json!({"op": "add", "path": "/metadata/labels/patched", "value": "yes"}),
                1 => json!({"op": "add", "path": "/metadata/labels", "value": {"a": "b"}}),
                2 => json!({"op": "replace", "path": "/spec/containers/0/image", "value": "nginx:1.27"}),
                3 => json!({"op": "remove", "path": "/metadata/annotations"}),
                4 => json!({"op": "add", "path": "/spec/containers/-", "value": {"name": "sidecar", "image": "envoy"}}),
                5 => json!({"op": "add", "path": "/metadata/annotations/example.com~1team", "value": "core"}),
                6 => json!({"op": "remove", "path": "/spec/containers/1"}),
                7 => {
                    json!({"op": "replace", "path": "/metadata/labels/app", "value": "{{request.object.metadata.name}}"})
                }
                8 => json!({"op": "add", "path": "/spec/containers/0/env", "value": [{"name": "A", "value": "1"}]}),
                9 => json!({"op": "copy", "from": "/metadata/name", "path": "/metadata/labels/name"}),
                10 => json!({"op": "test", "path": "/spec/containers/0/name", "value": "c0"}),
                _ => json!({"op": "move", "from": "/metadata/labels/app", "path": "/metadata/labels/application"}),
            };
            ops.push(op);
        }
        let text = serde_saphyr::to_string(&Value::Array(ops)).unwrap_or_default();
        Value::String(text)
    }

    /// A mutate rule's body: a strategic merge patch, an RFC 6902 patch, or a foreach over the
    /// containers with either.
    fn mutate(&mut self) -> Value {
        match self.upto(9) {
            0..=4 => json!({"patchStrategicMerge": self.merge_patch()}),
            5 | 6 => json!({"patchesJson6902": self.json_patch()}),
            7 | 8 => {
                let mut fe = json!({"list": "request.object.spec.containers", "patchStrategicMerge": {"spec": {"containers": [{
                    "name": "{{ element.name }}",
                    "securityContext": {"privileged": false}
                }]}}});
                if self.chance(0.5) {
                    fe["patchStrategicMerge"] = json!({"spec": {"containers": [{
                        "(name)": "{{ element.name }}",
                        "+(imagePullPolicy)": "{{ element.image | contains(@, ':latest') && 'Always' || 'IfNotPresent' }}"
                    }]}});
                }
                if self.chance(0.3) {
                    fe["preconditions"] =
                        json!({"all": [{"key": "{{ element.image }}", "operator": "Equals", "value": "*nginx*"}]});
                }
                json!({"foreach": [fe]})
            }
            _ => {
                let fe = json!({"list": "request.object.spec.containers",
                    "patchesJson6902": "- op: add\n  path: /spec/containers/{{elementIndex}}/imagePullPolicy\n  value: IfNotPresent\n"});
                json!({"foreach": [fe]})
            }
        }
    }

    /// A CEL predicate on one container `c`.
    fn cel_container(&mut self) -> String {
        self.pick(&[
            "c.image.startsWith('nginx')",
            "c.image.endsWith(':latest')",
            "!c.image.contains(':')",
            "c.image.matches('^[a-z0-9./:-]+$')",
            "c.name.size() < 3",
            "c.name in ['c0', 'c1']",
            "!has(c.securityContext) || c.securityContext.?privileged.orValue(false) == false",
            "c.?securityContext.?allowPrivilegeEscalation.orValue(true) == false",
            "c.?securityContext.?runAsNonRoot.orValue(false)",
            "c.?resources.?limits.?memory.hasValue()",
            "!c.?resources.?limits.?memory.hasValue() || quantity(c.resources.limits.memory).isLessThan(quantity('1Gi'))",
            "c.?ports.orValue([]).all(p, p.containerPort > 1024)",
            "c.?ports.orValue([]).all(p, !has(p.hostPort))",
            "c.?env.orValue([]).exists(e, e.name == 'MODE')",
            "c.?securityContext.?capabilities.?add.orValue([]).all(x, x in ['NET_BIND_SERVICE'])",
            "c.?imagePullPolicy.orValue('IfNotPresent') != 'Never'",
            "c.image.split(':').size() == 2",
            "c.image.lowerAscii() == c.image",
            "c.securityContext.privileged == false",
            "c.resources.limits.cpu != '0'",
            "int(c.?ports.orValue([]).size()) <= 1",
        ])
        .to_string()
    }

    /// A CEL validation over the object.
    fn cel_validation(&mut self) -> Value {
        let quant = self.pick(&["all", "exists", "exists_one"]);
        let pred = self.cel_container();
        let expression = match self.upto(9) {
            0..=4 => format!("object.spec.containers.{quant}(c, {pred})"),
            5 => format!("object.spec.?initContainers.orValue([]).all(c, {pred})"),
            6 => self.pick(&[
                "object.metadata.?labels.?app.orValue('') == 'web'",
                "'app' in object.metadata.?labels.orValue({})",
                "object.metadata.name.startsWith('r-1')",
                "object.spec.?hostNetwork.orValue(false) == false",
                "object.spec.?volumes.orValue([]).all(v, !has(v.hostPath))",
                "object.metadata.labels.app != 'db'",
                "size(object.spec.containers) <= 2",
            ])
            .to_string(),
            7 => format!("variables.names.all(n, n.startsWith('c')) && object.spec.containers.{quant}(c, {pred})"),
            _ => self.pick(&[
                "object.spec.containers.filter(c, c.image.endsWith(':latest')).size() == 0",
                "object.spec.containers.map(c, c.name).exists(n, n == 'c1')",
                "object.spec.containers[2].name != ''",
                "object.spec.?securityContext.?seccompProfile.?type.orValue('RuntimeDefault') in ['RuntimeDefault', 'Localhost']",
            ])
            .to_string(),
        };
        let mut v = json!({"expression": expression});
        match self.upto(3) {
            0 => {}
            1 => {
                v["messageExpression"] = json!(self.pick(&[
                    "'bad ' + object.metadata.name",
                    "'containers: ' + string(size(object.spec.containers))",
                    "object.metadata.name + ' in ' + object.metadata.namespace",
                ]))
            }
            _ => v["message"] = json!(self.pick(&["not allowed", "bad pod", ""])),
        }
        v
    }

    /// A ValidatingPolicy (policies.kyverno.io/v1) on Pods, sometimes with variables and match
    /// conditions.
    pub fn vpol(&mut self, name: &str) -> Value {
        let n = 1 + self.upto(1);
        let validations: Vec<Value> = (0..n).map(|_| self.cel_validation()).collect();
        let mut spec = json!({
            "validationActions": [self.pick(&["Deny", "Audit"])],
            "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                "operations": ["CREATE", "UPDATE"], "resources": ["pods"]}]},
            "variables": [{"name": "names", "expression": "object.spec.containers.map(c, c.name)"}],
            "validations": validations,
        });
        if self.chance(0.3) {
            let cond = self.pick(&[
                "object.metadata.namespace != 'kube-system'",
                "has(object.metadata.labels)",
                "object.metadata.?labels.?env.orValue('') != 'dev'",
            ]);
            spec["matchConditions"] = json!([{"name": "only-some", "expression": cond}]);
        }
        json!({"apiVersion": "policies.kyverno.io/v1", "kind": "ValidatingPolicy", "metadata": {"name": name}, "spec": spec})
    }

    /// A policy named `name`: mostly a ClusterPolicy with one to three validate rules,
    /// sometimes with mutate rules (and then perhaps a validate rule after them), sometimes a
    /// ValidatingPolicy.
    pub fn policy(&mut self, name: &str) -> Value {
        if self.chance(0.15) {
            return self.vpol(name);
        }
        let mutates = self.chance(0.3);
        let n = 1 + self.upto(2);
        let rules: Vec<Value> = (0..n)
            .map(|i| {
                let body = if mutates && (i == 0 || self.chance(0.6)) {
                    ("mutate", self.mutate())
                } else {
                    ("validate", self.validate())
                };
                let mut r = json!({"name": format!("rule-{i}"), "match": self.match_block()});
                r[body.0] = body.1;
                if self.chance(0.15) {
                    r["exclude"] = json!({"any": [{"resources": {"namespaces": ["kube-system"]}}]});
                }
                if self.chance(0.2) {
                    r["preconditions"] = self.conditions(false);
                }
                r
            })
            .collect();
        let mut spec =
            json!({"validationFailureAction": self.pick(&["Audit", "Enforce"]), "background": true, "rules": rules});
        if self.chance(0.1) {
            spec["failurePolicy"] = json!("Ignore");
        }
        json!({"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy", "metadata": {"name": name}, "spec": spec})
    }
}

/// Merges `b` into `a`: objects key by key, the first elements of two arrays of objects
/// together; otherwise `b` wins.
fn merge(a: &mut Value, b: Value) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            for (k, v) in y {
                match x.get_mut(&k) {
                    Some(slot) => merge(slot, v),
                    None => {
                        x.insert(k, v);
                    }
                }
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == 1 && y.len() == 1 && x[0].is_object() => {
            if let Some(first) = y.into_iter().next() {
                merge(&mut x[0], first);
            }
        }
        (slot, v) => *slot = v,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_cases_and_another_seed_others() {
        let run = |seed| {
            let mut g = Gen::new(seed);
            (g.policy("p"), g.resource("r"))
        };
        assert_eq!(run(7), run(7));
        assert_ne!((1..20).map(run).collect::<Vec<_>>(), (21..40).map(run).collect::<Vec<_>>());
    }

    #[test]
    fn merging_fragments_keeps_both_and_joins_the_first_container() {
        let mut a = json!({"spec": {"containers": [{"image": "a"}]}});
        merge(&mut a, json!({"spec": {"containers": [{"name": "*"}], "hostPID": false}}));
        assert_eq!(a, json!({"spec": {"containers": [{"image": "a", "name": "*"}], "hostPID": false}}));
    }
}
