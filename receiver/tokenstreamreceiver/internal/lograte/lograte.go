// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

// Package lograte bounds how often a logger repeats itself: what a user must
// see at the default level (an upstream failing, a hook's lines refused)
// without flooding the log while it lasts.
package lograte // import "github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver/internal/lograte"

import (
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// OncePerMinute is l logging each message at most once a minute: the first
// of each minute, per level and message (zap's sampler). The messages say
// that they are sampled and which counter counts every occurrence.
func OncePerMinute(l *zap.Logger) *zap.Logger {
	return l.WithOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core {
		return zapcore.NewSamplerWithOptions(c, time.Minute, 1, 0)
	}))
}
