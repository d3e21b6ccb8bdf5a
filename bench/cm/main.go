// Command cm measures what change management costs on the paths where it
// does work: the same workloads run, in every run, on a plain directory,
// on a tierfs mount without cm and on mounts with --cm (with and without
// excluding Kafka's checkpoint temporaries), taking turns in short bursts,
// and the table gives ops/s and the median of the per-run ratios to the
// mount without cm.
//
// Workloads (each op is one iteration of the pattern):
//
//	files: create a file, write 4 KiB, rename it over another, unlink that
//	kafka: a segment roll as a Kafka broker does it: the indexes of the
//	       active segment are opened again and trimmed to their entries,
//	       and the segment fsynced; the next .log is created and gets
//	       64 KiB, its .index and .timeindex are created, preallocated
//	       (10 MiB) and get their entries (184 and 276 bytes); a
//	       checkpoint is written as .tmp, fsynced and renamed over the
//	       old one; then the segment three rolls back is renamed to
//	       .deleted and its files unlinked (retention).
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/tierfs/tierfs/bench/internal/benchutil"
	"github.com/tierfs/tierfs/control"
)

type config struct {
	name string
	args []string // tierfs mount flags; nil: the plain directory
	bin  string   // the tierfs binary, when not -tierfs
}

func (c config) cm() bool { return slices.Contains(c.args, "--cm") }

