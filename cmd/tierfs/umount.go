package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/tierfs/tierfs/control"
	"github.com/tierfs/tierfs/fs"
	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"
)

func cmdUmount() *cli.Command {
	return &cli.Command{
		Name:      "umount",
		Aliases:   []string{"unmount"},
		Usage:     "unmount a tierfs mount; the serving process then exits",
		ArgsUsage: "MOUNTPOINT",
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "lazy", Aliases: []string{"l"}, Usage: "detach now even if files are open; finish when the last one is closed"},
			&cli.DurationFlag{Name: "wait", Value: 2 * time.Minute, Usage: "wait this long for transfers under way to finish (no new ones start); past it, refuse"},
			&cli.BoolFlag{Name: "force", Usage: "unmount without waiting for transfers (they resume from their last chunk at the next mount)"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return &exitError{code: 2, err: errors.New("umount takes one argument: the mount point")}
			}
			mp, err := filepath.Abs(c.Args().First())
			if err != nil {
				return err
			}
			if fstype, ok := fs.MountedAt(mp); !ok || fstype != "fuse.tierfs" {
				return fmt.Errorf("%s is not a tierfs mount", mp)
			}
			if fs.Dead(mp) {
				// Its process is gone (kill -9, a crash): nothing to
				// drain, nothing to wait for.
				if err := unix.Unmount(mp, unix.MNT_DETACH); err != nil {
					return fmt.Errorf("detach the dead tierfs mount at %s: %w", mp, err)
				}
				fmt.Fprintf(c.App.ErrWriter, "%s: detached a dead tierfs mount (its process had ended without unmounting)\n", mp)
				return nil
			}
			drained, err := drain(c.Context, mp, c.Duration("wait"), c.Bool("force"))
			if err != nil {
				return err
			}
			flags := 0
			if c.Bool("lazy") {
				flags = unix.MNT_DETACH
			}
			if err := unix.Unmount(mp, flags); err != nil {
				if drained {
					resume(mp)
				}
				if errors.Is(err, unix.EBUSY) {
					return fmt.Errorf("%s is busy: files are open on it (see fuser -vm %s), or use --lazy", mp, mp)
				}
				return fmt.Errorf("unmount %s: %w", mp, err)
			}
			return nil
		},
	}
}

// drain asks the mount to start no new transfers and to finish those
// under way (and change management to file and sync what it retained),
// waiting at most wait. drained says the mount must be resumed if the
// unmount then fails. A mount without a control socket (no remote, no
// cm) has nothing to drain.
func drain(ctx context.Context, mp string, wait time.Duration, force bool) (drained bool, err error) {
	if force {
		return false, nil
	}
	ctx, cancel := context.WithTimeout(ctx, wait+10*time.Second)
	defer cancel()
	b, _ := json.Marshal(drainArgs{TimeoutMs: wait.Milliseconds()})
	err = control.Call(ctx, mp, control.Request{Op: "drain", Args: b}, func(control.Event) {})
	switch {
	case errors.Is(err, control.ErrNoMount):
		return false, nil
	case err != nil:
		resume(mp)
		return false, &exitError{code: 1, err: fmt.Errorf("%s not unmounted: %w; wait longer with --wait, or unmount now with --force", mp, err)}
	}
	return true, nil
}

// resume lets a drained mount start transfers again.
func resume(mp string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	control.Call(ctx, mp, control.Request{Op: "resume"}, func(control.Event) {})
}
