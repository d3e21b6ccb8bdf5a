package kafka

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

func TestSegmentNames(t *testing.T) {
	good := map[string]SegmentName{
		"00000000000000000000.log":               {0, KindLog, ""},
		"00000000000000001234.index":             {1234, KindIndex, ""},
		"00000000000000001234.timeindex.deleted": {1234, KindTimeIndex, SuffixDeleted},
		"09223372036854775807.txnindex":          {9223372036854775807, KindTxnIndex, ""},
		"00000000000000000042.snapshot":          {42, KindSnapshot, ""},
		"00000000000000000042.log.cleaned":       {42, KindLog, SuffixCleaned},
		"00000000000000000042.log.swap":          {42, KindLog, SuffixSwap},
	}
	for name, want := range good {
		got, ok := ParseSegmentName(name)
		if !ok || got != want {
			t.Errorf("%s: got %+v %v, want %+v", name, got, ok, want)
		}
		if got.String() != name {
			t.Errorf("%s: String() = %s", name, got.String())
		}
	}
	for _, name := range []string{"", "0.log", "0000000000000000000a.log", "00000000000000000000.txt",
		"00000000000000000000.log.bak", "99999999999999999999.log", "leader-epoch-checkpoint", "00000000000000000000"} {
		if got, ok := ParseSegmentName(name); ok {
			t.Errorf("%s: parsed as %+v", name, got)
		}
	}
}

func TestPartitionDirs(t *testing.T) {
	good := map[string]PartitionDir{
		"orders-0":              {"orders", 0, DirLive, ""},
		"my.topic_x-17":         {"my.topic_x", 17, DirLive, ""},
		"a-b-c-3":               {"a-b-c", 3, DirLive, ""},
		"__consumer_offsets-49": {"__consumer_offsets", 49, DirLive, ""},
		"orders-0.0123456789abcdef0123456789abcdef-delete": {"orders", 0, DirDelete, "0123456789abcdef0123456789abcdef"},
		"orders-2.0123456789abcdef0123456789abcdef-future": {"orders", 2, DirFuture, "0123456789abcdef0123456789abcdef"},
		"orders-2.0123456789abcdef0123456789abcdef-stray":  {"orders", 2, DirStray, "0123456789abcdef0123456789abcdef"},
	}
	for name, want := range good {
		if got, ok := ParsePartitionDir(name); !ok || got != want {
			t.Errorf("%s: got %+v %v, want %+v", name, got, ok, want)
		}
	}
	for _, name := range []string{"orders", "orders-", "-1", "orders-01", "orders-x", "orders-0-delete",
		"orders-0.xyz-delete", "bad topic-0", ".tierfs", "..-0", "orders-+1", "orders-99999999999"} {
		if got, ok := ParsePartitionDir(name); ok {
			t.Errorf("%s: parsed as %+v", name, got)
		}
	}
}

