//go:build tools

// Package tools only records, for go mod tidy, the main package that
// scripts/install-control-plane.sh builds from this module.
package tools

import (
	_ "go.etcd.io/etcd/server/v3"
)
