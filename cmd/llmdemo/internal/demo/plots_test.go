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