func TestOffsetCheckpoint(t *testing.T) {
	cp, err := ParseOffsetCheckpoint("recovery-point-offset-checkpoint", []byte("0\n3\norders 0 1234\norders 1 99\n__consumer_offsets 7 0\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(cp) != 3 || cp[TopicPartition{"orders", 0}] != 1234 || cp[TopicPartition{"orders", 1}] != 99 {
		t.Fatalf("got %v", cp)
	}
	// An empty file is an empty checkpoint, as Kafka reads it (the broker
	// creates cleaner-offset-checkpoint empty).
	if cp, err := ParseOffsetCheckpoint("cleaner-offset-checkpoint", nil); err != nil || len(cp) != 0 {
		t.Fatalf("empty: %v %v", cp, err)
	}
	bad := map[string]string{
		"1\n0\n":                    "unsupported version",
		"0\n":                       "missing count",
		"0\nx\n":                    "bad count",
		"0\n2\norders 0 1\n":        "found 1",
		"0\n1\norders 0 1\nx 1 2\n": "more follow",
		"0\n1\norders 0\n":          "want 3 fields",
		"0\n1\norders z 1\n":        "bad partition",
		"0\n1\norders 0 q\n":        "bad offset",
		"0\n2\na 0 1\na 0 2\n":      "listed twice",
		"0\n1\nbad/topic 0 1\n":     "bad topic",
	}
	for in, want := range bad {
		_, err := ParseOffsetCheckpoint("cp", []byte(in))
		var fe *FormatError
		if !errors.As(err, &fe) || !strings.Contains(err.Error(), want) || !strings.HasPrefix(err.Error(), "cp: offset ") {
			t.Errorf("%q: error %v, want a FormatError mentioning %q", in, err, want)
		}
	}
	_, err = ParseOffsetCheckpoint("cp", []byte("0\n2\na 0 1\nb 0 x\n"))
	if fe := (*FormatError)(nil); !errors.As(err, &fe) || fe.Offset != 10 {
		t.Errorf("offset of bad line: %v", err)
	}
}

func TestLeaderEpochCheckpoint(t *testing.T) {
	got, err := ParseLeaderEpochCheckpoint("leader-epoch-checkpoint", []byte("0\n2\n0 0\n3 1500\n"))
	if err != nil || len(got) != 2 || got[1] != (EpochEntry{3, 1500}) {
		t.Fatalf("got %v %v", got, err)
	}
	if _, err := ParseLeaderEpochCheckpoint("l", []byte("0\n1\n-1 0\n")); err == nil {
		t.Error("negative epoch accepted")
	}
}

func TestScanRealBatches(t *testing.T) {
	specs := []batchSpec{
		{base: 0, records: 5, ts: 1000, producer: -1},
		{base: 5, records: 20, ts: 2000, attrs: 1, producer: -1},             // gzip
		{base: 25, records: 3, ts: 3000, attrs: 0x10, producer: 7, epoch: 2}, // transactional
		{base: 28, records: 1, ts: 3001, attrs: 0x30, producer: 7, epoch: 2}, // control marker
	}
	seg := segment(specs...)
	for _, verify := range []bool{false, true} {
		var got []Batch
		res, err := ScanBatches("s.log", bytes.NewReader(seg), int64(len(seg)), ScanOptions{VerifyCRC: verify}, func(b Batch) error {
			got = append(got, b)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if res.Batches != 4 || res.End != int64(len(seg)) || res.Torn {
			t.Fatalf("result %+v", res)
		}
		if got[1].Compression() != 1 || !got[2].Transactional() || !got[3].Control() || got[3].LastOffset != 28 ||
			got[1].BaseOffset != 5 || got[1].LastOffset != 24 || got[1].MaxTimestamp != 2019 || got[2].LeaderEpoch != 2 {
			t.Fatalf("batches %+v", got)
		}
		if got[1].Position != got[0].Size {
			t.Fatalf("positions: %d after size %d", got[1].Position, got[0].Size)
		}
	}
}

func TestScanTornTailAndCorruption(t *testing.T) {
	seg := segment(batchSpec{base: 0, records: 4, ts: 1}, batchSpec{base: 4, records: 4, ts: 2})
	first := int64(len(encodeBatch(batchSpec{base: 0, records: 4, ts: 1})))
	for _, cut := range []int64{first + 10, first + BatchHeaderSize + 3, int64(len(seg)) - 1} {
		res, err := ScanBatches("s.log", bytes.NewReader(seg[:cut]), cut, ScanOptions{VerifyCRC: true}, func(Batch) error { return nil })
		if err != nil || !res.Torn || res.End != first || res.Batches != 1 {
			t.Errorf("cut at %d: %+v %v", cut, res, err)
		}
	}
	bad := bytes.Clone(seg)
	bad[first+BatchHeaderSize+5] ^= 0xff
	_, err := ScanBatches("s.log", bytes.NewReader(bad), int64(len(bad)), ScanOptions{VerifyCRC: true}, func(Batch) error { return nil })
	var fe *FormatError
	if !errors.As(err, &fe) || fe.Offset != first || !strings.Contains(err.Error(), "CRC32C") {
		t.Errorf("flipped byte: %v", err)
	}
	old := bytes.Clone(seg)
	old[magicOffset] = 1
	_, err = ScanBatches("s.log", bytes.NewReader(old), int64(len(old)), ScanOptions{}, func(Batch) error { return nil })
	if err == nil || !strings.Contains(err.Error(), "magic 1") {
		t.Errorf("magic 1: %v", err)
	}
}

func FuzzScanBatches(f *testing.F) {
	f.Add(segment(batchSpec{base: 0, records: 3, ts: 5}, batchSpec{base: 3, records: 2, attrs: 1}))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, verify := range []bool{false, true} {
			res, err := ScanBatches("fuzz.log", bytes.NewReader(data), int64(len(data)), ScanOptions{VerifyCRC: verify}, func(b Batch) error {
				if b.Position < 0 || b.Position+b.Size > int64(len(data)) || b.LastOffset < b.BaseOffset {
					t.Fatalf("impossible batch %+v in %d bytes", b, len(data))
				}
				return nil
			})
			if err == nil && res.End > int64(len(data)) {
				t.Fatalf("end %d past %d", res.End, len(data))
			}
		}
	})
}

func FuzzCheckpoint(f *testing.F) {
	f.Add([]byte("0\n2\norders 0 1234\norders 1 99\n"))
	f.Add([]byte("0\n1\n0 0\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		if cp, err := ParseOffsetCheckpoint("f", data); err == nil && cp == nil {
			t.Fatal("nil map without error")
		}
		ParseLeaderEpochCheckpoint("f", data)
	})
}

func FuzzNames(f *testing.F) {
	f.Add("00000000000000001234.log.deleted")
	f.Add("orders-0.0123456789abcdef0123456789abcdef-delete")
	f.Fuzz(func(t *testing.T, name string) {
		if s, ok := ParseSegmentName(name); ok && s.String() != name {
			t.Fatalf("%q parsed as %+v but formats as %q", name, s, s.String())
		}
		ParsePartitionDir(name)
	})
}

// BenchmarkScan measures header-only and CRC-verifying scans of an
// in-memory segment of 1 KiB records (go test -bench Scan ./idx/kafka).
func BenchmarkScan(b *testing.B) {
	var specs []batchSpec
	for i := range 2000 {
		specs = append(specs, batchSpec{base: int64(i * 16), records: 16, ts: int64(i)})
	}
	seg := segment(specs...)
	for _, verify := range []bool{false, true} {
		name := "headers"
		if verify {
			name = "crc"
		}
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(len(seg)))
			r := bytes.NewReader(seg)
			for b.Loop() {
				if _, err := ScanBatches("bench.log", r, int64(len(seg)), ScanOptions{VerifyCRC: verify}, func(Batch) error { return nil }); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
