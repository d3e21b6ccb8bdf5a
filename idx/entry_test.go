package idx

import (
	"bytes"
	"encoding/hex"
	"errors"
	"strings"
	"testing"
)

// TestEntryGolden checks the encoding against bytes written by hand from
// the layout in docs/formats.md.
func TestEntryGolden(t *testing.T) {
	e := Entry{FirstOffset: 1, LastOffset: 2, FirstTimestamp: 3, LastTimestamp: 4, DataLength: 5, RDI: []byte("ab")}
	got, err := e.AppendTo(nil)
	if err != nil {
		t.Fatal(err)
	}
	want := "0000" + "0030" + "XXXXXXXX" +
		"0000000000000001" + "0000000000000002" + "0000000000000003" + "0000000000000004" +
		"00000005" + "0002" + "6162"
	// The CRC32C of bytes 8..48, computed by an independent table-free
	// bitwise implementation below.
	crc := bitwiseCRC32C(got[8:])
	want = strings.Replace(want, "XXXXXXXX", hex.EncodeToString([]byte{byte(crc >> 24), byte(crc >> 16), byte(crc >> 8), byte(crc)}), 1)
	if hex.EncodeToString(got) != want {
		t.Fatalf("encoding\n got %x\nwant %s", got, want)
	}
	back, n, err := DecodeEntry(got)
	if err != nil || n != 48 || back.LastTimestamp != 4 || !bytes.Equal(back.RDI, []byte("ab")) {
		t.Fatalf("decode: %+v %d %v", back, n, err)
	}
}

// bitwiseCRC32C is the reflected Castagnoli CRC, bit by bit.
func bitwiseCRC32C(b []byte) uint32 {
	crc := ^uint32(0)
	for _, c := range b {
		crc ^= uint32(c)
		for range 8 {
			if crc&1 != 0 {
				crc = crc>>1 ^ 0x82F63B78
			} else {
				crc >>= 1
			}
		}
	}
	return ^crc
}

func TestEntryErrors(t *testing.T) {
	good, _ := Entry{FirstOffset: 10, LastOffset: 20, RDI: []byte("s3://b/k@0")}.AppendTo(nil)
	if _, _, err := DecodeEntry(good[:len(good)-1]); !errors.Is(err, ErrShortEntry) {
		t.Errorf("cut entry: %v", err)
	}
	flipped := bytes.Clone(good)
	flipped[20] ^= 1
	if _, _, err := DecodeEntry(flipped); err == nil || !strings.Contains(err.Error(), "CRC32C") {
		t.Errorf("flipped byte: %v", err)
	}
	if _, err := (Entry{FirstOffset: 5, LastOffset: 4}).AppendTo(nil); err == nil {
		t.Error("offsets out of order encoded")
	}
	if _, err := (Entry{RDI: make([]byte, MaxRDILength+1)}).AppendTo(nil); err == nil {
		t.Error("oversized rdi encoded")
	}
	if _, err := (Entry{RDI: make([]byte, MaxRDILength)}).AppendTo(nil); err != nil {
		t.Errorf("largest rdi: %v", err)
	}
}

func FuzzDecodeEntry(f *testing.F) {
	good, _ := Entry{FirstOffset: 1, LastOffset: 9, FirstTimestamp: 5, LastTimestamp: 7, DataLength: 100, RDI: []byte("key@0")}.AppendTo(nil)
	f.Add(good)
	f.Fuzz(func(t *testing.T, b []byte) {
		e, n, err := DecodeEntry(b)
		if err != nil {
			return
		}
		if n > len(b) || n != e.Size() {
			t.Fatalf("size %d of %d input, entry size %d", n, len(b), e.Size())
		}
		again, err := e.AppendTo(nil)
		if err != nil || !bytes.Equal(again, b[:n]) {
			t.Fatalf("round trip differs: %v", err)
		}
	})
}
