// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package demo

import (
	"time"

	"github.com/otelcol-llm/otelcol-llm/internal/harness/process"
)

// stopGrace is how long a process gets between SIGTERM and SIGKILL.
const stopGrace = 15 * time.Second

// startProcess starts a child whose output goes to logPath in the report
// folder. It has a process group of its own, so that a Ctrl-C in the
// terminal reaches llmdemo only, which then stops its children in order
// (the load first, the collector before the engine, so the collector
// flushes what it has). A child that dies of the SIGTERM it is stopped with
// (haproxy -db does) was stopped cleanly.
func startProcess(name, logPath, bin string, args, env []string) (*process.Process, error) {
	return process.Start(name, bin, args, process.Options{Env: env, Log: logPath, OwnGroup: true, SIGTERMIsClean: true})
}
