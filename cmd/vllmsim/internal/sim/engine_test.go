package sim

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var t0 = time.Unix(1754000000, 0)

func testConfig() Config {
	c := DefaultConfig()
	c.Model = "m"
	return c
}

func newEngine(t *testing.T, c Config) *Engine {
	t.Helper()
	e, err := New(c)
	require.NoError(t, err)
	return e
}

// drive steps e from now until no work is left, returning the batches and
// the end time.
func drive(t *testing.T, e *Engine, now time.Time, maxSteps int, each func(b *Batch)) time.Time {
	t.Helper()
	for i := 0; i < maxSteps; i++ {
		s := e.Snapshot()
		if s.Running+s.Waiting == 0 {
			return now
		}
		b := e.Step(now)
		require.NotEmpty(t, b.Entries, "stuck with work left: %+v", s)
		if each != nil {
			each(b)
		}
		now = now.Add(b.Duration)
	}
	t.Fatalf("not done after %d steps", maxSteps)
	return now
}

// collect reads a finished request's events.
func collect(r *Request) (texts []string, finish string) {
	for ev := range r.Events() {
		texts = append(texts, ev.Text)
		finish = ev.Finish
	}
	return texts, finish
}

func TestDefaultCosts(t *testing.T) {
	c := testConfig()
	assert.GreaterOrEqual(t, c.StepCost(2000, 0), 100*time.Millisecond, "2000-token prefill")
	for _, n := range []int{1, 8, 32, 64} {
		d := c.StepCost(0, n)
		assert.True(t, d >= 10*time.Millisecond && d <= 30*time.Millisecond, "decode step of %d: %v", n, d)
	}
	assert.Greater(t, c.StepCost(0, 64), c.StepCost(0, 1), "decode grows with batch size")
	assert.Greater(t, c.StepCost(1000, 0), c.StepCost(100, 0), "prefill grows with tokens")
}

func TestOutputLengthAndFinish(t *testing.T) {
	e := newEngine(t, testConfig())
	stop, err := e.Submit("a", Params{PromptTokens: 10, MaxTokens: 5}, t0)
	require.NoError(t, err)
	length, err := e.Submit("b", Params{PromptTokens: 10, MaxTokens: 5, IgnoreEOS: true}, t0)
	require.NoError(t, err)
	drive(t, e, t0, 100, nil)

	texts, finish := collect(stop)
	require.Len(t, texts, 5)
	assert.Equal(t, FinishStop, finish)
	assert.Empty(t, texts[4], "EOS has no text")
	assert.NotEmpty(t, texts[0])
	assert.False(t, strings.HasPrefix(texts[0], " "), "first token has no leading space")

	texts, finish = collect(length)
	require.Len(t, texts, 5)
	assert.Equal(t, FinishLength, finish)
	assert.NotEmpty(t, texts[4])
	assert.Equal(t, Snapshot{FreeBlocks: e.cfg.KVBlocks}, e.Snapshot(), "all blocks back")
}

func TestSubmitRejects(t *testing.T) {
	c := testConfig()
	c.MaxModelLen = 100
	c.KVBlocks = 4
	e := newEngine(t, c)
	_, err := e.Submit("x", Params{PromptTokens: 90, MaxTokens: 20}, t0)
	assert.ErrorIs(t, err, ErrTooLong)
	_, err = e.Submit("y", Params{PromptTokens: 60, MaxTokens: 20}, t0) // 80 tokens > 4 blocks
	assert.ErrorIs(t, err, ErrTooLong)
	_, err = e.Submit("z", Params{PromptTokens: 5, MaxTokens: 0}, t0)
	assert.Error(t, err)
}

// demand is how many new blocks the running requests need for their next
// step (decode-first scheduling).
func demand(e *Engine) (need, free int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	budget := e.cfg.MaxNumBatchedTokens
	for _, r := range e.running {
		n := e.take(r, budget)
		budget -= n
		if d := blocksFor(r.computed+n) - r.blocks; d > 0 {
			need += d
		}
	}
	return need, e.free
}

