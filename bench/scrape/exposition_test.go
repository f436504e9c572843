// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

//go:build linux

package main

import (
	"path/filepath"
	"strings"
	"testing"
)

func loadTestExpositions(t *testing.T) []exposition {
	t.Helper()
	exps, err := loadExpositions(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if len(exps) != 5 {
		t.Fatalf("got %d expositions, want 5", len(exps))
	}
	return exps
}

func TestOpenMetricsAsPrometheusClientWritesIt(t *testing.T) {
	om := string(loadTestExpositions(t)[0].om)
	for _, want := range []string{
		// A counter's family drops _total; its samples keep it, each
		// followed by the _created sample of its series.
		"# TYPE vllm:num_preemptions counter\n" +
			`vllm:num_preemptions_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 4.0` + "\n" +
			`vllm:num_preemptions_created{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 1754000000.0123` + "\n",
		`vllm:request_success_total{engine="0",finished_reason="stop",model_name="meta-llama/Llama-3.1-8B-Instruct"} 161.0` + "\n" +
			`vllm:request_success_created{engine="0",finished_reason="stop",model_name="meta-llama/Llama-3.1-8B-Instruct"} 1754000000.0123` + "\n",
		// A histogram's _created sample follows its _sum.
		`vllm:request_prompt_tokens_sum{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 186556.0` + "\n" +
			`vllm:request_prompt_tokens_created{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 1754000000.0456` + "\n",
		"# TYPE vllm:kv_cache_usage_perc gauge\n",
	} {
		if !strings.Contains(om, want) {
			t.Errorf("OpenMetrics body lacks\n%s", want)
		}
	}
	if strings.Contains(om, "_created gauge") || strings.Contains(om, "TYPE vllm:num_preemptions_total") {
		t.Error("a _created gauge family or a counter family named _total is left")
	}
	if !strings.HasSuffix(om, "\n# EOF\n") {
		t.Error("no # EOF at the end")
	}
}

func TestMultiprocessForm(t *testing.T) {
	mp := string(loadTestExpositions(t)[3].text)
	if strings.Contains(mp, "_created") {
		t.Error("_created left in the multiprocess form")
	}
	sum := strings.Index(mp, "vllm:request_prompt_tokens_sum{")
	bucket := strings.Index(mp, "vllm:request_prompt_tokens_bucket{")
	if sum < 0 || bucket < sum {
		t.Errorf("_sum at %d, first _bucket at %d: want the sum first", sum, bucket)
	}
}

func TestWantsOpenMetrics(t *testing.T) {
	for accept, want := range map[string]bool{
		// The vllm source's header: OpenMetrics at a lower q is still
		// listed, and prometheus_client ignores q.
		"text/plain;version=0.0.4;q=1,application/openmetrics-text;version=1.0.0;q=0.5,*/*;q=0.1": true,
		"text/plain;version=0.0.4": false,
		"":                         false,
	} {
		if got := wantsOpenMetrics(accept); got != want {
			t.Errorf("wantsOpenMetrics(%q) = %t, want %t", accept, got, want)
		}
	}
}
