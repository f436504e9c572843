// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/otelcol-llm/otelcol-llm/internal/harness/testbin"
	"github.com/otelcol-llm/otelcol-llm/pkg/tokenevent"
)

// liveRows is what the page shows in its table of sessions in flight, top
// to bottom: each row's phase, as the DOM has it.
const liveRows = `Array.from(document.querySelectorAll("#sessions tbody tr")).map(r => r.dataset.phase)`

// TestLivePage drives a real headless Chromium against token_session's live
// page while vllmsim streams 32 requests at a time through the proxy. When
// the engine freezes (/admin/degrade), the page shows the sessions in flight
// frozen or stalled, at the top, within 2 s; after /admin/heal they are
// decoding again. It reads the DOM the page's script built from the SSE
// stream, not the JSON. With LIVE_SCREENSHOT set, the page while the engine
// is frozen is saved there (the README's docs/live.png). Last, a session
// with a long model name, sent by a hook, is shown cut.
func TestLivePage(t *testing.T) {
	browser := testbin.Tool(t, "chromium", "chromium")
	_, sinkAddr := startSink(t)
	simAddr, liveAddr := freePort(t, "tcp"), freePort(t, "tcp")
	col := startCollector(t, "live.yaml", sinkAddr, "UPSTREAM_URL=http://"+simAddr, "LIVE_ENDPOINT="+liveAddr)
	// A token every 20 ms or so: a request of 400 tokens streams for 8 s.
	startVLLMSim(t, simAddr, "-model", "sim", "-decode-base", "20ms")

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const concurrency = 32
	var load sync.WaitGroup
	for i := range concurrency {
		load.Add(1)
		go func() {
			defer load.Done()
			for n := 0; ctx.Err() == nil; n++ {
				body := fmt.Sprintf(`{"model":"sim","messages":[{"role":"user","content":"request %d of client %d"}],"max_tokens":400,"stream":true}`, n, i)
				req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+col.proxyAddr+"/v1/chat/completions", strings.NewReader(body))
				if err != nil {
					return
				}
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}
	defer func() { cancel(); load.Wait() }()

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(browser),
		chromedp.Flag("headless", true), chromedp.DisableGPU, chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.WindowSize(1500, 1000))
	if os.Geteuid() == 0 {
		// Chromium's sandbox needs user namespaces, which a container
		// running as root often lacks.
		opts = append(opts, chromedp.NoSandbox)
	}
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	defer cancelAlloc()
	page, cancelPage := chromedp.NewContext(allocCtx)
	defer cancelPage()
	require.NoError(t, chromedp.Do(page, chromedp.Navigate("http://"+liveAddr+"/")))

	rows := func() []string {
		phases, err := chromedp.Run(page, chromedp.Evaluate[[]string](liveRows))
		require.NoError(t, err)
		return phases
	}
	count := func(phases []string, want ...string) int {
		n := 0
		for _, p := range phases {
			for _, w := range want {
				if p == w {
					n++
				}
			}
		}
		return n
	}
	// "Stuck on top": every frozen or stalled row above every other one.
	stuckOnTop := func(phases []string) bool {
		n := count(phases, "frozen", "stalled")
		return n > 0 && count(phases[:n], "frozen", "stalled") == n
	}

	var phases []string
	require.Eventually(t, func() bool {
		phases = rows()
		return count(phases, "decoding") >= concurrency/2
	}, 60*time.Second, 100*time.Millisecond, "the page never showed the streams decoding: %v", &phases)

	post := func(path string) {
		resp, err := http.Post("http://"+simAddr+path, "", nil) //nolint:gosec // the test's own simulator
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, path)
	}
	// Every step 3 s longer: the engine's streams stop mid-decode.
	post("/admin/degrade?freeze=3s&every=1")
	frozeAt := time.Now()
	require.Eventually(t, func() bool {
		phases = rows()
		return count(phases, "frozen", "stalled") >= concurrency/2 && stuckOnTop(phases)
	}, 20*time.Second, 50*time.Millisecond, "the page never showed the frozen sessions on top: %v", &phases)
	shown := time.Since(frozeAt)
	t.Logf("frozen sessions on top of the page %s after the freeze: %v", shown.Round(time.Millisecond), phases)
	assert.LessOrEqual(t, shown, 2*time.Second, "the page showed the freeze late")
	assert.Positive(t, count(phases, "frozen"), "some sessions frozen, not only stalled: %v", phases)

	// Wait for a snapshot or two more, so that the engine bar and the
	// sessions of the picture agree, and keep it if asked for.
	require.NoError(t, chromedp.Do(page, chromedp.Sleep(500*time.Millisecond)))
	engineBars, err := chromedp.Run(page, chromedp.Evaluate[int](`document.querySelectorAll("#engines .bar").length`))
	require.NoError(t, err)
	assert.Equal(t, 1, engineBars, "one engine behind the proxy")
	if out := os.Getenv("LIVE_SCREENSHOT"); out != "" {
		png, err := chromedp.Run(page, chromedp.CaptureScreenshot())
		require.NoError(t, err)
		require.NoError(t, os.MkdirAll(filepath.Dir(out), 0o755)) //nolint:gosec // G703: the path the person running the test gave
		require.NoError(t, os.WriteFile(out, png, 0o600))         //nolint:gosec // G703: as above
	}

	post("/admin/heal")
	require.Eventually(t, func() bool {
		phases = rows()
		return count(phases, "frozen", "stalled") == 0 && count(phases, "decoding") >= concurrency/2
	}, 30*time.Second, 100*time.Millisecond, "the sessions never went back to decoding: %v", &phases)

	// A name a sender made long (a model of 250 characters, by a hook) is
	// cut in its cell and shown whole on hover: it does not stretch the
	// table.
	longModel := strings.Repeat("m", 250)
	start := tokenevent.Event{
		Kind: tokenevent.KindStart, SessionID: "long-name", TimeUnixNano: uint64(time.Now().UnixNano()),
		Model: longModel, Operation: tokenevent.OperationChat, Engine: "vllm-long", PromptTokens: 10, Count: 1, CompletionTokens: -1,
	}
	postLines(t, "http://"+col.httpAddr+"/v1/token-events", strings.TrimSpace(string(tokenevent.AppendJSON(nil, &start))))
	const modelCell = `document.querySelector('#sessions tr[data-session="long-name"] td:nth-child(4)')`
	require.Eventually(t, func() bool {
		shown, err := chromedp.Run(page, chromedp.Evaluate[bool](modelCell+` !== null`))
		return err == nil && shown
	}, 10*time.Second, 50*time.Millisecond, "the session with a long model name never showed")
	width, err := chromedp.Run(page, chromedp.Evaluate[float64](modelCell+`.getBoundingClientRect().width`))
	require.NoError(t, err)
	assert.LessOrEqual(t, width, 300.0, "the model's cell is cut, not stretched to 250 characters")
	title, err := chromedp.Run(page, chromedp.Evaluate[string](modelCell+`.firstChild.title`))
	require.NoError(t, err)
	assert.Equal(t, longModel, title, "the name whole on hover")
}
