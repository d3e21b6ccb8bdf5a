package main

import (
	"errors"
	"fmt"
	"path/filepath"

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
			flags := 0
			if c.Bool("lazy") {
				flags = unix.MNT_DETACH
			}
			if err := unix.Unmount(mp, flags); err != nil {
				if errors.Is(err, unix.EBUSY) {
					return fmt.Errorf("%s is busy: files are open on it (see fuser -vm %s), or use --lazy", mp, mp)
				}
				return fmt.Errorf("unmount %s: %w", mp, err)
			}
			return nil
		},
	}
}
