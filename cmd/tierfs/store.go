package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"text/tabwriter"
	"time"

	"github.com/tierfs/tierfs/chunkxfer"
	"github.com/tierfs/tierfs/chunkxfer/store"
	"github.com/tierfs/tierfs/tiering"
	"github.com/urfave/cli/v2"
)

// storeFlags select a store; shared by every command that talks to one.
func storeFlags() []cli.Flag {
	return append([]cli.Flag{
		&cli.StringFlag{Name: "store", Usage: "file:///path, or s3://bucket/prefix?endpoint=URL&region=R&path-style=true", EnvVars: []string{"TIERFS_STORE"}, Required: true},
	}, s3KeyFlags()...)
}

// s3KeyFlags are the credentials of an S3 store, for every command that
// opens one (openStore reads them).
func s3KeyFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "s3-access-key", Usage: "S3 access key (default: the AWS chain: AWS_ACCESS_KEY_ID, shared files, instance role)", EnvVars: []string{"TIERFS_S3_ACCESS_KEY"}},
		&cli.StringFlag{Name: "s3-secret-key", Usage: "S3 secret key; prefer the environment to the command line, which others can see", EnvVars: []string{"TIERFS_S3_SECRET_KEY"}},
	}
}

// openStore opens the store at rawURL with the credential flags of c
// (the store commands' --store, mount's --remote).
func openStore(c *cli.Context, rawURL string) (store.Store, error) {
	ak, sk := c.String("s3-access-key"), c.String("s3-secret-key")
	if (ak == "") != (sk == "") {
		return nil, &exitError{code: 2, err: errors.New("give both --s3-access-key and --s3-secret-key, or neither")}
	}
	return store.Open(c.Context, rawURL, store.S3Options{AccessKey: ak, SecretKey: sk})
}

func defaultJournalDir() string {
	if d, err := os.UserCacheDir(); err == nil {
		return filepath.Join(d, "tierfs", "xfer")
	}
	return filepath.Join(os.TempDir(), "tierfs-xfer")
}

