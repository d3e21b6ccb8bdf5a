package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/tierfs/tierfs/cm"
	"github.com/tierfs/tierfs/control"
	"github.com/tierfs/tierfs/fs"
	"github.com/tierfs/tierfs/internal/units"
	"github.com/tierfs/tierfs/tiering"
)

// cmFlags are the mount's change management settings.
func cmFlags() []cli.Flag {
	return []cli.Flag{
		&cli.BoolFlag{Name: "cm", Usage: "change management: retain the original of every file deleted, replaced, truncated or overwritten through the mount, with an event log (tierfs cm, tierfs repl)", EnvVars: []string{"TIERFS_CM"}},
		&cli.StringFlag{Name: "cm-root", Usage: "keep retained originals and the event log here (implies --cm; default: the state dir, .tierfs/cm in the backing dir)", EnvVars: []string{"TIERFS_CM_ROOT"}},
		&cli.DurationFlag{Name: "cm-retain", Value: 24 * time.Hour, Usage: "keep retained originals and events this long", EnvVars: []string{"TIERFS_CM_RETAIN"}},
		&cli.StringFlag{Name: "cm-max-bytes", Value: "0", Usage: "keep at most this much of retained originals, oldest go first, e.g. 100GiB (0: no cap)", EnvVars: []string{"TIERFS_CM_MAX_BYTES"}},
		&cli.DurationFlag{Name: "cm-sync-interval", Value: time.Second, Usage: "sync the event log and the cmroot this often (an event reaches the kernel at once: a crash of tierfs loses none; a crash of the machine loses at most this much)", EnvVars: []string{"TIERFS_CM_SYNC_INTERVAL"}},
		&cli.StringSliceFlag{Name: "cm-exclude", Usage: "do not track paths matching this glob (a glob without / matches the file name), e.g. '*.tmp'; repeatable", EnvVars: []string{"TIERFS_CM_EXCLUDE"}},
	}
}

// newChanges makes the change manager the flags ask for (nil: none).
// remote reads evicted files once the tierer exists.
func newChanges(c *cli.Context, remote *remoteFiles) (*cm.Manager, error) {
	if !c.Bool("cm") && c.String("cm-root") == "" {
		return nil, nil
	}
	maxBytes, err := units.ParseSize(c.String("cm-max-bytes"))
	if err != nil {
		return nil, &exitError{code: 2, err: fmt.Errorf("--cm-max-bytes: %w", err)}
	}
	for _, g := range c.StringSlice("cm-exclude") {
		if _, err := filepath.Match(g, ""); err != nil {
			return nil, &exitError{code: 2, err: fmt.Errorf("--cm-exclude %q: %w", g, err)}
		}
	}
	cfg := cm.Config{
		Retain:       c.Duration("cm-retain"),
		SyncInterval: c.Duration("cm-sync-interval"),
		MaxBytes:     maxBytes,
		Exclude:      c.StringSlice("cm-exclude"),
		Hide:         fs.StateDirName,
		Remote:       remote,
	}
	return cm.New(cfg), nil
}

// cmRoot is where the mount m keeps its cmroot.
func cmRoot(c *cli.Context, m *fs.Mounted) (string, error) {
	dir := c.String("cm-root")
	if dir == "" {
		return filepath.Join(m.StateDir, "cm"), nil
	}
	dir, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	if dir == m.Config.Mountpoint || strings.HasPrefix(dir, m.Config.Mountpoint+"/") {
		return "", fmt.Errorf("--cm-root %s is inside the mount: put it in another directory (or leave it unset for the state dir)", dir)
	}
	return dir, nil
}

// fsChanges gives fs the manager, or a true nil without one.
func fsChanges(m *cm.Manager) fs.Changes {
	if m == nil {
		return nil
	}
	return m
}

// beforeFree caches an evicted segment's checksum for cm (nil: no cm).
func beforeFree(m *cm.Manager) func(string) error {
	if m == nil {
		return nil
	}
	return m.CacheSum
}

// remoteFiles lets cm read evicted files through the tierer (none until
// it is set).
type remoteFiles struct{ t *tiering.Tierer }

