// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

// Package earlystop lets the token_session processor stop the token_stream
// receivers before it stops itself.
//
// token_session is one component shared by its logs, metrics and traces
// pipelines, and it stops at the first of its pipelines' Shutdown calls. The
// service stops components in a topological order of the pipeline graph: a
// receiver before the processors of its own pipelines, but in no fixed order
// with those of other pipelines (the order changes from run to run). So
// token_session could stop while a token_stream receiver feeding it through
// another pipeline still ran, and the proxy's drain then fed a stopped
// processor: the sessions that finished during the drain lost their metrics
// and spans.
//
// Stopping a receiver early is safe: whatever is downstream of a receiver
// that still runs has not been stopped yet. The list is per process, as a
// collector is: a token_session stops every token_stream receiver running.
package earlystop // import "github.com/otelcol-llm/otelcol-llm/internal/earlystop"

import (
	"context"
	"errors"
	"slices"
	"sync"
)

type entry struct{ stop func(context.Context) error }

var (
	mu    sync.Mutex
	stops []*entry // in the order registered
)

// Register adds stop to what StopAll runs. stop must be safe to call again
// (the service calls the component's Shutdown as well). The returned func
// removes it; call it from the component's own shutdown.
func Register(stop func(context.Context) error) (unregister func()) {
	e := &entry{stop: stop}
	mu.Lock()
	defer mu.Unlock()
	stops = append(stops, e)
	return func() {
		mu.Lock()
		defer mu.Unlock()
		stops = slices.DeleteFunc(stops, func(o *entry) bool { return o == e })
	}
}

// StopAll runs every registered stop, in the order they were registered,
// and returns their errors. A stop may unregister itself.
func StopAll(ctx context.Context) error {
	mu.Lock()
	pending := slices.Clone(stops)
	mu.Unlock()
	var errs []error
	for _, e := range pending {
		errs = append(errs, e.stop(ctx))
	}
	return errors.Join(errs...)
}
