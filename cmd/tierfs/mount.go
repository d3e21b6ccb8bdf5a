package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"

	"github.com/tierfs/tierfs/chunkxfer"
	"github.com/tierfs/tierfs/chunkxfer/store"
	"github.com/tierfs/tierfs/control"
	"github.com/tierfs/tierfs/fs"
	"github.com/tierfs/tierfs/internal/gctune"
	"github.com/tierfs/tierfs/internal/memgov"
	"github.com/tierfs/tierfs/internal/units"
	"github.com/tierfs/tierfs/kafkalead"
	"github.com/tierfs/tierfs/metrics"
	"github.com/tierfs/tierfs/tiering"
	"github.com/urfave/cli/v2"
)

func cmdMount() *cli.Command {
	return &cli.Command{
		Name:      "mount",
		Usage:     "mount a log directory (in place, or a separate backing directory) and serve it in the foreground",
		ArgsUsage: "MOUNTPOINT",
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "backing", Usage: "serve this directory at MOUNTPOINT (default: MOUNTPOINT itself, mounted in place)", EnvVars: []string{"TIERFS_BACKING"}},
			&cli.BoolFlag{Name: "passthrough", Value: true, Usage: "let the kernel read and write local files directly (FUSE passthrough, Linux 6.9+)", EnvVars: []string{"TIERFS_PASSTHROUGH"}},
			&cli.DurationFlag{Name: "entry-timeout", Value: time.Second, Usage: "how long the kernel caches names", EnvVars: []string{"TIERFS_ENTRY_TIMEOUT"}},
			&cli.DurationFlag{Name: "attr-timeout", Value: time.Second, Usage: "how long the kernel caches attributes", EnvVars: []string{"TIERFS_ATTR_TIMEOUT"}},
			&cli.StringFlag{Name: "read-ahead", Value: "1MiB", Usage: "kernel readahead for files read through FUSE (tiered segments), up to 64MiB; -1 keeps the kernel's 128 KiB", EnvVars: []string{"TIERFS_READ_AHEAD"}},
			&cli.BoolFlag{Name: "debug-fuse", Usage: "log every FUSE request"},
			&cli.StringFlag{Name: "remote", Usage: "ship cold segments to this store (file:///path or s3://bucket/prefix?endpoint=...); without it tierfs is a plain directory", EnvVars: []string{"TIERFS_REMOTE"}},
			&cli.DurationFlag{Name: "ship-after", Value: 10 * time.Minute, Usage: "ship a rolled, flushed, committed segment once it is this old", EnvVars: []string{"TIERFS_SHIP_AFTER"}},
			&cli.DurationFlag{Name: "local-retention-age", Usage: "free the local bytes of shipped segments older than this (0: no age limit)", EnvVars: []string{"TIERFS_LOCAL_RETENTION_AGE"}},
			&cli.StringFlag{Name: "local-retention-bytes", Value: "0", Usage: "keep at most this much of segments local per partition (e.g. 50GiB), freeing the oldest shipped first (0: no limit)", EnvVars: []string{"TIERFS_LOCAL_RETENTION_BYTES"}},
			&cli.StringFlag{Name: "ship-rate", Usage: "bytes per second for all uploads together, e.g. 50MiB (0: no limit)", Value: "0", EnvVars: []string{"TIERFS_SHIP_RATE"}},
			&cli.StringFlag{Name: "local-retention-total-bytes", Value: "0", Usage: "keep at most this much of segments local in all partitions together (e.g. 800GiB), freeing the oldest shipped anywhere first (0: no limit)", EnvVars: []string{"TIERFS_LOCAL_RETENTION_TOTAL_BYTES"}},
			&cli.IntFlag{Name: "ship-concurrency", Value: 2, Usage: "segments uploaded in parts (more than 1 MiB) at once; smaller segments ship from up to 4 times as many partitions at once, in no more memory", EnvVars: []string{"TIERFS_SHIP_CONCURRENCY"}},
			&cli.DurationFlag{Name: "tier-interval", Value: 30 * time.Second, Usage: "how often the tierer looks for work", EnvVars: []string{"TIERFS_TIER_INTERVAL"}},
			&cli.DurationFlag{Name: "rescan-interval", Value: 10 * time.Minute, Usage: "how often a pass looks at every partition, changed or not; in between it looks only at partitions whose directory changed or that wait for something (0: at every pass)", EnvVars: []string{"TIERFS_RESCAN_INTERVAL"}},
			&cli.IntFlag{Name: "remote-read-ahead", Value: 4, Usage: "chunks of an evicted segment fetched ahead of a sequential reader (0: none)", EnvVars: []string{"TIERFS_REMOTE_READ_AHEAD"}},
			&cli.StringFlag{Name: "cache-bytes", Value: "256MiB", Usage: "the memory budget for every chunk of remote files: being fetched, read, fetched ahead or cached (a size: 512MiB, 2GiB, or bytes; at least one 8 MiB chunk). The Go runtime's memory limit is set to this plus 32 MiB unless GOMEMLIMIT is set", EnvVars: []string{"TIERFS_CACHE_BYTES"}},
			&cli.StringFlag{Name: "role", Value: "auto", Usage: "auto: per partition, ship what this broker leads (with --kafka-bootstrap) and follow the rest, or without it ship what the store lacks; leader: ship every partition; follower: ship nothing, free segments whose batches other brokers shipped (brokers sharing --remote); reader: a read-only log dir of every segment in the store (--remote), for analytics hosts", EnvVars: []string{"TIERFS_ROLE"}},
			&cli.StringSliceFlag{Name: "kafka-bootstrap", Usage: "ask this broker (host:port, the mount's own broker first; repeat or comma-separate) which partitions it leads: those ship, the others follow, and leadership moves are taken over within one --kafka-poll-interval", EnvVars: []string{"TIERFS_KAFKA_BOOTSTRAP"}},
			&cli.StringFlag{Name: "kafka-client-properties", Usage: "a Kafka client properties file for --kafka-bootstrap: security.protocol, sasl.mechanism (PLAIN, SCRAM-SHA-256/512) and sasl.jaas.config, PEM ssl.truststore/keystore settings", EnvVars: []string{"TIERFS_KAFKA_CLIENT_PROPERTIES"}},
			&cli.DurationFlag{Name: "kafka-poll-interval", Value: kafkalead.DefaultInterval, Usage: "how often --kafka-bootstrap is asked who leads (and at once when a partition's leader epoch moves on disk)", EnvVars: []string{"TIERFS_KAFKA_POLL_INTERVAL"}},
			&cli.DurationFlag{Name: "share-grace", Value: time.Minute, Usage: "without --kafka-bootstrap: in a partition other brokers ship too, wait this long past --ship-after (plus a stagger of up to as long again) for their upload before uploading", EnvVars: []string{"TIERFS_SHARE_GRACE"}},
			&cli.DurationFlag{Name: "follow-interval", Value: 10 * time.Second, Usage: "follower and reader: how often the store is looked at for new and deleted segments", EnvVars: []string{"TIERFS_FOLLOW_INTERVAL"}},
			&cli.StringFlag{Name: "broker-id", Usage: "this broker's name among the brokers sharing --remote (default: node.id from the log dir's meta.properties)", EnvVars: []string{"TIERFS_BROKER_ID"}},
			&cli.StringFlag{Name: "metrics-listen", Usage: "serve Prometheus metrics at http://ADDR/metrics, e.g. 127.0.0.1:9464 (default: none)", EnvVars: []string{"TIERFS_METRICS_LISTEN"}},
		}, append(cmFlags(), s3KeyFlags()...)...),
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
	// A CPU profile of the whole mount, for performance work.
	if p := os.Getenv("TIERFS_CPUPROFILE"); p != "" {
		f, err := os.Create(p)
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer func() { pprof.StopCPUProfile(); f.Close() }()
	}
	// And a heap profile of what is live when the mount ends, or when
	// it gets SIGUSR1 (of a mount at rest, whose memory the end of the
	// mount has let go of already).
	if p := os.Getenv("TIERFS_MEMPROFILE"); p != "" {
		writeHeap := func() {
			runtime.GC() // the profile's in-use figures are as of the last collection
			if f, err := os.Create(p); err == nil {
				pprof.WriteHeapProfile(f)
				f.Close()
			}
		}
		usr1 := make(chan os.Signal, 1)
		signal.Notify(usr1, syscall.SIGUSR1)
		go func() {
			for range usr1 {
				writeHeap()
			}
		}()
		defer func() { signal.Stop(usr1); writeHeap() }()
	}
	// Where the mount's goroutines wait: a block profile (channel and
	// lock waits of 10 µs or more) to FILE and a mutex profile (one
	// contention in 5) to FILE.mutex, written when the mount ends.
	if p := os.Getenv("TIERFS_BLOCKPROFILE"); p != "" {
		runtime.SetBlockProfileRate(10_000)
		runtime.SetMutexProfileFraction(5)
		defer func() {
			for name, path := range map[string]string{"block": p, "mutex": p + ".mutex"} {
				if f, err := os.Create(path); err == nil {
					pprof.Lookup(name).WriteTo(f, 0)
					f.Close()
				}
			}
		}()
	}
	sizes, err := sizeFlags(c, "local-retention-bytes", "local-retention-total-bytes", "cache-bytes")
	if err != nil {
		return err
	}
	readAhead := int64(-1)
	if ra := c.String("read-ahead"); ra != "-1" {
		var err error
		if readAhead, err = units.ParseSize(ra); err != nil || readAhead > 64<<20 {
			return &exitError{code: 2, err: fmt.Errorf("--read-ahead %q: a size up to 64MiB, or -1", ra)}
		}
		if readAhead == 0 {
			readAhead = -1
		}
	}
	reader := false
	switch role := c.String("role"); role {
	case "auto", "leader":
	case "reader":
		reader = true
		if c.String("remote") == "" {
			return &exitError{code: 2, err: errors.New("--role reader needs --remote: the store to show")}
		}
		if c.Bool("cm") {
			return &exitError{code: 2, err: errors.New("--role reader is read-only: --cm has nothing to retain")}
		}
		if c.String("backing") == "" {
			// The stubs of the store's segments live in a directory of
			// their own, made again at each mount.
			dir, err := os.MkdirTemp("/var/tmp", "tierfs-reader-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(dir)
			if err := c.Set("backing", dir); err != nil {
				return err
			}
		}
	case "follower":
		if c.String("remote") == "" {
			return &exitError{code: 2, err: errors.New("--role follower needs --remote: the store its leader ships to")}
		}
	default:
		return &exitError{code: 2, err: fmt.Errorf("--role %q: auto, leader, follower or reader", role)}
	}
	if len(c.StringSlice("kafka-bootstrap")) > 0 && (c.String("remote") == "" || reader) {
		return &exitError{code: 2, err: errors.New("--kafka-bootstrap tells which partitions to ship: it needs --remote, and a reader ships nothing")}
	}
	remote := &remoteFiles{}
	changes, err := newChanges(c, remote)
	if err != nil {
		return err
	}
	var tierer *tiering.Tierer
	var tier fs.Tiering
	var shipRate int64
	var cache *chunkxfer.Pool
	var requests *store.Requests // stays nil without a remote
	if url := c.String("remote"); url != "" {
		st, err := openStore(c, url)
		if err != nil {
			return err
		}
		requests = new(store.Requests)
		st = store.Counted(st, requests)
		if shipRate, err = units.ParseSize(c.String("ship-rate")); err != nil {
			return &exitError{code: 2, err: fmt.Errorf("--ship-rate: %w", err)}
		}
		if cache, err = chunkPool(sizes["cache-bytes"], log); err != nil {
			return err
		}
		defer cache.Close()
		if os.Getenv("GOMEMLIMIT") == "" {
			// The chunks get what the rest of the mount leaves of
			// the budget, so that what is live stays within it and
			// the collector has goMemoryOverhead to work in.
			defer memgov.Start(sizes["cache-bytes"], goMemoryOverhead, cache, log).Stop()
		}
		if os.Getenv("GOGC") == "" {
			// The tierer's catalogue is long-lived heap: collected
			// after gcHeadroom of allocation, not after it doubled.
			defer gctune.Start(gcHeadroom, log).Stop()
		}
		var lead *leadership
		if len(c.StringSlice("kafka-bootstrap")) > 0 {
			if lead, err = newLeadership(c, log); err != nil {
				return err
			}
			defer lead.Close()
		}
		tierer, err = tiering.New(tiering.Config{
			Store:                    st,
			Policy:                   tiering.Policy{ShipAfter: c.Duration("ship-after")},
			LocalRetentionAge:        c.Duration("local-retention-age"),
			LocalRetentionBytes:      sizes["local-retention-bytes"],
			LocalRetentionTotalBytes: sizes["local-retention-total-bytes"],
			Concurrency:              c.Int("ship-concurrency"),
			ShipRate:                 shipRate,
			Pool:                     cache,
			BeforeFree:               beforeFree(changes),
			Role:                     tierRole(c.String("role")),
			Leadership:               lead.view(),
			ShareGrace:               c.Duration("share-grace"),
			RescanInterval:           c.Duration("rescan-interval"),
			StoreID:                  storeID(url),
			BrokerID:                 c.String("broker-id"),
			Log:                      log,
			CrashAt:                  crashAt(log),
			ReadAheadChunks:          readAheadChunks(c.Int("remote-read-ahead")),
		})
		if err != nil {
			return err
		}
		defer tierer.Close()
		tier = tierer
		remote.t = tierer
		if lead != nil {
			lead.node = tierer.BrokerID
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			go lead.w.Run(ctx)
		}
	}
	// Metrics listen before the mount, so a taken address fails early.
	var ops fs.OpObserver // stays nil without metrics: requests unobserved
	if addr := c.String("metrics-listen"); addr != "" {
		var mt metrics.Tiering // stays nil without a remote
		if tierer != nil {
			mt = tierer
		}
		page := metrics.New(mt, cache, log)
		if changes != nil {
			metrics.RegisterCM(page.Registry, changes)
		}
		if requests != nil {
			metrics.RegisterStore(page.Registry, requests)
		}
		ops = metrics.NewFUSEOps(page.Registry)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		if err := metrics.Serve(ctx, addr, page, log); err != nil {
			return fmt.Errorf("--metrics-listen: %w", err)
		}
	}
	m, err := fs.Mount(fs.Config{
		Backing:      c.String("backing"),
		Mountpoint:   c.Args().First(),
		Passthrough:  c.Bool("passthrough"),
		EntryTimeout: c.Duration("entry-timeout"),
		AttrTimeout:  c.Duration("attr-timeout"),
		Debug:        c.Bool("debug-fuse"),
		ReadOnly:     reader,
		Tiering:      tier,
		Changes:      fsChanges(changes),
		Ops:          ops,
		ReadAhead:    readAhead,
		Log:          log,
	})
	if err != nil {
		return err
	}
	if changes != nil {
		defer changes.Close()
		dir, err := cmRoot(c, m)
		if err == nil {
			err = changes.Attach(filepath.Dir(m.StateDir), dir)
		}
		if err != nil {
			m.Unmount(true)
			m.Wait()
			return fmt.Errorf("change management: %w", err)
		}
		log.Info("change management", "cmroot", c.String("cm-root"), "retain", c.Duration("cm-retain"), "max_bytes", c.String("cm-max-bytes"), "exclude", c.StringSlice("cm-exclude"))
	}
	if tierer != nil || changes != nil {
		srv, err := control.Listen(m.Config.Mountpoint, mountControl{t: tierer, cm: changes, mountpoint: m.Config.Mountpoint}, log)
		if err != nil {
			log.Warn("no control socket: tierfs ship, evict, status, cm and repl cannot reach this mount", "err", err)
		} else {
			defer srv.Close()
		}
	}
	if tierer != nil {
		// The tierer works on the backing directory through the mount's
		// own descriptor of it, never through the mount.
		tierer.SetRoot(filepath.Dir(m.StateDir), m.StateDir)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		if reader {
			rep := tierer.Mirror(ctx, c.Duration("follow-interval"))
			for _, err := range rep.Errors {
				log.Warn("mirror", "err", err)
			}
			log.Info("reader: a read-only view of the store", "remote", redactURL(c.String("remote")), "partitions", rep.PartitionsListed, "segments", rep.Segments, "follow_interval", c.Duration("follow-interval"))
		} else if c.String("role") == string(tiering.RoleFollower) {
			go tierer.Run(ctx, c.Duration("follow-interval"))
			log.Info("follower: frees segments the leader shipped", "remote", redactURL(c.String("remote")), "follow_interval", c.Duration("follow-interval"),
				"local_retention_bytes", sizes["local-retention-bytes"], "local_retention_age", c.Duration("local-retention-age"))
		} else {
			go tierer.Run(ctx, c.Duration("tier-interval"))
			log.Info("tiering", "remote", redactURL(c.String("remote")), "ship_after", c.Duration("ship-after"),
				"ship_rate", shipRate, "local_retention_bytes", sizes["local-retention-bytes"], "local_retention_age", c.Duration("local-retention-age"))
		}
	}
	log.Info("mounted", "mountpoint", m.Config.Mountpoint, "backing", m.Config.Backing,
		"in_place", m.Config.Mountpoint == m.Config.Backing, "local_files", m.Passthrough.String(), "posix_acls", m.ACLs)
	// In the background: listing every partition directory of a large
	// log dir must not delay the moment the mount says it is ready.
	go warnFileLimit(log, filepath.Dir(m.StateDir))
	// Under systemd (Type=notify), units ordered after this one (the
	// broker) start only now that the mount serves.
	if err := sdNotify("READY=1\nSTATUS=serving " + m.Config.Mountpoint); err != nil {
		log.Warn("cannot tell systemd the mount is ready", "err", err)
	}

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
			sdNotify("STOPPING=1")
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

// tierRole is the tierer's role for --role: a reader mount's tierer
// mirrors the store and ships nothing whatever its role, so it gets the
// default.
func tierRole(role string) tiering.Role {
	if role == "reader" {
		return tiering.RoleAuto
	}
	return tiering.Role(role)
}

// redactURL prints a store URL for logs (it carries no secret, but a
// user may have put one in it against advice).
// storeID names the store a URL points at (scheme, bucket or path,
// prefix, endpoint), with no credentials: mounts of one store agree on it.
func storeID(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return ""
	}
	id := u.Scheme + "://" + u.Host + strings.TrimSuffix(u.Path, "/")
	if ep := u.Query().Get("endpoint"); ep != "" {
		id += "?endpoint=" + ep
	}
	return id
}