func (r *remoteFiles) OpenIfRemote(path string) (io.ReaderAt, io.Closer, bool, error) {
	if r.t == nil {
		return nil, nil, false, nil
	}
	rr, ok, err := r.t.OpenIfRemote(path)
	if !ok || err != nil {
		return nil, nil, false, err
	}
	return rr, rr, true, nil
}

// The control ops of change management, and their arguments.
type cmLsArgs struct {
	Path      string `json:"path,omitempty"`
	Since     uint64 `json:"since,omitempty"`
	SinceTime int64  `json:"since_time_ns,omitempty"`
	Limit     int    `json:"limit,omitempty"`
}

type cmRestoreArgs struct {
	Path string `json:"path"`
	At   uint64 `json:"at,omitempty"`
	// AtTime, when set, picks the newest event at or before it.
	AtTime int64  `json:"at_time_ns,omitempty"`
	To     string `json:"to,omitempty"`
}

type cmRestoreReply struct {
	At     uint64        `json:"at"`
	Report cm.LoadReport `json:"report"`
}

type replDumpArgs struct {
	Dir       string `json:"dir"`
	From      uint64 `json:"from,omitempty"`
	To        uint64 `json:"to,omitempty"`
	Bootstrap bool   `json:"bootstrap,omitempty"`
}

type replLoadArgs struct {
	Dir    string `json:"dir"`
	Target string `json:"target"`
}

// cmCall answers the change management ops of the control socket.
func cmCall(ctx context.Context, m *cm.Manager, mountpoint, op string, args json.RawMessage) (any, error) {
	if m == nil {
		return nil, errors.New("this mount has no change management (mount it with --cm)")
	}
	switch op {
	case "cm.flush":
		// Files every original waiting and syncs (bench/cm times a burst
		// of changes with its background work).
		return struct{}{}, m.Flush()
	case "cm.ls":
		var a cmLsArgs
		if err := json.Unmarshal(args, &a); err != nil {
			return nil, err
		}
		var since time.Time
		if a.SinceTime != 0 {
			since = time.Unix(0, a.SinceTime)
		}
		return m.Events(a.Path, a.Since, since, a.Limit)
	case "cm.restore":
		var a cmRestoreArgs
		if err := json.Unmarshal(args, &a); err != nil {
			return nil, err
		}
		at := a.At
		var err error
		switch {
		case a.AtTime != 0:
			at, err = m.EventAt(time.Unix(0, a.AtTime))
		case at == 0:
			at, err = m.RestorePoint(a.Path)
		}
		if err != nil {
			return nil, err
		}
		target := a.To
		if target == "" {
			// In place: written through the mount, so the kernel's
			// caches and the event log see it like any other change.
			target = mountpoint
		}
		rep, err := m.Restore(a.Path, at, target)
		return cmRestoreReply{At: at, Report: rep}, err
	case "repl.dump":
		var a replDumpArgs
		if err := json.Unmarshal(args, &a); err != nil {
			return nil, err
		}
		return m.Dump(a.Dir, a.From, a.To, a.Bootstrap, mountpoint)
	case "repl.load":
		var a replLoadArgs
		if err := json.Unmarshal(args, &a); err != nil {
			return nil, err
		}
		// The mount's own process reads the source through its
		// descriptors (the state dir is hidden behind the mount).
		return cm.Load(a.Dir, a.Target, cm.LoadOptions{Source: m.Root(), CMRoot: m.Dir(), Remote: m.Remote()})
	}
	return nil, fmt.Errorf("unknown op %q", op)
}

// callMount sends op to the mount holding path and decodes its reply
// into out; rel is path relative to the mount.
func callMount(ctx context.Context, path, op string, args, out any) (rel string, err error) {
	mp, rel, err := control.FindMount(path)
	if err != nil {
		return "", &exitError{code: 2, err: err}
	}
	b, err := json.Marshal(args)
	if err != nil {
		return "", err
	}
	err = control.Call(ctx, mp, control.Request{Op: op, Args: b}, func(e control.Event) {
		if e.Status != nil {
			err = json.Unmarshal(e.Status, out)
		}
	})
	return rel, err
}