func main() {
	bin := flag.String("tierfs", "bin/tierfs", "tierfs binary")
	runs := flag.Int("runs", 5, "runs")
	ops := flag.Int("ops", 2000, "iterations of each workload per run")
	bursts := flag.Int("bursts", 10, "bursts each run's ops are split into; the configurations take turns")
	only := flag.String("only", "", "run only this workload (files or kafka)")
	vs := flag.String("vs", "", "other tierfs binaries (comma-separated) to measure --cm of, beside -tierfs (to compare builds)")
	fsType := flag.String("fs", "ext4", "measure on a fresh file system of this type (mkfs.TYPE on a loop device, as root); \"\" for a directory in /var/tmp")
	flag.Parse()
	// What to undo on the way out, newest first, also when a measurement
	// fails (Fail exits without running deferred calls).
	u := benchutil.NewUndo("bench-cm")
	fail := u.Fail
	defer u.Run()
	work, where := benchutil.WorkDir(u, "/var/tmp", *fsType, 8<<30)
	configs := []config{
		{name: "plain directory"},
		{name: "tierfs", args: []string{}},
		{name: "tierfs --cm", args: []string{"--cm"}},
		{name: "tierfs --cm --cm-exclude '*.tmp'", args: []string{"--cm", "--cm-exclude", "*.tmp"}},
	}
	if *vs != "" {
		for _, b := range strings.Split(*vs, ",") {
			configs = append(configs, config{name: "tierfs --cm (" + b + ")", args: []string{"--cm"}, bin: b})
		}
	}
	workloads := []struct {
		name string
		unit string
		run  func(dir string, n int) error
	}{{"files", "files ops/s", files}, {"kafka", "kafka rolls/s", kafkaRolls}}
	if *only != "" {
		kept := workloads[:0]
		for _, w := range workloads {
			if w.name == *only {
				kept = append(kept, w)
			}
		}
		if len(kept) == 0 {
			fail(fmt.Errorf("-only %q: no such workload", *only))
		}
		workloads = kept
	}
	// rate[workload][config][run]
	rate := map[string]map[string][]float64{}
	for _, w := range workloads {
		rate[w.name] = map[string][]float64{}
	}
	for r := 0; r < *runs; r++ {
		for _, w := range workloads {
			// Every configuration gets its mount up front; then they take
			// turns, a burst each, in an order that rotates, so whatever
			// drifts during a run (the journal, the page cache, ext4's
			// free inodes, other load) falls on all of them alike.
			dirs := make([]string, len(configs))
			dones := make([]func(), len(configs))
			for i, c := range configs {
				b := *bin
				if c.bin != "" {
					b = c.bin
				}
				dir, done, err := setUp(b, work, c)
				if err != nil {
					fail(err)
				}
				dirs[i], dones[i] = dir, done
				u.Push(done)
			}
			spent := make([]time.Duration, len(configs))
			n := (*ops + *bursts - 1) / *bursts
			for b := 0; b < *bursts; b++ {
				for k := range configs {
					i := (k + b + r) % len(configs)
					dir := filepath.Join(dirs[i], fmt.Sprintf("burst%d", b))
					if err := os.Mkdir(dir, 0o755); err != nil {
						fail(err)
					}
					// Each burst starts with nothing left to write back
					// from the one before.
					syscall.Sync()
					var err error
					spent[i] += benchutil.Time(func() {
						if err = w.run(dir, n); err == nil && configs[i].cm() {
							// The burst's background work (filing its
							// originals, syncing the event log) is
							// part of its cost, not the next one's.
							err = control.Call(context.Background(), dirs[i], control.Request{Op: "cm.flush"}, func(control.Event) {})
						}
					})
					if err != nil {
						fail(fmt.Errorf("%s on %s: %w", w.name, configs[i].name, err))
					}
				}
			}
			for i, c := range configs {
				dones[i]()
				ops := float64(n**bursts) / spent[i].Seconds()
				rate[w.name][c.name] = append(rate[w.name][c.name], ops)
				fmt.Fprintf(os.Stderr, "run %d %s %s: %.0f ops/s\n", r+1, c.name, w.name, ops)
			}
		}
	}
	rep := benchutil.Report{
		Name:  "cm",
		Title: "Change management: the cost of --cm",
		Notes: []string{fmt.Sprintf("%d runs of %d ops each, in %d bursts per run that the configurations take turns at, on %s (medians; ratios are medians of per-run ratios to tierfs without cm); %s. "+
			"files: create, write 4 KiB, rename over another, unlink every second; kafka: a segment roll as a broker does it (the rolled segment's .index and .timeindex opened again and trimmed to their entries, the segment fsynced, a new .log and preallocated indexes, checkpoint .tmp fsynced and renamed over, retention of the segment three rolls back).", *runs, *ops, *bursts, where, benchutil.Machine())},
		Header: []string{"configuration"},
	}
	for _, w := range workloads {
		rep.Header = append(rep.Header, w.unit, "× no cm")
	}
	for _, w := range workloads {
		ch := benchutil.Chart{Title: "cm: " + w.name + " pattern", Unit: "ops/s"}
		for _, c := range configs {
			ch.Bars = append(ch.Bars, benchutil.Bar{Label: c.name, Value: benchutil.Median(rate[w.name][c.name])})
		}
		rep.Charts = append(rep.Charts, ch)
	}
	for _, c := range configs {
		row := []string{c.name}
		for _, w := range workloads {
			xs := rate[w.name][c.name]
			row = append(row, fmt.Sprintf("%.0f", benchutil.Median(xs)), fmt.Sprintf("%.2f", benchutil.Median(benchutil.Ratios(xs, rate[w.name]["tierfs"]))))
		}
		rep.Rows = append(rep.Rows, row)
	}
	if err := rep.Emit(); err != nil {
		fail(err)
	}
}

// setUp makes a fresh directory for one measurement: the plain one, or a
// mount of a fresh backing dir with the config's flags.
func setUp(bin, work string, c config) (dir string, done func(), err error) {
	base, err := os.MkdirTemp(work, "run-")
	if err != nil {
		return "", nil, err
	}
	// What a measurement made stays until the end: deleting tens of
	// thousands of files at once would slow the next measurement's
	// creates for minutes (ext4 does not reuse an inode freed in the
	// last 60 to 300 s, and scans past each such one), which no broker
	// meets and which fell on whichever configuration came next.
	if c.args == nil {
		return base, func() {}, nil
	}
	backing, mnt := filepath.Join(base, "backing"), filepath.Join(base, "mnt")
	os.Mkdir(backing, 0o755)
	os.Mkdir(mnt, 0o755)
	args := append(append([]string{"--backing", backing}, c.args...), mnt)
	unmount, err := benchutil.Mount(bin, filepath.Join(base, "log"), nil, args...)
	if err != nil {
		return "", nil, err
	}
	return mnt, unmount, nil
}

