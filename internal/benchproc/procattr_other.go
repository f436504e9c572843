//go:build !linux

package benchproc

import "syscall"

// DieWithParent: see procattr_linux.go. Elsewhere there is no parent-death
// signal; a child its harness could not stop outlives it.
func DieWithParent() *syscall.SysProcAttr { return nil }
