// Package procmem reads what a process used: its peak resident memory,
// for the tests and benchmarks that hold the mount to its memory budget,
// and its CPU time, for the benchmarks that compare what servers spend.
package procmem

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// CPUSeconds is the CPU time process pid and its waited-for children
// have used (utime, stime, cutime and cstime of /proc/PID/stat), in
// seconds.
func CPUSeconds(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The fields after the command name (in parentheses, which may hold
	// blanks); utime is the 14th field of the line, the 12th after it.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 || i+2 > len(b) {
		return 0, fmt.Errorf("/proc/%d/stat: %q", pid, b)
	}
	f := strings.Fields(string(b[i+2:]))
	if len(f) < 15 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields after the name", pid, len(f))
	}
	var ticks float64
	for _, j := range []int{11, 12, 13, 14} {
		v, err := strconv.ParseFloat(f[j], 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/%d/stat field %d: %w", pid, j+3, err)
		}
		ticks += v
	}
	return ticks / 100, nil // USER_HZ
}

// PeakRSS is the peak resident memory of process pid since it started or
// since ResetPeakRSS (VmHWM), in bytes.
func PeakRSS(pid int) (int64, error) { return statusBytes(pid, "VmHWM") }

// RSS is the resident memory of process pid now (VmRSS), in bytes.
func RSS(pid int) (int64, error) { return statusBytes(pid, "VmRSS") }

// statusBytes reads a field in kB of /proc/<pid>/status, in bytes.
func statusBytes(pid int, field string) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			var kb int64
			if _, err := fmt.Sscanf(strings.TrimSpace(rest), "%d kB", &kb); err != nil {
				return 0, fmt.Errorf("%s of process %d: %q", field, pid, rest)
			}
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("no %s for process %d", field, pid)
}

// ResetPeakRSS starts pid's peak resident memory again from what it uses
// now.
func ResetPeakRSS(pid int) error {
	return os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0)
}
