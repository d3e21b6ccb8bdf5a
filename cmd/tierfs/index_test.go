package main

import (
	"bytes"
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/tierfs/tierfs/idx"
	"github.com/tierfs/tierfs/idx/kafka/kafkatest"
)

// partitionDir writes a segment with base 100 and its .index and
// .timeindex as Kafka does, plus an index file for it.
func partitionDir(t *testing.T) (dir string, seg []byte, positions []int64) {
	dir = t.TempDir()
	var specs []kafkatest.Batch
	var pos int64
	for i := range 10 {
		s := kafkatest.Batch{Base: 100 + int64(i)*4, Records: 4, TS: 1_700_000_000_000 + int64(i)*10, Attrs: int16(i%2) | int16(i/9)*0x10}
		specs = append(specs, s)
		positions = append(positions, pos)
		pos += int64(len(kafkatest.Encode(s)))
	}
	seg = kafkatest.Segment(specs...)
	write := func(name string, b []byte) {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("00000000000000000100.log", seg)
	var oi, ti []byte
	for _, i := range []int{3, 7} {
		oi = binary.BigEndian.AppendUint32(oi, uint32(specs[i].Base+3-100))
		oi = binary.BigEndian.AppendUint32(oi, uint32(positions[i]))
		ti = binary.BigEndian.AppendUint64(ti, uint64(specs[i].TS+3))
		ti = binary.BigEndian.AppendUint32(ti, uint32(specs[i].Base+3-100))
	}
	write("00000000000000000100.index", append(oi, make([]byte, 64)...))
	write("00000000000000000100.timeindex", append(ti, make([]byte, 48)...))

	f, err := idx.OpenFile(filepath.Join(dir, idx.FileName))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	c, err := idx.ChunkSegment("seg", bytes.NewReader(seg), int64(len(seg)), 100, idx.ChunkOptions{Size: 1024})
	if err != nil || c.Opaque {
		t.Fatal(err, c.Reason)
	}
	for _, ch := range c.Chunks {
		e := ch.Entry
		e.RDI = []byte("orders-0/00000000000000000100.log")
		if err := f.Append(e); err != nil {
			t.Fatal(err)
		}
	}
	f.View(func(x *idx.Index) {
		ri, err := x.BuildRemoteIndexes(100, math.MaxInt64)
		if err != nil {
			t.Fatal(err)
		}
		if err := idx.WriteRemoteIndexes(dir, ri); err != nil {
			t.Fatal(err)
		}
	})
	return dir, seg, positions
}

func TestIndexDumpAndVerify(t *testing.T) {
	dir, seg, positions := partitionDir(t)
	for name, want := range map[string][]string{
		"00000000000000000100.log":        {"10 batches", "gzip", "txn", "2023-11-14T22:13:20.000Z"},
		"00000000000000000100.index":      {"115", "131"},
		"00000000000000000100.timeindex":  {"2023-11-14T22:13:20.033Z", "115"},
		idx.FileName:                      {"orders-0/00000000000000000100.log", "entries"},
		"00000000000000000100.rindex":     {"INDEX_POSITION", "100"},
		"00000000000000000100.rtimeindex": {"INDEX_POSITION", "2023-11-14T22:13:20.013Z"},
	} {
		path := filepath.Join(dir, name)
		var out bytes.Buffer
		if err := indexDump(&out, path, kindOf(path)); err != nil {
			t.Fatalf("dump %s: %v", name, err)
		}
		for _, w := range want {
			if !strings.Contains(out.String(), w) {
				t.Errorf("dump %s lacks %q:\n%s", name, w, out.String())
			}
		}
		if err := Main([]string{"tierfs", "index", "verify", path}); err != nil {
			t.Errorf("verify %s: %v", name, err)
		}
	}
	if sum, err := indexVerify(filepath.Join(dir, "00000000000000000100.log"), kindSegment); err != nil || !strings.Contains(sum, ".index 2 entries good, .timeindex 2 entries good") {
		t.Fatalf("verify log: %q %v", sum, err)
	}

	// Problems: exit 1, naming the file and the byte offset.
	logPath := filepath.Join(dir, "00000000000000000100.log")
	bad := append([]byte{}, seg...)
	bad[positions[5]+40] ^= 0xff
	os.WriteFile(logPath, bad, 0o644)
	expectProblem(t, logPath, "00000000000000000100.log: offset "+itoa(positions[5])+": batch at offset 120: CRC32C")
	os.WriteFile(logPath, seg[:len(seg)-10], 0o644)
	expectProblem(t, logPath, "offset "+itoa(positions[9])+": torn batch")
	// An .index entry that does not point at its batch.
	os.WriteFile(logPath, seg, 0o644)
	ip := filepath.Join(dir, "00000000000000000100.index")
	data, _ := os.ReadFile(ip)
	binary.BigEndian.PutUint32(data[12:], uint32(positions[6]))
	os.WriteFile(ip, data, 0o644)
	expectProblem(t, ip, "00000000000000000100.index: offset 8: entry (offset 131, position "+itoa(positions[6])+") is not a batch")
	// A torn index file.
	xp := filepath.Join(dir, idx.FileName)
	data, _ = os.ReadFile(xp)
	os.WriteFile(xp, append(data, 0, 0, 0, 60, 1, 2), 0o644)
	expectProblem(t, xp, idx.FileName+": offset "+itoa(int64(len(data)))+": torn tail of 6 bytes")
	// A checkpoint whose count is wrong.
	cp := filepath.Join(dir, "recovery-point-offset-checkpoint")
	os.WriteFile(cp, []byte("0\n2\norders 0 100\n"), 0o644)
	expectProblem(t, cp, "recovery-point-offset-checkpoint")
	// Usage errors.
	if err := Main([]string{"tierfs", "index", "verify", filepath.Join(dir, "mystery")}); exitCode(err) != 2 || !strings.Contains(err.Error(), "--type") {
		t.Errorf("unknown kind: %v", err)
	}
	if err := Main([]string{"tierfs", "index", "dump", "--type", "nope", cp}); exitCode(err) != 2 {
		t.Errorf("bad --type: %v", err)
	}
}

func expectProblem(t *testing.T, path, msg string) {
	t.Helper()
	err := Main([]string{"tierfs", "index", "verify", path})
	if err == nil || exitCode(err) != 1 || !strings.Contains(err.Error(), msg) {
		t.Errorf("verify %s: %v (exit %d), want %q", filepath.Base(path), err, exitCode(err), msg)
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
