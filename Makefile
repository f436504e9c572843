# otelcol-llm: build, run and test the distribution.
#
#   make build   ./bin/otelcol-llm (ocb generates _build/, go compiles it)
#   make run     the collector with otelcol-dev.yaml (every session kept and
#                printed); CONFIG=otelcol-config.yaml for the production-shaped one
#   make test    gofmt, go vet, the Python hook tests and go test -race,
#                end-to-end tests against ./bin/otelcol-llm and real
#                llama.cpp servers included
#   make llama-server  llama.cpp's llama-server for the CPU, built once into
#                ~/.cache/otelcol-llm (about 8 min on 2 cores), for the tests
#   make generate          mdatagen (pinned in tools/go.mod) over every
#                          metadata.yaml: go generate ./...
#   make check-generate    fails when the generated files are not current
#   make bench   the Go benchmarks and bench/run.sh, into bench/results/
#                (git-ignored; docs/performance.md keeps the figures of one dated run)
#   make soak    vllmsim + the collector (proxy, scrape, token_session) +
#                llmload at 200 streams for DURATION (default 15m): RSS, CPU,
#                goroutines and open files every 10 s, a report in
#                SOAK_OUT (bench/results/soak); fails on a lost session or
#                unbounded growth
#   make demo    vllmsim + the collector + llmload, scenario by scenario, into a
#                report folder (DURATION=10s per point, OUT=demo-report); it
#                prints the URL of token_session's live view as it starts
#   make demo-breaker  HAProxy ejecting a stalling replica through engine_health
#   make demo-real     the collector in front of a real llama.cpp server (REAL_OUT=demo-real)
#   make check-deploy  the deploy kit's tests (promtool, Prometheus, manifests)
#   make image   the container image of deploy/Dockerfile (podman or buildah)
#   make lint    golangci-lint, pinned, with .golangci.yml (contrib's linters)
#   make tidy-check    fails when go mod tidy would change a go.mod or go.sum
#   make help    every target, one line each

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := build

GO           ?= go
OCB_VERSION  := v0.161.0
BIN_DIR      := $(CURDIR)/bin
OCB          := $(BIN_DIR)/ocb-$(OCB_VERSION)
OTELCOL      := $(BIN_DIR)/otelcol-llm
BUILD_DIR    := _build
# Everything the binary is compiled from: the files of this module's
# packages that the components of builder-config.yaml import (go list -deps),
# tests left out. Listed only when the binary is checked (see
# .SECONDEXPANSION below); -e lists a package that does not compile too, so
# that go build, not make, reports it.
MODULE       := github.com/otelcol-llm/otelcol-llm
COMPONENTS    = $(shell sed -n 's/^ *import: *//p' builder-config.yaml)
GO_SOURCES    = $(shell CGO_ENABLED=0 $(GO) list -e -deps -f '{{with .Module}}{{if eq .Path "$(MODULE)"}}{{range $$.GoFiles}}{{$$.Dir}}/{{.}} {{end}}{{range $$.EmbedFiles}}{{$$.Dir}}/{{.}} {{end}}{{end}}{{end}}' $(COMPONENTS)) go.mod go.sum
BENCHTIME    ?= 1s

.PHONY: build run test fmt-check vet python-test go-test check-deploy bench soak clean generate check-generate lint tidy-check help

build: $(OTELCOL) ## ./bin/otelcol-llm (ocb generates _build/, go compiles it)

$(OCB):
	@mkdir -p $(BIN_DIR)/.ocb
	GOBIN=$(BIN_DIR)/.ocb $(GO) install go.opentelemetry.io/collector/cmd/builder@$(OCB_VERSION)
	mv $(BIN_DIR)/.ocb/builder $@

# ocb regenerates the sources only when the component list or our module's
# requirements change; a second `make build` with nothing changed does nothing.
$(BUILD_DIR)/main.go: builder-config.yaml go.mod $(OCB)
	$(OCB) --config builder-config.yaml --skip-compilation
	@touch $@

.SECONDEXPANSION:
$(OTELCOL): $(BUILD_DIR)/main.go $$(GO_SOURCES)
	cd $(BUILD_DIR) && CGO_ENABLED=0 $(GO) build -trimpath -ldflags='-s -w' -o $@ .

MDATAGEN := $(BIN_DIR)/mdatagen

