// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

//go:build linux

package main

import (
	"bufio"
	"bytes"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// exposition is one /metrics body the fake engine serves, in the classic
// text format (0.0.4) and in OpenMetrics 1.0 as prometheus_client writes it.
type exposition struct {
	name string
	text []byte
	om   []byte
	// created holds the values of the body's _created samples (Unix
	// seconds, as written), to recognize start times taken from them.
	created map[string]bool
}

// loadExpositions reads the expositions the repository tests the vllm
// source with: the fixture, and the bodies of the golden tests (read from
// the test file, so that they stay the ones the tests use).
func loadExpositions(root string) ([]exposition, error) {
	fixture, err := os.ReadFile(filepath.Join(root, "testdata", "fixtures", "vllm", "metrics-v1.prom"))
	if err != nil {
		return nil, err
	}
	golden := filepath.Join(root, "internal", "promconv", "golden_test.go")
	consts, err := stringConsts(golden, "olderNamesBody", "dataParallelBody")
	if err != nil {
		return nil, err
	}
	bodies := []struct {
		name string
		text []byte
	}{
		{"v1 fixture (metrics-v1.prom)", fixture},
		{"older names (vLLM 0.7-0.10)", []byte(consts["olderNamesBody"])},
		{"data-parallel (2 engines)", []byte(consts["dataParallelBody"])},
		{"multiprocess (fixture)", multiprocess(fixture)},
		{"multiprocess + data-parallel", multiprocess([]byte(consts["dataParallelBody"]))},
	}
	out := make([]exposition, 0, len(bodies))
	for _, b := range bodies {
		out = append(out, newExposition(b.name, b.text))
	}
	return out, nil
}

func newExposition(name string, text []byte) exposition {
	e := exposition{name: name, text: text, om: openMetrics(text), created: map[string]bool{}}
	for _, f := range families(text) {
		if strings.HasSuffix(f.name, "_created") {
			for _, s := range f.samples {
				e.created[sampleValue(s)] = true
			}
		}
	}
	return e
}

// stringConsts returns the values of the named string constants of a Go
// file.
func stringConsts(path string, names ...string) (map[string]string, error) {
	f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.SkipObjectResolution)
	if err != nil {
		return nil, err
	}
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	out := map[string]string{}
	ast.Inspect(f, func(n ast.Node) bool {
		spec, ok := n.(*ast.ValueSpec)
		if !ok {
			return true
		}
		for i, id := range spec.Names {
			if i >= len(spec.Values) {
				break
			}
			lit, ok := spec.Values[i].(*ast.BasicLit)
			if !want[id.Name] || !ok || lit.Kind != token.STRING {
				continue
			}
			if s, err := strconv.Unquote(lit.Value); err == nil {
				out[id.Name] = s
			}
		}
		return false
	})
	for _, n := range names {
		if _, ok := out[n]; !ok {
			return nil, fmt.Errorf("%s: no string constant %s", path, n)
		}
	}
	return out, nil
}

// family is one metric family of a text exposition: its HELP and TYPE
// lines and its sample lines, in order.
type family struct {
	name, typ, help string
	samples         []string
}

// families splits a text exposition into its families. Comments other than
// HELP and TYPE are left out.
func families(text []byte) []*family {
	var out []*family
	cur := func(name string) *family {
		if n := len(out); n > 0 && out[n-1].name == name {
			return out[n-1]
		}
		out = append(out, &family{name: name})
		return out[len(out)-1]
	}
	sc := bufio.NewScanner(bytes.NewReader(text))
	sc.Buffer(nil, len(text)+1)
	for sc.Scan() {
		line := sc.Text()
		f := strings.Fields(line)
		switch {
		case len(f) == 0:
		case len(f) >= 3 && f[0] == "#" && f[1] == "HELP":
			cur(f[2]).help = strings.TrimSpace(strings.SplitN(line, f[2], 2)[1])
		case len(f) >= 4 && f[0] == "#" && f[1] == "TYPE":
			cur(f[2]).typ = f[3]
		case f[0] == "#":
		case len(out) > 0:
			out[len(out)-1].samples = append(out[len(out)-1].samples, line)
		}
	}
	return out
}

