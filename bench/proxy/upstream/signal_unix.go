// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

//go:build !windows

package main

import (
	"os"
	"syscall"
)

// reportSignals print the counters without stopping (run.sh sends SIGUSR1
// before and after each point).
var reportSignals = []os.Signal{syscall.SIGUSR1}