$(MDATAGEN): tools/go.mod tools/go.sum
	cd tools && $(GO) build -o $@ go.opentelemetry.io/collector/cmd/mdatagen

# The //go:generate lines call mdatagen by name: bin/ goes first on PATH.
generate: $(MDATAGEN) ## mdatagen over every metadata.yaml (go generate ./...)
	PATH="$(BIN_DIR):$$PATH" $(GO) generate ./...

# For CI on a clean clone: regenerating must change nothing that is committed
# and add nothing new.
check-generate: generate ## fails when the generated files are not current
	@if [ -n "$$(git status --porcelain --untracked-files=all)" ]; then \
	  echo "generated files are not current; run make generate and commit:"; git status --short; exit 1; fi

# otelcol-dev.yaml keeps and prints every session, so that the first request
# shows something; otelcol-config.yaml (OTLP_BACKEND=host:port) samples and
# exports as in production.
CONFIG ?= otelcol-dev.yaml

run: $(OTELCOL) ## the collector in the foreground with CONFIG (default otelcol-dev.yaml)
	$(OTELCOL) --config $(CONFIG)

# Every Go file but the generated ones opens with the license's SPDX line,
# as the collector's own do.
fmt-check: ## fails when a file needs gofmt, or a Go file lacks its SPDX line
	@bad=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$bad" ]; then echo "gofmt needed:"; echo "$$bad"; exit 1; fi
	@bad=$$(for f in $$(git ls-files '*.go'); do head -c 600 "$$f" | grep -q -e 'SPDX-License-Identifier: Apache-2.0' -e '^// Code generated' || echo "$$f"; done); \
	if [ -n "$$bad" ]; then echo "no SPDX-License-Identifier line (// Copyright The otelcol-llm Authors, then // SPDX-License-Identifier: Apache-2.0):"; echo "$$bad"; exit 1; fi

# The test modules: the end-to-end tests and the deploy kit's, each a module of
# its own so that what only they need (a browser driver, a schema validator,
# Kubernetes' API types) stays out of the product's go.mod. Each replaces the
# distribution's module with this folder.
TEST_MODULES := internal/harness/e2e deploy

vet: ## go vet ./..., in the module and in each test module
	$(GO) vet ./...
	@for m in $(TEST_MODULES); do echo "cd $$m && $(GO) vet ./..."; (cd $$m && $(GO) vet ./...); done

python-test: $(OTELCOL) ## the Python hook's tests against ./bin/otelcol-llm
	cd hooks/python && OTELCOL_LLM_BIN=$(OTELCOL) python3 -m unittest -v

# Last, so that its summary closes the output: the module's packages, then
# the end-to-end tests' module (the deploy kit's tests are make
# check-deploy's), whose one test binary takes about 4 min on 2 cores and
# twice that beside other work: 20 min before go test gives up, not 10. llama-server is built first when it can be (see below);
# when it cannot, the llama.cpp tests skip (fail under CI), saying so.
go-test: $(OTELCOL) js-client ## go test -race, then the end-to-end tests' module (deploy/ is check-deploy's)
	@llama=$$(tools/llama-server.sh) || echo "llama-server could not be built: the llama.cpp tests will skip (fail under CI)"; \
	echo "LLAMA_CPP_DIR=$$llama OTELCOL_LLM_BIN=$(OTELCOL) $(GO) test -race -count=1 ./..."; \
	rc=0; LLAMA_CPP_DIR=$$llama OTELCOL_LLM_BIN=$(OTELCOL) $(GO) test -race -count=1 ./... || rc=1; \
	echo "cd internal/harness/e2e && $(GO) test -race -count=1 -timeout 20m ./..."; \
	(cd internal/harness/e2e && LLAMA_CPP_DIR=$$llama OTELCOL_LLM_BIN=$(OTELCOL) $(GO) test -race -count=1 -timeout 20m ./...) || rc=1; \
	exit $$rc

# llama.cpp's llama-server for the CPU, with the GGUF writer and the
# vocabularies its tree ships, from the llama.cpp release inside the npm
# package node-llama-cpp (pinned in tools/llama-server.sh). Built once per
# version and build options into ~/.cache/otelcol-llm/llama.cpp
# (LLAMA_CACHE_DIR moves it), about 8 min on 2 cores; found there after.
# Needs npm, git, cmake and g++. Prints the folder the tests take as
# LLAMA_CPP_DIR.
.PHONY: llama-server
llama-server: ## llama.cpp's llama-server for the CPU, built once into a cache (about 8 min); prints its folder
	@tools/llama-server.sh

