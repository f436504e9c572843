// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package heldspans

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestDefaultConfigIsValid(t *testing.T) {
	require.Empty(t, DefaultConfig().Validate())
	b, err := New(DefaultConfig())
	require.NoError(t, err)
	assert.Equal(t, 0, b.HeldSpans())
	assert.Equal(t, 0, b.HeldTraces())
	assert.Equal(t, 0, b.CachedVerdicts())
}

func TestNewNamesEveryInvalidField(t *testing.T) {
	_, err := New(Config{MaxHeldSpans: 0, MaxHold: -time.Second, VerdictCacheSize: -1})
	require.Error(t, err)
	assert.ErrorContains(t, err, "max_held_spans: must be positive, got 0")
	assert.ErrorContains(t, err, "max_hold: must be positive, got -1s")
	assert.ErrorContains(t, err, "verdict_cache_size: must be positive, got -1")

	cfg := DefaultConfig()
	cfg.VerdictCacheSize = math.MaxInt32 + 1
	assert.ErrorContains(t, errors.Join(cfg.Validate()...), "verdict_cache_size: at most 2147483647")
}
