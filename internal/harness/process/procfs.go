// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package process

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// userHZ is USER_HZ, the unit of the CPU times in /proc: 100 on every Linux
// architecture Go supports.
const userHZ = 100

// ticks is a count of USER_HZ ticks as a duration.
func ticks(n int64) time.Duration { return time.Duration(n) * time.Second / userHZ }

// CPU is the process's user and system CPU time so far.
func (p *Process) CPU() (time.Duration, error) { return CPUOf(p.Pid()) }

// CPUOf is the user and system CPU time process pid has used so far (the
// harness's own: os.Getpid()).
func CPUOf(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces: count from its ')'.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(f) < 13 {
		return 0, errors.New("short /proc stat")
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return ticks(utime + stime), nil
}

// MachineBusy is the CPU time every process on the machine has used since
// boot: the first line of /proc/stat, all but idle and iowait.
func MachineBusy() (time.Duration, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 6 || f[0] != "cpu" {
		return 0, errors.New("no cpu line in /proc/stat")
	}
	var total int64
	for i, v := range f[1:] {
		if i == 3 || i == 4 { // idle, iowait
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/stat: %w", err)
		}
		total += n
	}
	return ticks(total), nil
}

// RSS is the process's resident set size in bytes.
func (p *Process) RSS() (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.Pid()))
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, errors.New("no VmRSS in /proc status")
}

// OpenFiles is the number of the process's open file descriptors.
func (p *Process) OpenFiles() (int, error) {
	entries, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", p.Pid()))
	return len(entries), err
}
