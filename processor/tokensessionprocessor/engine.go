// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package tokensessionprocessor // import "github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor"

import (
	"math"
	"net"
	"strconv"
	"sync"
	"time"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/pmetric"

	"github.com/otelcol-llm/otelcol-llm/processor/tokensessionprocessor/internal/session"
)

// engineRole is what an engine metric says about the engine's state.
type engineRole uint8

const (
	roleKVUsage engineRole = iota
	roleRunning
	roleWaiting
	rolePreemptions
	engineRoles
)

type engineMetric struct {
	prefix string // the engine's attribute prefix: vllm, sglang, llamacpp, tgi
	role   engineRole
}

// engineMetrics maps the engine metrics the processor reads to what they
// mean, across engines and engine versions.
var engineMetrics = map[string]engineMetric{
	"vllm:kv_cache_usage_perc":   {"vllm", roleKVUsage},
	"vllm:gpu_cache_usage_perc":  {"vllm", roleKVUsage},
	"vllm:num_requests_running":  {"vllm", roleRunning},
	"vllm:num_requests_waiting":  {"vllm", roleWaiting},
	"vllm:num_preemptions_total": {"vllm", rolePreemptions},
	"vllm:num_preemptions":       {"vllm", rolePreemptions},
	"sglang:token_usage":         {"sglang", roleKVUsage},
	"sglang:num_running_reqs":    {"sglang", roleRunning},
	"sglang:num_queue_reqs":      {"sglang", roleWaiting},
	// A histogram of retractions per finished request: its sum counts
	// them all, as vLLM's pre-emption counter does.
	"sglang:num_retractions": {"sglang", rolePreemptions},
	// llama.cpp (llama-server --metrics): requests_processing (busy slots)
	// and requests_deferred (requests waiting for a slot) from b2258, its
	// first /metrics, to v0.5.0; kv_cache_usage_ratio (KV cells used / n_ctx)
	// from b2258 to b5440 only: b5441 (PR #13660) took it out and nothing has
	// replaced it, so a current llama.cpp gives no KV figure.
	"llamacpp:kv_cache_usage_ratio": {"llamacpp", roleKVUsage},
	"llamacpp:requests_processing":  {"llamacpp", roleRunning},
	"llamacpp:requests_deferred":    {"llamacpp", roleWaiting},
	"tgi_batch_current_size":        {"tgi", roleRunning},
	"tgi_queue_size":                {"tgi", roleWaiting},
}

// engineSnapshot is an engine's state at one time; NaN where unknown.
type engineSnapshot struct {
	at     int64
	values [engineRoles]float64
}

// engineHistoryLen bounds the snapshots kept per engine: at a 1 s scrape
// interval, the last 8.5 minutes.
const engineHistoryLen = 512

// engineHistory is one engine instance's recent snapshots, oldest first
// in ring order.
type engineHistory struct {
	prefix string
	ring   []engineSnapshot
	next   int
	// seenAt and prevSeenAt are when (collector time) the latest two
	// snapshots came: their distance is the engine's scrape interval.
	seenAt, prevSeenAt int64
}

// defaultScrapeInterval stands for the interval of an engine seen once: the
// prometheus receiver's default.
const defaultScrapeInterval = 15 * int64(time.Second)

// interval is the engine's scrape interval as its snapshots show it.
func (h *engineHistory) interval() int64 {
	if h.prevSeenAt == 0 {
		return defaultScrapeInterval
	}
	return max(h.seenAt-h.prevSeenAt, 1)
}

// staleIntervals is how many scrape intervals an engine may miss before it
// is forgotten (a pod that went away).
const staleIntervals = 10

func (h *engineHistory) add(s engineSnapshot) {
	if len(h.ring) < engineHistoryLen {
		h.ring = append(h.ring, s)
		return
	}
	h.ring[h.next] = s
	h.next = (h.next + 1) % engineHistoryLen
}

// each visits the snapshots oldest first.
func (h *engineHistory) each(fn func(*engineSnapshot)) {
	for i := range h.ring {
		fn(&h.ring[(h.next+i)%len(h.ring)])
	}
}

// before returns the latest snapshot taken at or before t.
func (h *engineHistory) before(t int64) (engineSnapshot, bool) {
	var best engineSnapshot
	found := false
	h.each(func(s *engineSnapshot) {
		if s.at <= t {
			best, found = *s, true
		}
	})
	return best, found
}

