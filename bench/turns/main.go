// Command turns reads evicted segments through a tierfs mount the way a
// Kafka consumer catching up on many partitions does, without Kafka: a
// few readers, each with its share of the partitions open, read 1 MiB
// of each partition in turn until every segment is read. For each
// --cache-bytes it mounts tierfs afresh over the same log dir (a dir
// store in the same work directory), waits until every rolled segment
// is evicted, drops the page cache and reads everything -rounds times.
// It prints, per round: MB/s, the mount's CPU seconds, its garbage
// collections (from GODEBUG=gctrace=1 in its log) and its CPU at rest
// in the -rest after. A quick loop (minutes) for the memory settings;
// bench/kafkacatchup is the same pattern with a real broker. Not a test.
//
//	go run ./bench/turns -tierfs bin/tierfs -partitions 1000 -batches 720 -budgets 256MiB,1GiB
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tierfs/tierfs/bench/internal/benchutil"
	"github.com/tierfs/tierfs/idx/kafka/kafkatest"
	"github.com/tierfs/tierfs/internal/procmem"
)

func main() {
	bin := flag.String("tierfs", "bin/tierfs", "tierfs binary")
	partitions := flag.Int("partitions", 1000, "partitions, each with one rolled segment read and an active one")
	batches := flag.Int("batches", 720, "batches of 16 records of 1 KiB in each segment (720: about 6 MB)")
	budgets := flag.String("budgets", "256MiB,1GiB", "--cache-bytes of each mount, comma-separated")
	readers := flag.Int("readers", 2, "readers, each reading its share of the partitions in turns")
	turn := flag.Int("turn", 1<<20, "bytes read of a partition in its turn")
	rounds := flag.Int("rounds", 2, "reads of everything per mount")
	rest := flag.Duration("rest", 20*time.Second, "how long the mount's CPU at rest is measured after each round")
	flag.Parse()

	u := benchutil.NewUndo("bench-turns")
	check := u.Check
	tierfsBin, err := filepath.Abs(*bin)
	check(err)
	dir, where := benchutil.WorkDir(u, "/var/tmp", "", 0)
	logs := filepath.Join(dir, "logs")
	_, err = kafkatest.LogDir{Topic: "turns", Partitions: *partitions, Segments: 2, Batches: *batches, Records: 16, ValueSize: 1024, Age: time.Hour, Repeat: true}.Write(logs)
	check(err)
	fmt.Printf("%d partitions of %d batches, %d readers in turns of %d bytes; in %s; %s\n", *partitions, *batches, *readers, *turn, where, benchutil.Machine())
	for i, budget := range strings.Split(*budgets, ",") {
		base := filepath.Join(dir, fmt.Sprint(i))
		backing, mnt, remote := filepath.Join(base, "backing"), filepath.Join(base, "mnt"), filepath.Join(base, "remote")
		for _, d := range []string{mnt, remote} {
			check(os.MkdirAll(d, 0o755))
		}
		check(benchutil.CopyTree(logs, backing))
		logPath := filepath.Join(base, "tierfs.log")
		unmount, pid, err := benchutil.MountProc(tierfsBin, logPath, []string{"GODEBUG=gctrace=1"}, "--backing", backing, "--remote", "file://"+remote,
			"--ship-after", "0s", "--local-retention-bytes", "1", "--tier-interval", "500ms", "--cache-bytes", budget, mnt)
		check(err)
		u.Push(unmount)
		files, err := filepath.Glob(filepath.Join(mnt, "turns-*", "00000000000000000000.log"))
		check(err)
		check(benchutil.WaitFor(func() bool { return benchutil.AllRemote(files) }, 30*time.Minute, "every rolled segment evicted"))
		for r := range *rounds {
			benchutil.DropCaches()
			gc0, cpu0 := gcs(logPath), cpuSeconds(pid)
			t0 := time.Now()
			n, err := readInTurns(files, *readers, *turn)
			check(err)
			d := time.Since(t0)
			gc1, cpu1 := gcs(logPath), cpuSeconds(pid)
			time.Sleep(*rest)
			cpu2 := cpuSeconds(pid)
			fmt.Printf("--cache-bytes %s, round %d: %.0f MB/s (%.0f MB in %.1f s), the mount's CPU %.1f s, %d collections; at rest after: %.1f %% of a core\n",
				budget, r+1, float64(n)/1e6/d.Seconds(), float64(n)/1e6, d.Seconds(), cpu1-cpu0, gc1-gc0, (cpu2-cpu1)/rest.Seconds()*100)
		}
		unmount()
	}
	u.Run()
}

// readInTurns reads every file whole: readers goroutines, each with its
// share of the files open, read turn bytes of each of its files in turn.
func readInTurns(files []string, readers, turn int) (int64, error) {
	var total atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, readers)
	for w := range readers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var fs []*os.File
			defer func() {
				for _, f := range fs {
					f.Close()
				}
			}()
			for i := w; i < len(files); i += readers {
				f, err := os.Open(files[i])
				if err != nil {
					errs <- err
					return
				}
				fs = append(fs, f)
			}
			buf := make([]byte, turn)
			for off := int64(0); ; off += int64(turn) {
				more := false
				for _, f := range fs {
					n, err := f.ReadAt(buf, off)
					if n > 0 {
						more = true
						total.Add(int64(n))
					}
					if err != nil && n == 0 && !errors.Is(err, io.EOF) {
						errs <- fmt.Errorf("%s at %d: %w", f.Name(), off, err)
						return
					}
				}
				if !more {
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	return total.Load(), <-errs
}

// gcs counts the collections the mount's log shows (GODEBUG=gctrace=1).
func gcs(logPath string) int {
	b, err := os.ReadFile(logPath)
	if err != nil {
		return 0
	}
	n := 0
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "gc ") {
			n++
		}
	}
	return n
}

// cpuSeconds is the CPU time process pid has used so far.
func cpuSeconds(pid int) float64 {
	s, err := procmem.CPUSeconds(pid)
	if err != nil {
		return math.NaN()
	}
	return s
}