func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable)"
	}
	return u.Redacted()
}

// crashAtEnv names a crash point (tiering.CrashPoint) at which the
// mount kills itself (SIGKILL), for the end-to-end tests of crash
// safety. Unset, as it always is in use, there are none.
const crashAtEnv = "TIERFS_TEST_CRASH_AT"

func crashAt(log *slog.Logger) func(tiering.CrashPoint) {
	want := tiering.CrashPoint(os.Getenv(crashAtEnv))
	if want == "" {
		return nil
	}
	log.Warn("this mount kills itself at a crash point (a test)", "env", crashAtEnv, "point", want)
	return func(p tiering.CrashPoint) {
		if p == want {
			log.Warn("crash point reached: killing the mount", "point", p)
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // the signal is on its way
		}
	}
}

// sizeFlags reads the named flags as sizes (units.ParseSize: 512MiB,
// 50GB, or bytes), the error naming the flag.
func sizeFlags(c *cli.Context, names ...string) (map[string]int64, error) {
	out := map[string]int64{}
	for _, name := range names {
		n, err := units.ParseSize(c.String(name))
		if err != nil {
			return nil, &exitError{code: 2, err: fmt.Errorf("--%s: %w", name, err)}
		}
		out[name] = n
	}
	return out, nil
}

// goMemoryOverhead is the collector's margin: the Go runtime's memory
// limit is the budget plus this. What is live stays within the budget
// (internal/memgov gives the chunks what the rest of the mount leaves of
// it, less the runtime's own headroom below the limit), so the heap grows
// by this much between collections under load, whatever the budget.
const goMemoryOverhead = 32 << 20

