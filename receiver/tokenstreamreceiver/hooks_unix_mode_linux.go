// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

//go:build linux

package tokenstreamreceiver // import "github.com/otelcol-llm/otelcol-llm/receiver/tokenstreamreceiver"

import (
	"io/fs"
	"syscall"
)

// presetSocketMode sets the mode of the socket fd before it is bound: Linux
// gives the socket file the socket's own mode less the umask, so the file
// is never more open than mode, not even until listenUnix's Chmod.
func presetSocketMode(fd uintptr, mode fs.FileMode) {
	_ = syscall.Fchmod(int(fd), uint32(mode))
}
