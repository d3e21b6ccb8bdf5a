package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"time"

	"github.com/urfave/cli/v2"
	"github.com/vbauerster/mpb/v8"
	"github.com/vbauerster/mpb/v8/decor"
	"golang.org/x/sys/unix"

	"github.com/tierfs/tierfs/chunkxfer"
	"github.com/tierfs/tierfs/cm"
	"github.com/tierfs/tierfs/control"
	"github.com/tierfs/tierfs/internal/tiered"
	"github.com/tierfs/tierfs/tiering"
)

// adoptArgs ask a mount to take over an evicted file of another mount of
// its store (tierfs pull): Rel its path from the mount root.
type adoptArgs struct {
	Rel    string          `json:"rel"`
	Remote json.RawMessage `json:"remote"`
	Mode   uint32          `json:"mode"`
}

// adoptReply is the temporary name the file was made under (to rename
// through the mount), or why its bytes must be pulled instead.
type adoptReply struct {
	Tmp      string `json:"tmp,omitempty"`
	Fallback string `json:"fallback,omitempty"`
}

type roleArgs struct {
	Role tiering.Role `json:"role"`
}

func cmdRole() *cli.Command {
	return &cli.Command{
		Name:      "role",
		Usage:     "print or change a mount's role: auto (per partition, from --kafka-bootstrap), or by hand for every partition leader (ships) or follower (maps its segments onto what the leader shipped)",
		ArgsUsage: "MOUNTPOINT [auto|leader|follower]",
		Action: func(c *cli.Context) error {
			if c.NArg() < 1 || c.NArg() > 2 {
				return &exitError{code: 2, err: errors.New("role takes a mount point and, to change it, auto, leader or follower")}
			}
			ctx, cancel := context.WithTimeout(c.Context, 10*time.Second)
			defer cancel()
			var reply roleArgs
			if _, err := callMount(ctx, c.Args().First(), "role", roleArgs{Role: tiering.Role(c.Args().Get(1))}, &reply); err != nil {
				return err
			}
			fmt.Fprintln(c.App.Writer, reply.Role)
			return nil
		},
	}
}

// mountControl answers control requests with the mount's tierer and
// change manager (either may be nil).
type mountControl struct {
	t          *tiering.Tierer
	cm         *cm.Manager
	mountpoint string
}

func (m mountControl) Do(ctx context.Context, op, rel string, progress func(done, total int64)) (string, error) {
	if m.t == nil {
		return "", errors.New("this mount has no remote (mount it with --remote)")
	}
	var st tiered.State
	var err error
	switch op {
	case "ship":
		st, err = m.t.ShipNow(ctx, rel, chunkxfer.Progress(progress))
	case "evict":
		st, err = m.t.EvictNow(ctx, rel, chunkxfer.Progress(progress))
	case "hydrate":
		st, err = m.t.HydrateNow(ctx, rel, chunkxfer.Progress(progress))
	default:
		return "", fmt.Errorf("unknown op %q", op)
	}
	return st.String(), err
}

func (m mountControl) Status() any {
	if m.t == nil {
		return map[string]tiering.PartitionError{}
	}
	return m.t.LastErrors()
}

func (m mountControl) Call(ctx context.Context, op string, args json.RawMessage) (any, error) {
	switch op {
	case "drain":
		var a drainArgs
		if err := json.Unmarshal(args, &a); err != nil {
			return nil, err
		}
		dctx, cancel := context.WithTimeout(ctx, time.Duration(a.TimeoutMs)*time.Millisecond)
		defer cancel()
		var r drainReply
		if m.t != nil {
			var err error
			if r.WasActive, err = m.t.Drain(dctx); err != nil {
				return nil, fmt.Errorf("%d transfers still under way after %v (they resume from their last chunk at the next mount)", m.t.Active(), time.Duration(a.TimeoutMs)*time.Millisecond)
			}
		}
		if m.cm != nil {
			if err := m.cm.Flush(); err != nil {
				return nil, err
			}
		}
		return r, nil
	case "resume":
		if m.t != nil {
			m.t.Undrain()
		}
		return struct{}{}, nil
	case "adopt":
		if m.t == nil {
			return nil, errors.New("this mount has no remote (mount it with --remote)")
		}
		var a adoptArgs
		if err := json.Unmarshal(args, &a); err != nil {
			return nil, err
		}
		tmp, err := m.t.AdoptRemote(ctx, a.Rel, a.Remote, a.Mode)
		if errors.Is(err, tiering.ErrOtherStore) {
			return adoptReply{Fallback: err.Error()}, nil
		}
		if err != nil {
			return nil, err
		}
		return adoptReply{Tmp: tmp}, nil
	case "returns":
		if m.t == nil {
			return []returnCount{}, nil
		}
		return returnCounts(m.t.Counters()), nil
	case "role":
		if m.t == nil {
			return nil, errors.New("this mount has no remote (mount it with --remote)")
		}
		var a roleArgs
		if err := json.Unmarshal(args, &a); err != nil {
			return nil, err
		}
		if a.Role != "" {
			if err := m.t.SetRole(a.Role); err != nil {
				return nil, err
			}
		}
		return roleArgs{Role: m.t.Role()}, nil
	case "partitions":
		var a partitionsArgs
		if err := json.Unmarshal(args, &a); err != nil {
			return nil, err
		}
		return partitionInfos(m.t, a)
	case "summary":
		if m.t == nil {
			return nil, errors.New("this mount has no remote (mount it with --remote)")
		}
		return m.t.Summary()
	}
	return cmCall(ctx, m.cm, m.mountpoint, op, args)
}