// parseAt reads an event id or a time (RFC 3339, or a duration ago).
func parseAt(s string) (id uint64, at time.Time, err error) {
	if s == "" {
		return 0, time.Time{}, nil
	}
	if id, err := strconv.ParseUint(s, 10, 64); err == nil {
		return id, time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return 0, t, nil
	}
	if d, err := time.ParseDuration(s); err == nil {
		return 0, time.Now().Add(-d), nil
	}
	return 0, time.Time{}, fmt.Errorf("%q is not an event id, an RFC 3339 time or a duration ago (e.g. 10m)", s)
}

func cmdCM() *cli.Command {
	return &cli.Command{
		Name:  "cm",
		Usage: "change management: what was deleted or overwritten through a mount, and bringing it back",
		Subcommands: []*cli.Command{
			{
				Name:      "ls",
				Usage:     "list the events (and the retained originals) of a mount, or of a path in it",
				ArgsUsage: "PATH",
				Flags: []cli.Flag{
					&cli.StringFlag{Name: "since", Usage: "from this event id, RFC 3339 time or duration ago"},
					&cli.IntFlag{Name: "limit", Value: 1000, Usage: "at most this many (the newest); 0: all"},
					&cli.BoolFlag{Name: "json", Usage: "one JSON object per event"},
				},
				Action: cmLs,
			},
			{
				Name:      "restore",
				Usage:     "bring a file or a directory tree back to its state at an event (default: just before it was last deleted or changed)",
				ArgsUsage: "PATH",
				Flags: []cli.Flag{
					&cli.StringFlag{Name: "at", Usage: "the event id, or a time (RFC 3339, or a duration ago): the newest event at or before it"},
					&cli.StringFlag{Name: "to", Usage: "write it under this directory (at the same relative path) instead of in place"},
				},
				Action: cmRestore,
			},
		},
	}
}

func cmLs(c *cli.Context) error {
	if c.NArg() != 1 {
		return &exitError{code: 2, err: errors.New("cm ls takes one argument: a mount point or a path in it")}
	}
	id, t, err := parseAt(c.String("since"))
	if err != nil {
		return &exitError{code: 2, err: fmt.Errorf("--since: %w", err)}
	}
	p, err := filepath.Abs(c.Args().First())
	if err != nil {
		return err
	}
	var evs []cm.Event
	args := cmLsArgs{Since: id, Limit: c.Int("limit")}
	if !t.IsZero() {
		args.SinceTime = t.UnixNano()
	}
	mp, rel, err := control.FindMount(p)
	if err != nil {
		return &exitError{code: 2, err: err}
	}
	if rel != "." {
		args.Path = rel
	}
	if _, err := callMount(c.Context, mp+"/"+rel, "cm.ls", args, &evs); err != nil {
		return err
	}
	if c.Bool("json") {
		enc := json.NewEncoder(c.App.Writer)
		for _, ev := range evs {
			enc.Encode(ev)
		}
		return nil
	}
	w := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "ID\tTIME\tTYPE\tPATH\tSIZE\tRETAINED AS")
	for _, ev := range evs {
		path := ev.Path
		if ev.To != "" {
			path += " -> " + ev.To
		}
		retained := ev.Name
		if retained == "" {
			retained = "-"
		}
		size := ""
		if ev.Size != 0 || ev.Retains() {
			size = strconv.FormatInt(ev.Size, 10)
		}
		typ := ev.Type
		if ev.Kind == cm.KindDir {
			typ += " dir"
		}
		fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\t%s\n", ev.ID, time.Unix(0, ev.TimeNs).UTC().Format("2006-01-02T15:04:05.000Z"), typ, path, size, retained)
	}
	return w.Flush()
}

