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
	// tierfs mount read them from there to send them).
	Evicted    int
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
	retries := c.Retries
	if retries == 0 {
		retries = 10
	}
	for {
		err := c.connect(ctx)
		if err == nil {
			err = fn()
			if err == nil {
				c.failed = 0
				return nil
			}
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
	}
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
			if err := c.pullFile(ctx, dfd, rel, e); err != nil {
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
	chunk := c.chunk()
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
		for off := int64(0); off < size && !stale; off += chunk {
			n := min(chunk, size-off)
			var have *uint32
			if crc, ok := mine[off]; ok {
				have = &crc
			} else if off+n <= held {
				crc, err := localCRC(fd, off, n, &c.buf)
				if err != nil {
					return fmt.Errorf("%s: %w", rel+PartSuffix, err)
				}
				have = &crc
			}
			r, err := c.readChunk(ctx, fd, e.Path, off, n, ver, have)
			switch {
			case err != nil:
				return err
			case r.changed:
				size, ver, mtime = r.h.Size, r.h.Version, r.h.MtimeNs
				stale = true
			case r.bad:
				ver, stale = "", true
			default:
				mine[off] = r.h.CRC
				if r.h.Same {
					c.stats.Kept += n
				}
				if c.Progress != nil {
					c.Progress(e.Path, off+n, size)
				}
				if r.after != ver { // it changed while this chunk was sent
					ver, stale = "", true
				}
			}
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

// chunkResult is what became of one chunk.
type chunkResult struct {
	h       header
	changed bool   // the file is not at the version asked for: h says what it is now
	bad     bool   // the bytes failed their CRC (the file changed as they were sent)
	after   string // the file's version once the chunk was sent
}

// readChunk asks for n bytes at off of version ver and, unless the
// server says the file changed or that the client's chunk (have) is
// right, writes them at off of fd once their CRC matches.
func (c *Client) readChunk(ctx context.Context, fd int, p string, off, n int64, ver string, have *uint32) (chunkResult, error) {
	var r chunkResult
	err := c.do(ctx, func() error {
		r = chunkResult{}
		if err := writeJSON(c.w, request{Op: "read", Path: p, Off: off, Len: n, Version: ver, Have: have}); err != nil {
			return err
		}
		if err := c.w.Flush(); err != nil {
			return err
		}
		h := &r.h
		if err := readJSON(c.r, h); err != nil {
			return err
		}
		switch {
		case h.Error != "":
			return errServer{h.Error}
		case h.Changed:
			r.changed = true
			return nil
		case !h.Same && h.Len != n:
			return errServer{fmt.Sprintf("%s: asked for %d bytes at %d, the server sends %d", p, n, off, h.Len)}
		}
		if !h.Same {
			if int64(cap(c.buf)) < n {
				c.buf = make([]byte, n)
			}
			b := c.buf[:n]
			if _, err := io.ReadFull(c.r, b); err != nil {
				return err
			}
			c.stats.Received += n
			if crc32.Checksum(b, castagnoli) != h.CRC {
				// The file changed between the server's checksum and
				// its send, or the bytes were damaged on the way.
				c.log().Info("chunk failed its CRC; asking again", "path", p, "off", off)
				r.bad = true
			} else if _, err := unix.Pwrite(fd, b, off); err != nil {
				return errServer{fmt.Sprintf("write %s at %d: %v", p, off, err)}
			}
		}
		var t trailer
		if err := readJSON(c.r, &t); err != nil {
			return err
		}
		r.after = t.Version
		return nil
	})
	return r, err
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
