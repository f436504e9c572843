// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

//go:build !race

package tokenstreamreceiver

// raceEnabled: the race detector allocates on its own account, so
// allocation counts mean nothing under it.
const raceEnabled = false
