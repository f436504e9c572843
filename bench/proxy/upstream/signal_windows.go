// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package main

import "os"

// reportSignals: Windows has no SIGUSR1; the counters are printed at exit.
var reportSignals []os.Signal