func cmRestore(c *cli.Context) error {
	if c.NArg() != 1 {
		return &exitError{code: 2, err: errors.New("cm restore takes one argument: the path to restore (it may not exist now)")}
	}
	id, t, err := parseAt(c.String("at"))
	if err != nil {
		return &exitError{code: 2, err: fmt.Errorf("--at: %w", err)}
	}
	p, err := filepath.Abs(c.Args().First())
	if err != nil {
		return err
	}
	mp, rel, err := control.FindMount(p)
	if err != nil {
		return &exitError{code: 2, err: err}
	}
	if rel == "" || rel == "." {
		return &exitError{code: 2, err: errors.New("restore a path inside the mount, not the mount itself (repl dump --bootstrap and repl load copy a whole tree)")}
	}
	args := cmRestoreArgs{Path: rel, At: id}
	if !t.IsZero() {
		args.AtTime = t.UnixNano()
	}
	if to := c.String("to"); to != "" {
		if args.To, err = filepath.Abs(to); err != nil {
			return err
		}
	}
	var rep cmRestoreReply
	if _, err := callMount(c.Context, mp, "cm.restore", args, &rep); err != nil {
		return err
	}
	where := p
	if args.To != "" {
		where = filepath.Join(args.To, rel)
	}
	fmt.Fprintf(c.App.Writer, "%s: restored to its state at event %d: %d files copied (%s), %d already right, %d entries made, %d removed\n",
		where, rep.At, rep.Report.Copied, bytesHuman(rep.Report.Bytes), rep.Report.Unchanged, rep.Report.Made, rep.Report.Removed)
	return nil
}

func cmdRepl() *cli.Command {
	return &cli.Command{
		Name:  "repl",
		Usage: "replication dumps: the changes between two events, without copying data, and loading them onto a replica",
		Subcommands: []*cli.Command{
			{
				Name:      "dump",
				Usage:     "write a dump of the events --from..--to of the mount at MOUNTPOINT to DIR",
				ArgsUsage: "MOUNTPOINT DIR",
				Flags: []cli.Flag{
					&cli.Uint64Flag{Name: "from", Usage: "the first event (the last dump's --to + 1)"},
					&cli.Uint64Flag{Name: "to", Usage: "the last event (default: the newest)"},
					&cli.BoolFlag{Name: "bootstrap", Usage: "dump the whole tree at --to, for a new replica"},
				},
				Action: func(c *cli.Context) error {
					if c.NArg() != 2 {
						return &exitError{code: 2, err: errors.New("repl dump takes two arguments: the mount point and the dump directory")}
					}
					if !c.Bool("bootstrap") && c.Uint64("from") == 0 {
						return &exitError{code: 2, err: errors.New("repl dump needs --from N (or --bootstrap)")}
					}
					dir, err := filepath.Abs(c.Args().Get(1))
					if err != nil {
						return err
					}
					var h cm.DumpHeader
					if _, err := callMount(c.Context, c.Args().First(), "repl.dump", replDumpArgs{Dir: dir, From: c.Uint64("from"), To: c.Uint64("to"), Bootstrap: c.Bool("bootstrap")}, &h); err != nil {
						return err
					}
					fmt.Fprintf(c.App.Writer, "%s: events %d..%d, %d entries; next dump: --from %d\n", dir, h.From, h.To, h.Files, h.To+1)
					return nil
				},
			},
			{
				Name:      "load",
				Usage:     "bring TARGET to the state of the dump in DIR (each file from the source mount if unchanged, else from its cmroot)",
				ArgsUsage: "DIR TARGET",
				Action: func(c *cli.Context) error {
					if c.NArg() != 2 {
						return &exitError{code: 2, err: errors.New("repl load takes two arguments: the dump directory and the target directory")}
					}
					dir, err := filepath.Abs(c.Args().First())
					if err != nil {
						return err
					}
					target, err := filepath.Abs(c.Args().Get(1))
					if err != nil {
						return err
					}
					h, _, _, err := cm.ReadDump(dir)
					if err != nil {
						return err
					}
					var rep cm.LoadReport
					// The source mount's process reads its own files and
					// cmroot; without it, they are read where the dump
					// says.
					_, err = callMount(c.Context, h.Source, "repl.load", replLoadArgs{Dir: dir, Target: target}, &rep)
					if errors.Is(err, control.ErrNoMount) || (err != nil && strings.Contains(err.Error(), "not a tierfs mount")) {
						rep, err = cm.Load(dir, target, cm.LoadOptions{})
					}
					if err != nil {
						return err
					}
					fmt.Fprintf(c.App.Writer, "%s: at event %d: %d files copied (%s), %d already right, %d entries made, %d removed\n",
						target, h.To, rep.Copied, bytesHuman(rep.Bytes), rep.Unchanged, rep.Made, rep.Removed)
					return nil
				},
			},
		},
	}
}
