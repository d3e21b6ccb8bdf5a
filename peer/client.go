package peer

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"net"
	"path"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tierfs/tierfs/internal/beneath"
)

// PartSuffix names a file being pulled, beside where it will go. A pull
// that finds one resumes from the chunks it holds.
const PartSuffix = ".tierfs-part"

// Client pulls from a Server.
type Client struct {
	Addr string
	// TLS, when set, is used for every connection (see ClientTLS).
	TLS *tls.Config
	Log *slog.Logger
	// ChunkSize is the unit of transfer (DefaultChunkSize if 0).
	ChunkSize int64
	// Retries is how many connections in a row may fail, with no chunk
	// confirmed in between, before the pull gives up (default 10).
	Retries int
	// MaxPasses is how many times a file that keeps changing is sent
	// again before the pull gives up on it (default 5).
	MaxPasses int
	// Dial connects (default: TCP).
	Dial func(ctx context.Context, addr string) (net.Conn, error)
	// Progress, when set, is told of every chunk confirmed.
	Progress func(path string, done, size int64)
	// TakeOver, when set, is offered every file the server's tierfs
	// mount has evicted (Entry.Remote), with its local path under the
	// pull's directory; it returns true if it made the file without its
	// bytes (a tierfs mount of the same store referencing them), false to
	// have the bytes pulled.
	TakeOver func(ctx context.Context, rel string, e Entry) (bool, error)

	conn   net.Conn
	r      *bufio.Reader
	w      *bufio.Writer
	buf    []byte
	failed int // connections failed since the last confirmed chunk
	stats  Stats
}

// Stats say what a pull did.
type Stats struct {
	Files, Dirs, Symlinks int
	Bytes                 int64 // file bytes in the pulled tree
	Received              int64 // file bytes that came over the network
	Kept                  int64 // bytes already here (a resumed pull): checked, not sent
	Resent                int   // passes over files that changed while sent
	// Evicted counts the files that were in the server's store (its
	// tierfs mount read them from there to send them, or TakeOver took
	// them over without their bytes: TakenOver).
	Evicted    int
	TakenOver  int
	Reconnects int
}

// errServer is an error the server reported: not retried.
type errServer struct{ msg string }

func (e errServer) Error() string { return e.msg }

func (c *Client) log() *slog.Logger {
	if c.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return c.Log
}

func (c *Client) chunk() int64 {
	if c.ChunkSize > 0 {
		return c.ChunkSize
	}
	return DefaultChunkSize
}

// Close closes the connection.
func (c *Client) Close() error {
	if c.conn == nil {
		return nil
	}
	err := c.conn.Close()
	c.conn = nil
	return err
}

func (c *Client) connect(ctx context.Context) error {
	if c.conn != nil {
		return nil
	}
	dial := c.Dial
	if dial == nil {
		dial = func(ctx context.Context, addr string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", addr)
		}
	}
	conn, err := dial(ctx, c.Addr)
	if err != nil {
		return err
	}
	if c.TLS != nil {
		tc := tls.Client(conn, c.TLS)
		if err := tc.HandshakeContext(ctx); err != nil {
			conn.Close()
			return errServer{fmt.Sprintf("TLS with %s: %v", c.Addr, err)}
		}
		conn = tc
	}
	c.conn, c.r, c.w = conn, bufio.NewReaderSize(conn, 256<<10), bufio.NewWriterSize(conn, 4<<10)
	return nil
}

// do runs fn on a connection, and again on a new one when the
// connection fails, until it succeeds, the server reports an error, or
// Retries connections in a row fail.
func (c *Client) do(ctx context.Context, fn func() error) error {
	for {
		err := c.connect(ctx)
		if err == nil {
			err = fn()
			if err == nil {
				c.failed = 0
				return nil
			}
		}
		if err := c.retry(ctx, err); err != nil {
			return err
		}
	}
}

// retry deals with err from a connection: nil when a new connection
// should be tried (after a pause), else the error to give up with.
func (c *Client) retry(ctx context.Context, err error) error {
	retries := c.Retries
	if retries == 0 {
		retries = 10
	}
	var es errServer
	var op *net.OpError
	switch {
	case errors.As(err, &es) || ctx.Err() != nil:
		return err
	case c.TLS != nil && errors.As(err, &op) && op.Op == "remote error":
		return fmt.Errorf("%s refused this client's TLS certificate: %w", c.Addr, err)
	}
	c.Close()
	c.failed++
	if c.failed > retries {
		hint := ""
		if c.TLS == nil && errors.Is(err, io.EOF) {
			hint = " (does the server want TLS? then give --tls-cert, --tls-key and --tls-ca)"
		}
		return fmt.Errorf("%s: %d connections in a row failed, the last: %w%s", c.Addr, c.failed, err, hint)
	}
	c.stats.Reconnects++
	c.log().Info("peer connection lost; resuming", "peer", c.Addr, "err", err)
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(min(time.Duration(c.failed)*100*time.Millisecond, 2*time.Second)):
	}
	return nil
}

