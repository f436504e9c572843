// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package live

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component/componenttest"

	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
)

func get(t *testing.T, url string) (*http.Response, []byte) {
	t.Helper()
	resp, err := http.Get(url) //nolint:gosec // the test's own server
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, body
}

// GET /sessions answers from a recent snapshot where it has one, and
// takes at most onDemandRate new ones a second however they are asked for
// (a filter each, to defeat the sharing): each holds the sessions' lock.
func TestLiveAskedSnapshotsSharedAndLimited(t *testing.T) {
	h := newHarness(t, nil, func(l *Config) { l.Interval = time.Minute })
	ls, url := h.server(t)
	clock := time.Now()
	setClock := func(at time.Time) {
		// The server reads its clock under these locks (no broadcaster
		// runs: no viewer).
		ls.mu.Lock()
		ls.askMu.Lock()
		clock = at
		ls.now = func() time.Time { return clock }
		ls.askMu.Unlock()
		ls.mu.Unlock()
	}
	setClock(clock)

	first := map[string][]byte{}
	for i := range onDemandRate {
		engine := fmt.Sprintf("e%d", i)
		resp, body := get(t, url+"/sessions?engine="+engine)
		require.Equal(t, http.StatusOK, resp.StatusCode, engine)
		first[engine] = body
	}
	resp, body := get(t, url+"/sessions?engine=one-too-many")
	assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	assert.Equal(t, "1", resp.Header.Get("Retry-After"))
	assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	assert.Contains(t, string(body), "at most 10 a second")

	// A session that starts now is not in the snapshot shared for the
	// interval; the filters asked for are answered, spent rate or not.
	h.feed(start("s1", "vllm-0", "llama", base))
	resp, body = get(t, url+"/sessions?engine=e0")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, first["e0"], body)

	// A second later the rate allows ten more; an interval later the
	// shared snapshot is taken again, and shows the session.
	setClock(clock.Add(time.Second))
	resp, _ = get(t, url+"/sessions?engine=one-too-many")
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	setClock(clock.Add(time.Minute))
	resp, body = get(t, url+"/sessions")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var snap Snapshot
	require.NoError(t, json.Unmarshal(body, &snap))
	assert.Equal(t, []string{"s1=waiting"}, phasesOf(snap))
}

// One pass over the table per interval serves every viewer, whatever the
// number of viewers and filters: 1000 viewers each asking for a filter of
// its own are let in up to live::max_filters, the rest turned away (503),
// and those let in, and 100 more on those filters and on none, get the
// snapshot of their filter from one pass.
func TestLiveOnePassPerInterval(t *testing.T) {
	tel := componenttest.NewTelemetry()
	defer func() { require.NoError(t, tel.Shutdown(context.Background())) }()
	// An interval of an hour: the test makes the broadcaster's rounds.
	h := newHarness(t, tel, func(l *Config) { l.Interval = time.Hour; l.MaxViewers = 1000 })
	ls, _ := h.server(t)
	var evs []tokenevent.Event
	for i := range 40 {
		evs = append(evs, start(fmt.Sprintf("s%d", i), "vllm-0", fmt.Sprintf("m-%d", i%20), base))
	}
	h.fold(base, evs...)

	newViewer := func(f Filter) *liveViewer {
		return &liveViewer{filter: f, next: make(chan []byte, 1), gone: make(chan struct{})}
	}
	var in []*liveViewer
	refused := 0
	for i := range 900 {
		v := newViewer(Filter{Model: fmt.Sprintf("m-%d", i)})
		cause, err := ls.join(v)
		if err != nil {
			assert.Equal(t, dropFilters, cause)
			refused++
			continue
		}
		in = append(in, v)
	}
	require.Equal(t, 16, len(in), "live::max_filters") //nolint:testifylint // not the 900 viewers' pointers in the message
	for i := range 100 {
		f := Filter{}
		if i%2 == 1 {
			f = in[i%16].filter
		}
		v := newViewer(f)
		_, err := ls.join(v)
		require.NoError(t, err, "a filter watched already, or none")
		in = append(in, v)
	}
	assert.Equal(t, 900-16, refused)

	require.True(t, ls.broadcastOnce(&liveBroadcast{}))
	assert.Equal(t, int64(1), liveCount(t, tel, "otelcol_processor_token_session_live_scans"), "one pass for 116 viewers on 17 filters")
	for _, v := range in {
		select {
		case data := <-v.next:
			var snap Snapshot
			require.NoError(t, json.Unmarshal(data, &snap))
			assert.Equal(t, v.filter.Model, snap.Filter.Model)
			want := 40
			if v.filter.Model != "" {
				want = 2
			}
			assert.Equal(t, want, snap.Matching, v.filter.Model)
			assert.Len(t, snap.Sessions, want)
		default:
			t.Fatalf("viewer of %+v got no snapshot", v.filter)
		}
	}
}

// The snapshots kept for GET /sessions are at most live::max_filters + 1,
// however many filters are asked for over an interval.
func TestLiveAskedSnapshotsBounded(t *testing.T) {
	h := newHarness(t, nil, func(l *Config) { l.Interval = time.Hour; l.MaxFilters = 4 })
	ls, url := h.server(t)
	clock := time.Now()
	for i := range 50 {
		ls.askMu.Lock()
		ls.mu.Lock()
		at := clock.Add(time.Duration(i) * time.Second) // within the rate
		ls.now = func() time.Time { return at }
		ls.mu.Unlock()
		ls.askMu.Unlock()
		resp, _ := get(t, url+fmt.Sprintf("/sessions?engine=e%d", i))
		require.Equal(t, http.StatusOK, resp.StatusCode)
		ls.askMu.Lock()
		assert.LessOrEqual(t, len(ls.asked), 5)
		ls.askMu.Unlock()
	}
}

// A filter longer than any name shown is a bad request.
func TestLiveFilterTooLong(t *testing.T) {
	_, url := newHarness(t, nil, nil).server(t)
	long := strings.Repeat("x", maxFilterValue+1)
	for _, path := range []string{"/sessions?engine=" + long, "/sessions/stream?model=" + long} {
		resp, body := get(t, url+path)
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
		assert.Contains(t, string(body), "at most 259 bytes (longer names are shown cut to 256, and filtered by what is shown)")
	}
	resp, _ := get(t, url+"/sessions?engine="+long[:maxFilterValue])
	assert.Equal(t, http.StatusOK, resp.StatusCode)
}
