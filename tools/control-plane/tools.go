//go:build tools

// Package tools only records, for go mod tidy, the main packages that
// scripts/install-control-plane.sh builds from this module.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
)