// returnCount is what brought evicted segments back to local disk since
// the mount started, for one cause (tierfs status).
type returnCount struct {
	Cause    string `json:"cause"`
	Moves    int64  `json:"moves"` // started (0 for hydrate: not a move)
	Segments int64  `json:"segments"`
	Bytes    int64  `json:"bytes"`
}

func returnCounts(c *tiering.Counters) []returnCount {
	out := make([]returnCount, 0, tiered.NumCauses)
	for cause := range tiered.NumCauses {
		out = append(out, returnCount{Cause: cause.String(), Moves: c.Moves[cause].Load(), Segments: c.HydratedSegments[cause].Load(), Bytes: c.HydratedBytes[cause].Load()})
	}
	return out
}

// returns asks the mount at mountpoint what brought segments back; nil
// when it does not answer (not a mount).
func returns(mountpoint string) []returnCount {
	var out []returnCount
	askMount(mountpoint, "returns", &out)
	return out
}

type drainArgs struct {
	TimeoutMs int64 `json:"timeout_ms"`
}

type drainReply struct {
	WasActive int `json:"was_active"` // transfers under way when the drain began
}

func cmdShip() *cli.Command {
	return cmdMove("ship", "ship segments to the store now, whatever their age (they must be rolled, flushed and committed)")
}

func cmdEvict() *cli.Command {
	return cmdMove("evict", "free the local bytes of segments now, shipping them first if needed")
}

func cmdHydrate() *cli.Command {
	return cmdMove("hydrate", "bring the bytes of evicted segments back to local disk (their remote copies stay until the files change)")
}

func cmdMove(op, usage string) *cli.Command {
	return &cli.Command{
		Name:      op,
		Usage:     usage,
		ArgsUsage: "SEGMENT.log...",
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "no-progress", Usage: "no progress bars (the default when stderr is not a terminal)"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() == 0 {
				return &exitError{code: 2, err: fmt.Errorf("%s takes segment files on a tierfs mount", op)}
			}
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, unix.SIGTERM)
			defer stop()
			bars := !c.Bool("no-progress") && isTerminal(os.Stderr)
			return move(ctx, c.App.Writer, c.App.ErrWriter, op, c.Args().Slice(), bars)
		},
	}
}

func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// move asks the mounts holding paths to ship or evict them, printing
// each path's state after (and its progress, with bars).
func move(ctx context.Context, out, errOut io.Writer, op string, paths []string, bars bool) error {
	type group struct {
		paths, rels []string
	}
	byMount := map[string]*group{}
	var order []string
	for _, p := range paths {
		mp, rel, err := control.FindMount(p)
		if err != nil {
			return &exitError{code: 2, err: err}
		}
		g := byMount[mp]
		if g == nil {
			g = &group{}
			byMount[mp] = g
			order = append(order, mp)
		}
		g.paths, g.rels = append(g.paths, p), append(g.rels, rel)
	}
	var prog *mpb.Progress
	if bars {
		prog = mpb.NewWithContext(ctx, mpb.WithOutput(errOut), mpb.WithWidth(40), mpb.WithRefreshRate(150*time.Millisecond))
	}
	failed := 0
	for _, mp := range order {
		g := byMount[mp]
		name := map[string]string{}
		for i, rel := range g.rels {
			name[rel] = g.paths[i]
		}
		barOf := map[string]*mpb.Bar{}
		err := control.Call(ctx, mp, control.Request{Op: op, Paths: g.rels}, func(e control.Event) {
			if prog != nil && e.Total > 0 {
				b := barOf[e.Path]
				if b == nil {
					b = prog.AddBar(e.Total,
						mpb.PrependDecorators(decor.Name(filepath.Base(e.Path), decor.WCSyncSpaceR)),
						mpb.AppendDecorators(decor.CountersKibiByte("% .1f / % .1f"), decor.Name(" "), decor.AverageSpeed(decor.SizeB1024(0), "% .1f")))
					barOf[e.Path] = b
				}
				b.SetCurrent(e.Done)
			}
			if e.State == "" && e.Error == "" {
				return
			}
			if b := barOf[e.Path]; b != nil {
				if e.Error != "" {
					b.Abort(false)
				} else {
					b.SetTotal(-1, true)
				}
			}
			if e.Error != "" {
				failed++
				fmt.Fprintf(out, "%s: %s failed: %s\n", name[e.Path], op, e.Error)
				return
			}
			fmt.Fprintf(out, "%s: %s\n", name[e.Path], e.State)
		})
		if err != nil {
			if prog != nil {
				prog.Shutdown()
			}
			if errors.Is(err, control.ErrNoMount) {
				return &exitError{code: 1, err: fmt.Errorf("%w; is it mounted with --remote?", err)}
			}
			return err
		}
	}
	if prog != nil {
		prog.Wait()
	}
	if failed > 0 {
		return &exitError{code: 1, err: fmt.Errorf("%d of %d segments failed", failed, len(paths))}
	}
	return nil
}

// lastErrors asks the mount at mountpoint for its partitions' last
// errors; none when it does not answer (not a mount, or no remote).
func lastErrors(mountpoint string) map[string]tiering.PartitionError {
	var out map[string]tiering.PartitionError
	askMount(mountpoint, "status", &out)
	return out
}

// askMount puts the running mount's answer to op into out; out stays as
// it is when nothing answers within 2 s (not a mount).
func askMount(mountpoint, op string, out any) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	control.Call(ctx, mountpoint, control.Request{Op: op}, func(e control.Event) {
		json.Unmarshal(e.Status, out)
	})
}