# The official OpenAI JS client that TestStallBreakerEndToEnd streams with,
# pinned in its package-lock.json. Without npm the test's JS part skips
# (fails under CI), saying so.
JS_CLIENT_DIR := internal/harness/e2e/testdata/openai-js
.PHONY: js-client
js-client: ## npm ci of the OpenAI JS client the end-to-end tests use (when npm is there)
	@if [ -f $(JS_CLIENT_DIR)/node_modules/openai/package.json ] && [ $(JS_CLIENT_DIR)/node_modules/.package-lock.json -nt $(JS_CLIENT_DIR)/package-lock.json ]; then :; \
	elif command -v npm >/dev/null; then cd $(JS_CLIENT_DIR) && npm ci --no-audit --no-fund --loglevel=error; \
	else echo "npm is missing: the OpenAI JS client part of TestStallBreakerEndToEnd will skip (apt-get install nodejs npm)"; fi

# The image of deploy/Dockerfile, FROM scratch around the static binary:
# podman, buildah or docker, whichever is there (CONTAINER_TOOL=...).
IMAGE          ?= localhost/otelcol-llm:0.1.0
CONTAINER_TOOL ?= $(shell command -v podman || command -v buildah || command -v docker)
CA_BUNDLE      ?= /etc/ssl/certs/ca-certificates.crt
.PHONY: image
image: $(OTELCOL) ## the container image of deploy/Dockerfile (podman, buildah or docker)
	@if [ -z "$(CONTAINER_TOOL)" ]; then echo "make image needs podman, buildah or docker (Debian: apt-get install podman)"; exit 1; fi
	rm -rf $(BUILD_DIR)/image && mkdir -p $(BUILD_DIR)/image
	cp $(OTELCOL) $(BUILD_DIR)/image/otelcol-llm
	cp $(CA_BUNDLE) $(BUILD_DIR)/image/ca-certificates.crt
	cp deploy/agent-config.yaml $(BUILD_DIR)/image/config.yaml
	$(CONTAINER_TOOL) build -f deploy/Dockerfile -t $(IMAGE) $(BUILD_DIR)/image

# The deploy kit (deploy/): the alert rules under promtool (Debian's
# prometheus package), then the Go tests that run the agent config, decode the
# manifests, validate the Helm values and run the dashboard's queries against
# a real Prometheus.
check-deploy: $(OTELCOL) ## the deploy kit's tests (promtool, Prometheus, manifests)
	promtool check rules deploy/prometheus/rules.yaml
	promtool test rules deploy/prometheus/rules_test.yaml
	cd deploy && OTELCOL_LLM_BIN=$(OTELCOL) $(GO) test -count=1 ./...

test: fmt-check vet python-test go-test ## fmt-check, vet, python-test and go-test

# golangci-lint is pinned and built once into bin/, like ocb: a second make
# lint does not rebuild it. .golangci.yml says how it follows contrib's.
GOLANGCI_LINT_VERSION := v2.15.0
GOLANGCI_LINT         := $(BIN_DIR)/golangci-lint-$(GOLANGCI_LINT_VERSION)

$(GOLANGCI_LINT):
	@mkdir -p $(BIN_DIR)/.golangci
	GOBIN=$(BIN_DIR)/.golangci $(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)
	mv $(BIN_DIR)/.golangci/golangci-lint $@

lint: $(GOLANGCI_LINT) ## golangci-lint run ./... with .golangci.yml (linters and formatters), in each module
	$(GOLANGCI_LINT) run ./...
	@for m in $(TEST_MODULES); do echo "cd $$m && golangci-lint run ./..."; (cd $$m && $(GOLANGCI_LINT) run ./...); done

# go mod tidy -diff changes nothing and fails with the diff it would apply;
# tools/ and the test modules are modules of their own.
tidy-check: ## fails when go mod tidy would change a go.mod or go.sum
	$(GO) mod tidy -diff
	@for m in tools $(TEST_MODULES); do echo "cd $$m && $(GO) mod tidy -diff"; (cd $$m && $(GO) mod tidy -diff); done

