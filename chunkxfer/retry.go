package chunkxfer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"time"

	"github.com/tierfs/tierfs/chunkxfer/store"
)

// retryPolicy retries one chunk's transfer on top of whatever the store
// retries itself: a store retries requests; this retries a chunk whose
// body was cut short or failed its checksum.
type retryPolicy struct {
	attempts int
	backoff  time.Duration
}

var defaultRetry = retryPolicy{attempts: 5, backoff: 50 * time.Millisecond}

// permanent errors are not retried: the object or upload is gone or
// changed, the source changed, or the caller gave up.
func permanent(err error) bool {
	return errors.Is(err, store.ErrNotFound) || errors.Is(err, store.ErrPrecondition) ||
		errors.Is(err, ErrSourceChanged) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

func (p retryPolicy) do(ctx context.Context, fn func() error) error {
	var err error
	wait := p.backoff
	for attempt := 1; ; attempt++ {
		if err = fn(); err == nil || permanent(err) || attempt >= p.attempts {
			return err
		}
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return fmt.Errorf("%w (after: %v)", ctx.Err(), err)
		}
		wait = min(2*wait, 2*time.Second)
	}
}

// fetchChunk reads chunk i of the object into buf (exactly its length)
// and checks its CRC32C, retrying short bodies and mismatches.
func fetchChunk(ctx context.Context, s store.Store, m *Manifest, i int, buf []byte) error {
	return fetchChunkWith(ctx, defaultRetry, s, m, i, buf)
}

func fetchChunkWith(ctx context.Context, policy retryPolicy, s store.Store, m *Manifest, i int, buf []byte) error {
	off, n := m.ChunkRange(i)
	if int64(len(buf)) != n {
		return fmt.Errorf("chunk %d: buffer of %d bytes for %d", i, len(buf), n)
	}
	return policy.do(ctx, func() error {
		rc, err := getRange(ctx, s, m, off, n)
		if err != nil {
			return err
		}
		defer rc.Close()
		got, err := readFullCRC(rc, buf)
		if err != nil {
			return fmt.Errorf("chunk %d of %s: %w", i, m.Key, err)
		}
		if got != m.CRC32C[i] {
			return fmt.Errorf("chunk %d of %s: CRC32C %08x, manifest says %08x: %w", i, m.Key, got, m.CRC32C[i], ErrChecksum)
		}
		return nil
	})
}

// fetchBlocksWith reads blocks b0 to b1 of the object, in one GET, into
// buf (exactly their length) and checks each block's CRC32C, retrying
// short bodies and mismatches.
func fetchBlocksWith(ctx context.Context, policy retryPolicy, s store.Store, m *Manifest, b0, b1 int, buf []byte) error {
	off, n := m.blocksRange(b0, b1)
	if int64(len(buf)) != n {
		return fmt.Errorf("blocks %d-%d: buffer of %d bytes for %d", b0, b1, len(buf), n)
	}
	return policy.do(ctx, func() error {
		rc, err := getRange(ctx, s, m, off, n)
		if err != nil {
			return err
		}
		defer rc.Close()
		for b := b0; b <= b1; b++ {
			bOff, bn := m.BlockRange(b)
			got, err := readFullCRC(rc, buf[bOff-off:bOff-off+bn])
			if err != nil {
				return fmt.Errorf("block %d of %s: %w", b, m.Key, err)
			}
			if want := m.blockCRC(b); got != want {
				return fmt.Errorf("block %d of %s (at %d): CRC32C %08x, manifest says %08x: %w", b, m.Key, bOff, got, want, ErrChecksum)
			}
		}
		return nil
	})
}

// getRange reads n bytes of m's object from off: from the store, on the
// condition that the object is still the one m describes, or from m
// itself when it holds the object (Inline).
func getRange(ctx context.Context, s store.Store, m *Manifest, off, n int64) (io.ReadCloser, error) {
	if m.Inline != nil {
		if off < 0 || off+n > int64(len(m.Inline)) {
			return nil, fmt.Errorf("%s: bytes %d to %d of %d held inline", m.Key, off, off+n, len(m.Inline))
		}
		return io.NopCloser(bytes.NewReader(m.Inline[off : off+n])), nil
	}
	return s.Get(ctx, m.Key, off, n, store.GetOptions{IfMatch: m.ETag})
}

// readFullCRC is io.ReadFull that also returns the CRC32C of buf, summed
// as each read lands, while its bytes are still in the CPU's cache (one
// pass over memory instead of two).
func readFullCRC(r io.Reader, buf []byte) (uint32, error) {
	var crc uint32
	pos := 0
	for pos < len(buf) {
		n, err := r.Read(buf[pos:])
		crc = crc32.Update(crc, castagnoli, buf[pos:pos+n])
		pos += n
		if err != nil {
			if err == io.EOF && pos < len(buf) {
				err = io.ErrUnexpectedEOF
			}
			if pos == len(buf) && err == io.EOF {
				break
			}
			return crc, err
		}
	}
	return crc, nil
}
