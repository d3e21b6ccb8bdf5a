package e2e

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tierfs/tierfs/idx/kafka/kafkatest"
	"github.com/tierfs/tierfs/internal/procmem"
)

// TestManyReadersOneBudget: 40 evicted segments of two 8 MiB chunks
// each are read at once, from 80 handles (two readers per segment),
// through a mount whose chunk memory is 32 MiB: four chunks for 80
// readers. Every byte is exact, and the mount's peak resident memory
// stays within the budget plus the mount's own 64 MiB.
func TestManyReadersOneBudget(t *testing.T) {
	requireRoot(t)
	_, backing, mnt := mountDirs(t)
	const parts = 40
	// 9 MB segments: a full chunk and a part of one.
	bases, err := kafkatest.LogDir{Topic: "catchup", Partitions: parts, Segments: 2, Batches: 280, Records: 64, ValueSize: 1000, Age: time.Hour, Repeat: true}.Write(backing)
	if err != nil {
		t.Fatal(err)
	}
	seg := func(p int) string {
		return filepath.Join(fmt.Sprintf("catchup-%d", p), fmt.Sprintf("%020d.log", bases[fmt.Sprintf("catchup-%d", p)][0]))
	}
	want := map[string][32]byte{}
	for p := range parts {
		b, err := os.ReadFile(filepath.Join(backing, seg(p)))
		if err != nil {
			t.Fatal(err)
		}
		if len(b) <= 8<<20 {
			t.Fatalf("segment of %d bytes: the test wants more than one chunk", len(b))
		}
		want[seg(p)] = sha256.Sum256(b)
	}
	const budget = 32 << 20
	m := startMount(t, nil, "--backing", backing, "--remote", "file://"+filepath.Join(t.TempDir(), "remote"),
		"--ship-after", "1m", "--local-retention-bytes", "1", "--tier-interval", "200ms", "--ship-concurrency", "4",
		"--cache-bytes", "32MiB", mnt)
	deadline := time.Now().Add(3 * time.Minute)
	for p := 0; p < parts; {
		if st := state(filepath.Join(mnt, seg(p))); st == "remote" {
			p++
			continue
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not evicted after 3 minutes", seg(p))
		}
		time.Sleep(100 * time.Millisecond)
	}
	os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0)
	before := peakRSS(t, m.cmd.Process.Pid)
	// From here the peak is the reads' (shipping had its own buffers).
	if err := procmem.ResetPeakRSS(m.cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}

	var wg sync.WaitGroup
	errs := make(chan error, 2*parts)
	for r := range 2 * parts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rel := seg(r % parts)
			b, err := os.ReadFile(filepath.Join(mnt, rel))
			switch {
			case err != nil:
				errs <- fmt.Errorf("reader %d of %s: %w", r, rel, err)
			case sha256.Sum256(b) != want[rel]:
				errs <- fmt.Errorf("reader %d of %s: %d bytes, not the segment's", r, rel, len(b))
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	peak := peakRSS(t, m.cmd.Process.Pid)
	t.Logf("peak RSS of the mount: %d MiB while shipping, %d MiB while reading (budget %d MiB)", before>>20, peak>>20, budget>>20)
	if peak > budget+64<<20 {
		t.Errorf("peak RSS %d MiB, over the budget of %d MiB plus 64 MiB", peak>>20, budget>>20)
	}
	if !strings.Contains(m.Log(), "go memory limit set") {
		t.Errorf("the mount did not set the Go memory limit from --cache-bytes")
	}
	if bytes.Contains([]byte(m.Log()), []byte("level=ERROR")) {
		t.Errorf("errors logged:\n%s", m.Log())
	}
}

// peakRSS is the mount's peak resident memory (procmem.PeakRSS).
func peakRSS(t *testing.T, pid int) int64 {
	t.Helper()
	n, err := procmem.PeakRSS(pid)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
