package aftergc

import (
	"runtime"
	"sync/atomic"
	"testing"
	"time"
)

// TestRunCallsAfterEachCollectionUntilFalse: fn runs after collections,
// once per collection, and not again once it returned false.
func TestRunCallsAfterEachCollectionUntilFalse(t *testing.T) {
	var calls atomic.Int64
	Run(func() bool { return calls.Add(1) < 3 })
	deadline := time.Now().Add(10 * time.Second)
	for calls.Load() < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("%d calls after 10 s of collections, want 3", calls.Load())
		}
		runtime.GC()
		time.Sleep(time.Millisecond)
	}
	for range 5 {
		runtime.GC()
		time.Sleep(time.Millisecond)
	}
	if n := calls.Load(); n != 3 {
		t.Fatalf("%d calls, want 3: it ran after it returned false", n)
	}
}
