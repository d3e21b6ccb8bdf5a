// Package procmem reads a process's peak resident memory, for the tests
// and benchmarks that hold the mount to its memory budget.
package procmem

import (
	"fmt"
	"os"
	"strings"
)

// PeakRSS is the peak resident memory of process pid since it started or
// since ResetPeakRSS (VmHWM), in bytes.
func PeakRSS(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			var kb int64
			if _, err := fmt.Sscanf(strings.TrimSpace(rest), "%d kB", &kb); err != nil {
				return 0, fmt.Errorf("VmHWM of process %d: %q", pid, rest)
			}
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("no VmHWM for process %d", pid)
}

// ResetPeakRSS starts pid's peak resident memory again from what it uses
// now.
func ResetPeakRSS(pid int) error {
	return os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0)
}
