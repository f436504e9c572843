package enginehealthexporter // import "github.com/otelcol-llm/otelcol-llm/exporter/enginehealthexporter"

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
)

// verdicts is what the judge last said of every engine. The endpoints read
// it without a lock: a health check never waits for a batch being folded.
type verdicts struct {
	list   []engineStatus // by engine name
	byName map[string]int // index into list
}

func newVerdicts(list []engineStatus) *verdicts {
	v := &verdicts{list: list, byName: make(map[string]int, len(list))}
	for i := range list {
		v.byName[list[i].Engine] = i
	}
	return v
}

// lookup returns an engine's status; false for an engine never seen.
func (v *verdicts) lookup(engine string) (engineStatus, bool) {
	i, ok := v.byName[engine]
	if !ok {
		return engineStatus{}, false
	}
	return v.list[i], true
}

// handler serves GET /engines, GET /engines/{engine}/health and GET /health
// (the engine in the Host header).
func (h *engineHealth) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /engines", func(w http.ResponseWriter, _ *http.Request) {
		now := h.now()
		v := h.verdicts.Load()
		out := make([]engineStatus, len(v.list))
		for i, st := range v.list {
			out[i] = st.at(now)
		}
		writeJSON(w, http.StatusOK, out)
	})
	// {engine} is llm.engine URL-escaped: the mux unescapes the segment, so
	// an engine named "ns/pod" is asked for as /engines/ns%2Fpod/health.
	mux.HandleFunc("GET /engines/{engine}/health", func(w http.ResponseWriter, r *http.Request) {
		h.serveHealth(w, r.PathValue("engine"))
	})
	// Checkers whose path is one for all the servers they check (Envoy's
	// health checks: a path per cluster, a Host header per endpoint) name
	// the engine in the Host header instead.
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		h.serveHealth(w, r.Host)
	})
	return mux
}

// serveHealth answers 200 for a healthy engine, 503 for an ejected one and
// 404 for one never seen, each with a JSON body.
func (h *engineHealth) serveHealth(w http.ResponseWriter, engine string) {
	st, ok := h.verdicts.Load().lookup(engine)
	if !ok {
		writeJSON(w, http.StatusNotFound, map[string]string{
			"error": fmt.Sprintf("unknown engine %q: no session of it has been seen", engine)})
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
const (
	// agentReadTimeout bounds the wait for the agent-send string; without
	// one configured, HAProxy sends nothing and gets "up" after it.
	agentReadTimeout = 500 * time.Millisecond
	agentMaxName     = 256
	// agentMaxConns bounds the checks answered at once; more are closed,
	// which HAProxy does not count as a failure.
	agentMaxConns = 64
)

type agentServer struct {
	health *engineHealth
	ln     net.Listener
	slots  chan struct{}
	done   sync.WaitGroup
}

func (a *agentServer) serve(endpoint string) error {
	ln, err := net.Listen("tcp", endpoint)
	if err != nil {
		return fmt.Errorf("agent::endpoint: listen on %s: %w", endpoint, err)
	}
	a.ln = ln
	a.slots = make(chan struct{}, agentMaxConns)
	a.done.Add(1)
	go func() {
		defer a.done.Done()
		for {
			conn, err := ln.Accept()
			if err != nil {
				if !errors.Is(err, net.ErrClosed) {
					a.health.set.Logger.Warn("agent-check endpoint stopped accepting", zap.Error(err))
				}
				return
			}
			select {
			case a.slots <- struct{}{}:
			default:
				_ = conn.Close()
				continue
			}
			a.done.Add(1)
			go func() {
				defer a.done.Done()
				defer func() { <-a.slots }()
				a.answer(conn)
			}()
		}
	}()
	return nil
}

// answer reads the engine name a check sends and replies with its state.
func (a *agentServer) answer(conn net.Conn) {
	defer conn.Close()
	_ = conn.SetReadDeadline(time.Now().Add(agentReadTimeout))
	line, err := bufio.NewReaderSize(io.LimitReader(conn, agentMaxName), agentMaxName).ReadString('\n')
	var netErr net.Error
	if err != nil && !errors.Is(err, io.EOF) && !(errors.As(err, &netErr) && netErr.Timeout()) {
		return
	}
	_ = conn.SetWriteDeadline(time.Now().Add(time.Second))
	_, _ = io.WriteString(conn, a.health.agentReply(strings.TrimSpace(line)))
}

// agentReply is the agent-check answer for engine.
func (h *engineHealth) agentReply(engine string) string {
	st, ok := h.verdicts.Load().lookup(engine)
	if ok && st.State == stateEjected {
		return "down #ejected: " + st.Reason + "\n"
	}
	return "up\n"
}

func (a *agentServer) shutdown() error {
	err := a.ln.Close()
	a.done.Wait()
	return err
}
