// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package enginehealthexporter // import "github.com/otelcol-llm/otelcol-llm/exporter/enginehealthexporter"

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.uber.org/zap"

	"github.com/otelcol-llm/otelcol-llm/exporter/enginehealthexporter/internal/metadata"
	"github.com/otelcol-llm/otelcol-llm/internal/httpserve"
)

// endpoints serve the judge's verdicts over HTTP; they read the exporter
// through the verdicts it last stored and its clock.
type endpoints struct {
	verdicts func() *verdicts
	now      func() time.Time
}

// handler serves GET /engines, GET /engines/{engine}/health, GET /health
// (the engine in the Host header) and GET /metrics. It routes on the escaped path itself:
// http.ServeMux would clean a path whose engine is "." or ".." into another
// (a 307 to /health), and cannot tell an escaped "/" in a name.
func (h endpoints) handler() http.Handler {
	return httpserve.GetOnly(func(r *http.Request) (http.HandlerFunc, int, string) {
		path := r.URL.EscapedPath()
		switch segment, isHealth := engineSegment(path); {
		case path == "/engines":
			return func(w http.ResponseWriter, _ *http.Request) { h.serveList(w) }, 0, ""
		case path == "/metrics":
			// The verdicts as gauges, for a router that scrapes its
			// endpoints (the llm-d router's endpoint picker) or Prometheus.
			return func(w http.ResponseWriter, r *http.Request) { serveMetrics(w, r, h.verdicts()) }, 0, ""
		case path == "/health":
			// Checkers whose path is one for all the servers they check
			// (Envoy's health checks: a path per cluster, a Host header per
			// endpoint) name the engine in the Host header instead.
			return func(w http.ResponseWriter, r *http.Request) { h.serveHealth(w, hostEngine(h.verdicts(), r.Host)) }, 0, ""
		case isHealth:
			// {engine} is llm.engine URL-escaped: an engine named "ns/pod"
			// is asked for as /engines/ns%2Fpod/health.
			engine, err := url.PathUnescape(segment)
			if err != nil {
				return nil, http.StatusBadRequest, "the engine in the path is not URL-escaped right"
			}
			return func(w http.ResponseWriter, _ *http.Request) { h.serveHealth(w, engine) }, 0, ""
		}
		return nil, http.StatusNotFound, "no such endpoint: GET /engines, /engines/{engine}/health, /health or /metrics"
	})
}

// engineSegment is the escaped {engine} of /engines/{engine}/health; false
// for another path.
func engineSegment(path string) (string, bool) {
	rest, ok := strings.CutPrefix(path, "/engines/")
	if !ok {
		return "", false
	}
	segment, ok := strings.CutSuffix(rest, "/health")
	if !ok || strings.Contains(segment, "/") {
		return "", false
	}
	return segment, true
}

// serveList answers every engine's status, by name.
func (h endpoints) serveList(w http.ResponseWriter) {
	now := h.now()
	v := h.verdicts()
	out := make([]engineStatus, len(v.list))
	for i, st := range v.list {
		out[i] = st.at(now)
	}
	writeJSON(w, http.StatusOK, out)
}

// hostEngine is the engine a Host header names: the header whole if an
// engine has that name (llm.engine is often host:port), else its host
// without the port and without a trailing dot, as a host name is written in
// a URL ("LOWER.example.com.:80" names "lower.example.com").
func hostEngine(v *verdicts, host string) string {
	name, tooLong := normalizeEngine(host)
	if tooLong {
		return host // serveHealth says why it is no engine's
	}
	if _, ok := v.lookup(name); ok || name == "" {
		return name
	}
	if h, _, err := net.SplitHostPort(name); err == nil {
		name = h
	}
	return strings.TrimSuffix(name, ".")
}

// serveHealth answers 200 for a healthy engine, 503 for an ejected one and
// 404 for one never seen (or a name no engine can have), each with a JSON
// body.
func (h endpoints) serveHealth(w http.ResponseWriter, engine string) {
	name, tooLong := normalizeEngine(engine)
	if tooLong {
		// Not echoed: the name is the client's, of any length.
		httpserve.WriteError(w, http.StatusNotFound, fmt.Sprintf("unknown engine: a name of %d bytes, over the %d an engine name may have",
			len(engine), maxEngineName))
		return
	}
	st, ok := h.verdicts().lookup(name)
	if !ok {
		httpserve.WriteError(w, http.StatusNotFound, fmt.Sprintf("unknown engine %q: no session of it has been seen", name))
		return
	}
	code := http.StatusOK
	if st.State == stateEjected {
		code = http.StatusServiceUnavailable
	}
	writeJSON(w, code, st.at(h.now()))
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = w.Write(append(body, '\n'))
}

