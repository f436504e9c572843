// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

//go:build linux

package main

import (
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
)

// compare writes, as Markdown bullets, how what the vllm source (v) and
// the prometheus receiver (p) made of exp differ.
func compare(b *strings.Builder, exp exposition, v, p readout) {
	for _, ro := range []readout{v, p} {
		if ro.err != nil {
			fmt.Fprintf(b, "- **%s failed**: %v\n", ro.src, ro.err)
		}
	}
	if v.err != nil || p.err != nil {
		return
	}
	for _, ro := range []readout{v, p} {
		fmt.Fprintf(b, "- %s: sent `%s`, was answered %s; resource %s\n",
			ro.src, ro.accept, servedString(ro.served), rawString(ro.resource))
	}
	vv, pv := viewOf(v, exp), viewOf(p, exp)
	var onlyV, onlyP, same []string
	for name := range vv {
		if _, ok := pv[name]; ok {
			same = append(same, name)
		} else {
			onlyV = append(onlyV, name)
		}
	}
	for name := range pv {
		if _, ok := vv[name]; !ok {
			onlyP = append(onlyP, name)
		}
	}
	slices.Sort(onlyV)
	slices.Sort(onlyP)
	slices.Sort(same)
	fmt.Fprintf(b, "- metrics: %d from the vllm source, %d from the prometheus receiver, %d by the same name\n", len(vv), len(pv), len(same))
	if len(onlyV) > 0 {
		fmt.Fprintf(b, "- only from the vllm source: %s\n", describe(onlyV, vv))
	}
	if len(onlyP) > 0 {
		fmt.Fprintf(b, "- only from the prometheus receiver: %s\n", describe(onlyP, pv))
	}
	identical := 0
	for _, name := range same {
		a, c := vv[name], pv[name]
		var diffs []string
		if a.shape != c.shape {
			diffs = append(diffs, fmt.Sprintf("type %s vs %s", a.shape, c.shape))
		}
		if !reflect.DeepEqual(a.points, c.points) {
			diffs = append(diffs, fmt.Sprintf("points %s vs %s", pointsString(a.points), pointsString(c.points)))
		}
		if !reflect.DeepEqual(a.starts, c.starts) {
			diffs = append(diffs, fmt.Sprintf("start time %s vs %s", setString(a.starts), setString(c.starts)))
		}
		if len(diffs) == 0 {
			identical++
			continue
		}
		fmt.Fprintf(b, "- `%s` differs: %s\n", name, strings.Join(diffs, "; "))
	}
	fmt.Fprintf(b, "- %d of the %d same-named metrics identical (type, attributes, values, histogram buckets, start-time source)\n", identical, len(same))
	fmt.Fprintf(b, "- start times of sums and histograms: vllm source %s; prometheus receiver %s\n", startsOf(vv), startsOf(pv))
	for _, kind := range []struct {
		name string
		v, p map[string]any
	}{{"session summary", v.summary, p.summary}, {"stall alert", v.stall, p.stall}} {
		verdict := "**the same**"
		if !reflect.DeepEqual(kind.v, kind.p) {
			verdict = "**different**"
		}
		fmt.Fprintf(b, "- token_session %s engine context: %s; vllm source %s, prometheus receiver %s\n",
			kind.name, verdict, rawString(kind.v), rawString(kind.p))
	}
}

func describe(names []string, views map[string]metricView) string {
	parts := make([]string, len(names))
	for i, n := range names {
		parts[i] = fmt.Sprintf("`%s` (%s, %d points)", n, views[n].shape, len(views[n].points))
	}
	return strings.Join(parts, ", ")
}

func startsOf(views map[string]metricView) string {
	count := map[string]int{}
	for _, v := range views {
		for k := range v.starts {
			count[k]++
		}
	}
	if len(count) == 0 {
		return "none"
	}
	parts := []string{}
	for _, k := range slices.Sorted(maps.Keys(count)) {
		parts = append(parts, fmt.Sprintf("%s ×%d", k, count[k]))
	}
	return strings.Join(parts, ", ")
}

func servedString(m map[string]int) string {
	parts := []string{}
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("`%s` ×%d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

func rawString(m map[string]any) string {
	parts := []string{}
	for _, k := range slices.Sorted(maps.Keys(m)) {
		if s, ok := m[k].(string); ok {
			parts = append(parts, fmt.Sprintf("%s=%q", k, s))
		} else {
			parts = append(parts, fmt.Sprintf("%s=%v", k, m[k]))
		}
	}
	return "`{" + strings.Join(parts, ", ") + "}`"
}

func setString(m map[string]bool) string {
	return "[" + strings.Join(slices.Sorted(maps.Keys(m)), ", ") + "]"
}

func pointsString(m map[string]string) string {
	parts := []string{}
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, k+" "+m[k])
	}
	s := strings.Join(parts, " | ")
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	return "`" + s + "`"
}
