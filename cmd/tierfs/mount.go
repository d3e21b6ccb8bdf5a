package main

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/tierfs/tierfs/fs"
	"github.com/urfave/cli/v2"
)

func cmdMount() *cli.Command {
	return &cli.Command{
		Name:      "mount",
		Usage:     "mount a log directory (in place, or a separate backing directory) and serve it in the foreground",
		ArgsUsage: "MOUNTPOINT",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "backing", Usage: "serve this directory at MOUNTPOINT (default: MOUNTPOINT itself, mounted in place)", EnvVars: []string{"TIERFS_BACKING"}},
			&cli.BoolFlag{Name: "passthrough", Value: true, Usage: "let the kernel read and write local files directly (FUSE passthrough, Linux 6.9+)", EnvVars: []string{"TIERFS_PASSTHROUGH"}},
			&cli.DurationFlag{Name: "entry-timeout", Value: time.Second, Usage: "how long the kernel caches names", EnvVars: []string{"TIERFS_ENTRY_TIMEOUT"}},
			&cli.DurationFlag{Name: "attr-timeout", Value: time.Second, Usage: "how long the kernel caches attributes", EnvVars: []string{"TIERFS_ATTR_TIMEOUT"}},
			&cli.BoolFlag{Name: "debug-fuse", Usage: "log every FUSE request"},
		},
		Action: runMount,
	}
}

func runMount(c *cli.Context) error {
	if c.NArg() != 1 {
		return &exitError{code: 2, err: errors.New("mount takes one argument: the mount point")}
	}
	log, err := newLogger(c)
	if err != nil {
		return &exitError{code: 2, err: err}
	}
	if os.Geteuid() != 0 {
		return errors.New("tierfs mount must run as root (it mounts with allow_other and uses kernel passthrough and file handles)")
	}
	m, err := fs.Mount(fs.Config{
		Backing:      c.String("backing"),
		Mountpoint:   c.Args().First(),
		Passthrough:  c.Bool("passthrough"),
		EntryTimeout: c.Duration("entry-timeout"),
		AttrTimeout:  c.Duration("attr-timeout"),
		Debug:        c.Bool("debug-fuse"),
		Log:          log,
	})
	if err != nil {
		return err
	}
	log.Info("mounted", "mountpoint", m.Config.Mountpoint, "backing", m.Config.Backing,
		"in_place", m.Config.Mountpoint == m.Config.Backing, "local_files", m.Passthrough.String())

	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	done := make(chan struct{})
	go func() { m.Wait(); close(done) }()
	for {
		select {
		case <-done:
			log.Info("unmounted", "mountpoint", m.Config.Mountpoint)
			return nil
		case s := <-sigs:
			log.Info("signal received, unmounting", "signal", s.String())
			if err := m.Unmount(false); err != nil {
				log.Warn("mount busy, detaching lazily: it goes away when the last open file is closed", "err", err)
				if err := m.Unmount(true); err != nil {
					return fmt.Errorf("unmount: %w", err)
				}
			}
			<-done
			log.Info("unmounted", "mountpoint", m.Config.Mountpoint)
			return nil
		}
	}
}
