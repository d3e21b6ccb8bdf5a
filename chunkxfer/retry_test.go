package chunkxfer

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"testing"
	"testing/iotest"
)

// TestReadFullCRC: the CRC summed as reads land is the CRC of the whole
// buffer, whatever sizes the reads come in; a short body is
// io.ErrUnexpectedEOF and a failing one its error.
func TestReadFullCRC(t *testing.T) {
	data := make([]byte, 300_001)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range data {
		data[i] = byte(r.Uint32())
	}
	want := crc32c(data)
	for name, rd := range map[string]io.Reader{
		"whole":         bytes.NewReader(data),
		"one byte":      iotest.OneByteReader(bytes.NewReader(data)),
		"halves":        iotest.HalfReader(bytes.NewReader(data)),
		"EOF with data": iotest.DataErrReader(bytes.NewReader(data)),
	} {
		buf := make([]byte, len(data))
		got, err := readFullCRC(rd, buf)
		if err != nil || got != want || !bytes.Equal(buf, data) {
			t.Errorf("%s: crc %08x (want %08x), %v", name, got, want, err)
		}
	}
	buf := make([]byte, len(data)+1)
	if _, err := readFullCRC(bytes.NewReader(data), buf); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("short body: %v", err)
	}
	boom := errors.New("connection reset")
	if _, err := readFullCRC(iotest.ErrReader(boom), buf); !errors.Is(err, boom) {
		t.Errorf("failing body: %v", err)
	}
	if _, err := readFullCRC(bytes.NewReader(nil), nil); err != nil {
		t.Errorf("empty chunk: %v", err)
	}
}
