// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

//go:build !linux

package process

import "syscall"

// sysProcAttr: see procattr_linux.go. Elsewhere there is no parent-death
// signal, and children share the harness's process group: a child its
// harness could not stop outlives it, and a Ctrl-C reaches every child.
func sysProcAttr(bool) *syscall.SysProcAttr { return nil }