func TestPreemptionOnlyWhenKVExhausted(t *testing.T) {
	run := func(t *testing.T, kvBlocks int) (preempted int, reqs []*Request, e *Engine) {
		c := testConfig()
		c.KVBlocks = kvBlocks
		e = newEngine(t, c)
		for i := range 4 {
			r, err := e.Submit(fmt.Sprint(i), Params{PromptTokens: 40, MaxTokens: 40}, t0)
			require.NoError(t, err)
			reqs = append(reqs, r)
		}
		now := t0
		for step := 0; step < 1000; step++ {
			s := e.Snapshot()
			if s.Running+s.Waiting == 0 {
				break
			}
			need, free := demand(e)
			b := e.Step(now)
			now = now.Add(b.Duration)
			if len(b.Preempted) > 0 {
				assert.Greater(t, need, free, "step %d pre-empted %v without exhaustion", step, b.Preempted)
				preempted += len(b.Preempted)
			} else {
				assert.LessOrEqual(t, need, free, "step %d: running requests needed %d blocks, %d free, yet nobody was pre-empted", step, need, free)
			}
			assert.GreaterOrEqual(t, e.Snapshot().FreeBlocks, 0)
		}
		return preempted, reqs, e
	}

	t.Run("ample pool", func(t *testing.T) {
		n, reqs, e := run(t, 64) // 4 requests x 5 blocks fit
		assert.Zero(t, n)
		assert.Zero(t, e.Snapshot().Preemptions)
		for _, r := range reqs {
			texts, _ := collect(r)
			assert.Len(t, texts, 40)
		}
	})
	t.Run("exhausted pool", func(t *testing.T) {
		n, reqs, e := run(t, 12) // prompts fit (4x3 blocks), outputs do not
		assert.Positive(t, n)
		assert.Equal(t, n, e.Snapshot().Preemptions)
		var sb strings.Builder
		require.NoError(t, e.WriteMetrics(&sb))
		assert.Contains(t, sb.String(), fmt.Sprintf(`vllm:num_preemptions_total{engine="0",model_name="m"} %d.0`, n))
		for _, r := range reqs {
			texts, finish := collect(r)
			assert.Len(t, texts, 40, "pre-empted requests are recomputed and finish")
			assert.Equal(t, FinishStop, finish)
		}
		assert.Equal(t, 12, e.Snapshot().FreeBlocks)
		assert.Positive(t, reqs[3].preemptions+reqs[2].preemptions, "the newest are the victims")
		assert.Zero(t, reqs[0].preemptions, "the oldest is never the victim")
	})
}

func TestPreemptedRequestIsRecomputed(t *testing.T) {
	c := testConfig()
	c.KVBlocks = 4 // 64 tokens
	e := newEngine(t, c)
	a, err := e.Submit("a", Params{PromptTokens: 30, MaxTokens: 20}, t0) // 50 tokens: 4 blocks at the end
	require.NoError(t, err)
	b, err := e.Submit("b", Params{PromptTokens: 20, MaxTokens: 4}, t0) // 2 blocks
	require.NoError(t, err)
	var recs []StepRecord
	drive(t, e, t0, 200, func(bt *Batch) { recs = append(recs, e.Record(bt)) })
	var preemptAt = -1
	for i, r := range recs {
		if len(r.Preempted) > 0 {
			preemptAt = i
			assert.Equal(t, []uint64{b.Seq}, r.Preempted)
			break
		}
	}
	require.GreaterOrEqual(t, preemptAt, 0, "b must be pre-empted: %v", recs)
	// b comes back with a prefill of its prompt plus what it had generated.
	var resumed bool
	for _, r := range recs[preemptAt+1:] {
		for _, en := range r.Entries {
			if strings.HasPrefix(en, "1:") && strings.HasSuffix(en, "p") && en != "1:20p" {
				resumed = true
			}
		}
	}
	assert.True(t, resumed, "b recomputes prompt+generated tokens: %v", recs)
	ta, _ := collect(a)
	tb, _ := collect(b)
	assert.Len(t, ta, 20)
	assert.Len(t, tb, 4)
}