// gcHeadroom is what the heap of a mount with a remote may grow by
// between collections (internal/gctune), unless GOGC says otherwise: at
// 100,000 segments the tierer keeps about 100 MiB of metadata, which
// the runtime's default would let double. Idle, the heap sits between
// what is live and live + gcHeadroom, and the runtime keeps about a
// tenth more than that: at 48 MiB a follower of 100,000 segments (108
// MiB live) held 209 MiB.
const gcHeadroom = 32 << 20

// chunkPool makes the chunk memory of --cache-bytes, refusing a budget
// no read could be served from, and sets the Go runtime's memory limit
// from it (unless GOMEMLIMIT says otherwise) so that the process's
// memory follows the budget.
func chunkPool(budget int64, log *slog.Logger) (*chunkxfer.Pool, error) {
	if budget < chunkxfer.DefaultChunkSize {
		return nil, &exitError{code: 2, err: fmt.Errorf("--cache-bytes %s is less than one chunk (%s): a read of an evicted file holds a whole chunk, checked, before it returns a byte; use at least 8MiB (the default is 256MiB)",
			units.FormatSize(budget), units.FormatSize(chunkxfer.DefaultChunkSize))}
	}
	if os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(budget + goMemoryOverhead)
		log.Debug("go memory limit set from --cache-bytes", "limit", budget+goMemoryOverhead)
	}
	return chunkxfer.NewPool(budget, log)
}

// readAheadChunks turns --remote-read-ahead into tiering's setting (0 is
// its default there, so none is -1).
func readAheadChunks(n int) int {
	if n <= 0 {
		return -1
	}
	return n
}

// warnFileLimit warns when tierfs's open-file limit is too low for the
// segments of the log dir at dir. It counts them in the backing
// directory (through tierfs's own descriptor of it), so the count makes
// no lookups through the mount.
func warnFileLimit(log *slog.Logger, dir string) {
	segs, err := countSegments(dir)
	if err != nil {
		return
	}
	soft, _ := fileLimit()
	if advice := fileLimitAdvice("tierfs", soft, segs); advice != "" {
		log.Warn("the open-file limit is too low for this log dir", "limit", soft, "segments", segs, "advice", advice)
	} else {
		log.Debug("open-file limit", "limit", soft, "segments", segs)
	}
}
