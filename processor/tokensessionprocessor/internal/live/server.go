// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package live // import "github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor/internal/live"

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/otelcol-llm/otelcol-llm/internal/httpserve"
	"github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor/internal/metadata"
)

// livePage is GET /: one self-contained page (no script or style from
// elsewhere) that follows GET /sessions/stream.
//
//go:embed live.html
var livePage []byte

// Server serves the live view: GET / (the page), GET /sessions (a
// snapshot as JSON) and GET /sessions/stream (a snapshot every
// live::interval as Server-Sent Events).
//
// Snapshots for the stream are made by one goroutine, the broadcaster,
// which runs only while a viewer is connected: one pass over the table per
// interval, which makes the snapshot of every distinct filter watched (at
// most live::max_filters of them, and the unfiltered one), each encoded
// once and shared by the viewers that asked for it. Each viewer has room
// for one snapshot; one that has not taken the last when the next is ready
// is dropped, so nothing queues for a viewer that does not read.
type Server struct {
	cfg     *Config
	view    *State
	set     component.TelemetrySettings
	tel     *metadata.TelemetryBuilder
	dropSet [3]metric.AddOption // by liveDropCause
	http    *httpserve.Server
	now     func() time.Time

	mu      sync.Mutex
	viewers map[*liveViewer]struct{}
	// watched counts the viewers of each filter: at most
	// live::max_filters filters besides the unfiltered one.
	watched     map[Filter]int
	broadcaster bool // running
	// latest are the broadcaster's snapshots of its last tick, by filter:
	// a viewer that joins gets one as its first if it is fresh, rather than
	// a snapshot of its own.
	latest   map[Filter][]byte
	latestAt time.Time
	closed   bool
	closing  chan struct{}
	done     sync.WaitGroup

	// asked are the snapshots taken for GET /sessions and for a stream's
	// first, by filter, answered again while younger than an interval (at
	// most live::max_filters + 1, the oldest forgotten first); askTokens
	// and askAt the rate limit on taking them (onDemandRate), askScan the
	// buffers of the pass. askMu guards them, apart from mu: a snapshot is
	// taken under it.
	askMu     sync.Mutex
	asked     map[Filter]askedSnapshot
	askTokens float64
	askAt     time.Time
	askScan   liveScan
}

// askedSnapshot is a snapshot taken on a request, and when.
type askedSnapshot struct {
	at   time.Time
	body []byte
}

// onDemandRate bounds the snapshots taken on requests (those no recent one
// answers): a second's worth, and as many at once. At 100 000 open
// sessions one holds the sessions' lock about 6 ms, so whoever asks, and
// however often, the fold waits at most about 6% of its time.
const onDemandRate = 10

// errSnapshotRate is a request's answer when onDemandRate is spent.
var errSnapshotRate = fmt.Errorf("too many snapshots asked for: at most %d a second are taken (each holds the sessions' lock); try again in a second, or watch GET /sessions/stream", onDemandRate)

type liveDropCause int

const (
	dropLimit liveDropCause = iota
	dropFilters
	dropSlow
)

// liveViewer is one GET /sessions/stream.
type liveViewer struct {
	filter Filter
	// next holds the snapshot to write; room for one.
	next chan []byte
	// gone is closed when the viewer is dropped.
	gone chan struct{}
}

// NewServer serves view as cfg says, once started.
func NewServer(cfg *Config, view *State, set component.TelemetrySettings, tel *metadata.TelemetryBuilder) *Server {
	ls := &Server{
		cfg: cfg, view: view, set: set, tel: tel, now: time.Now,
		viewers: make(map[*liveViewer]struct{}), watched: make(map[Filter]int), closing: make(chan struct{}),
		asked: make(map[Filter]askedSnapshot), askTokens: onDemandRate,
	}
	for i, cause := range []string{"limit", "filters", "slow"} {
		ls.dropSet[i] = metric.WithAttributeSet(attribute.NewSet(attribute.String("cause", cause)))
	}
	return ls
}

