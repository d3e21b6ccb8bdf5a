package peer

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"net"
	"os"
	"path"
	"path/filepath"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tierfs/tierfs/internal/beneath"
)

// maxChunk bounds what one read may ask for.
const maxChunk = 64 << 20

// Server shares the tree under Root.
type Server struct {
	Root string
	// TLS, when set, is required of every connection (see ServerTLS:
	// clients must present a certificate the CA signed). Without it the
	// server sends with sendfile.
	TLS *tls.Config
	Log *slog.Logger

	// beforeChunk, when set (tests), runs before each chunk is read.
	beforeChunk func(path string, off int64)

	sent     atomic.Int64 // payload bytes sent
	rootFd   int
	openOnce sync.Once
	openErr  error
}

// BytesSent is the file bytes sent so far.
func (s *Server) BytesSent() int64 { return s.sent.Load() }

func (s *Server) log() *slog.Logger {
	if s.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return s.Log
}

func (s *Server) open() error {
	s.openOnce.Do(func() {
		s.rootFd, s.openErr = unix.Open(s.Root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if s.openErr != nil {
			s.openErr = fmt.Errorf("serve %s: %w", s.Root, s.openErr)
		}
	})
	return s.openErr
}

// Serve answers connections on ln until ctx ends or ln fails.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	if err := s.open(); err != nil {
		return err
	}
	defer unix.Close(s.rootFd)
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			cc := context.AfterFunc(ctx, func() { c.Close() })
			defer cc()
			if err := s.serveConn(c); err != nil && !errors.Is(err, io.EOF) && ctx.Err() == nil {
				s.log().Warn("peer connection ended", "peer", c.RemoteAddr().String(), "err", err)
			}
		}()
	}
}

func (s *Server) serveConn(raw net.Conn) error {
	var c net.Conn = raw
	if s.TLS != nil {
		tc := tls.Server(raw, s.TLS)
		raw.SetDeadline(time.Now().Add(30 * time.Second))
		if err := tc.Handshake(); err != nil {
			s.log().Warn("refused peer", "peer", raw.RemoteAddr().String(), "err", err)
			return nil
		}
		raw.SetDeadline(time.Time{})
		c = tc
	}
	r := bufio.NewReaderSize(c, 64<<10)
	w := bufio.NewWriterSize(c, 64<<10)
	var buf []byte // TLS: a chunk's bytes
	for {
		var req request
		if err := readJSON(r, &req); err != nil {
			return err
		}
		if err := checkPath(req.Path); err != nil {
			writeJSON(w, header{Error: err.Error()})
			return w.Flush()
		}
		var err error
		switch req.Op {
		case "list":
			err = s.list(w, req.Path)
		case "read":
			err = s.read(c, w, req, &buf)
		default:
			writeJSON(w, header{Error: fmt.Sprintf("unknown op %q", req.Op)})
			return w.Flush()
		}
		if err == nil {
			err = w.Flush()
		}
		if err != nil {
			return err
		}
	}
}

func version(st *unix.Stat_t) string {
	return fmt.Sprintf("%d:%d:%d:%d", st.Size, st.Mtim.Nano(), st.Ctim.Nano(), st.Ino)
}

// list sends the entries at and under p, parents before children, then
// an end line (or an error line).
func (s *Server) list(w *bufio.Writer, p string) error {
	err := s.walk(p, func(e Entry) error { return writeJSON(w, e) })
	if err != nil {
		return writeJSON(w, Entry{Error: err.Error()})
	}
	return writeJSON(w, Entry{End: true})
}

