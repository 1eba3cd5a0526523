#!/usr/bin/env python3
"""Writes an AdmissionReview (CREATE) of a large Pod to stdout: CONTAINERS containers (default
60), each with 30 env vars, ports, mounts and a security context, about 250 KB. Our own
fixture for bench/reliability.sh; every bundled Pod Security policy has work to do on it."""
import json, sys

n = int(sys.argv[1]) if len(sys.argv) > 1 else 60
def container(i):
    return {"name": f"c{i}", "image": f"registry.example.com/team/app-{i}:1.{i}",
            "env": [{"name": f"VAR_{i}_{j}", "value": "x" * 40} for j in range(30)],
            "ports": [{"containerPort": 8000 + i, "protocol": "TCP"}],
            "volumeMounts": [{"name": f"v{i}", "mountPath": f"/data/{i}"}],
            "resources": {"limits": {"cpu": "100m", "memory": "64Mi"}},
            "securityContext": {"runAsNonRoot": True, "allowPrivilegeEscalation": False,
                                "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}}
pod = {"apiVersion": "v1", "kind": "Pod",
       "metadata": {"name": "heavy", "namespace": "load", "labels": {f"l{k}": "v" for k in range(50)},
                    "annotations": {f"a{k}": "v" * 100 for k in range(50)}},
       "spec": {"containers": [container(i) for i in range(n)],
                "volumes": [{"name": f"v{i}", "emptyDir": {}} for i in range(n)],
                "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}}}
review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
          "request": {"uid": "6a1b2c3d-0000-4000-8000-000000000001",
                      "kind": {"group": "", "version": "v1", "kind": "Pod"},
                      "resource": {"group": "", "version": "v1", "resource": "pods"},
                      "namespace": "load", "name": "heavy", "operation": "CREATE",
                      "userInfo": {"username": "load", "groups": ["system:authenticated"]},
                      "object": pod, "dryRun": False}}
json.dump(review, sys.stdout)
