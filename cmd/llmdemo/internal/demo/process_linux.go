package demo

import "syscall"

// sysProcAttr puts a child in its own process group, so that a Ctrl-C in
// the terminal reaches llmdemo only, which then stops its children in order
// (the load first, the collector before the engine, so the collector
// flushes what it has); and has the kernel stop the child if llmdemo dies
// without doing so.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
}
