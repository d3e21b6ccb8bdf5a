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
	rss, err := RSS(os.Getpid())
	peakAfter, _ := PeakRSS(os.Getpid())
	if err != nil || rss < int64(len(b)) || rss > peakAfter {
		t.Fatalf("resident %d, %v; the buffer is %d bytes, the peak then %d", rss, err, len(b), peakAfter)
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
	// Spin until this process's CPU time moves by 50 ms: on a loaded
	// machine that takes longer than 50 ms, so no time is asserted, only
	// that the count moves (within a generous bound).
	x, after := 0, before
	for end := time.Now().Add(20 * time.Second); after < before+0.05 && time.Now().Before(end); {
		for range 1 << 20 {
			x++
		}
		if after, err = CPUSeconds(os.Getpid()); err != nil {
			t.Fatal(err)
		}
	}
	if after < before+0.05 {
		t.Fatalf("CPU seconds %v after %v of 20 s spinning (%d)", after, before, x)
	}
	if _, err := CPUSeconds(1 << 30); err == nil {
		t.Fatal("a process that is not there has CPU time")
	}
}