// Start serves the view on live::endpoint.
func (ls *Server) Start(ctx context.Context, host component.Host) error {
	ls.http = &httpserve.Server{}
	if err := ls.http.Serve(ctx, &ls.cfg.ServerConfig, ls.handler(), host, ls.set, nil); err != nil {
		return fmt.Errorf("live::endpoint: %w", err)
	}
	return nil
}

// Shutdown ends the streams (a stream never goes idle, and the server's
// Shutdown waits for idle connections), then the server.
func (ls *Server) Shutdown(ctx context.Context) error {
	ls.mu.Lock()
	if !ls.closed {
		ls.closed = true
		close(ls.closing)
	}
	ls.mu.Unlock()
	ls.done.Wait()
	if ls.http == nil || ls.http.HTTP == nil {
		return nil
	}
	return ls.http.Shutdown(ctx)
}

// Addr is where the view is served, once started.
func (ls *Server) Addr() net.Addr { return ls.http.Addr }

func (ls *Server) handler() http.Handler {
	return httpserve.GetOnly(func(r *http.Request) (http.HandlerFunc, int, string) {
		switch r.URL.Path {
		case "/":
			return func(w http.ResponseWriter, _ *http.Request) { ls.servePage(w) }, 0, ""
		case "/sessions":
			return ls.serveSnapshot, 0, ""
		case "/sessions/stream":
			return ls.serveStream, 0, ""
		}
		return nil, http.StatusNotFound, "no such endpoint: GET /, /sessions or /sessions/stream"
	})
}

func (ls *Server) servePage(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	// The page is its own: no script, style or frame from elsewhere.
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	_, _ = w.Write(livePage)
}

// maxFilterValue is the longest ?engine= or ?model= that can match: a
// name as the view shows it (liveName).
const maxFilterValue = liveMaxName + len(liveCut)

// filterOf reads ?engine= and ?model=.
func filterOf(r *http.Request) (Filter, error) {
	q := r.URL.Query()
	f := Filter{Engine: q.Get("engine"), Model: q.Get("model")}
	for _, v := range [...]struct{ name, value string }{{"engine", f.Engine}, {"model", f.Model}} {
		if len(v.value) > maxFilterValue {
			return Filter{}, fmt.Errorf("%s: at most %d bytes (longer names are shown cut to %d, and filtered by what is shown), got %d", v.name, maxFilterValue, liveMaxName, len(v.value))
		}
	}
	return f, nil
}

// askSnapshot is the snapshot for f that a request gets: the
// broadcaster's or an asked one younger than an interval, else a new one
// while onDemandRate allows (errSnapshotRate beyond). Requests take their
// snapshots one at a time, so that many asking at once share one.
func (ls *Server) askSnapshot(f Filter) ([]byte, error) {
	if body := ls.fresh(f); body != nil {
		return body, nil
	}
	ls.askMu.Lock()
	defer ls.askMu.Unlock()
	now := ls.now()
	if a, ok := ls.asked[f]; ok && now.Sub(a.at) < ls.cfg.Interval {
		return a.body, nil
	}
	ls.askTokens = min(onDemandRate, ls.askTokens+now.Sub(ls.askAt).Seconds()*onDemandRate)
	ls.askAt = now
	if ls.askTokens < 1 {
		return nil, errSnapshotRate
	}
	ls.askTokens--
	ls.forgetAsked(now)
	body := ls.view.snapshot(now, f, &ls.askScan)
	ls.asked[f] = askedSnapshot{at: now, body: body}
	return body, nil
}

// forgetAsked forgets the asked snapshots older than an interval, and the
// oldest while more than live::max_filters are kept, to make room for one
// more. Call with askMu held.
func (ls *Server) forgetAsked(now time.Time) {
	for k, a := range ls.asked {
		if now.Sub(a.at) >= ls.cfg.Interval {
			delete(ls.asked, k)
		}
	}
	for len(ls.asked) > ls.cfg.MaxFilters {
		var oldest Filter
		var at time.Time
		for k, a := range ls.asked {
			if at.IsZero() || a.at.Before(at) {
				oldest, at = k, a.at
			}
		}
		delete(ls.asked, oldest)
	}
}