func files(dir string, n int) error {
	buf := bytes.Repeat([]byte("x"), 4096)
	if err := os.WriteFile(filepath.Join(dir, "target"), buf, 0o644); err != nil {
		return err
	}
	for i := 0; i < n; i++ {
		p := filepath.Join(dir, fmt.Sprintf("f%d", i))
		buf[0] = byte(i)
		if err := os.WriteFile(p, buf, 0o644); err != nil {
			return err
		}
		if err := os.Rename(p, filepath.Join(dir, "target")); err != nil {
			return err
		}
		if i%2 == 1 {
			if err := os.Remove(filepath.Join(dir, "target")); err != nil {
				return err
			}
		}
	}
	return nil
}

func kafkaRolls(dir string, n int) error {
	part := filepath.Join(dir, "orders-0")
	if err := os.Mkdir(part, 0o755); err != nil {
		return err
	}
	batch := bytes.Repeat([]byte("record"), 64<<10/6)
	cp := filepath.Join(dir, "recovery-point-offset-checkpoint")
	// A segment's indexes as a broker makes them: each preallocated
	// (segment.index.bytes, 10 MiB, rounded down to whole entries) and
	// trimmed to its entries at the roll, here 23 offset-index entries
	// of 8 bytes and as many time-index entries of 12.
	kafkaIndexes := []struct {
		ext               string
		prealloc, entries int64
	}{
		{".index", 10 << 20, 23 * 8},
		{".timeindex", 10<<20 - 4, 23 * 12},
	}
	// The active segment's log stays open, as a broker keeps it; its
	// indexes are written through a mapping, which holds no descriptor.
	var activeLog *os.File
	defer func() {
		if activeLog != nil {
			activeLog.Close()
		}
	}()
	for i := 0; i < n; i++ {
		// The roll: the indexes of the segment that was active are
		// opened again and trimmed to their entries (which end inside a
		// block), and the segment is flushed (Kafka schedules that at
		// once, UnifiedLog.roll), so what retention deletes later is on
		// disk, as it is in a broker.
		if activeLog != nil {
			base := strings.TrimSuffix(activeLog.Name(), ".log")
			for _, ix := range kafkaIndexes {
				if err := reopen(base+ix.ext, os.O_RDWR, func(f *os.File) error { return f.Truncate(ix.entries) }); err != nil {
					return err
				}
			}
			if err := activeLog.Sync(); err != nil {
				return err
			}
			activeLog.Close()
			activeLog = nil
			for _, ix := range kafkaIndexes {
				if err := reopen(base+ix.ext, os.O_RDONLY, (*os.File).Sync); err != nil {
					return err
				}
			}
		}
		base := filepath.Join(part, fmt.Sprintf("%020d", i*1000))
		lf, err := os.OpenFile(base+".log", os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
		if err != nil {
			return err
		}
		activeLog = lf
		// What the segment gets while it is active.
		batch[0] = byte(i) // every segment different, as in a real log
		if _, err := lf.Write(batch); err != nil {
			return err
		}
		for _, ix := range kafkaIndexes {
			err := reopen(base+ix.ext, os.O_RDWR|os.O_CREATE|os.O_EXCL, func(f *os.File) error {
				if err := f.Truncate(ix.prealloc); err != nil {
					return err
				}
				entries := bytes.Repeat([]byte{byte(i)}, int(ix.entries))
				_, err := f.WriteAt(entries, 0)
				return err
			})
			if err != nil {
				return err
			}
		}
		tmp, err := os.Create(cp + ".tmp")
		if err != nil {
			return err
		}
		fmt.Fprintf(tmp, "0\n1\norders 0 %d\n", i*1000)
		tmp.Sync()
		tmp.Close()
		if err := os.Rename(cp+".tmp", cp); err != nil {
			return err
		}
		if i >= 3 {
			old := filepath.Join(part, fmt.Sprintf("%020d", (i-3)*1000))
			for _, ext := range []string{".log", ".index", ".timeindex"} {
				if err := os.Rename(old+ext, old+ext+".deleted"); err != nil {
					return err
				}
				if err := os.Remove(old + ext + ".deleted"); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// reopen opens path with flags, runs fn on it and closes it.
func reopen(path string, flags int, fn func(*os.File) error) error {
	f, err := os.OpenFile(path, flags, 0o644)
	if err != nil {
		return err
	}
	err = fn(f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// die ends the program: with an error, or (nil) normally.
