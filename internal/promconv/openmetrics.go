// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package promconv // import "github.com/otelcol-llm/otelcol-llm/internal/promconv"

import (
	"bytes"
	"math"
	"strconv"
	"strings"
)

// Reasons a family is skipped, the keys of Skipped.
const (
	SkipGaugeHistogram = "gaugehistogram" // OpenMetrics gauge histogram: no pmetric counterpart kept
	SkipSummary        = "summary"        // summaries are not converted
	SkipUnknownType    = "unknown_type"   // an OpenMetrics TYPE the 1.0 spec does not define
)

// Skipped counts the families of one exposition left out, by reason.
type Skipped map[string]int

// omSampleSuffixes are the sample name suffixes of an OpenMetrics family:
// a skipped family's samples are those named after it with one of them.
var omSampleSuffixes = []string{"", "_bucket", "_gcount", "_gsum", "_count", "_sum", "_created", "_total", "_info"}

// normalizeOpenMetrics rewrites an OpenMetrics 1.0 body into the classic
// text format expfmt's parser reads, mapping the OpenMetrics types the way
// the prometheus receiver does:
//   - info `x` → gauge `x_info` (its samples, valued 1, carry the labels);
//   - stateset `x` → gauge `x`, one series per state (1 for the current);
//   - unknown → untyped;
//   - gaugehistogram and any type the spec does not define → the family is
//     skipped (descriptors and samples), counted in the returned Skipped;
//   - exemplars (` # {…} v [ts]` after a sample) are dropped;
//   - sample timestamps, seconds as a float, become integer milliseconds.
//
// Counters stay as they are (ParseExposition retypes their `x_total`).
// Lines it does not understand are kept for the parser to reject.
func normalizeOpenMetrics(body []byte) ([]byte, Skipped) {
	lines := bytes.Split(body, []byte("\n"))
	types := make(map[string]string)
	for _, l := range lines {
		if !bytes.HasPrefix(l, []byte("# TYPE ")) {
			continue
		}
		if f := strings.Fields(string(l)); len(f) == 4 && f[0] == "#" && f[1] == "TYPE" {
			types[f[2]] = strings.ToLower(f[3])
		}
	}
	var skipped Skipped
	skipFam := make(map[string]bool)
	skip := make(map[string]bool) // sample names of skipped families
	for name, typ := range types {
		var reason string
		switch typ {
		case "counter", "gauge", "histogram", "summary", "info", "stateset", "unknown":
			continue
		case "gaugehistogram":
			reason = SkipGaugeHistogram
		default:
			reason = SkipUnknownType
		}
		if skipped == nil {
			skipped = make(Skipped)
		}
		skipped[reason]++
		skipFam[name] = true
		for _, s := range omSampleSuffixes {
			skip[name+s] = true
		}
	}
	out := make([]byte, 0, len(body))
	for i, l := range lines {
		if i == len(lines)-1 && len(l) == 0 {
			break // the split's empty tail after the last newline
		}
		line := string(l)
		if strings.HasPrefix(line, "#") {
			if f := strings.Fields(line); len(f) >= 3 && f[0] == "#" && (f[1] == "TYPE" || f[1] == "HELP" || f[1] == "UNIT") {
				name := f[2]
				if skipFam[name] {
					continue
				}
				switch {
				case f[1] == "TYPE" && types[name] == "info":
					line = "# TYPE " + name + "_info gauge"
				case f[1] == "TYPE" && types[name] == "stateset":
					line = "# TYPE " + name + " gauge"
				case f[1] == "TYPE" && types[name] == "unknown":
					line = "# TYPE " + name + " untyped"
				case types[name] == "info":
					line = strings.Replace(line, " "+name, " "+name+"_info", 1)
				}
			}
			out = append(out, line...)
			out = append(out, '\n')
			continue
		}
		name, rest, ok := splitSample(line)
		if !ok {
			out = append(out, line...)
			out = append(out, '\n')
			continue
		}
		if skip[name] {
			continue
		}
		out = append(out, line[:len(line)-len(rest)]...)
		out = append(out, sampleValue(rest)...)
		out = append(out, '\n')
	}
	return out, skipped
}

// splitSample splits a sample line after its name and labels; rest is the
// value, timestamp and exemplar. ok is false for a line it cannot split.
func splitSample(line string) (name, rest string, ok bool) {
	i := strings.IndexAny(line, "{ ")
	if i <= 0 {
		return "", "", false
	}
	name = line[:i]
	if line[i] == ' ' {
		return name, line[i:], true
	}
	inQuote, esc := false, false
	for j := i + 1; j < len(line); j++ {
		c := line[j]
		switch {
		case esc:
			esc = false
		case inQuote && c == '\\':
			esc = true
		case c == '"':
			inQuote = !inQuote
		case !inQuote && c == '}':
			return name, line[j+1:], true
		}
	}
	return "", "", false
}

// sampleValue is rest (" value [timestamp] [# exemplar]") without its
// exemplar and with its timestamp in milliseconds.
func sampleValue(rest string) string {
	if i := strings.Index(rest, " #"); i >= 0 {
		rest = rest[:i]
	}
	f := strings.Fields(rest)
	if len(f) != 2 {
		return rest
	}
	sec, err := strconv.ParseFloat(f[1], 64)
	if err != nil || math.IsNaN(sec) || math.IsInf(sec, 0) || math.Abs(sec) > math.MaxInt64/1000 {
		return rest
	}
	return " " + f[0] + " " + strconv.FormatInt(int64(math.Round(sec*1000)), 10)
}
