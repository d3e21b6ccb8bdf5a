package tiering

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tierfs/tierfs/chunkxfer/store"
	"github.com/tierfs/tierfs/internal/tiered"
)

func TestShipAndEvictByHand(t *testing.T) {
	root, bases, sums := logDir(t)
	s := store.NewMem(nil)
	tr, err := New(Config{Root: root, StateDir: filepath.Join(root, ".tierfs"), Store: s, Policy: Policy{ShipAfter: 1000 * time.Hour}, ChunkSize: 64 << 10, ShipRate: 1 << 40})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	if rep := mustPass(t, tr); rep.Shipped != 0 {
		t.Fatalf("shipped by itself: %+v", rep)
	}
	ctx := context.Background()
	b := bases["orders-0"]
	rel := func(i int) string { return "orders-0/" + kafkaName(b[i], ".log") }
	var last, total int64
	var during tiered.State
	st, err := tr.ShipNow(ctx, rel(0), func(done, tot int64) {
		last, total = done, tot
		during, _, _ = tr.copies.stateOf(filepath.Join(root, rel(0)))
	})
	if during != StateShipping {
		t.Errorf("state while shipping: %s", during)
	}
	if err != nil || st != StateShipped || last != total || total == 0 {
		t.Fatalf("ship: %s %v, progress %d/%d", st, err, last, total)
	}
	// By hand, the age does not count; the broker's state does.
	for i, want := range map[int]string{2: "not flushed", 3: "active segment"} {
		if _, err := tr.ShipNow(ctx, rel(i), nil); !errors.Is(err, ErrNotEligible) || !strings.Contains(err.Error(), want) {
			t.Errorf("segment %d: %v", i, err)
		}
	}
	for _, bad := range []string{"../etc/passwd", "orders-0", "orders-0/" + kafkaName(b[0], ".index"), "nope-0/x.log"} {
		if _, err := tr.ShipNow(ctx, bad, nil); err == nil {
			t.Errorf("%s shipped", bad)
		}
	}
	// Evict ships first when it has to.
	st, err = tr.EvictNow(ctx, rel(1), nil)
	if err != nil || st != StateRemote {
		t.Fatalf("evict: %s %v", st, err)
	}
	p := filepath.Join(root, rel(1))
	if sha(readAll(t, tr, p)) != sums[p] {
		t.Fatal("evicted segment does not read back")
	}
	if st, err := tr.EvictNow(ctx, rel(1), nil); err != nil || st != StateRemote {
		t.Fatalf("second evict: %s %v", st, err)
	}
	// A failure is remembered as the partition's last error.
	s.Inject(store.Fault{Err: errors.New("injected outage")}) // every request
	if _, err := tr.EvictNow(ctx, "orders-1/"+kafkaName(bases["orders-1"][0], ".log"), nil); err == nil {
		t.Fatal("evict with the store down")
	}
	if e := tr.LastErrors()["orders-1"]; !strings.Contains(e.Err, "injected outage") || e.Time.IsZero() {
		t.Fatalf("last errors: %+v", tr.LastErrors())
	}
}

// TestTotalRetention: over the total limit, the oldest shipped segment
// of any partition goes first, and only as many as needed.
func TestTotalRetention(t *testing.T) {
	root, bases, _ := logDir(t)
	var total int64
	parts, _ := Scan(root)
	for _, p := range parts {
		for _, seg := range p.Segments {
			total += seg.Size
		}
	}
	// orders-1's first segment is the oldest of all.
	oldest := filepath.Join(root, "orders-1", kafkaName(bases["orders-1"][0], ".log"))
	past := time.Now().Add(-5 * time.Hour)
	if err := os.Chtimes(oldest, past, past); err != nil {
		t.Fatal(err)
	}
	tr, err := New(Config{Root: root, StateDir: filepath.Join(root, ".tierfs"), Store: store.NewMem(nil), Policy: Policy{ShipAfter: time.Minute}, ChunkSize: 64 << 10, LocalRetentionTotalBytes: total - 1})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	if rep := mustPass(t, tr); rep.Shipped != 4 || rep.Evicted != 1 {
		t.Fatalf("report %+v", rep)
	}
	if st, _, _ := tr.copies.stateOf(oldest); st != StateRemote {
		t.Fatalf("oldest segment is %s", st)
	}
	if rep := mustPass(t, tr); rep.Evicted != 0 {
		t.Fatalf("second pass evicted more: %+v", rep)
	}
}

