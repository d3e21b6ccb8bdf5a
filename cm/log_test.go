package cm

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

func appendN(t *testing.T, l *eventLog, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		if err := l.append(&Event{Type: EvCreate, Kind: KindFile, Path: "p"}); err != nil {
			t.Fatal(err)
		}
	}
}

func TestLogSurvivesATornAppend(t *testing.T) {
	dir := t.TempDir()
	l, err := openLog(dir)
	if err != nil {
		t.Fatal(err)
	}
	appendN(t, l, 3)
	l.close()
	seg := filepath.Join(dir, segName(1))
	f, _ := os.OpenFile(seg, os.O_WRONLY|os.O_APPEND, 0)
	f.WriteString(`1234abcd {"id":4,"type":"cre`) // a crash mid-append
	f.Close()
	l, err = openLog(dir)
	if err != nil {
		t.Fatalf("torn tail: %v", err)
	}
	if l.lastID() != 3 {
		t.Fatalf("last id %d after a torn 4th, want 3", l.lastID())
	}
	appendN(t, l, 1)
	l.close()
	var ids []uint64
	readEvents(dir, 1, 100, func(ev Event) error { ids = append(ids, ev.ID); return nil })
	if len(ids) != 4 || ids[3] != 4 {
		t.Fatalf("ids %v", ids)
	}
}

func TestLogRefusesCorruptionInTheMiddle(t *testing.T) {
	dir := t.TempDir()
	l, _ := openLog(dir)
	appendN(t, l, 3)
	l.close()
	seg := filepath.Join(dir, segName(1))
	b, _ := os.ReadFile(seg)
	i := strings.Index(string(b), `"id":2`)
	b[i+10] ^= 0x20 // a flipped bit in the second line
	os.WriteFile(seg, b, 0o600)
	_, err := openLog(dir)
	if err == nil {
		// The last segment tolerates only a bad *last* line.
		t.Fatal("a corrupt line in the middle was accepted")
	}
	first := strings.Index(string(b), "\n") + 1
	if !strings.Contains(err.Error(), seg) || !strings.Contains(err.Error(), "offset "+strconv.Itoa(first)) {
		t.Fatalf("error %q should name %s and offset %d", err, seg, first)
	}
}

func TestLogRollsAndCleanerDropsOldSegments(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	s := newSim(t, Config{Retain: time.Hour, Now: func() time.Time { return now }})
	s.m.log.segSize = 400 // a few events per segment
	for i := 0; i < 20; i++ {
		s.write("f", 0, []byte{byte(i)})
		s.unlink("f")
	}
	segs, _ := segments(s.m.log.dir)
	if len(segs) < 5 {
		t.Fatalf("%d segments", len(segs))
	}
	s.m.flushFiler()
	kept, _ := os.ReadDir(filepath.Join(s.m.Dir(), "by-sum"))
	if len(kept) != 20 {
		t.Fatalf("%d retained, want 20", len(kept))
	}
	now = now.Add(30 * time.Minute)
	s.write("g", 0, []byte("recent"))
	s.unlink("g")
	if n, err := s.m.Clean(); err != nil || n != 0 {
		t.Fatalf("clean within retention removed %d (%v)", n, err)
	}
	now = now.Add(45 * time.Minute) // the first 20 are 75 min old, g 45
	n, err := s.m.Clean()
	if err != nil || n != 20 {
		t.Fatalf("clean removed %d (%v), want 20", n, err)
	}
	first, _ := firstID(s.m.log.dir)
	if first <= 1 {
		t.Fatalf("old segments kept (first id %d)", first)
	}
	if _, err := s.m.Restore("g", first, t.TempDir()); err != nil && !strings.Contains(err.Error(), "did not exist") {
		t.Fatalf("restore within retention: %v", err)
	}
	if _, err := s.m.Dump(t.TempDir(), 1, 0, false, s.root); err == nil || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("dump from an expired event: %v", err)
	}
	if left, _ := os.ReadDir(filepath.Join(s.m.Dir(), "files")); len(left) != 1 {
		t.Fatalf("files/ holds %d entries, want only g's", len(left))
	}
}

