// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package live

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.uber.org/goleak"

	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
	"github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor/internal/metadata"
	"github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor/internal/session"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const ms = int64(time.Millisecond)

// base is an engine time close to the test's clock, so that a snapshot
// taken now sees the sessions it starts in flight.
var base = time.Now().UnixNano()

// harness is the fold as the view sees it: a session table with the
// defaults token_session runs it with, its events applied under a lock
// without the limits a record is read with, the sessions that end fed to
// the view, and the view's snapshots taken through the same lock.
type harness struct {
	mu      sync.Mutex
	cfg     Config
	table   *session.Table[struct{}]
	reports []session.Report[struct{}]
	tel     *metadata.TelemetryBuilder
	state   *State
}

// nopObserver keeps no state of a session: the view reads the table.
type nopObserver struct{}

func (nopObserver) Started(*session.Session, *struct{})                   {}
func (nopObserver) Gap(*session.Session, *struct{}, time.Duration, int64) {}
func (nopObserver) FirstToken(*session.Session, *struct{})                {}
func (nopObserver) Restarted(*session.Session, *struct{})                 {}

// newHarness is a view configured as mutate says (on 127.0.0.1:0, a
// snapshot every 50 ms otherwise), its self-telemetry in tel (nil: none).
func newHarness(tb testing.TB, tel *componenttest.Telemetry, mutate func(*Config)) *harness {
	tb.Helper()
	h := &harness{cfg: DefaultConfig()}
	h.cfg.ServerConfig.NetAddr.Endpoint = "127.0.0.1:0"
	h.cfg.Interval = 50 * time.Millisecond
	if mutate != nil {
		mutate(&h.cfg)
	}
	require.Empty(tb, h.cfg.Validate())
	set := componenttest.NewNopTelemetrySettings()
	if tel != nil {
		set = tel.NewTelemetrySettings()
	}
	var err error
	h.tel, err = metadata.NewTelemetryBuilder(set)
	require.NoError(tb, err)
	tb.Cleanup(h.tel.Shutdown)
	h.table, err = session.NewTable[struct{}](session.DefaultConfig(), nopObserver{})
	require.NoError(tb, err)
	h.state = NewState(&h.cfg, h.tel, h.withTable)
	return h
}

func (h *harness) withTable(fn func(Table)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	fn(h.table)
}

// feed applies each event at its own time: engine and collector clocks
// agree.
func (h *harness) feed(evs ...tokenevent.Event) {
	for i := range evs {
		h.fold(int64(evs[i].TimeUnixNano), evs[i])
	}
}

// fold applies evs as one batch that arrives at collector time now.
func (h *harness) fold(now int64, evs ...tokenevent.Event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for i := range evs {
		h.reports = h.table.Apply(&evs[i], now, h.reports)
	}
	for i := range h.reports {
		if r := &h.reports[i]; r.Kind == session.ReportEnded {
			h.state.Ended(r.Session, &r.End, now)
		}
	}
	h.reports = h.table.Release(h.reports)
}

// take is the snapshot that f picks at collector time now, decoded.
func (h *harness) take(tb testing.TB, now time.Time, f Filter) Snapshot {
	tb.Helper()
	var snap Snapshot
	require.NoError(tb, json.Unmarshal(h.state.Snapshot(now, f), &snap))
	return snap
}

// server serves the view on 127.0.0.1:0 until the test ends; it returns
// the server and its base URL.
func (h *harness) server(tb testing.TB) (*Server, string) {
	tb.Helper()
	ls := NewServer(&h.cfg, h.state, componenttest.NewNopTelemetrySettings(), h.tel)
	require.NoError(tb, ls.Start(context.Background(), componenttest.NewNopHost()))
	tb.Cleanup(func() { require.NoError(tb, ls.Shutdown(context.Background())) })
	return ls, "http://" + ls.Addr().String()
}

func start(id, engine, model string, at int64) tokenevent.Event {
	return tokenevent.Event{
		Kind: tokenevent.KindStart, SessionID: id, TimeUnixNano: uint64(at), TraceID: tokenevent.TraceID{0xbb, 2},
		SpanID: tokenevent.SpanID{0x5e, byte(len(id))}, Model: model, Operation: "chat", Engine: engine, PromptTokens: 100,
		Count: 1, CompletionTokens: -1,
	}
}

func tok(id string, at, n int64) tokenevent.Event {
	return tokenevent.Event{Kind: tokenevent.KindToken, SessionID: id, TimeUnixNano: uint64(at), Count: n, PromptTokens: -1, CompletionTokens: -1}
}

func end(id string, at int64) tokenevent.Event {
	return tokenevent.Event{Kind: tokenevent.KindEnd, SessionID: id, TimeUnixNano: uint64(at), CompletionTokens: -1, FinishReason: "stop", PromptTokens: -1, Count: 1}
}

// phasesOf is each listed session's ID and phase, in the snapshot's order.
func phasesOf(snap Snapshot) []string {
	var out []string
	for _, s := range snap.Sessions {
		out = append(out, s.ID+"="+s.Phase)
	}
	return out
}
