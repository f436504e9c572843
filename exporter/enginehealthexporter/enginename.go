// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package enginehealthexporter // import "github.com/otelcol-llm/otelcol-llm/exporter/enginehealthexporter"

import "strings"

// maxEngineName is the longest engine name, in bytes: a longer llm.engine is
// not judged, and a longer name asked for is no engine's.
const maxEngineName = 256

// normalizeEngine is the one normalisation of an engine name, wherever the
// name comes from (llm.engine, the path of /engines/{engine}/health, the Host
// header of /health, an agent-send line): white space around it dropped and
// ASCII letters lower-cased, as host names compare (llm.engine is mostly a
// host, or the proxy's upstream host:port). tooLong reports a name over
// maxEngineName bytes, which is then "".
func normalizeEngine(raw string) (name string, tooLong bool) {
	name = strings.TrimSpace(raw)
	if len(name) > maxEngineName {
		return "", true
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; 'A' <= c && c <= 'Z' {
			// Byte by byte: strings.ToLower would also rewrite what is not
			// UTF-8, and change the name's length.
			b := []byte(name)
			for j := i; j < len(b); j++ {
				if 'A' <= b[j] && b[j] <= 'Z' {
					b[j] += 'a' - 'A'
				}
			}
			return string(b), false
		}
	}
	return name, false
}
