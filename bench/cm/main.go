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
//	kafka: a segment roll as a Kafka broker does it: the active segment's
//	       .index is trimmed and the segment fsynced, the next .log and
//	       .index (preallocated 10 MiB) are created, get 64 KiB and 4 KiB,
//	       a checkpoint is written as .tmp, fsynced and renamed over the
//	       old one; then the segment three rolls back is renamed to
//	       .deleted and its files unlinked (retention).
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
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
	work, err := os.MkdirTemp("/var/tmp", "tierfs-bench-cm-")
	if err != nil {
		die(err)
	}
	// What to undo on the way out, newest first, also when a measurement
	// fails (fail exits without running deferred calls).
	var undo []func()
	fail := func(err error) {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
		die(err)
	}
	undo = append(undo, func() { os.RemoveAll(work) })
	defer func() { fail(nil) }()
	where := "a directory in /var/tmp"
	if *fsType != "" {
		dir, done, err := freshFS(work, *fsType)
		if err != nil {
			fail(fmt.Errorf("-fs %s: %w (-fs \"\" measures in /var/tmp instead)", *fsType, err))
		}
		undo = append(undo, done)
		work, where = dir, "a fresh "+*fsType+" file system (mkfs defaults, on a loop device)"
	}
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
				undo = append(undo, done)
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
			"files: create, write 4 KiB, rename over another, unlink every second; kafka: a segment roll as a broker does it (the rolled segment's .index trimmed and the segment fsynced, a new .log and preallocated .index, checkpoint .tmp fsynced and renamed over, retention of the segment three rolls back).", *runs, *ops, *bursts, where, benchutil.Machine())},
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

// freshFS makes a file system of type typ in an image file in work and
// mounts it; the measurements run there, as a broker's log dir is on a
// disk of its own. On a shared file system the results depend on what
// else it did lately: ext4 without a journal, as the root file system of
// this project's test machines is, skips every inode freed in the last
// few minutes when it allocates one, so one configuration's creates
// paid for another's (and an earlier program's) deletes.
func freshFS(work, typ string) (string, func(), error) {
	img, dir := filepath.Join(work, "fs.img"), filepath.Join(work, "fs")
	if err := os.Mkdir(dir, 0o755); err != nil {
		return "", nil, err
	}
	// Sparse: it takes what the measurements write, a few hundred MB.
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		return "", nil, err
	}
	if err := os.Truncate(img, 8<<30); err != nil {
		return "", nil, err
	}
	for _, cmd := range [][]string{{"mkfs." + typ, "-q", img}, {"mount", "-o", "loop", img, dir}} {
		if out, err := exec.Command(cmd[0], cmd[1:]...).CombinedOutput(); err != nil {
			return "", nil, fmt.Errorf("%s: %v: %s", strings.Join(cmd, " "), err, bytes.TrimSpace(out))
		}
	}
	return dir, func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "bench/cm: umount %s: %v: %s\n", dir, err, out)
		}
	}, nil
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
	entry := make([]byte, 4096)
	cp := filepath.Join(dir, "recovery-point-offset-checkpoint")
	// The active segment's files stay open, as a broker keeps them.
	var activeLog, activeIndex *os.File
	defer func() {
		if activeLog != nil {
			activeLog.Close()
			activeIndex.Close()
		}
	}()
	for i := 0; i < n; i++ {
		// The roll: the index of the segment that was active is trimmed
		// to its entries, and the segment flushed (Kafka schedules that
		// at once, UnifiedLog.roll), so what retention deletes later is
		// on disk, as it is in a broker.
		if activeLog != nil {
			activeIndex.Truncate(4096)
			for _, f := range []*os.File{activeLog, activeIndex} {
				if err := f.Sync(); err != nil {
					return err
				}
				f.Close()
			}
			activeLog, activeIndex = nil, nil
		}
		base := filepath.Join(part, fmt.Sprintf("%020d", i*1000))
		lf, err := os.OpenFile(base+".log", os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
		if err != nil {
			return err
		}
		ix, err := os.OpenFile(base+".index", os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
		if err != nil {
			lf.Close()
			return err
		}
		activeLog, activeIndex = lf, ix
		if err := ix.Truncate(10 << 20); err != nil { // preallocated
			return err
		}
		// What the segment gets while it is active.
		batch[0] = byte(i) // every segment different, as in a real log
		if _, err := lf.Write(batch); err != nil {
			return err
		}
		entry[0] = byte(i)
		if _, err := ix.WriteAt(entry, 0); err != nil {
			return err
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
			for _, ext := range []string{".log", ".index"} {
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

// die ends the program: with an error, or (nil) normally.
func die(err error) {
	if err == nil {
		os.Exit(0)
	}
	fmt.Fprintln(os.Stderr, "bench/cm:", err)
	os.Exit(1)
}