func (ls *Server) serveSnapshot(w http.ResponseWriter, r *http.Request) {
	f, err := filterOf(r)
	if err != nil {
		httpserve.WriteError(w, http.StatusBadRequest, err.Error())
		return
	}
	body, err := ls.askSnapshot(f)
	if err != nil {
		w.Header().Set("Retry-After", "1")
		httpserve.WriteError(w, http.StatusTooManyRequests, err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	// G705: JSON the encoder made, served as JSON (nosniff), never as HTML.
	// Two writes: body is shared with other requests, and an append could
	// write into its spare capacity.
	if _, err := w.Write(body); err == nil { //nolint:gosec
		_, _ = w.Write([]byte{'\n'})
	}
}

// writeTimeout is how long one snapshot may take to reach a viewer; a
// viewer that takes longer is dropped.
func (ls *Server) writeTimeout() time.Duration {
	return max(2*ls.cfg.Interval, 2*time.Second)
}

func (ls *Server) serveStream(w http.ResponseWriter, r *http.Request) {
	f, err := filterOf(r)
	if err != nil {
		httpserve.WriteError(w, http.StatusBadRequest, err.Error())
		return
	}
	v := &liveViewer{filter: f, next: make(chan []byte, 1), gone: make(chan struct{})}
	ctx := r.Context()
	if cause, err := ls.join(v); err != nil {
		ls.tel.ProcessorTokenSessionLiveViewersDropped.Add(ctx, 1, ls.dropSet[cause])
		w.Header().Set("Retry-After", "5")
		httpserve.WriteError(w, http.StatusServiceUnavailable, err.Error())
		return
	}
	ls.tel.ProcessorTokenSessionLiveViewers.Add(ctx, 1)
	defer func() {
		ls.leave(v)
		ls.tel.ProcessorTokenSessionLiveViewers.Add(context.WithoutCancel(ctx), -1)
	}()
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	// A buffering reverse proxy in front would hold the events back.
	h.Set("X-Accel-Buffering", "no")
	rc := http.NewResponseController(w)
	write := func(data []byte) bool {
		// A deadline per snapshot: the server's write_timeout is for
		// whole responses, and a stream has no end. A viewer that does
		// not read is let go when it passes.
		if err := rc.SetWriteDeadline(time.Now().Add(ls.writeTimeout())); err != nil && !errors.Is(err, http.ErrNotSupported) {
			return false
		}
		for _, part := range [...][]byte{[]byte("event: snapshot\ndata: "), data, []byte("\n\n")} {
			if _, err := w.Write(part); err != nil {
				return false
			}
		}
		return rc.Flush() == nil
	}
	// The first snapshot at once, not an interval later; the retry field
	// tells EventSource how long to wait before reconnecting.
	if _, err := fmt.Fprintf(w, "retry: %d\n\n", max(ls.cfg.Interval.Milliseconds(), 1000)); err != nil {
		return
	}
	// Past the rate, the first comes with the broadcaster's next tick.
	if first, err := ls.askSnapshot(v.filter); err == nil && !write(first) {
		ls.drop(v)
		return
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-v.gone:
			return
		case <-ls.closing:
			return
		case data := <-v.next:
			if !write(data) {
				ls.drop(v)
				return
			}
		}
	}
}

// fresh is the broadcaster's latest snapshot for f, if it is younger than
// an interval; nil otherwise.
func (ls *Server) fresh(f Filter) []byte {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.now().Sub(ls.latestAt) >= ls.cfg.Interval {
		return nil
	}
	return ls.latest[f]
}

// join adds v, starting the broadcaster if it is the first viewer; a
// viewer refused is refused for the cause it returns.
func (ls *Server) join(v *liveViewer) (liveDropCause, error) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	switch {
	case ls.closed:
		return dropLimit, errors.New("the collector is shutting down")
	case len(ls.viewers) >= ls.cfg.MaxViewers:
		return dropLimit, fmt.Errorf("too many viewers: live::max_viewers (%d) are connected; try again later", ls.cfg.MaxViewers)
	case v.filter != Filter{} && ls.watched[v.filter] == 0 && ls.filtersWatched() >= ls.cfg.MaxFilters:
		return dropFilters, fmt.Errorf("too many filters: live::max_filters (%d) distinct filters are being watched; watch one of them, or all sessions (no filter), or try again later", ls.cfg.MaxFilters)
	}
	ls.viewers[v] = struct{}{}
	ls.watched[v.filter]++
	if !ls.broadcaster {
		ls.broadcaster = true
		ls.done.Add(1)
		go ls.broadcast()
	}
	return 0, nil
}