func TestMaxBytesDropsOldestFirst(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	s := newSim(t, Config{MaxBytes: 3 * 4096, Now: func() time.Time { return now }})
	for i := 0; i < 6; i++ {
		now = now.Add(time.Second)
		s.write("f", 0, []byte(strings.Repeat(string(rune('a'+i)), 4000)))
		s.unlink("f")
	}
	if n, err := s.m.Clean(); err != nil || n != 3 {
		t.Fatalf("removed %d (%v), want 3", n, err)
	}
	all, _ := s.m.Events("f", 0, time.Time{}, 0)
	var dels []Event
	for _, ev := range all {
		if ev.Type == EvDelete {
			dels = append(dels, ev)
		}
	}
	for i, ev := range dels {
		_, err := os.Stat(filepath.Join(s.m.Dir(), ev.Name))
		if kept := err == nil; kept != (i >= 3) {
			t.Errorf("original %d of 6 kept=%v", i+1, kept)
		}
	}
}

func TestCrashBeforeTheEventIsRecovered(t *testing.T) {
	root, cmroot := t.TempDir(), t.TempDir()
	m := New(Config{})
	if err := m.Attach(root, cmroot); err != nil {
		t.Fatal(err)
	}
	m.Close()
	// A crash between moving the original into tmp and filing it.
	os.WriteFile(filepath.Join(cmroot, "tmp", "move-1700000000000000000-1-orders-0%2F0.log"), []byte("segment bytes"), 0o644)
	m = New(Config{})
	if err := m.Attach(root, cmroot); err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	evs, _ := m.Events("", 0, time.Time{}, 0)
	if len(evs) != 1 || !evs[0].Recovered || evs[0].Path != "orders-0/0.log" || evs[0].Name == "" {
		t.Fatalf("events %+v", evs)
	}
	b, err := os.ReadFile(filepath.Join(cmroot, evs[0].Name))
	if err != nil || string(b) != "segment bytes" {
		t.Fatalf("recovered original %q %v", b, err)
	}
}

// A crash after an original's filed record, before it moved from tmp to
// its name: the next start moves it there (or, when its name has the
// content already, removes it), and records nothing more.
func TestCrashAfterFilingIsRecovered(t *testing.T) {
	for _, nameThere := range []bool{false, true} {
		t.Run(fmt.Sprintf("name there %v", nameThere), func(t *testing.T) {
			s := newSim(t, Config{})
			s.mkdir("orders-0")
			s.write("orders-0/0.log", 0, []byte("segment bytes"))
			s.unlink("orders-0/0.log")
			s.must(s.m.Flush())
			var pending, name string
			s.must(readEvents(s.m.log.dir, 0, ^uint64(0), func(ev Event) error {
				if ev.Type == EvDelete {
					pending = ev.Pending
				}
				if ev.Type == EvFiled {
					name = ev.Name
				}
				return nil
			}))
			if pending == "" || name == "" {
				t.Fatalf("pending %q, filed as %q", pending, name)
			}
			before, _ := s.m.Events("", 0, time.Time{}, 0)
			s.m.Close()
			// Back to how the crash left it.
			op := os.Rename
			if nameThere {
				op = os.Link
			}
			s.must(op(filepath.Join(s.m.Dir(), name), filepath.Join(s.m.Dir(), pending)))
			m := New(Config{})
			s.must(m.Attach(s.root, s.m.Dir()))
			defer m.Close()
			if b, err := os.ReadFile(filepath.Join(m.Dir(), name)); err != nil || string(b) != "segment bytes" {
				t.Fatalf("at its name: %q %v", b, err)
			}
			if _, err := os.Lstat(filepath.Join(m.Dir(), pending)); !os.IsNotExist(err) {
				t.Fatalf("still in tmp: %v", err)
			}
			after, _ := m.Events("", 0, time.Time{}, 0)
			if len(after) != len(before) {
				t.Fatalf("events before the crash %v, after %v", before, after)
			}
			out := t.TempDir()
			if _, err := m.Restore("orders-0", before[len(before)-2].ID, out); err != nil {
				t.Fatal(err)
			}
			if b, err := os.ReadFile(filepath.Join(out, "orders-0", "0.log")); err != nil || string(b) != "segment bytes" {
				t.Fatalf("restored %q %v", b, err)
			}
		})
	}
}
