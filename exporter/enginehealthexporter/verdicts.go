// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package enginehealthexporter // import "github.com/otelcol-llm/otelcol-llm/exporter/enginehealthexporter"

// verdicts is what the judge last said of every engine. The endpoints read
// it without a lock: a health check never waits for a batch being folded.
type verdicts struct {
	list   []engineStatus // by engine name
	byName map[string]int // index into list
}

func newVerdicts(list []engineStatus) *verdicts {
	v := &verdicts{list: list, byName: make(map[string]int, len(list))}
	for i := range list {
		v.byName[list[i].Engine] = i
	}
	return v
}

// lookup returns an engine's status; false for an engine never seen.
func (v *verdicts) lookup(engine string) (engineStatus, bool) {
	i, ok := v.byName[engine]
	if !ok {
		return engineStatus{}, false
	}
	return v.list[i], true
}
