package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/tierfs/tierfs/control"
	"github.com/tierfs/tierfs/internal/units"
	"github.com/tierfs/tierfs/peer"
)

func tlsFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "tls-cert", Usage: "this side's certificate (PEM); with --tls-key and --tls-ca, turns on mutual TLS", EnvVars: []string{"TIERFS_TLS_CERT"}},
		&cli.StringFlag{Name: "tls-key", Usage: "this side's private key (PEM)", EnvVars: []string{"TIERFS_TLS_KEY"}},
		&cli.StringFlag{Name: "tls-ca", Usage: "the CA (PEM) that signed the other side's certificate", EnvVars: []string{"TIERFS_TLS_CA"}},
	}
}

func usesTLS(c *cli.Context) bool {
	return c.String("tls-cert") != "" || c.String("tls-key") != "" || c.String("tls-ca") != ""
}

func cmdServe() *cli.Command {
	return &cli.Command{
		Name:      "serve",
		Usage:     "share a tree (a partition dir, a log dir, a tierfs mount) for `tierfs pull` on another machine",
		ArgsUsage: "DIR",
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "listen", Usage: "address to listen on, e.g. 127.0.0.1:7070", Required: true},
			&cli.BoolFlag{Name: "insecure", Usage: "allow plain TCP (no TLS) on an address other than loopback: anyone who reaches it can read DIR"},
		}, tlsFlags()...),
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return &exitError{code: 2, err: errors.New("serve takes one argument: the directory to share")}
			}
			log, err := newLogger(c)
			if err != nil {
				return err
			}
			dir := c.Args().First()
			if st, err := os.Stat(dir); err != nil || !st.IsDir() {
				return fmt.Errorf("serve %s: not a directory", dir)
			}
			s := &peer.Server{Root: dir, Log: log}
			if usesTLS(c) {
				if s.TLS, err = peer.ServerTLS(c.String("tls-cert"), c.String("tls-key"), c.String("tls-ca")); err != nil {
					return err
				}
			} else if !c.Bool("insecure") && !loopback(c.String("listen")) {
				return fmt.Errorf("--listen %s without TLS would let anyone who reaches it read %s: give --tls-cert, --tls-key and --tls-ca, or --insecure", c.String("listen"), dir)
			}
			ln, err := net.Listen("tcp", c.String("listen"))
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(c.Context, syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			mode := "plain TCP with sendfile"
			if s.TLS != nil {
				mode = "mutual TLS"
			}
			log.Info("serving", "dir", dir, "listen", ln.Addr().String(), "transport", mode)
			err = s.Serve(ctx, ln)
			log.Info("stopped serving", "sent_bytes", s.BytesSent())
			return err
		},
	}
}

// loopback says whether addr listens on a loopback address only.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func cmdPull() *cli.Command {
	return &cli.Command{
		Name:      "pull",
		Usage:     "copy REMOTE_PATH (a file or a tree) from a `tierfs serve` into LOCAL_DIR/<its name>: chunked, verified, resumed after a broken connection or a crash",
		ArgsUsage: "HOST:PORT REMOTE_PATH LOCAL_DIR",
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "chunk-size", Value: "8MiB", Usage: "unit of transfer, verification and resume"},
			&cli.IntFlag{Name: "retries", Value: 10, Usage: "connections in a row that may fail, with no chunk confirmed in between, before giving up"},
			&cli.IntFlag{Name: "max-passes", Value: 5, Usage: "times a file that keeps changing on the server is sent again before giving up on it"},
			&cli.StringFlag{Name: "tls-server-name", Usage: "the name the server's certificate must carry (default: the host of HOST:PORT)"},
		}, tlsFlags()...),
		Action: func(c *cli.Context) error {
			if c.NArg() != 3 {
				return &exitError{code: 2, err: errors.New("pull takes three arguments: HOST:PORT REMOTE_PATH LOCAL_DIR")}
			}
			log, err := newLogger(c)
			if err != nil {
				return err
			}
			addr, remote, dir := c.Args().Get(0), c.Args().Get(1), c.Args().Get(2)
			chunk, err := units.ParseSize(c.String("chunk-size"))
			if err != nil || chunk <= 0 || chunk > 64<<20 {
				return fmt.Errorf("--chunk-size %q: a size up to 64MiB", c.String("chunk-size"))
			}
			cl := &peer.Client{Addr: addr, Log: log, ChunkSize: chunk, Retries: c.Int("retries"), MaxPasses: c.Int("max-passes")}
			if usesTLS(c) {
				name := c.String("tls-server-name")
				if name == "" {
					name, _, _ = net.SplitHostPort(addr)
				}
				if cl.TLS, err = peer.ClientTLS(c.String("tls-cert"), c.String("tls-key"), c.String("tls-ca"), name); err != nil {
					return err
				}
			}
			defer cl.Close()
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(c.Context, syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			if mp, base, err := control.FindMount(dir); err == nil {
				// Into a tierfs mount: evicted files of a mount of the
				// same store come over as references, not bytes.
				cl.TakeOver = takeOver(log, mp, base)
			}
			t0 := time.Now()
			st, err := cl.Pull(ctx, remote, dir)
			d := time.Since(t0)
			fmt.Fprintf(c.App.Writer, "%d files, %d dirs, %d symlinks, %s in %s (%.0f MB/s); received %s, already here %s; %d evicted files taken over from the store; %d files sent again as they changed; %d reconnects\n",
				st.Files, st.Dirs, st.Symlinks, units.FormatSize(st.Bytes), d.Round(time.Millisecond), float64(st.Bytes)/1e6/max(d.Seconds(), 1e-6),
				units.FormatSize(st.Received), units.FormatSize(st.Kept), st.TakenOver, st.Resent, st.Reconnects)
			if err != nil && errors.Is(err, context.Canceled) {
				return fmt.Errorf("interrupted; pull again to resume: %w", err)
			}
			return err
		},
	}
}

// takeOver asks the tierfs mount at mp (the pull's directory is base
// under it) to make each evicted file of the server an evicted file of
// its own, and renames it into place through the mount.
func takeOver(log *slog.Logger, mp, base string) func(ctx context.Context, rel string, e peer.Entry) (bool, error) {
	return func(ctx context.Context, rel string, e peer.Entry) (bool, error) {
		target := filepath.Join(base, rel)
		var reply adoptReply
		if _, err := callMount(ctx, mp, "adopt", adoptArgs{Rel: target, Remote: e.Remote, Mode: e.Mode}, &reply); err != nil {
			return false, err
		}
		if reply.Tmp == "" {
			log.Info("pulling the bytes of an evicted file", "file", rel, "why", reply.Fallback)
			return false, nil
		}
		if err := os.Rename(filepath.Join(mp, reply.Tmp), filepath.Join(mp, target)); err != nil {
			return false, err
		}
		return true, nil
	}
}