func TestChunkedPrefillBudget(t *testing.T) {
	c := testConfig()
	c.ChunkedPrefill = true
	c.MaxNumBatchedTokens = 64
	e := newEngine(t, c)
	short, err := e.Submit("s", Params{PromptTokens: 10, MaxTokens: 30}, t0)
	require.NoError(t, err)
	now := e.Step(t0).Start // short's prefill
	now = now.Add(c.StepCost(10, 0))
	long, err := e.Submit("l", Params{PromptTokens: 200, MaxTokens: 3}, now)
	require.NoError(t, err)
	var prefillSteps int
	drive(t, e, now, 200, func(b *Batch) {
		total := 0
		for _, en := range b.Entries {
			total += en.Tokens
			if en.Req == long && en.Prefill {
				prefillSteps++
			}
		}
		assert.LessOrEqual(t, total, 64, "a step's tokens stay within the budget")
		assert.LessOrEqual(t, b.PrefillTokens, 64)
	})
	// 200 prompt tokens beside one decode: 63 per step -> 4 steps.
	assert.Equal(t, 4, prefillSteps)
	ts, _ := collect(short)
	tl, _ := collect(long)
	assert.Len(t, ts, 30)
	assert.Len(t, tl, 3)

	t.Run("off", func(t *testing.T) {
		c.ChunkedPrefill = false
		c.MaxNumBatchedTokens = c.MaxModelLen
		e := newEngine(t, c)
		_, err := e.Submit("l", Params{PromptTokens: 200, MaxTokens: 3}, t0)
		require.NoError(t, err)
		b := e.Step(t0)
		assert.Equal(t, 200, b.PrefillTokens, "whole prompt in one step")
		assert.Equal(t, c.StepCost(200, 0), b.Duration)
		drive(t, e, t0, 10, nil)
	})
}

func TestPrefillPriority(t *testing.T) {
	for _, prio := range []bool{false, true} {
		t.Run(fmt.Sprint(prio), func(t *testing.T) {
			c := testConfig()
			c.PrefillPriority = prio
			e := newEngine(t, c)
			_, err := e.Submit("a", Params{PromptTokens: 10, MaxTokens: 10}, t0)
			require.NoError(t, err)
			e.Step(t0)
			e.Step(t0) // a decoding
			_, err = e.Submit("b", Params{PromptTokens: 500, MaxTokens: 3}, t0)
			require.NoError(t, err)
			b := e.Step(t0)
			assert.Equal(t, 500, b.PrefillTokens)
			if prio {
				assert.Zero(t, b.DecodeSeqs, "prefill-priority step runs no decodes")
			} else {
				assert.Equal(t, 1, b.DecodeSeqs, "decode-first step keeps the decode")
			}
			drive(t, e, t0, 100, nil)
		})
	}
}

func TestFP8HalvesDecode(t *testing.T) {
	decodeStep := func(profile string) time.Duration {
		c := testConfig()
		c.Profile = profile
		e := newEngine(t, c)
		for i := range 16 {
			_, err := e.Submit(fmt.Sprint(i), Params{PromptTokens: 20, MaxTokens: 10}, t0)
			require.NoError(t, err)
		}
		e.Step(t0) // all prefills
		b := e.Step(t0)
		require.Equal(t, 16, b.DecodeSeqs)
		require.Zero(t, b.PrefillTokens)
		drive(t, e, t0, 100, nil)
		return b.Duration
	}
	fp16, fp8 := decodeStep(ProfileFP16), decodeStep(ProfileFP8)
	ratio := float64(fp8) / float64(fp16)
	assert.InDelta(t, 0.5, ratio, 0.05, "fp16 %v fp8 %v", fp16, fp8)
	assert.True(t, fp16 >= 10*time.Millisecond && fp16 <= 30*time.Millisecond, "fp16 decode step %v", fp16)
}

