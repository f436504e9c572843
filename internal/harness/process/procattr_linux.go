// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package process

import "syscall"

// sysProcAttr has the kernel signal a child when the harness dies without
// stopping it (a test's timeout panic, a SIGKILL), so that no collector
// outlives its harness holding ports: SIGKILL, or SIGTERM for a child in
// its own process group (Options.OwnGroup), which may then flush what it
// holds.
func sysProcAttr(ownGroup bool) *syscall.SysProcAttr {
	if ownGroup {
		return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	}
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