func (s *Server) walk(p string, emit func(Entry) error) error {
	fd, err := beneath.Open(s.rootFd, p, unix.O_PATH|unix.O_NOFOLLOW)
	if err != nil {
		return fmt.Errorf("%s: %w", p, err)
	}
	var st unix.Stat_t
	err = unix.Fstat(fd, &st)
	unix.Close(fd)
	if err != nil {
		return fmt.Errorf("%s: %w", p, err)
	}
	e, err := s.entry(p, &st)
	if err != nil {
		return err
	}
	if err := emit(e); err != nil {
		return err
	}
	if e.Kind != KindDir {
		return nil
	}
	dfd, err := beneath.Open(s.rootFd, p, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW)
	if err != nil {
		return fmt.Errorf("%s: %w", p, err)
	}
	d := os.NewFile(uintptr(dfd), p)
	names, err := d.Readdirnames(-1)
	if err != nil {
		d.Close()
		return fmt.Errorf("%s: %w", p, err)
	}
	slices.Sort(names)
	var dirs []string
	for _, name := range names {
		child := path.Join(p, name)
		if p == "" || p == "." {
			child = name
		}
		var cst unix.Stat_t
		if err := unix.Fstatat(dfd, name, &cst, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			if errors.Is(err, unix.ENOENT) {
				continue // gone since the listing
			}
			d.Close()
			return fmt.Errorf("%s: %w", child, err)
		}
		if cst.Mode&unix.S_IFMT == unix.S_IFDIR {
			dirs = append(dirs, child)
			continue
		}
		ce, err := s.entry(child, &cst)
		if err != nil {
			d.Close()
			return err
		}
		if ce.Kind == "" {
			continue // sockets, fifos, devices: not copied
		}
		if err := emit(ce); err != nil {
			d.Close()
			return err
		}
	}
	d.Close()
	for _, c := range dirs {
		if err := s.walk(c, emit); err != nil {
			return err
		}
	}
	return nil
}

// entry describes p; Kind is empty for what is not copied.
func (s *Server) entry(p string, st *unix.Stat_t) (Entry, error) {
	e := Entry{Path: p, Mode: st.Mode & 0o7777, MtimeNs: st.Mtim.Nano()}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		e.Kind = KindDir
	case unix.S_IFREG:
		e.Kind, e.Size, e.Version = KindFile, st.Size, version(st)
		e.State = xattr(filepath.Join(s.Root, p), "user.tierfs.state")
		if e.State == "remote" {
			e.Remote = remoteCopy(filepath.Join(s.Root, p))
		}
	case unix.S_IFLNK:
		e.Kind = KindSymlink
		buf := make([]byte, 4096)
		dir, base := path.Split(p)
		dfd, err := beneath.Open(s.rootFd, path.Clean(dir), unix.O_PATH|unix.O_DIRECTORY)
		if err != nil {
			return e, fmt.Errorf("%s: %w", p, err)
		}
		n, err := unix.Readlinkat(dfd, base, buf)
		unix.Close(dfd)
		if err != nil {
			return e, fmt.Errorf("%s: %w", p, err)
		}
		e.Target = string(buf[:n])
	}
	return e, nil
}

// remoteCopy is a tierfs file's user.tierfs.remote, or nil (none, or too
// long for a listing line).
func remoteCopy(p string) json.RawMessage {
	n, err := unix.Lgetxattr(p, "user.tierfs.remote", nil)
	if err != nil || n <= 0 || n > maxLine/2 {
		return nil
	}
	buf := make([]byte, n)
	n, err = unix.Lgetxattr(p, "user.tierfs.remote", buf)
	if err != nil || !json.Valid(buf[:n]) {
		return nil
	}
	return buf[:n]
}

func xattr(p, name string) string {
	buf := make([]byte, 64)
	n, err := unix.Lgetxattr(p, name, buf)
	if err != nil {
		return ""
	}
	return string(buf[:n])
}

