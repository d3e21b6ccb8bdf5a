package chunkxfer

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// The Pool's buffers (chunk memory) are mapped from the kernel, not
// allocated on the Go heap. A full pool is hundreds of MiB that the
// garbage collector would count, and pace its collections by: with the
// budget full and the Go memory limit at the budget plus 32 MiB, each
// collection found the heap at its limit and the next one started at
// once, and a consumer catching up on a thousand partitions spent three
// quarters of tierfs's CPU marking (bench/kafkacatchup). The pool
// bounds its own memory; the collector sees only the rest. A buffer the
// pool lets go is given back to the kernel at once (munmap). The rule
// that a buffer is filled again only once no holder has it (Pool) covers
// unmapping too: a buffer is unmapped only where it could be refilled.

// mapBuf maps n bytes of zeroed memory for the pool.
func mapBuf(n int64) ([]byte, error) {
	b, err := unix.Mmap(-1, 0, int(n), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, fmt.Errorf("mapping %d bytes of chunk memory: %w", n, err)
	}
	return b, nil
}

// unmapBuf gives b, from mapBuf, back to the kernel. unix.Munmap
// refuses (EINVAL) a slice that is not one of its mappings, whole.
func unmapBuf(b []byte) {
	if cap(b) > 0 {
		_ = unix.Munmap(b[:cap(b)])
	}
}