# The targets with a "## " description after their prerequisites, in this
# file's order.
help: ## every target, one line each
	@grep -E '^[a-z][a-z-]*:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN { FS = ":.*## " } { printf "  %-16s %s\n", $$1, $$2 }'

# The Go benchmarks, then the collector side by side with the stock pipeline
# and nginx (bench/run.sh): bench/results/results.md and results.json, in a
# git-ignored folder, so that a run leaves the tree clean.
bench: $(OTELCOL) ## the Go benchmarks and bench/run.sh, into bench/results/
	BENCHTIME=$(BENCHTIME) bench/run.sh

SOAK_OUT ?= bench/results/soak
# DURATION, given on the command line or in the environment, is the soak's
# length too (make soak DURATION=1m); its default here is 15m, not the
# demo's 10s per point.
SOAK_DURATION = $(if $(filter command line environment environment override,$(origin DURATION)),$(DURATION),15m)

# CHURN new engine, model and tenant names a second beside the load (months
# of pod churn compressed into the run), with engine_health judging; 0: none.
CHURN ?= 0

# The collector as an agent under steady load for DURATION (bench/soak):
# the report's last line is "soak: <N> requests, <N> sessions counted, ...".
soak: $(OTELCOL) ## the collector under steady load for DURATION (default 15m), judged; CHURN=1000 adds name churn
	$(GO) run ./bench/soak -collector $(OTELCOL) -duration $(SOAK_DURATION) -out $(SOAK_OUT) -churn $(CHURN)

# The demo's tools are rebuilt every time (go build caches); llmdemo starts
# and stops every process it needs, on loopback only.
DURATION ?= 10s
OUT      ?= demo-report

.PHONY: demo demo-tools demo-breaker demo-real
demo: $(OTELCOL) demo-tools ## simulator, collector and load, scenario by scenario, into OUT
	$(BIN_DIR)/llmdemo -bin $(BIN_DIR) -duration $(DURATION) -out $(OUT)

demo-tools: ## bin/vllmsim, bin/llmload and bin/llmdemo
	$(GO) build -o $(BIN_DIR)/vllmsim ./cmd/vllmsim
	$(GO) build -o $(BIN_DIR)/llmload ./cmd/llmload
	$(GO) build -o $(BIN_DIR)/llmdemo ./cmd/llmdemo

# The load-balancer story (about 2.5 min; needs Debian's haproxy): HAProxy,
# two vllmsim replicas, one of which freezes, engine_health ejecting it.
# Run three times: the proxies' stall breaker off, then on at
# BREAKER_STALL_MAX_GAP, then with proxy::migrate on as well ("heal"; 0 skips
# the second and third runs), about 75 s each.
BREAKER_OUT ?= demo-breaker
BREAKER_STALL_MAX_GAP ?= 500ms
demo-breaker: $(OTELCOL) demo-tools ## HAProxy ejecting a stalling replica through engine_health, the stall breaker off, on, and healing
	$(BIN_DIR)/llmdemo -breaker -bin $(BIN_DIR) -out $(BREAKER_OUT) -stall-max-gap $(BREAKER_STALL_MAX_GAP)

# The same story on a real engine (about 1 min after the build; see
# llama-server above): llama.cpp's llama-server and the tiny random-weight
# model, the collector in front of it, llmload at 1, SLOTS, 2×SLOTS and
# 4×SLOTS clients for DURATION each; the report sets the collector beside the
# client and beside llama.cpp's own timings.
REAL_OUT ?= demo-real
SLOTS    ?= 2
demo-real: $(OTELCOL) demo-tools ## the collector in front of a real llama.cpp server, against the client and llama.cpp's timings, into REAL_OUT
	@llama=$$(tools/llama-server.sh) && \
	$(BIN_DIR)/llmdemo -real -llama-dir $$llama -bin $(BIN_DIR) -duration $(DURATION) -out $(REAL_OUT) -slots $(SLOTS)

# bin/ goes whole: the binaries, mdatagen, the stock baseline of make bench
# (bin/otelcol-stock, rebuilt by the next make bench) and ocb, which the
# distribution and bench/stock share (one release train). The ocb-generated
# sources go with them; results (bench/results/, demo-report/) stay.
clean: ## removes bin/ and the ocb-generated _build/ folders
	rm -rf $(BUILD_DIR) bench/stock/_build $(BIN_DIR)