// Agent-check protocol (HAProxy's agent-check, agent-send): HAProxy connects
// to the agent, sends its agent-send string verbatim, and reads one line back.
// Each server's agent-send names its engine ("vllm-a\n"); the agent answers
// "up" or "down #<reason>" for that engine. An engine never seen, or a check
// that names none, is answered "up": the agent only takes out the engines the
// judge ejected, and leaves reachability to HAProxy's own check.
//
// HAProxy keeps a server's last agent state when the agent cannot be reached
// or does not answer: a check turned away leaves an ejection unapplied, or
// never lifted. So every connection accepted is answered, and connections
// that send nothing cannot hold the places of real checks: a real check
// sends its line at once and is answered in microseconds, so when too many
// connections wait for their line, the one that has waited longest is
// answered at once with what it sent so far.
const (
	// agentLineWait bounds the wait for the agent-send line; a check
	// without one (HAProxy sends nothing without agent-send) is answered
	// "up" after it. It is well within any agent-inter: HAProxy times a
	// check out after its interval unless "timeout check" says otherwise.
	agentLineWait = 200 * time.Millisecond
	// agentMaxLine bounds what is read of a line: past it, the line is
	// longer than any engine name.
	agentMaxLine = 1024
	// agentMaxWaiting bounds the connections waiting for their line, and
	// agentMaxWaitingPerSource those of one source address: a newer
	// connection over either answers the oldest at once.
	agentMaxWaiting          = 64
	agentMaxWaitingPerSource = 8
	// agentLastRead is how long a connection whose wait is over (or was
	// cut short) still has to deliver what it has sent.
	agentLastRead = 5 * time.Millisecond
	// agentMaxConns bounds the connections open at once, waiting or being
	// answered; more are closed at once.
	agentMaxConns = 4 * agentMaxWaiting
)

// agentServer answers agent checks from the verdicts it is given.
type agentServer struct {
	verdicts func() *verdicts
	logger   *zap.Logger
	tel      *metadata.TelemetryBuilder
	ln       net.Listener
	slots    chan struct{}
	done     sync.WaitGroup
	queue    agentQueue
}

func (a *agentServer) serve(endpoint string) error {
	ln, err := net.Listen("tcp", endpoint)
	if err != nil {
		return fmt.Errorf("agent::endpoint: listen on %s: %w", endpoint, err)
	}
	a.ln = ln
	a.slots = make(chan struct{}, agentMaxConns)
	a.queue = newAgentQueue(agentMaxWaiting, agentMaxWaitingPerSource)
	a.done.Add(1)
	go func() {
		defer a.done.Done()
		for {
			conn, err := ln.Accept()
			if err != nil {
				if !errors.Is(err, net.ErrClosed) {
					a.logger.Warn("agent-check endpoint stopped accepting", zap.Error(err))
				}
				return
			}
			select {
			case a.slots <- struct{}{}:
			default:
				_ = conn.Close()
				a.cutShort(limitOpen)
				continue
			}
			// The deadline is set before the connection is queued: cutting
			// it short (cut) moves the deadline, and must not be undone.
			_ = conn.SetReadDeadline(time.Now().Add(agentLineWait))
			w, cut := a.queue.add(conn)
			a.cutShort(cut)
			a.done.Add(1)
			go func() {
				defer a.done.Done()
				defer func() { <-a.slots }()
				a.answer(w)
			}()
		}
	}()
	return nil
}

// The bounds of the agent-check endpoint (the limit attribute of its
// self-telemetry).
const (
	limitPerSource = "per_source"
	limitWaiting   = "waiting"
	limitOpen      = "open"
)

// cutShort counts a connection answered early, or closed, at limit ("" for
// none).
func (a *agentServer) cutShort(limit string) {
	if limit != "" {
		a.tel.ExporterEngineHealthAgentCutShort.Add(context.Background(), 1,
			metric.WithAttributes(attribute.String("limit", limit)))
	}
}

// answer reads the engine name a check sends and replies with its state.
func (a *agentServer) answer(w *agentWaiter) {
	defer w.conn.Close()
	line, complete := readAgentLine(w.conn, func() { a.queue.remove(w) })
	a.queue.remove(w)
	name := ""
	if complete || len(line) < agentMaxLine {
		name = line // else longer than any engine name
	}
	_ = w.conn.SetWriteDeadline(time.Now().Add(time.Second))
	_, _ = io.WriteString(w.conn, agentReply(a.verdicts(), name))
}