// filtersWatched counts the distinct filters watched, the unfiltered view
// aside. Call with mu held.
func (ls *Server) filtersWatched() int {
	n := len(ls.watched)
	if ls.watched[Filter{}] > 0 {
		n--
	}
	return n
}

// remove takes v out, once; it reports whether v was in. Call with mu
// held.
func (ls *Server) remove(v *liveViewer) bool {
	if _, ok := ls.viewers[v]; !ok {
		return false
	}
	delete(ls.viewers, v)
	if ls.watched[v.filter]--; ls.watched[v.filter] == 0 {
		delete(ls.watched, v.filter)
	}
	return true
}

func (ls *Server) leave(v *liveViewer) {
	ls.mu.Lock()
	ls.remove(v)
	ls.mu.Unlock()
}

// drop disconnects a slow viewer, once.
func (ls *Server) drop(v *liveViewer) {
	ls.mu.Lock()
	ok := ls.remove(v)
	if ok {
		close(v.gone)
	}
	ls.mu.Unlock()
	if ok {
		ls.tel.ProcessorTokenSessionLiveViewersDropped.Add(context.Background(), 1, ls.dropSet[dropSlow])
	}
}

// broadcast makes the snapshots every interval and offers them to the
// viewers; it ends when the last viewer has gone.
func (ls *Server) broadcast() {
	defer ls.done.Done()
	tick := time.NewTicker(ls.cfg.Interval)
	defer tick.Stop()
	var b liveBroadcast
	for {
		select {
		case <-ls.closing:
			return
		case <-tick.C:
		}
		if !ls.broadcastOnce(&b) {
			return
		}
	}
}

// liveBroadcast is the broadcaster's buffers, kept between intervals.
type liveBroadcast struct {
	scan    liveScan
	viewers []*liveViewer
	filters []Filter
}

// broadcastOnce makes the snapshot of every filter watched, in one pass
// over the table, and offers each viewer its filter's; it reports false,
// the broadcaster stopped, when no viewer is left.
func (ls *Server) broadcastOnce(b *liveBroadcast) bool {
	ls.mu.Lock()
	if len(ls.viewers) == 0 {
		ls.broadcaster = false
		ls.latest = nil
		ls.mu.Unlock()
		return false
	}
	b.viewers, b.filters = b.viewers[:0], b.filters[:0]
	for v := range ls.viewers {
		b.viewers = append(b.viewers, v)
	}
	for f := range ls.watched {
		b.filters = append(b.filters, f)
	}
	ls.mu.Unlock()
	at := ls.now()
	bodies := ls.view.snapshots(at, b.filters, &b.scan)
	// A new map each tick: the joining viewers read the last one.
	snaps := make(map[Filter][]byte, len(bodies))
	for i, f := range b.filters {
		snaps[f] = bodies[i]
	}
	for _, v := range b.viewers {
		select {
		case v.next <- snaps[v.filter]: // read with the filters, under one lock
		default:
			ls.drop(v) // the last one is still waiting
		}
	}
	ls.mu.Lock()
	ls.latest, ls.latestAt = snaps, at
	ls.mu.Unlock()
	clear(b.viewers) // no viewer kept alive until the next tick
	return true
}
