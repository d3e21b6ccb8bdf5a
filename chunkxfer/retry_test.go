package chunkxfer

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"testing"
	"testing/iotest"
	"time"
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

// TestPartBuffersAreReusedThenDropped: an upload's part buffers serve
// the next upload (not zeroed: every part read fills them), and go once
// no upload took one for partBufIdle.
func TestPartBuffersAreReusedThenDropped(t *testing.T) {
	u := &Uploader{Parallel: 2}
	a := u.partBuf(1 << 20)
	a[0] = 7
	u.putPartBuf(a)
	b := u.partBuf(1 << 19)
	if &b[0] != &a[0] || len(b) != 1<<19 {
		t.Fatal("a kept buffer was not reused")
	}
	if c := u.partBuf(1 << 20); &c[0] == &a[0] {
		t.Fatal("a buffer handed out twice")
	}
	u.putPartBuf(b)
	if big := u.partBuf(2 << 20); &big[0] == &a[0] || len(big) != 2<<20 {
		t.Fatal("a buffer too small was handed out")
	}
	u.bufMu.Lock()
	kept := len(u.bufs)
	u.bufMu.Unlock()
	if kept != 1 {
		t.Fatalf("%d buffers kept", kept)
	}
	u.bufDrop.Reset(time.Millisecond)
	time.Sleep(50 * time.Millisecond)
	u.bufMu.Lock()
	defer u.bufMu.Unlock()
	if len(u.bufs) != 0 {
		t.Fatalf("%d buffers kept after the idle time", len(u.bufs))
	}
}