// TestDrainWaitsForTransfers: Drain (tierfs umount) waits for a transfer
// under way, refuses new ones meanwhile, and Undrain lets them start again.
func TestDrainWaitsForTransfers(t *testing.T) {
	root, bases, _ := logDir(t)
	s := store.NewMem(nil)
	s.Inject(store.Fault{Latency: 40 * time.Millisecond}) // every store call is slow
	tr, err := New(Config{Root: root, StateDir: filepath.Join(root, ".tierfs"), Store: s, Policy: Policy{ShipAfter: 1000 * time.Hour}, ChunkSize: 64 << 10, ShipRate: 1 << 40})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	rel := "orders-0/" + kafkaName(bases["orders-0"][0], ".log")
	shipped := make(chan error, 1)
	go func() { _, err := tr.ShipNow(context.Background(), rel, nil); shipped <- err }()
	for tr.Active() == 0 {
		time.Sleep(time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	was, err := tr.Drain(ctx)
	if err != nil || was != 1 {
		t.Fatalf("drain: %d under way, %v", was, err)
	}
	select {
	case err := <-shipped:
		if err != nil {
			t.Fatalf("the transfer under way failed: %v", err)
		}
	default:
		t.Fatal("Drain returned before the transfer under way was done")
	}
	if st, _, _ := tr.copies.stateOf(filepath.Join(root, rel)); st != StateShipped {
		t.Fatalf("state after drain: %s", st)
	}
	rel1 := "orders-0/" + kafkaName(bases["orders-0"][1], ".log")
	if _, err := tr.ShipNow(context.Background(), rel1, nil); !errors.Is(err, ErrDraining) {
		t.Fatalf("ship while drained: %v", err)
	}
	if rep := tr.RunOnce(context.Background()); rep.Shipped+rep.Evicted+rep.Deleted != 0 {
		t.Fatalf("a pass ran while drained: %+v", rep)
	}
	tr.Undrain()
	if _, err := tr.ShipNow(context.Background(), rel1, nil); err != nil {
		t.Fatalf("ship after undrain: %v", err)
	}
}

// TestEvictOfALostCopyKeepsTheBytesAndSaysWhy: a shipped segment whose
// object left the store is not freed, and the error carries the store's
// own (errors.Is finds store.ErrNotFound through it).
func TestEvictOfALostCopyKeepsTheBytesAndSaysWhy(t *testing.T) {
	root, bases, _ := logDir(t)
	s := store.NewMem(nil)
	tr := newTierer(t, root, s, 1<<40)
	rel := "orders-0/" + kafkaName(bases["orders-0"][1], ".log")
	if st, err := tr.ShipNow(context.Background(), rel, nil); err != nil || st != StateShipped {
		t.Fatalf("ship: %s %v", st, err)
	}
	rec, _, err := readRecord(filepath.Join(root, rel))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(context.Background(), rec.Key); err != nil {
		t.Fatal(err)
	}
	_, err = tr.EvictNow(context.Background(), rel, nil)
	if err == nil || !errors.Is(err, store.ErrNotFound) || !strings.Contains(err.Error(), "not freeing the local bytes") {
		t.Fatalf("evict of a segment whose object is gone: %v", err)
	}
	var st syscall.Stat_t
	syscall.Stat(filepath.Join(root, rel), &st)
	if st.Blocks == 0 {
		t.Error("its local bytes were freed")
	}
}

// TestRetentionAsTheActiveSegmentGrows: a partition at rest (settled,
// its rolled segments' part of the local bytes kept in its scan) whose
// active segment grows past the local retention, as a broker's appends
// do without the tierer seeing them, has its oldest shipped segment
// evicted at the next pass, and only that one.
func TestRetentionAsTheActiveSegmentGrows(t *testing.T) {
	root, bases, _ := logDir(t)
	parts, _ := Scan(root)
	var local int64 // of orders-0
	for _, p := range parts {
		if p.Name == "orders-0" {
			for _, seg := range p.Segments {
				local += seg.Size
			}
		}
	}
	const room = 100 << 10
	tr, err := New(Config{Root: root, StateDir: filepath.Join(root, ".tierfs"), Store: store.NewMem(nil), Policy: Policy{ShipAfter: time.Minute}, ChunkSize: 64 << 10,
		LocalRetentionBytes: local + room, RescanInterval: time.Hour, Now: func() time.Time { return time.Now().Add(time.Hour) }})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	if rep := mustPass(t, tr); rep.Evicted != 0 {
		t.Fatalf("report %+v", rep)
	}
	for range 2 {
		if rep := mustPass(t, tr); rep.Shipped+rep.Evicted != 0 {
			t.Fatalf("not at rest: %+v", rep)
		}
	}
	active := filepath.Join(root, "orders-0", kafkaName(bases["orders-0"][len(bases["orders-0"])-1], ".log"))
	f, err := os.OpenFile(active, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(make([]byte, room+1)); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if rep := mustPass(t, tr); rep.Evicted != 1 {
		t.Fatalf("after the active segment grew: %+v", rep)
	}
	oldest := filepath.Join(root, "orders-0", kafkaName(bases["orders-0"][0], ".log"))
	if st, _, _ := tr.copies.stateOf(oldest); st != StateRemote {
		t.Fatalf("the oldest segment is %s", st)
	}
	if rep := mustPass(t, tr); rep.Evicted != 0 {
		t.Fatalf("a pass after evicted more: %+v", rep)
	}
}
