// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package lograte

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

func TestOncePerMinute(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	l := OncePerMinute(zap.New(core))
	for range 5 {
		l.Warn("upstream failed")
		l.Warn("lines rejected")
	}
	l.Error("upstream failed") // another level: its own count
	assert.Equal(t, 3, logs.Len(), "the first of each message and level")
}
