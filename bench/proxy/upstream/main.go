// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

// Command upstream is a stand-in for vLLM's OpenAI-compatible server for the
// proxy benchmark: POST /v1/chat/completions answers a chat stream shaped as
// vLLM's (role chunk, N content chunks G apart, a finish chunk, a usage chunk
// when stream_options.include_usage is asked, data: [DONE]).
//
// Every content chunk's id carries its send time: "chatcmpl-" followed by 32
// hex digits, as vLLM's, of which the first 16 identify the stream and the
// last 16 are the Unix time in ns at which the chunk was written. (vLLM keeps
// one id per stream; a client ignores it, the proxy does not read it.)
//
// On SIGINT/SIGTERM it prints to stderr how many connections and requests it
// served (to check that a proxy reuses its upstream connections).
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"
)

var conns, requests, streams atomic.Int64

type chatRequest struct {
	Model         string `json:"model"`
	Stream        bool   `json:"stream"`
	StreamOptions *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

func main() {
	addr := flag.String("addr", "127.0.0.1:18000", "listen address")
	n := flag.Int("n", 64, "content chunks per stream")
	gap := flag.Duration("gap", 20*time.Millisecond, "time between content chunks")
	flag.Parse()

	words := []string{"The", " capital", " of", " France", " is", " Paris", ".", " It", " has", " a", " river", ","}
	const model = "meta-llama/Llama-3.1-8B-Instruct"

	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var req chatRequest
		if err := json.Unmarshal(body, &req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if req.Model == "" {
			req.Model = model
		}
		if !req.Stream {
			http.Error(w, "this bench upstream only streams", http.StatusBadRequest)
			return
		}
		streams.Add(1)
		usage := req.StreamOptions != nil && req.StreamOptions.IncludeUsage
		fl := w.(http.Flusher)
		w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
		w.WriteHeader(http.StatusOK)

		streamID := fmt.Sprintf("%016x", rand.Uint64())
		created := strconv.FormatInt(time.Now().Unix(), 10)
		modelJSON, _ := json.Marshal(req.Model)
		head := `data: {"id":"chatcmpl-` + streamID
		mid := `","object":"chat.completion.chunk","created":` + created + `,"model":` + string(modelJSON) + `,"choices":[{"index":0,"delta":`
		tail := `,"logprobs":null,"finish_reason":null}]}` + "\n\n"
		buf := make([]byte, 0, 512)
		send := func(b []byte) bool {
			if _, err := w.Write(b); err != nil {
				return false
			}
			fl.Flush()
			return true
		}
		// Role chunk (vLLM's id for this one too; the time part is zero).
		buf = append(buf[:0], head...)
		buf = append(buf, "0000000000000000"...)
		buf = append(buf, mid...)
		buf = append(buf, `{"role":"assistant","content":""}`...)
		buf = append(buf, tail...)
		if !send(buf) {
			return
		}
		start := time.Now()
		for i := 1; i <= *n; i++ {
			if d := time.Until(start.Add(time.Duration(i) * *gap)); d > 0 {
				select {
				case <-time.After(d):
				case <-r.Context().Done():
					return
				}
			}
			word, _ := json.Marshal(words[(i-1)%len(words)])
			buf = append(buf[:0], head...)
			now := time.Now().UnixNano()
			buf = fmt.Appendf(buf, "%016x", uint64(now))
			buf = append(buf, mid...)
			buf = append(buf, `{"content":`...)
			buf = append(buf, word...)
			buf = append(buf, '}')
			buf = append(buf, tail...)
			if !send(buf) {
				return
			}
		}
		buf = append(buf[:0], head...)
		buf = append(buf, "0000000000000000"...)
		buf = append(buf, mid...)
		buf = append(buf, `{"content":""},"logprobs":null,"finish_reason":"stop","stop_reason":null}]}`+"\n\n"...)
		if !send(buf) {
			return
		}
		if usage {
			buf = append(buf[:0], head...)
			buf = append(buf, "0000000000000000"...)
			buf = append(buf, `","object":"chat.completion.chunk","created":`+created+`,"model":`+string(modelJSON)+`,"choices":[],"usage":{"prompt_tokens":42,"total_tokens":`...)
			buf = strconv.AppendInt(buf, int64(42+*n), 10)
			buf = append(buf, `,"completion_tokens":`...)
			buf = strconv.AppendInt(buf, int64(*n), 10)
			buf = append(buf, "}}\n\n"...)
			if !send(buf) {
				return
			}
		}
		send([]byte("data: [DONE]\n\n"))
	})

	srv := &http.Server{
		Addr:              *addr,
		Handler:           mux,
		ReadHeaderTimeout: 10 * time.Second,
		ConnState: func(_ net.Conn, s http.ConnState) {
			if s == http.StateNew {
				conns.Add(1)
			}
		},
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, append([]os.Signal{os.Interrupt, syscall.SIGTERM}, reportSignals...)...)
	go func() {
		for s := range sig {
			fmt.Fprintf(os.Stderr, "{\"connections\":%d,\"requests\":%d,\"streams\":%d}\n", conns.Load(), requests.Load(), streams.Load())
			if !slices.Contains(reportSignals, s) {
				srv.Close()
			}
		}
	}()
	log.Printf("upstream on %s: n=%d gap=%s", *addr, *n, *gap)
	if err := srv.Serve(ln); err != nil && err != http.ErrServerClosed {
		log.Fatal(err)
	}
}
