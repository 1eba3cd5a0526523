//go:build tools

// Package tools only records, for go mod tidy, the main package that
// scripts/install-control-plane.sh builds from this module.
package tools

import (
	_ "sigs.k8s.io/kwok/cmd/kwok"
)
