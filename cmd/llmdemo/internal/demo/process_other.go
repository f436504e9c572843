//go:build !linux

package demo

import "syscall"

// sysProcAttr: see process_linux.go. Elsewhere children share llmdemo's
// process group, so a Ctrl-C reaches them too; each stops on its own.
func sysProcAttr() *syscall.SysProcAttr { return nil }