func TestDeterministic(t *testing.T) {
	scenario := func(seed uint64) ([]StepRecord, [][]string) {
		c := testConfig()
		c.Seed = seed
		c.KVBlocks = 20
		c.MaxNumBatchedTokens = 48
		e := newEngine(t, c)
		var reqs []*Request
		now := t0
		for i := range 6 {
			r, err := e.Submit(fmt.Sprint(i), Params{PromptTokens: 20 + 15*i, MaxTokens: 25, IgnoreEOS: i%2 == 0}, now)
			require.NoError(t, err)
			reqs = append(reqs, r)
			if i%2 == 1 {
				b := e.Step(now)
				now = now.Add(b.Duration)
			}
		}
		var recs []StepRecord
		drive(t, e, now, 1000, func(b *Batch) { recs = append(recs, e.Record(b)) })
		var texts [][]string
		for _, r := range reqs {
			tx, _ := collect(r)
			texts = append(texts, tx)
		}
		return recs, texts
	}
	r1, t1 := scenario(7)
	r2, t2 := scenario(7)
	assert.Equal(t, r1, r2, "same schedule")
	assert.Equal(t, t1, t2, "same text")
	_, t3 := scenario(8)
	assert.NotEqual(t, t1, t3, "another seed, another text")
	var pre int
	for _, r := range r1 {
		pre += len(r.Preempted)
	}
	assert.Positive(t, pre, "the scenario exercises pre-emption")
}

func TestAbortFreesBlocks(t *testing.T) {
	e := newEngine(t, testConfig())
	r, err := e.Submit("a", Params{PromptTokens: 100, MaxTokens: 100}, t0)
	require.NoError(t, err)
	b := e.Plan(t0)
	require.Len(t, b.Entries, 1)
	e.Abort(r, t0) // between plan and commit
	e.Commit(b, t0.Add(b.Duration))
	_, ok := <-r.Events()
	assert.False(t, ok)
	assert.Equal(t, Snapshot{FreeBlocks: e.cfg.KVBlocks}, e.Snapshot())
	var sb strings.Builder
	require.NoError(t, e.WriteMetrics(&sb))
	assert.Contains(t, sb.String(), `vllm:request_success_total{engine="0",finished_reason="abort",model_name="m"} 1.0`)
}

// fakeClock advances only when slept on.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *fakeClock) Sleep(ctx context.Context, d time.Duration) error {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
	return ctx.Err()
}

func TestRunWithInjectedClock(t *testing.T) {
	c := testConfig()
	e := newEngine(t, c)
	clk := &fakeClock{now: t0}
	r, err := e.Submit("a", Params{PromptTokens: 100, MaxTokens: 3}, t0)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); e.Run(ctx, clk) }()
	var times []time.Time
	for ev := range r.Events() {
		times = append(times, ev.Time)
	}
	cancel()
	<-done
	require.Len(t, times, 3)
	first := t0.Add(c.StepCost(100, 0))
	assert.Equal(t, first, times[0], "TTFT = prefill cost")
	assert.Equal(t, c.StepCost(0, 1), times[1].Sub(times[0]), "ITL = decode step")
	_, err = e.Submit("late", Params{PromptTokens: 1, MaxTokens: 1}, t0)
	assert.ErrorIs(t, err, ErrStopped)
}

func TestFormatFloat(t *testing.T) {
	for v, want := range map[float64]string{12: "12.0", 0.4178: "0.4178", 1754000000.0123: "1754000000.0123", 0: "0.0", 0.001: "0.001", 7680: "7680.0"} {
		assert.Equal(t, want, FormatFloat(v))
	}
	assert.Equal(t, []float64{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000}, Build125Buckets(4096))
}