// List fetches the entries at and under p on the server.
func (c *Client) List(ctx context.Context, p string) ([]Entry, error) {
	if err := checkPath(p); err != nil {
		return nil, err
	}
	var out []Entry
	err := c.do(ctx, func() error {
		out = out[:0]
		if err := writeJSON(c.w, request{Op: "list", Path: p}); err != nil {
			return err
		}
		if err := c.w.Flush(); err != nil {
			return err
		}
		for {
			var e Entry
			if err := readJSON(c.r, &e); err != nil {
				return err
			}
			switch {
			case e.Error != "":
				return errServer{e.Error}
			case e.End:
				return nil
			}
			out = append(out, e)
		}
	})
	return out, err
}

// Pull copies the path p of the server (a file or a tree) into the
// directory dir, as dir/<base of p> ("" or "." : the whole shared tree,
// into dir). Files are written as <name>.tierfs-part and renamed into
// place once every chunk is verified against one version of the file.
func (c *Client) Pull(ctx context.Context, p, dir string) (Stats, error) {
	c.stats = Stats{}
	entries, err := c.List(ctx, p)
	if err != nil {
		return c.stats, err
	}
	dfd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return c.stats, err
	}
	defer unix.Close(dfd)
	strip := path.Dir(p)
	if p == "" || p == "." {
		strip = "."
	}
	local := func(e Entry) (string, error) {
		rel := e.Path
		if strip != "." {
			if !strings.HasPrefix(rel, strip+"/") {
				return "", fmt.Errorf("the server listed %q under %q", e.Path, p)
			}
			rel = strings.TrimPrefix(rel, strip+"/")
		}
		if err := checkPath(rel); err != nil || rel == "" || rel == "." {
			return "", fmt.Errorf("the server listed a bad path %q", e.Path)
		}
		return rel, nil
	}
	var dirs []Entry
	for _, e := range entries {
		if strip == "." && (e.Path == "" || e.Path == ".") && e.Kind == KindDir {
			continue // the shared root itself: dir
		}
		rel, err := local(e)
		if err != nil {
			return c.stats, err
		}
		switch e.Kind {
		case KindDir:
			if err := mkdirBeneath(dfd, rel); err != nil {
				return c.stats, err
			}
			dirs = append(dirs, e)
			c.stats.Dirs++
		case KindSymlink:
			if err := symlinkBeneath(dfd, rel, e.Target); err != nil {
				return c.stats, err
			}
			c.stats.Symlinks++
		case KindFile:
			took := false
			if c.TakeOver != nil && e.Remote != nil {
				if took, err = c.TakeOver(ctx, rel, e); err != nil {
					return c.stats, fmt.Errorf("take over %s: %w", rel, err)
				}
			}
			if took {
				c.stats.TakenOver++
				if pfd, base, err := parentBeneath(dfd, rel); err == nil {
					unix.Unlinkat(pfd, base+PartSuffix, 0) // of an earlier pull of its bytes
					unix.Close(pfd)
				}
			} else if err := c.pullFile(ctx, dfd, rel, e); err != nil {
				return c.stats, err
			}
			c.stats.Files++
			c.stats.Bytes += e.Size
			if e.State == "remote" {
				c.stats.Evicted++
			}
		}
	}
	// Directories last, deepest first: their times change as they fill.
	for i := len(dirs) - 1; i >= 0; i-- {
		rel, _ := local(dirs[i])
		fd, err := beneath.Open(dfd, rel, unix.O_RDONLY|unix.O_DIRECTORY)
		if err != nil {
			return c.stats, fmt.Errorf("%s: %w", rel, err)
		}
		unix.Fchmod(fd, dirs[i].Mode)
		ts := unix.NsecToTimespec(dirs[i].MtimeNs)
		unix.UtimesNanoAt(fd, "", []unix.Timespec{ts, ts}, unix.AT_EMPTY_PATH)
		err = unix.Fsync(fd)
		unix.Close(fd)
		if err != nil {
			return c.stats, fmt.Errorf("%s: %w", rel, err)
		}
	}
	return c.stats, nil
}

// parentBeneath opens the directory that holds rel, beneath dfd.
func parentBeneath(dfd int, rel string) (int, string, error) {
	d, base := path.Split(rel)
	fd, err := beneath.Open(dfd, path.Clean(d), unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		return -1, "", fmt.Errorf("%s: %w", rel, err)
	}
	return fd, base, nil
}