func sampleName(line string) string {
	name, _, _ := strings.Cut(strings.Fields(line)[0], "{")
	return name
}

func sampleValue(line string) string {
	if i := strings.LastIndexByte(line, '}'); i >= 0 {
		line = line[i+1:]
	} else {
		line = strings.TrimPrefix(line, strings.Fields(line)[0])
	}
	return strings.Fields(line)[0]
}

// multiprocess rewrites a single-process exposition as prometheus_client
// writes it in multiprocess mode (vLLM with --api-server-count > 1), as
// internal/promconv/golden_test.go describes it: no _created families, and a
// histogram's _count and _sum lines before all its _bucket lines.
func multiprocess(text []byte) []byte {
	var b bytes.Buffer
	for _, f := range families(text) {
		if strings.HasSuffix(f.name, "_created") {
			continue
		}
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s %s\n", f.name, f.help, f.name, f.typ)
		var buckets []string
		for _, s := range f.samples {
			if strings.HasSuffix(sampleName(s), "_bucket") {
				buckets = append(buckets, s)
				continue
			}
			b.WriteString(s + "\n")
		}
		for _, s := range buckets {
			b.WriteString(s + "\n")
		}
	}
	return b.Bytes()
}

// openMetrics rewrites a text exposition as prometheus_client's OpenMetrics
// output: a counter family is named without _total (its samples keep it),
// the _created gauges of counters and histograms become _created samples
// of their family, and the body ends with # EOF.
func openMetrics(text []byte) []byte {
	fams := families(text)
	byName := map[string]*family{}
	for _, f := range fams {
		byName[f.name] = f
	}
	// owner is the family whose _created samples a _created gauge holds.
	owner := func(f *family) *family {
		if !strings.HasSuffix(f.name, "_created") || f.typ != "gauge" {
			return nil
		}
		base := strings.TrimSuffix(f.name, "_created")
		if o := byName[base+"_total"]; o != nil && o.typ == "counter" {
			return o
		}
		if o := byName[base]; o != nil && (o.typ == "histogram" || o.typ == "summary") {
			return o
		}
		return nil
	}
	created := map[*family][]string{}
	for _, f := range fams {
		if o := owner(f); o != nil {
			created[o] = append(created[o], f.samples...)
		}
	}
	var b bytes.Buffer
	for _, f := range fams {
		if owner(f) != nil {
			continue
		}
		name := f.name
		if f.typ == "counter" {
			name = strings.TrimSuffix(name, "_total")
		}
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s %s\n", name, f.help, name, f.typ)
		for _, s := range withCreated(f.samples, created[f]) {
			b.WriteString(s + "\n")
		}
	}
	b.WriteString("# EOF\n")
	return b.Bytes()
}

// withCreated puts each _created sample right after the last sample of its
// series, as prometheus_client writes a series' samples together.
func withCreated(samples, created []string) []string {
	out := append([]string(nil), samples...)
	for _, c := range created {
		at := len(out)
		for i, s := range out {
			if seriesLabels(s) == seriesLabels(c) {
				at = i + 1
			}
		}
		out = append(out[:at], append([]string{c}, out[at:]...)...)
	}
	return out
}

// seriesLabels is a sample's label set without le (the fixtures' label
// values hold no commas or braces).
func seriesLabels(line string) string {
	_, rest, ok := strings.Cut(line, "{")
	if !ok {
		return ""
	}
	rest, _, _ = strings.Cut(rest, "}")
	var keep []string
	for _, l := range strings.Split(rest, ",") {
		if !strings.HasPrefix(l, "le=") {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, ",")
}