func cmdStore() *cli.Command {
	journal := &cli.StringFlag{Name: "journal-dir", Value: defaultJournalDir(), Usage: "where transfer journals are kept (an interrupted transfer resumes from here)", EnvVars: []string{"TIERFS_JOURNAL_DIR"}}
	chunk := &cli.StringFlag{Name: "chunk-size", Value: fmt.Sprintf("%dMiB", chunkxfer.DefaultChunkSize>>20), Usage: "part and chunk size, e.g. 16MiB (S3 needs at least 5 MiB)"}
	parallel := &cli.IntFlag{Name: "parallel", Value: 4, Usage: "chunks in flight"}
	args := func(c *cli.Context, n int, what string) error {
		if c.NArg() != n {
			return &exitError{code: 2, err: fmt.Errorf("store %s takes %s", c.Command.Name, what)}
		}
		return nil
	}
	return &cli.Command{
		Name:  "store",
		Usage: "use an object store directly: list, upload, download, verify (chunked, checksummed, resumable)",
		Flags: storeFlags(),
		Subcommands: []*cli.Command{
			{
				Name: "ls", Usage: "list objects under a prefix", ArgsUsage: "[PREFIX]",
				Action: func(c *cli.Context) error {
					s, err := openStore(c, c.String("store"))
					if err != nil {
						return err
					}
					infos, err := s.List(c.Context, c.Args().First())
					if err != nil {
						return err
					}
					tw := tabwriter.NewWriter(c.App.Writer, 2, 8, 2, ' ', 0)
					for _, i := range infos {
						fmt.Fprintf(tw, "%d\t%s\t%s\n", i.Size, i.ModTime.UTC().Format(time.RFC3339), i.Key)
					}
					return tw.Flush()
				},
			},
			{
				Name: "put", Usage: "upload a file as a multipart object with its manifest; a rerun resumes", ArgsUsage: "FILE KEY",
				Flags: []cli.Flag{journal, chunk, parallel},
				Action: func(c *cli.Context) error {
					if err := args(c, 2, "two arguments: the file and the key"); err != nil {
						return err
					}
					s, err := openStore(c, c.String("store"))
					if err != nil {
						return err
					}
					log, err := newLogger(c)
					if err != nil {
						return err
					}
					sizes, err := sizeFlags(c, "chunk-size")
					if err != nil {
						return err
					}
					up := &chunkxfer.Uploader{Store: s, JournalDir: c.String("journal-dir"), ChunkSize: sizes["chunk-size"], Parallel: c.Int("parallel"), Log: log}
					t0 := time.Now()
					m, err := up.Upload(c.Context, c.Args().Get(0), c.Args().Get(1))
					if err != nil {
						return err
					}
					fmt.Fprintf(c.App.Writer, "%s: %d bytes in %d chunks, %s, %s\n", m.Key, m.Size, m.Chunks(), m.Whole, rate(m.Size, time.Since(t0)))
					return nil
				},
			},
			{
				Name: "get", Usage: "download an object to a file, every chunk checked; a rerun resumes", ArgsUsage: "KEY FILE",
				Flags: []cli.Flag{journal, parallel},
				Action: func(c *cli.Context) error {
					if err := args(c, 2, "two arguments: the key and the file"); err != nil {
						return err
					}
					s, err := openStore(c, c.String("store"))
					if err != nil {
						return err
					}
					log, err := newLogger(c)
					if err != nil {
						return err
					}
					dl := &chunkxfer.Downloader{Store: s, JournalDir: c.String("journal-dir"), Parallel: c.Int("parallel"), Log: log}
					t0 := time.Now()
					m, err := dl.Download(c.Context, c.Args().Get(0), c.Args().Get(1))
					if err != nil {
						return err
					}
					fmt.Fprintf(c.App.Writer, "%s: %d bytes, %s\n", c.Args().Get(1), m.Size, rate(m.Size, time.Since(t0)))
					return nil
				},
			},
			{
				Name: "cat", Usage: "write an object's bytes (or a range) to stdout through the checked reader", ArgsUsage: "KEY",
				Flags: []cli.Flag{
					&cli.Int64Flag{Name: "offset"},
					&cli.Int64Flag{Name: "length", Value: -1, Usage: "bytes, -1 for to the end"},
				},
				Action: func(c *cli.Context) error {
					if err := args(c, 1, "one argument: the key"); err != nil {
						return err
					}
					s, err := openStore(c, c.String("store"))
					if err != nil {
						return err
					}
					cache, err := chunkxfer.NewPool(64<<20, nil)
					if err != nil {
						return err
					}
					defer cache.Close()
					key := c.Args().First()
					var src io.ReaderAt
					var size int64
					r, err := chunkxfer.NewReader(c.Context, s, key, cache, chunkxfer.ReaderOptions{ReadAhead: 4})
					switch {
					case errors.Is(err, store.ErrNotFound):
						// A small segment's index file, say: held by its
						// .log's manifest, under no key of its own.
						b, held := heldFile(c.Context, s, key)
						if !held {
							return err
						}
						src, size = bytes.NewReader(b), int64(len(b))
					case err != nil:
						return err
					default:
						defer r.Close()
						src, size = r, r.Size()
					}
					n := c.Int64("length")
					if n < 0 {
						n = size
					}
					_, err = io.Copy(c.App.Writer, io.NewSectionReader(src, c.Int64("offset"), n))
					return err
				},
			},
			{
				Name: "verify", Usage: "read an object back and check every chunk against its manifest (exit 1 on a mismatch)", ArgsUsage: "KEY",
				Action: func(c *cli.Context) error {
					if err := args(c, 1, "one argument: the key"); err != nil {
						return err
					}
					s, err := openStore(c, c.String("store"))
					if err != nil {
						return err
					}
					m, err := chunkxfer.LoadManifest(c.Context, s, c.Args().First())
					if err != nil {
						return &exitError{code: 1, err: err}
					}
					if err := chunkxfer.Verify(c.Context, s, m); err != nil {
						return &exitError{code: 1, err: err}
					}
					fmt.Fprintf(c.App.Writer, "%s: ok: %d bytes, %d chunks, %s\n", m.Key, m.Size, m.Chunks(), m.Whole)
					return nil
				},
			},
			{
				Name: "uploads", Usage: "list multipart uploads in progress under a prefix", ArgsUsage: "[PREFIX]",
				Flags: []cli.Flag{&cli.BoolFlag{Name: "abort", Usage: "abort them"}},
				Action: func(c *cli.Context) error {
					s, err := openStore(c, c.String("store"))
					if err != nil {
						return err
					}
					ups, err := s.ListMultipart(c.Context, c.Args().First())
					if err != nil {
						return err
					}
					for _, u := range ups {
						status := ""
						if c.Bool("abort") {
							status = " aborted"
							if err := s.AbortMultipart(context.WithoutCancel(c.Context), u.Key, u.UploadID); err != nil {
								status = " abort failed: " + err.Error()
							}
						}
						fmt.Fprintf(c.App.Writer, "%s\t%s\t%s%s\n", u.Initiated.UTC().Format(time.RFC3339), u.Key, u.UploadID, status)
					}
					return nil
				},
			},
		},
	}
}

func rate(n int64, d time.Duration) string {
	return fmt.Sprintf("%.1f MB/s", float64(n)/1e6/max(d.Seconds(), 1e-9))
}

// heldFile is the file key would name, if the manifest of the .log it
// belongs to holds it (tiering.HeldFileOf), checked by its CRC32C.
func heldFile(ctx context.Context, s store.Store, key string) ([]byte, bool) {
	logKey, name, ok := tiering.HeldFileOf(key)
	if !ok {
		return nil, false
	}
	m, err := chunkxfer.ReadManifest(ctx, s, logKey)
	if err != nil {
		return nil, false
	}
	return m.File(name)
}
