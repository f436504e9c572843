package benchproc

import "syscall"

// DieWithParent is the SysProcAttr of a child that the kernel kills when
// the process that started it dies without stopping it (a test's timeout
// panic, a SIGKILL), so that no collector outlives its harness holding
// ports.
func DieWithParent() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