// read answers one read request: a header, the chunk's bytes unless the
// client has them, and a trailer with the file's version after.
func (s *Server) read(c net.Conn, w *bufio.Writer, req request, buf *[]byte) error {
	fail := func(err error) error { return writeJSON(w, header{Error: fmt.Sprintf("%s: %v", req.Path, err)}) }
	if req.Len <= 0 || req.Len > maxChunk || req.Off < 0 {
		return fail(fmt.Errorf("bad range %d+%d", req.Off, req.Len))
	}
	fd, err := beneath.Open(s.rootFd, req.Path, unix.O_RDONLY|unix.O_NOFOLLOW)
	if err != nil {
		return fail(err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fail(err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return fail(errors.New("not a regular file"))
	}
	ver := version(&st)
	changed := header{Changed: true, Version: ver, Size: st.Size, MtimeNs: st.Mtim.Nano()}
	if ver != req.Version || req.Off >= st.Size {
		return writeJSON(w, changed)
	}
	if s.beforeChunk != nil {
		s.beforeChunk(req.Path, req.Off)
	}
	n := min(req.Len, st.Size-req.Off)
	var crc uint32
	if s.TLS != nil {
		if int64(cap(*buf)) < n {
			*buf = make([]byte, n)
		}
		b := (*buf)[:n]
		got, err := unix.Pread(fd, b, req.Off)
		if err != nil {
			return fail(err)
		}
		if int64(got) < n {
			return writeJSON(w, changed) // shrank
		}
		crc = crc32.Checksum(b, castagnoli)
	} else {
		var ok bool
		crc, ok, err = mappedCRC(fd, req.Off, n)
		if err != nil {
			return fail(err)
		}
		if !ok {
			return writeJSON(w, changed) // shrank under the mapping
		}
	}
	if req.Have != nil && *req.Have == crc {
		if err := writeJSON(w, header{Same: true, CRC: crc, Version: ver}); err != nil {
			return err
		}
		return s.trailer(w, fd)
	}
	if err := writeJSON(w, header{Len: n, CRC: crc, Version: ver}); err != nil {
		return err
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if s.TLS != nil {
		if _, err := c.Write((*buf)[:n]); err != nil {
			return err
		}
	} else if err := sendfile(c, fd, req.Off, n); err != nil {
		return err
	}
	s.sent.Add(n)
	return s.trailer(w, fd)
}

func (s *Server) trailer(w *bufio.Writer, fd int) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	return writeJSON(w, trailer{Version: version(&st)})
}

// mappedCRC is the CRC32C of n bytes at off of fd, read through a
// mapping (no copy). ok is false if the file shrank under it: the fault
// that gives is recovered, not a crash.
func mappedCRC(fd int, off, n int64) (crc uint32, ok bool, err error) {
	page := int64(os.Getpagesize())
	start := off / page * page
	m, err := unix.Mmap(fd, start, int(off-start+n), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return 0, false, err
	}
	defer unix.Munmap(m)
	unix.Madvise(m, unix.MADV_SEQUENTIAL)
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			if _, fault := r.(interface{ Addr() uintptr }); !fault {
				panic(r)
			}
			crc, ok, err = 0, false, nil
		}
	}()
	return crc32.Checksum(m[off-start:], castagnoli), true, nil
}

// sendfile writes n bytes at off of fd to c without copying them through
// user space. Should the file have shrunk, zeros make up the count (the
// CRC and the trailer tell the client).
func sendfile(c net.Conn, fd int, off, n int64) error {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		k, err := io.Copy(c, io.NewSectionReader(fdReader(fd), off, n))
		if err == nil && k < n {
			_, err = c.Write(make([]byte, n-k))
		}
		return err
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return err
	}
	left := n
	var serr error
	err = rc.Write(func(sock uintptr) bool {
		for left > 0 {
			k, err := unix.Sendfile(int(sock), fd, &off, int(min(left, 1<<30)))
			if k > 0 {
				left -= int64(k)
			}
			switch {
			case errors.Is(err, unix.EAGAIN):
				return false // wait until the socket can take more
			case errors.Is(err, unix.EINTR):
				continue
			case err != nil:
				serr = err
				return true
			case k == 0:
				return true // end of file: shrank
			}
		}
		return true
	})
	if err == nil {
		err = serr
	}
	if err == nil && left > 0 {
		_, err = c.Write(make([]byte, left))
	}
	return err
}

// fdReader reads a descriptor at offsets (it does not own it).
type fdReader int

func (f fdReader) ReadAt(p []byte, off int64) (int, error) {
	n, err := unix.Pread(int(f), p, off)
	if err == nil && n < len(p) {
		err = io.EOF
	}
	return max(n, 0), err
}
