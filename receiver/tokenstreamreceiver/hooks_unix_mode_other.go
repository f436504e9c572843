// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

//go:build !linux

package tokenstreamreceiver // import "github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver"

import "io/fs"

// presetSocketMode does nothing: elsewhere bind gives the socket file the
// umask's mode, and listenUnix's Chmod sets socket_mode.
func presetSocketMode(uintptr, fs.FileMode) {}
