//go:build tools

// Package tools only records, for go mod tidy, the main packages that
// scripts/install-kyverno-oracle.sh builds from this module.
package tools

import (
	_ "github.com/kyverno/kyverno/cmd/cli/kubectl-kyverno"
	_ "github.com/kyverno/kyverno/cmd/kyverno"
)
