// Package control is the channel between a running mount and the tierfs
// commands that ask it to do something now (ship, evict) or say how it is
// doing (last errors). It is a Unix socket in the abstract namespace,
// named after the mount point, so it needs no file inside the mount
// (whose state dir is hidden) and vanishes with the process. Only root
// and the user running the mount may use it (checked by peer
// credentials). Requests and replies are JSON lines.
package control

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Request asks the mount to act on paths relative to the mount point.
type Request struct {
	Op    string   `json:"op"` // ship, evict, status, or one the Handler's Call knows
	Paths []string `json:"paths,omitempty"`
	// Args are the arguments of an op answered by Handler.Call.
	Args json.RawMessage `json:"args,omitempty"`
}

// Event is one line of a reply: progress of a path, its end (state or
// error), or the mount's status.
type Event struct {
	Path   string          `json:"path,omitempty"`
	Done   int64           `json:"done,omitempty"`
	Total  int64           `json:"total,omitempty"`
	State  string          `json:"state,omitempty"` // set when the path is finished
	Error  string          `json:"error,omitempty"` // set when it failed
	Status json.RawMessage `json:"status,omitempty"`
	End    bool            `json:"end,omitempty"` // the last line
}

// Handler does what requests ask.
type Handler interface {
	// Do runs op (ship or evict) on rel and returns its state after.
	Do(ctx context.Context, op, rel string, progress func(done, total int64)) (state string, err error)
	// Status is the mount's status, as JSON.
	Status() any
	// Call answers any other op; its result is sent as the reply's
	// Status.
	Call(ctx context.Context, op string, args json.RawMessage) (any, error)
}

// Address is the socket name of the mount at mountpoint.
func Address(mountpoint string) (string, error) {
	abs, err := filepath.Abs(mountpoint)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256([]byte(filepath.Clean(abs)))
	return fmt.Sprintf("@tierfs/%x", sum[:16]), nil
}

// Server answers requests for one mount.
type Server struct {
	l   net.Listener
	h   Handler
	log *slog.Logger
	wg  sync.WaitGroup
	// ctx ends with Close: running operations stop.
	ctx    context.Context
	cancel context.CancelFunc
}

// Listen starts answering requests for the mount at mountpoint.
func Listen(mountpoint string, h Handler, log *slog.Logger) (*Server, error) {
	addr, err := Address(mountpoint)
	if err != nil {
		return nil, err
	}
	l, err := net.Listen("unix", addr)
	if err != nil {
		return nil, fmt.Errorf("control socket for %s: %w", mountpoint, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{l: l, h: h, log: log, ctx: ctx, cancel: cancel}
	s.wg.Add(1)
	go s.accept()
	return s, nil
}

// Close stops listening and stops running operations.
func (s *Server) Close() error {
	err := s.l.Close()
	s.cancel()
	s.wg.Wait()
	return err
}

func (s *Server) accept() {
	defer s.wg.Done()
	for {
		c, err := s.l.Accept()
		if err != nil {
			return
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer c.Close()
			if err := s.serve(c.(*net.UnixConn)); err != nil {
				s.log.Warn("control request", "err", err)
			}
		}()
	}
}

// allowed checks the peer is root or the user running the mount.
func allowed(c *net.UnixConn) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) { cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil {
		return err
	}
	if cerr != nil {
		return cerr
	}
	if cred.Uid != 0 && int(cred.Uid) != os.Getuid() {
		return fmt.Errorf("uid %d may not control this mount", cred.Uid)
	}
	return nil
}

func (s *Server) serve(c *net.UnixConn) error {
	enc := json.NewEncoder(c)
	var mu sync.Mutex
	emit := func(e Event) {
		mu.Lock()
		defer mu.Unlock()
		enc.Encode(e)
	}
	// The request is read before the peer is judged, so a refused client
	// gets its refusal rather than a broken pipe on its write.
	r := bufio.NewReaderSize(c, 4096)
	c.SetReadDeadline(time.Now().Add(requestTimeout))
	line, err := readLine(r, maxRequest)
	c.SetReadDeadline(time.Time{})
	if aerr := allowed(c); aerr != nil {
		emit(Event{Error: aerr.Error(), End: true})
		return aerr
	}
	if err != nil {
		emit(Event{Error: "bad request: " + err.Error(), End: true})
		return err
	}
	var req Request
	if err := json.Unmarshal(line, &req); err != nil {
		emit(Event{Error: "bad request: " + err.Error(), End: true})
		return nil
	}
	// The client going away (Ctrl-C) stops the work; what was sent is
	// kept and resumed by the next attempt.
	ctx, cancel := context.WithCancel(s.ctx)
	defer cancel()
	go func() {
		r.ReadByte()
		cancel()
	}()
	switch req.Op {
	case "status":
		b, err := json.Marshal(s.h.Status())
		if err != nil {
			emit(Event{Error: err.Error(), End: true})
			return nil
		}
		emit(Event{Status: b, End: true})
	case "ship", "evict", "hydrate":
		for _, p := range req.Paths {
			st, err := s.h.Do(ctx, req.Op, p, func(done, total int64) { emit(Event{Path: p, Done: done, Total: total}) })
			ev := Event{Path: p, State: st}
			if err != nil {
				ev.Error = err.Error()
			}
			emit(ev)
		}
		emit(Event{End: true})
	default:
		res, err := s.h.Call(ctx, req.Op, req.Args)
		if err != nil {
			emit(Event{Error: err.Error(), End: true})
			return nil
		}
		b, err := json.Marshal(res)
		if err != nil {
			emit(Event{Error: err.Error(), End: true})
			return nil
		}
		emit(Event{Status: b, End: true})
	}
	return nil
}

const (
	// A request is a few paths; 1 MiB is far above any real one and
	// bounds what a peer can make the mount buffer.
	maxRequest = 1 << 20
	// How long a connected peer may take to send its request line.
	requestTimeout = 10 * time.Second
)

// readLine reads one newline-terminated line of at most max bytes.
func readLine(r *bufio.Reader, max int) ([]byte, error) {
	var line []byte
	for {
		chunk, err := r.ReadSlice('\n')
		line = append(line, chunk...)
		if len(line) > max {
			return nil, fmt.Errorf("request longer than %d bytes", max)
		}
		if err == bufio.ErrBufferFull {
			continue
		}
		return line, err
	}
}

// ErrNoMount means nothing answers for the mount point: it is not a
// tierfs mount, or its process is gone.
var ErrNoMount = errors.New("no tierfs mount answers there")

// Call sends req to the mount at mountpoint and hands each event to fn
// until the last.
func Call(ctx context.Context, mountpoint string, req Request, fn func(Event)) error {
	addr, err := Address(mountpoint)
	if err != nil {
		return err
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", addr)
	if err != nil {
		return fmt.Errorf("%s: %w (%v)", mountpoint, ErrNoMount, err)
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	b, _ := json.Marshal(req)
	// A failed write is not the answer: the mount may have replied (a
	// refusal) and closed, and that reply says more than EPIPE.
	_, werr := c.Write(append(b, '\n'))
	dec := json.NewDecoder(c)
	for {
		var e Event
		if err := dec.Decode(&e); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if werr != nil {
				return fmt.Errorf("%s: sending the request: %w", mountpoint, werr)
			}
			return fmt.Errorf("%s: the mount stopped answering: %w", mountpoint, err)
		}
		if e.End {
			if e.Error != "" {
				return errors.New(e.Error)
			}
			if e.Status != nil {
				fn(e)
			}
			return nil
		}
		fn(e)
	}
}