// readAgentLine reads up to a newline, the end of the connection or
// agentMaxLine bytes, or until the read deadline: complete reports a
// newline. Once the deadline has passed (which may be before this goroutine
// first ran, or when the connection was cut short), leave is called and what
// has arrived by then is read still, for agentLastRead: a line already sent
// is not missed.
func readAgentLine(conn net.Conn, leave func()) (line string, complete bool) {
	buf := make([]byte, 0, 128)
	chunk := make([]byte, 512)
	lastRead := false
	for len(buf) < agentMaxLine {
		n, err := conn.Read(chunk[:min(len(chunk), agentMaxLine-len(buf))])
		if i := bytes.IndexByte(chunk[:n], '\n'); i >= 0 {
			return string(append(buf, chunk[:i]...)), true
		}
		buf = append(buf, chunk[:n]...)
		var netErr net.Error
		switch {
		case err == nil:
		case !lastRead && errors.As(err, &netErr) && netErr.Timeout():
			lastRead = true
			leave() // no longer cut short from here on: the deadline below is the last
			_ = conn.SetReadDeadline(time.Now().Add(agentLastRead))
		default:
			return string(buf), false
		}
	}
	return string(buf), false
}

// agentReply is the agent-check answer for what a check sent: the state of
// the engine it names in v; "up" when it names none (or a name no engine
// can have).
func agentReply(v *verdicts, sent string) string {
	name, _ := normalizeEngine(sent)
	st, ok := v.lookup(name)
	if ok && name != "" && st.State == stateEjected {
		return "down #ejected: " + st.Reason + "\n"
	}
	return "up\n"
}

func (a *agentServer) shutdown() error {
	err := a.ln.Close()
	a.done.Wait()
	if errors.Is(err, net.ErrClosed) {
		return nil // a second Shutdown: closed by the first
	}
	return err
}

// agentWaiter is a connection waiting for its agent-send line.
type agentWaiter struct {
	conn   net.Conn
	source string
	// seq orders the waiters by arrival; 0 once it left the queue.
	seq uint64
}

// agentQueue holds the connections waiting for their line, oldest first,
// within its bounds: the whole and per source address.
type agentQueue struct {
	mu        sync.Mutex
	max, per  int
	next      uint64
	waiting   []*agentWaiter // by arrival; at most max
	perSource map[string]int
}

func newAgentQueue(maxWaiting, perSource int) agentQueue {
	return agentQueue{max: maxWaiting, per: perSource, perSource: make(map[string]int)}
}

// add queues conn, first cutting short the oldest waiter of its source, or
// of all, when it would go over a bound; cut names the bound ("" for none).
func (q *agentQueue) add(conn net.Conn) (w *agentWaiter, cut string) {
	source := conn.RemoteAddr().String()
	if host, _, err := net.SplitHostPort(source); err == nil {
		source = host
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.perSource[source] >= q.per {
		for _, old := range q.waiting {
			if old.source == source {
				q.cutLocked(old)
				cut = limitPerSource
				break
			}
		}
	}
	if len(q.waiting) >= q.max {
		q.cutLocked(q.waiting[0])
		cut = limitWaiting
	}
	q.next++
	w = &agentWaiter{conn: conn, source: source, seq: q.next}
	q.waiting = append(q.waiting, w)
	q.perSource[source]++
	return w, cut
}

// cutLocked takes w out of the queue and has it answered now, with what
// it sent so far.
func (q *agentQueue) cutLocked(w *agentWaiter) {
	q.removeLocked(w)
	_ = w.conn.SetReadDeadline(time.Now())
}

// remove takes w out of the queue, if it is still in.
func (q *agentQueue) remove(w *agentWaiter) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.removeLocked(w)
}

func (q *agentQueue) removeLocked(w *agentWaiter) {
	if w.seq == 0 {
		return
	}
	i, _ := slices.BinarySearchFunc(q.waiting, w.seq, func(x *agentWaiter, seq uint64) int { return cmp.Compare(x.seq, seq) })
	q.waiting = slices.Delete(q.waiting, i, i+1)
	w.seq = 0
	if q.perSource[w.source]--; q.perSource[w.source] <= 0 {
		delete(q.perSource, w.source)
	}
}
