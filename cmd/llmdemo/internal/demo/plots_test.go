// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package demo

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestRoundTicks(t *testing.T) {
	var labels []string
	for _, tk := range (roundTicks{}).Ticks(-0.3, 26) {
		if tk.Label != "" {
			labels = append(labels, tk.Label)
		}
	}
	assert.Equal(t, []string{"0", "5", "10", "15", "20", "25"}, labels)
}

func TestRoundTicksDecimals(t *testing.T) {
	var labels []string
	for _, tk := range (roundTicks{}).Ticks(0, 1) {
		if tk.Label != "" {
			labels = append(labels, tk.Label)
		}
	}
	assert.Equal(t, []string{"0", "0.2", "0.4", "0.6", "0.8", "1.0"}, labels)
}

// Within two decades a log axis is labeled at 1, 2 and 5 times each power
// of ten, not at one power of ten alone; nothing is labeled above top.
func TestLogTicks(t *testing.T) {
	var labels []string
	for _, tk := range (logTicks{top: 120}).Ticks(5, 400) {
		if tk.Label != "" {
			labels = append(labels, tk.Label)
		}
	}
	assert.Equal(t, []string{"5", "10", "20", "50", "100"}, labels)

	labels = nil
	for _, tk := range (logTicks{}).Ticks(15, 20000) {
		if tk.Label != "" {
			labels = append(labels, tk.Label)
		}
	}
	assert.Equal(t, []string{"100", "1000", "10000"}, labels)
}
