// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

// Command client drives the proxy benchmark: C workers each open a streaming
// chat completion, read it to the end and open the next, until the duration
// is up. For every content chunk it records receive time - send time (the
// send time is the Unix ns the bench upstream put in the last 16 hex digits
// of the chunk's id) and prints one JSON object with the latency percentiles
// and the rate of content events.
//
// Samples are kept only for chunks received in [warmup, duration); streams
// still open at the end are read to completion (bounded by -grace) so that
// every connection closes cleanly.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"
)

type result struct {
	Label        string  `json:"label,omitempty"`
	URL          string  `json:"url"`
	Concurrency  int     `json:"concurrency"`
	WindowS      float64 `json:"window_s"`
	Streams      int64   `json:"streams_completed"`
	Errors       int64   `json:"errors"`
	Count        int     `json:"count"`
	TotalEvents  int64   `json:"total_content_events"`
	EventsPerSec float64 `json:"events_per_s"`
	P50us        float64 `json:"p50_us"`
	P90us        float64 `json:"p90_us"`
	P99us        float64 `json:"p99_us"`
	Maxus        float64 `json:"max_us"`
	Meanus       float64 `json:"mean_us"`
	FirstError   string  `json:"first_error,omitempty"`
}

var (
	idKey   = []byte(`"id":"chatcmpl-`)
	content = []byte(`"delta":{"content":"`)
)

func main() {
	url := flag.String("url", "http://127.0.0.1:18000/v1/chat/completions", "completions URL")
	c := flag.Int("c", 100, "concurrent streams")
	dur := flag.Duration("duration", 15*time.Second, "how long to keep opening streams")
	warmup := flag.Duration("warmup", 2*time.Second, "samples before this are dropped")
	ramp := flag.Duration("ramp", 1300*time.Millisecond, "worker starts are spread uniformly over this")
	grace := flag.Duration("grace", 10*time.Second, "hard stop after duration")
	label := flag.String("label", "", "label copied to the output")
	usage := flag.Bool("usage", true, "ask for stream_options.include_usage")
	flag.Parse()

	body := `{"model":"meta-llama/Llama-3.1-8B-Instruct","messages":[{"role":"user","content":"What is the capital of France?"}],"stream":true,"max_tokens":64`
	if *usage {
		body += `,"stream_options":{"include_usage":true}`
	}
	body += "}"

	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        *c * 2,
		MaxIdleConnsPerHost: *c * 2,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
	client := &http.Client{Transport: tr}

	start := time.Now()
	from, to := start.Add(*warmup), start.Add(*dur)
	ctx, cancel := context.WithDeadline(context.Background(), to.Add(*grace))
	defer cancel()

	type workerOut struct {
		lat      []int64
		total    int64
		streams  int64
		errors   int64
		firstErr string
	}
	outs := make([]workerOut, *c)
	var wg sync.WaitGroup
	for i := 0; i < *c; i++ {
		wg.Add(1)
		go func(o *workerOut) {
			defer wg.Done()
			if *ramp > 0 {
				time.Sleep(time.Duration(rand.Int64N(int64(*ramp))))
			}
			o.lat = make([]int64, 0, 4096)
			for time.Now().Before(to) && ctx.Err() == nil {
				err := stream(ctx, client, *url, body, from, to, &o.lat, &o.total)
				if err != nil {
					o.errors++
					if o.firstErr == "" {
						o.firstErr = err.Error()
					}
					time.Sleep(50 * time.Millisecond)
					continue
				}
				o.streams++
			}
		}(&outs[i])
	}
	wg.Wait()

	var all []int64
	res := result{Label: *label, URL: *url, Concurrency: *c, WindowS: to.Sub(from).Seconds()}
	for _, o := range outs {
		all = append(all, o.lat...)
		res.Streams += o.streams
		res.TotalEvents += o.total
		res.Errors += o.errors
		if res.FirstError == "" {
			res.FirstError = o.firstErr
		}
	}
	slices.Sort(all)
	res.Count = len(all)
	res.EventsPerSec = float64(len(all)) / res.WindowS
	if len(all) > 0 {
		q := func(p float64) float64 {
			i := int(p*float64(len(all))+0.5) - 1
			i = max(0, min(i, len(all)-1))
			return float64(all[i]) / 1e3
		}
		res.P50us, res.P90us, res.P99us = q(0.50), q(0.90), q(0.99)
		res.Maxus = float64(all[len(all)-1]) / 1e3
		var sum float64
		for _, v := range all {
			sum += float64(v)
		}
		res.Meanus = sum / float64(len(all)) / 1e3
	}
	if err := json.NewEncoder(os.Stdout).Encode(res); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1) //nolint:gocritic // cancel only releases the signal handler of a process that ends here
	}
}

// stream runs one request and appends the latency of each content chunk
// received within [from, to) and counts every content chunk in total.
func stream(ctx context.Context, client *http.Client, url, body string, from, to time.Time, lat *[]int64, total *int64) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewBufferString(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("status %d: %s", resp.StatusCode, bytes.TrimSpace(b))
	}
	br := bufio.NewReaderSize(resp.Body, 64<<10)
	done := false
	for {
		line, err := br.ReadSlice('\n')
		if len(line) > 0 {
			now := time.Now()
			if bytes.HasPrefix(line, []byte("data: ")) {
				data := line[6:]
				if bytes.HasPrefix(data, []byte("[DONE]")) {
					done = true
				} else if bytes.Contains(data, content) && !bytes.Contains(data, []byte(`"content":""`)) {
					*total++
					sent, ok := sendTime(data)
					if ok && !now.Before(from) && now.Before(to) {
						*lat = append(*lat, now.UnixNano()-sent)
					}
				}
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
	}
	if !done {
		return fmt.Errorf("stream ended without [DONE]")
	}
	return nil
}

// sendTime reads the Unix ns in the last 16 hex digits of the chunk's id.
func sendTime(data []byte) (int64, bool) {
	i := bytes.Index(data, idKey)
	if i < 0 {
		return 0, false
	}
	id := data[i+len(idKey):]
	if len(id) < 33 || id[32] != '"' {
		return 0, false
	}
	v, err := strconv.ParseUint(string(id[16:32]), 16, 64)
	if err != nil || v == 0 {
		return 0, false
	}
	return int64(v), true
}