func mkdirBeneath(dfd int, rel string) error {
	pfd, base, err := parentBeneath(dfd, rel)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	err = unix.Mkdirat(pfd, base, 0o700)
	if errors.Is(err, unix.EEXIST) {
		var st unix.Stat_t
		if err = unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil && st.Mode&unix.S_IFMT != unix.S_IFDIR {
			err = fmt.Errorf("it exists and is not a directory")
		}
	}
	if err != nil {
		return fmt.Errorf("%s: %w", rel, err)
	}
	return nil
}

func symlinkBeneath(dfd int, rel, target string) error {
	pfd, base, err := parentBeneath(dfd, rel)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	tmp := base + PartSuffix
	unix.Unlinkat(pfd, tmp, 0)
	if err := unix.Symlinkat(target, pfd, tmp); err != nil {
		return fmt.Errorf("%s: %w", rel, err)
	}
	if err := unix.Renameat(pfd, tmp, pfd, base); err != nil {
		return fmt.Errorf("%s: %w", rel, err)
	}
	return nil
}

// pullFile copies one file: every chunk, confirmed by CRC under one
// version of the file, into rel.tierfs-part, then renamed to rel.
func (c *Client) pullFile(ctx context.Context, dfd int, rel string, e Entry) error {
	pfd, base, err := parentBeneath(dfd, rel)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	part := base + PartSuffix
	fd, err := unix.Openat(pfd, part, unix.O_RDWR|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("%s: %w", rel+PartSuffix, err)
	}
	defer unix.Close(fd)
	var pst unix.Stat_t
	if err := unix.Fstat(fd, &pst); err != nil {
		return err
	}
	// What the part file holds from an earlier pull is checked chunk by
	// chunk against the server, not trusted.
	held := pst.Size
	size, ver, mtime := e.Size, e.Version, e.MtimeNs
	// mine[i] is the CRC of chunk i as this pull wrote it.
	mine := map[int64]uint32{}
	maxPasses := c.MaxPasses
	if maxPasses == 0 {
		maxPasses = 5
	}
	for pass := 1; ; pass++ {
		if ver == "" {
			h, err := c.probe(ctx, e.Path)
			if err != nil {
				return err
			}
			size, ver, mtime = h.Size, h.Version, h.MtimeNs
		}
		stale := false
		r, err := c.runPass(ctx, fd, e.Path, size, ver, held, mine, rel+PartSuffix)
		switch {
		case err != nil:
			return err
		case r.changed:
			size, ver, mtime, stale = r.h.Size, r.h.Version, r.h.MtimeNs, true
		case r.stale:
			ver, stale = "", true
		}
		if !stale {
			break
		}
		if pass >= maxPasses {
			return fmt.Errorf("%s: it changed while it was sent, %d times; stop its writers or pull again", e.Path, pass)
		}
		c.stats.Resent++
	}
	if err := unix.Ftruncate(fd, size); err != nil {
		return fmt.Errorf("%s: %w", rel+PartSuffix, err)
	}
	unix.Fchmod(fd, e.Mode)
	ts := unix.NsecToTimespec(mtime)
	if err := unix.UtimesNanoAt(fd, "", []unix.Timespec{ts, ts}, unix.AT_EMPTY_PATH); err != nil {
		return fmt.Errorf("%s: %w", rel+PartSuffix, err)
	}
	if err := unix.Fsync(fd); err != nil {
		return fmt.Errorf("%s: %w", rel+PartSuffix, err)
	}
	if err := unix.Renameat(pfd, part, pfd, base); err != nil {
		return fmt.Errorf("%s: %w", rel, err)
	}
	return nil
}

// probe learns the current size and version of a file: the listing of
// the file alone.
func (c *Client) probe(ctx context.Context, p string) (header, error) {
	es, err := c.List(ctx, p)
	if err != nil {
		return header{}, err
	}
	if len(es) != 1 || es[0].Kind != KindFile {
		return header{}, errServer{fmt.Sprintf("%s: no longer a file on the server", p)}
	}
	return header{Size: es[0].Size, Version: es[0].Version, MtimeNs: es[0].MtimeNs}, nil
}

// window is how many chunks a pass asks for ahead of the one it
// receives: the server checksums and sends the next ones while the
// client checks and writes this one.
const window = 3

type inflight struct {
	off, n int64
	have   *uint32
}

// passResult is how a pass over a file ended.
type passResult struct {
	changed bool   // the file is at another version: h says which
	stale   bool   // it changed while sent (or a chunk was damaged): learn its version again
	h       header // with changed
}

