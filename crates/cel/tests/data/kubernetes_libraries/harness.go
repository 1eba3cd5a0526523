// The Go side of crates/cel/tests/kubernetes_libraries.rs: evaluates each CEL expression read
// from stdin (one a line) with Kubernetes' URL, IP, CIDR, semver (v1) and quantity libraries
// and cel-go's optional types and regex extension, as Kyverno registers them, and prints
// `expression TAB OK TAB json` or `expression TAB ERR TAB "message"` (COMPILE for a type error).
// An IP, CIDR, URL or semver result prints as Verno holds it: {"@ip": text} and so on.
//
// Regenerate go_answers.tsv (Kyverno's versions: apiserver v0.36.4, cel-go v0.31.0, a module
// at go 1.26 or later so that net/url's current defaults apply):
//
//	mkdir /tmp/h && cp harness.go /tmp/h/main.go && cd /tmp/h
//	printf 'module h\n\ngo 1.26.0\n' > go.mod
//	GOFLAGS=-mod=mod go get k8s.io/apiserver@v0.36.4 github.com/google/cel-go@v0.31.0
//	python3 cases.py | go run . > go_answers.tsv
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/common/types/ref"
	"github.com/google/cel-go/common/types/traits"
	"github.com/google/cel-go/ext"
	apiservercel "k8s.io/apiserver/pkg/cel"
	"k8s.io/apiserver/pkg/cel/library"
)

func main() {
	env, err := cel.NewEnv(
		cel.OptionalTypes(),
		library.URLs(),
		library.IP(),
		library.CIDR(),
		library.SemverLib(library.SemverVersion(1)),
		library.Quantity(),
		ext.Regex(),
		ext.Strings(ext.StringsVersion(2)),
	)
	if err != nil {
		panic(err)
	}
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<20)
	for in.Scan() {
		src := in.Text()
		if src == "" {
			continue
		}
		ast, iss := env.Compile(src)
		if iss.Err() != nil {
			fmt.Printf("%s\tCOMPILE\t%q\n", src, iss.Err().Error())
			continue
		}
		prg, err := env.Program(ast)
		if err != nil {
			fmt.Printf("%s\tPROGRAM\t%q\n", src, err.Error())
			continue
		}
		out, _, err := prg.Eval(map[string]any{})
		if err != nil {
			fmt.Printf("%s\tERR\t%q\n", src, err.Error())
			continue
		}
		b, _ := json.Marshal(plain(out))
		fmt.Printf("%s\tOK\t%s\n", src, b)
	}
}

// plain is a result as JSON would hold it.
func plain(v ref.Val) any {
	switch x := v.(type) {
	case apiservercel.IP:
		return map[string]any{"@ip": x.Addr.String()}
	case apiservercel.CIDR:
		return map[string]any{"@cidr": x.Prefix.String()}
	case apiservercel.URL:
		return map[string]any{"@url": x.URL.String()}
	case apiservercel.Semver:
		version := x.Version
		version.Build = nil // no precedence, and nothing reads it
		return map[string]any{"@semver": version.String()}
	case *types.Optional:
		if x.HasValue() {
			return map[string]any{"@some": plain(x.GetValue())}
		}
		return map[string]any{"@none": true}
	}
	switch v.Type() {
	case types.ListType:
		l := v.(traits.Lister)
		out := []any{}
		for i := types.Int(0); i < l.Size().(types.Int); i++ {
			out = append(out, plain(l.Get(i)))
		}
		return out
	case types.MapType:
		m := v.(traits.Mapper)
		out := map[string]any{}
		for it := m.Iterator(); it.HasNext() == types.True; {
			k := it.Next()
			out[fmt.Sprint(k.Value())] = plain(m.Get(k))
		}
		return out
	}
	return v.Value()
}
