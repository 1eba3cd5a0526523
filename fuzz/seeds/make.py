#!/usr/bin/env python3
"""Writes the seed inputs of every fuzz target into fuzz/corpus/<target>/ (run from anywhere).
Seeds are the project's own policies and fixtures; the fuzzers grow the corpora from there."""
import glob, hashlib, json, os

root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
corpus = os.path.join(root, "fuzz", "corpus")

def put(target, data):
    if isinstance(data, str):
        data = data.encode()
    d = os.path.join(corpus, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "seed-" + hashlib.sha1(data).hexdigest()[:16]), "wb") as f:
        f.write(data)

pod = {"apiVersion": "v1", "kind": "Pod",
       "metadata": {"name": "web", "namespace": "shop", "labels": {"app": "web", "team": "a"},
                    "annotations": {"owner": "ops"}},
       "spec": {"hostNetwork": False,
                "containers": [{"name": "c", "image": "ghcr.io/acme/web:1.2",
                                "ports": [{"containerPort": 80}],
                                "resources": {"limits": {"memory": "128Mi", "cpu": "500m"}},
                                "securityContext": {"privileged": False, "runAsNonRoot": True}}],
                "volumes": [{"name": "v", "emptyDir": {}}]}}
deploy = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d", "namespace": "shop"},
          "spec": {"replicas": 2, "template": {"metadata": {"labels": {"app": "d"}}, "spec": pod["spec"]}}}
P, D = json.dumps(pod), json.dumps(deploy)

for e in ["request.object.spec.containers[*].image", "length(spec.containers[?securityContext.privileged])",
          "metadata.labels.app || 'none'", "to_upper(metadata.name) == 'WEB'",
          "spec.containers[].resources.limits.memory | [0]", "items(metadata.labels, 'k', 'v')",
          "split(spec.containers[0].image, ':')[1]", "sort_by(spec.containers, &name)[0].name",
          "{n: metadata.name, c: length(spec.containers)}", "divide(`10`, `3`)", "regex_match('^g', spec.containers[0].image)",
          "parse_json('{\"a\":1}').a", "base64_decode(base64_encode('x'))", "time_add('2024-01-01T00:00:00Z', '1h')",
          "spec.containers[0].resources.limits.memory > '64Mi'", "[?@ == `1`]", "merge(metadata.labels, `{\"x\": \"y\"}`)"]:
    put("jmespath", e + "\0" + P)

for t in ["Image {{ request.object.spec.containers[0].image }} is not allowed",
          "{{ request.object.metadata.name }}/{{ request.object.metadata.namespace || 'default' }}",
          "{{- request.object.metadata.labels.app }}", "{{ to_string(`1`) }} {{ request.operation }}",
          "nested {{ request.object.metadata.annotations.\"{{ request.object.metadata.name }}\" }}", "plain text"]:
    put("template", t + "\0" + P)

for pat in [{"spec": {"containers": [{"image": "!*:latest"}]}},
            {"metadata": {"labels": {"app": "?*"}}},
            {"spec": {"=(hostNetwork)": False, "containers": [{"=(securityContext)": {"=(privileged)": "false"}}]}},
            {"spec": {"containers": [{"(name)": "c", "resources": {"limits": {"memory": "<=256Mi"}}}]}},
            {"spec": {"^(containers)": [{"ports": [{"containerPort": ">0 & <65536"}]}]}},
            {"spec": {"X(hostPID)": "null", "+(dnsPolicy)": "ClusterFirst", "<(volumes)": [{"name": "v"}]}},
            {"metadata": {"annotations": {"owner": "ops | dev"}}}]:
    put("pattern", json.dumps(pat) + "\0" + P)

put("patch", "Pod\0" + P + "\0" + json.dumps({"spec": {"containers": [{"name": "c", "image": "x"}, {"name": "s", "image": "side"}]}}))
put("patch", "Pod\0" + P + "\0" + json.dumps({"spec": {"containers": [{"name": "c", "$patch": "delete"}]}, "metadata": {"labels": {"app": None}}}))
put("patch", "Deployment\0" + D + "\0" + json.dumps({"spec": {"template": {"spec": {"volumes": [{"name": "w", "emptyDir": {}}]}}}}))
put("patch", "Service\0" + json.dumps({"kind": "Service", "spec": {"ports": [{"port": 80}]}}) + "\0" + json.dumps({"spec": {"ports": [{"port": 80, "name": "http"}]}}))
put("patch", "Pod\0" + P + "\0" + json.dumps([{"op": "add", "path": "/metadata/labels/x", "value": "y"},
                                               {"op": "remove", "path": "/spec/volumes/0"},
                                               {"op": "replace", "path": "/spec/containers/0/image", "value": "z"},
                                               {"op": "move", "from": "/metadata/annotations", "path": "/metadata/a2"},
                                               {"op": "test", "path": "/kind", "value": "Pod"}]))

for f in sorted(glob.glob(os.path.join(root, "policies", "*.yaml")) + glob.glob(os.path.join(root, "testdata", "**", "*.yaml"), recursive=True)):
    text = open(f, encoding="utf-8").read()
    if "kyverno-test" in f:
        put("test_file", text)
    elif "\nkind: " in "\n" + text and ("Policy" in text or "Exception" in text or "Binding" in text):
        put("policy", text)

def review(obj, op="CREATE", kind="Pod", group="", version="v1", resource="pods", old=None):
    req = {"uid": "0f1e2d3c", "kind": {"group": group, "version": version, "kind": kind},
           "resource": {"group": group, "version": version, "resource": resource},
           "namespace": obj.get("metadata", {}).get("namespace", ""), "name": obj.get("metadata", {}).get("name", ""),
           "operation": op, "userInfo": {"username": "alice", "groups": ["dev"]}, "object": obj, "dryRun": False}
    if old is not None:
        req["oldObject"] = old
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": req})

put("admission", review(pod))
priv = json.loads(P); priv["spec"]["containers"][0]["securityContext"]["privileged"] = True
put("admission", review(priv))
put("admission", review(deploy, kind="Deployment", group="apps", resource="deployments"))
put("admission", review(pod, op="UPDATE", old=pod))
put("admission", review({}, op="DELETE", old=pod))
put("admission", review({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a", "labels": {"team": "a"}}},
                        kind="Namespace", resource="namespaces"))

for c in ["object.spec.containers.all(c, c.image.startsWith('ghcr.io/'))", "has(object.metadata.labels) && 'app' in object.metadata.labels",
          "object.spec.containers.map(c, c.name).join(',')", "size(object.spec.containers) < 3 ? 'ok' : 'many'",
          "object.?metadata.?labels.?team.orValue('none')", "variables.v.kind == 'Pod'",
          "object.spec.containers.filter(c, c.?securityContext.?privileged.orValue(false)).size() == 0",
          "string(object.spec.containers[0].ports[0].containerPort + 1)", "object.metadata.name.matches('^w.*')",
          "[1,2,3].exists(x, x > 2) && {'a': 1}.a == 1", "object.metadata.name.split('e').size()", "base64.encode(b'x')",
          "math.greatest([1, 5, 3])", "lists.range(3)", "sets.contains([1,2],[1])", "image('nginx:1.2').registry()"]:
    put("cel", c + "\0" + P)