// runPass asks for every chunk of version ver of p (a window of them at
// a time), writes each at its offset of fd once its CRC matches, and
// notes it in mine. A chunk the client holds already (mine, or the part
// file's first held bytes) is checked by CRC on the server, not sent.
// A broken connection is redialled and the pass goes on from the chunk
// it was in.
func (c *Client) runPass(ctx context.Context, fd int, p string, size int64, ver string, held int64, mine map[int64]uint32, partName string) (passResult, error) {
	chunk := c.chunk()
	var queue []inflight
	next, done := int64(0), int64(0)
	for done < size {
		err := c.connect(ctx)
		for err == nil && len(queue) < window && next < size {
			q := inflight{off: next, n: min(chunk, size-next)}
			if crc, ok := mine[q.off]; ok {
				q.have = &crc
			} else if q.off+q.n <= held {
				crc, lerr := localCRC(fd, q.off, q.n, &c.buf)
				if lerr != nil {
					return passResult{}, fmt.Errorf("%s: %w", partName, lerr)
				}
				q.have = &crc
			}
			err = writeJSON(c.w, request{Op: "read", Path: p, Off: q.off, Len: q.n, Version: ver, Have: q.have})
			queue = append(queue, q)
			next += q.n
		}
		if err == nil {
			err = c.w.Flush()
		}
		var r chunkResult
		if err == nil {
			r, err = c.receive(fd, p, queue[0].off, queue[0].n, true)
		}
		if err != nil {
			if err := c.retry(ctx, err); err != nil {
				return passResult{}, err
			}
			queue, next = nil, done // ask again from the chunk it was in
			continue
		}
		c.failed = 0
		q := queue[0]
		queue = queue[1:]
		if r.changed || r.bad || r.after != ver {
			// What is still asked for is of the old version: read it
			// off, or drop the connection.
			for _, o := range queue {
				if _, err := c.receive(fd, p, o.off, o.n, false); err != nil {
					c.Close()
					break
				}
			}
			if r.changed {
				return passResult{changed: true, h: r.h}, nil
			}
			if !r.bad {
				mine[q.off] = r.h.CRC
			}
			return passResult{stale: true}, nil
		}
		mine[q.off] = r.h.CRC
		if r.h.Same {
			c.stats.Kept += q.n
		}
		done = q.off + q.n
		if c.Progress != nil {
			c.Progress(p, done, size)
		}
	}
	return passResult{}, nil
}

// chunkResult is what became of one chunk.
type chunkResult struct {
	h       header
	changed bool   // the file is not at the version asked for: h says what it is now
	bad     bool   // the bytes failed their CRC (the file changed as they were sent)
	after   string // the file's version once the chunk was sent
}

// receive reads the answer to a read of n bytes at off of p and, when
// write is set, writes the bytes at off of fd once their CRC matches.
func (c *Client) receive(fd int, p string, off, n int64, write bool) (chunkResult, error) {
	var r chunkResult
	h := &r.h
	if err := readJSON(c.r, h); err != nil {
		return r, err
	}
	switch {
	case h.Error != "":
		return r, errServer{h.Error}
	case h.Changed:
		r.changed = true
		return r, nil
	case !h.Same && h.Len != n:
		return r, errServer{fmt.Sprintf("%s: asked for %d bytes at %d, the server sends %d", p, n, off, h.Len)}
	}
	if !h.Same {
		if int64(cap(c.buf)) < n {
			c.buf = make([]byte, n)
		}
		b := c.buf[:n]
		if _, err := io.ReadFull(c.r, b); err != nil {
			return r, err
		}
		c.stats.Received += n
		switch {
		case !write:
		case crc32.Checksum(b, castagnoli) != h.CRC:
			// The file changed between the server's checksum and its
			// send, or the bytes were damaged on the way.
			c.log().Info("chunk failed its CRC; asking again", "path", p, "off", off)
			r.bad = true
		default:
			if _, err := unix.Pwrite(fd, b, off); err != nil {
				return r, errServer{fmt.Sprintf("write %s at %d: %v", p, off, err)}
			}
		}
	}
	var t trailer
	if err := readJSON(c.r, &t); err != nil {
		return r, err
	}
	r.after = t.Version
	return r, nil
}

// localCRC is the CRC32C of n bytes at off of fd.
func localCRC(fd int, off, n int64, buf *[]byte) (uint32, error) {
	if int64(cap(*buf)) < n {
		*buf = make([]byte, n)
	}
	b := (*buf)[:n]
	got, err := unix.Pread(fd, b, off)
	if err != nil {
		return 0, err
	}
	return crc32.Checksum(b[:got], castagnoli), nil
}