// after returns the earliest snapshot taken at or after t.
func (h *engineHistory) after(t int64) (engineSnapshot, bool) {
	var best engineSnapshot
	found := false
	h.each(func(s *engineSnapshot) {
		if !found && s.at >= t {
			best, found = *s, true
		}
	})
	return best, found
}

// at returns the latest snapshot taken at or before t, or else the first
// one after it.
func (h *engineHistory) at(t int64) (engineSnapshot, bool) {
	var best engineSnapshot
	found := false
	h.each(func(s *engineSnapshot) {
		if !found || s.at <= t {
			best, found = *s, true
		}
	})
	return best, found
}

// engineStates is the engine state of every engine seen in the metrics,
// up to maxInstances (metrics::max_engines; 0: no bound).
type engineStates struct {
	byInstance   map[string]*engineHistory
	maxInstances int
	// overflowed counts the snapshots of instances beyond maxInstances,
	// not kept.
	overflowed uint64
}

// observe reads the engine metrics of md, one snapshot per resource (an
// engine instance, as the vllm scraper or the prometheus receiver name it).
// Data-parallel ranks (vLLM's engine label) add up: KV usage is their
// maximum, counts their sum.
func (e *engineStates) observe(md pmetric.Metrics, now int64) {
	for _, rm := range md.ResourceMetrics().All() {
		snap := engineSnapshot{at: now}
		for i := range snap.values {
			snap.values[i] = math.NaN()
		}
		prefix := ""
		for _, sm := range rm.ScopeMetrics().All() {
			for _, m := range sm.Metrics().All() {
				em, ok := engineMetrics[m.Name()]
				if !ok {
					continue
				}
				add := func(v float64, ts pcommon.Timestamp) {
					if ts != 0 {
						snap.at = int64(ts)
					}
					cur := snap.values[em.role]
					switch {
					case math.IsNaN(cur):
						snap.values[em.role] = v
					case em.role == roleKVUsage:
						snap.values[em.role] = max(cur, v)
					default:
						snap.values[em.role] = cur + v
					}
				}
				var dps pmetric.NumberDataPointSlice
				switch m.Type() {
				case pmetric.MetricTypeGauge:
					dps = m.Gauge().DataPoints()
				case pmetric.MetricTypeSum:
					dps = m.Sum().DataPoints()
				case pmetric.MetricTypeHistogram:
					if em.role != rolePreemptions {
						continue
					}
					prefix = em.prefix
					for _, dp := range m.Histogram().DataPoints().All() {
						add(dp.Sum(), dp.Timestamp())
					}
					continue
				default:
					continue
				}
				prefix = em.prefix
				for _, dp := range dps.All() {
					v := dp.DoubleValue()
					if dp.ValueType() == pmetric.NumberDataPointValueTypeInt {
						v = float64(dp.IntValue())
					}
					add(v, dp.Timestamp())
				}
			}
		}
		if prefix == "" {
			continue
		}
		key := instanceKey(rm.Resource().Attributes())
		if e.byInstance == nil {
			e.byInstance = make(map[string]*engineHistory)
		}
		h := e.byInstance[key]
		if h == nil {
			if e.maxInstances > 0 && len(e.byInstance) >= e.maxInstances {
				e.overflowed++
				continue
			}
			h = &engineHistory{prefix: prefix}
			e.byInstance[key] = h
		}
		h.add(snap)
		h.prevSeenAt, h.seenAt = h.seenAt, now
	}
	for key, h := range e.byInstance {
		if now-h.seenAt > staleIntervals*h.interval() {
			delete(e.byInstance, key)
		}
	}
}

// instanceKey names an engine instance by its resource: service.instance.id,
// else server.address:server.port.
func instanceKey(attrs pcommon.Map) string {
	if v, ok := attrs.Get("service.instance.id"); ok && v.Str() != "" {
		return v.Str()
	}
	host, _ := attrs.Get("server.address")
	port, ok := attrs.Get("server.port")
	if !ok {
		return host.AsString()
	}
	return net.JoinHostPort(host.AsString(), strconv.FormatInt(port.Int(), 10))
}

// match finds a session's engine: the instance named by its engine (the
// hook's engine field, or the proxy's upstream host:port), else the only
// engine there is.
func (e *engineStates) match(engine string) *engineHistory {
	if h, ok := e.byInstance[engine]; ok {
		return h
	}
	if len(e.byInstance) == 1 {
		for _, h := range e.byInstance {
			return h
		}
	}
	return nil
}

