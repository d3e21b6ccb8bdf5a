package procmem

import (
	"os"
	"testing"
	"time"
)

// TestPeakRSSOfThisProcess: the peak is at least what a buffer this
// process touched takes, and stays so after a reset while it is held.
func TestPeakRSSOfThisProcess(t *testing.T) {
	b := make([]byte, 32<<20)
	for i := range b {
		b[i] = 1
	}
	peak, err := PeakRSS(os.Getpid())
	if err != nil || peak < int64(len(b)) {
		t.Fatalf("peak %d, %v; a buffer of %d bytes is resident", peak, err, len(b))
	}
	if err := ResetPeakRSS(os.Getpid()); err != nil {
		t.Skipf("clear_refs: %v", err)
	}
	again, err := PeakRSS(os.Getpid())
	if err != nil || again < int64(len(b)) {
		t.Fatalf("after a reset: %d, %v", again, err)
	}
	_ = b[len(b)-1]
	if _, err := PeakRSS(-1); err == nil {
		t.Fatal("a process that does not exist has a peak")
	}
}

func TestCPUSeconds(t *testing.T) {
	before, err := CPUSeconds(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	x := 0
	for end := time.Now().Add(300 * time.Millisecond); time.Now().Before(end); {
		x++
	}
	after, err := CPUSeconds(os.Getpid())
	if err != nil || after < before+0.1 {
		t.Fatalf("CPU seconds %v after %v of spinning 300 ms (%d): %v", after, before, x, err)
	}
	if _, err := CPUSeconds(1 << 30); err == nil {
		t.Fatal("a process that is not there has CPU time")
	}
}
