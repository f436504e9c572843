// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package proxy

import (
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/consumer/consumertest"
)

// A client that does not read holds up no other stream: the event loop
// relays the streams, and one whose client's socket is full leaves it
// rather than wait for that client. Stream A's client never reads while
// its upstream sends far more than the sockets hold; once A's upstream
// can write no more (everything between it and A's client is full), stream
// B is asked for, and comes whole.
func TestProxySlowClientHoldsNoOtherStream(t *testing.T) {
	chat, _ := fixtureStreams(t)
	big := "data: " + `{"choices":[{"index":0,"delta":{"content":"` + strings.Repeat("x", 4000) + `"}}]}` + "\n\n"
	var requests, bigWrites atomic.Int64
	up := newScriptedUpstream(t, func(u *scriptedUpstream, w http.ResponseWriter, r *http.Request) {
		if requests.Add(1) > 1 {
			replay(u, w, r, chat, func(int) time.Duration { return 0 })
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		f := w.(http.Flusher)
		for range 64 << 20 / len(big) { // far more than the sockets' buffers hold
			if _, err := io.WriteString(w, big); err != nil {
				return
			}
			f.Flush()
			bigWrites.Add(1)
		}
	})
	tr := startTestProxy(t, up.URL, consumertest.NewNop())
	slow, err := net.Dial("tcp", tr.p.Addr().String())
	require.NoError(t, err)
	defer slow.Close()
	body := `{"model":"m","stream":true}`
	_, err = io.WriteString(slow, "POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\nContent-Type: application/json\r\nContent-Length: "+strconv.Itoa(len(body))+"\r\n\r\n"+body)
	require.NoError(t, err)
	// and never reads. A's upstream stops when its writes stop returning.
	last, still := int64(-1), 0
	for still < 5 {
		time.Sleep(50 * time.Millisecond)
		n := bigWrites.Load()
		if n > 0 && n == last {
			still++
		} else {
			still = 0
		}
		last = n
	}
	client := &http.Client{Timeout: 20 * time.Second}
	// Asking for the usage: the client gets the engine's stream as it came.
	req, err := http.NewRequest(http.MethodPost, tr.proxyURL()+"/v1/chat/completions",
		strings.NewReader(`{"model":"m","stream":true,"stream_options":{"include_usage":true}}`))
	require.NoError(t, err)
	resp, err := client.Do(req)
	require.NoError(t, err, "stream B is answered")
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	require.NoError(t, err, "stream B is relayed whole")
	assert.Equal(t, strings.Join(chat, ""), string(got))
}