// Engine context attribute names, after the engine's prefix.
const (
	attrKVUsageStart   = ".kv_cache_usage.start"
	attrKVUsageMax     = ".kv_cache_usage.max"
	attrWaitingStart   = ".num_requests_waiting.start"
	attrPreemptions    = ".num_preemptions"
	attrKVUsage        = ".kv_cache_usage"
	attrRunning        = ".num_requests_running"
	attrWaiting        = ".num_requests_waiting"
	attrPreemptionsTot = ".num_preemptions_total"
)

// putSessionContext writes what the engine's state was during the session:
// KV usage at start and its maximum, the queue at start, and the
// pre-emptions counted between the snapshots that bracket the session: the
// last one at or before its start and the first at or after its end. Without
// both the count is unknown and left out: a 0 is only ever measured.
func putSessionContext(m pcommon.Map, h *engineHistory, s *session.Session, end int64) {
	start := s.StartedAt()
	first, ok := h.at(start)
	if !ok {
		return
	}
	putIfKnown(m, h.prefix+attrKVUsageStart, first.values[roleKVUsage])
	putIfKnown(m, h.prefix+attrWaitingStart, first.values[roleWaiting])
	kvMax := first.values[roleKVUsage]
	h.each(func(sn *engineSnapshot) {
		if sn.at < start || sn.at > end {
			return
		}
		if v := sn.values[roleKVUsage]; !math.IsNaN(v) && (math.IsNaN(kvMax) || v > kvMax) {
			kvMax = v
		}
	})
	putIfKnown(m, h.prefix+attrKVUsageMax, kvMax)
	before, ok1 := h.before(start)
	after, ok2 := h.after(end)
	if !ok1 || !ok2 {
		return
	}
	if a, b := before.values[rolePreemptions], after.values[rolePreemptions]; !math.IsNaN(a) && !math.IsNaN(b) {
		d := b - a
		if d < 0 { // the counter was reset: count what the new one saw
			d = b
		}
		m.PutInt(h.prefix+attrPreemptions, int64(d))
	}
}

// putStallContext writes the engine's state when a stall was detected.
func putStallContext(m pcommon.Map, h *engineHistory, at int64) {
	sn, ok := h.at(at)
	if !ok {
		return
	}
	putIfKnown(m, h.prefix+attrKVUsage, sn.values[roleKVUsage])
	putIfKnown(m, h.prefix+attrRunning, sn.values[roleRunning])
	putIfKnown(m, h.prefix+attrWaiting, sn.values[roleWaiting])
	putIfKnown(m, h.prefix+attrPreemptionsTot, sn.values[rolePreemptions])
}

func putIfKnown(m pcommon.Map, k string, v float64) {
	if !math.IsNaN(v) {
		m.PutDouble(k, v)
	}
}

// engineContext is the part of the core that knows the engines' state, read
// from the metrics pipeline, for the engine context of sessions and stalls.
// mu guards states: a metrics batch writes under mu alone; the sessions
// part reads while it writes outputs, with its own lock held. mu is a leaf:
// nothing is locked under it.
type engineContext struct {
	mu     sync.RWMutex
	states engineStates
}

// observe reads the engine metrics of md at collector time now.
func (e *engineContext) observe(md pmetric.Metrics, now int64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.states.observe(md, now)
}

// overflowed counts the snapshots of engine instances not kept, beyond
// metrics::max_engines.
func (e *engineContext) overflowed() uint64 {
	e.mu.RLock()
	defer e.mu.RUnlock()
	return e.states.overflowed
}

// putSessionContext writes what the state of the session's engine was
// during it (see putSessionContext), if the engine is known.
func (e *engineContext) putSessionContext(m pcommon.Map, s *session.Session, end int64) {
	e.mu.RLock()
	defer e.mu.RUnlock()
	if h := e.states.match(s.Engine); h != nil {
		putSessionContext(m, h, s, end)
	}
}

// putStallContext writes the engine's state at a stall detected at at, if
// the engine is known.
func (e *engineContext) putStallContext(m pcommon.Map, engine string, at int64) {
	e.mu.RLock()
	defer e.mu.RUnlock()
	if h := e.states.match(engine); h != nil {
		putStallContext(m, h, at)
	}
}

// scrapePending reports whether engine is known and not yet scraped at or
// after end, with its scrape interval.
func (e *engineContext) scrapePending(engine string, end int64) (interval int64, pending bool) {
	e.mu.RLock()
	defer e.mu.RUnlock()
	h := e.states.match(engine)
	if h == nil {
		return 0, false
	}
	if _, scraped := h.after(end); scraped {
		return 0, false
	}
	return h.interval(), true
}
