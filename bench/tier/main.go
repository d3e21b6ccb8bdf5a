// Command tier measures reads of an evicted segment through a tierfs
// mount against versitygw on loopback, in one run: cold sequential read
// (page cache dropped, tierfs chunk cache off) next to raw ranged GETs of
// the same object and to s3fs and rclone mounts of it; first byte at a
// random offset; ls -l of a partition with 10,000 segments.
//
//	go run ./bench/tier -tierfs bin/tierfs -size 1GiB -runs 3
package main

import (
	"context"
	"flag"
	"fmt"
	"github.com/tierfs/tierfs/bench/internal/benchutil"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/tierfs/tierfs/chunkxfer"
	"github.com/tierfs/tierfs/chunkxfer/store"
	"github.com/tierfs/tierfs/chunkxfer/store/s3test"
	"github.com/tierfs/tierfs/idx/kafka/kafkatest"
)

const chunk = 8 << 20

// blockSize is the manifests' block size.
const blockSize = chunkxfer.DefaultBlockSize

func main() {
	bin := flag.String("tierfs", "bin/tierfs", "tierfs binary")
	sizeFlag := flag.String("size", "1GiB", "evicted segment size")
	runs := flag.Int("runs", 3, "runs of each measurement")
	segments := flag.Int("ls-segments", 10000, "segments in the partition listed by ls -l")
	peers := flag.Bool("peers", true, "measure s3fs and rclone too")
	variants := flag.String("variants", "", "comma-separated NAME=VALUE settings of the mount's environment, each measured as another mount (for tuning)")
	flag.Parse()
	size, err := benchutil.ParseSize(*sizeFlag)
	check(err)
	tierfsBin, err := filepath.Abs(*bin)
	check(err)
	dir, err := os.MkdirTemp("", "bench-tier-")
	check(err)
	defer os.RemoveAll(dir)

	srv, err := s3test.Start(filepath.Join(dir, "s3"))
	check(err)
	defer srv.Stop()
	ctx := context.Background()
	st, err := srv.NewStore(ctx, "bench", "")
	check(err)
	srvOpts = srv.Options("bench", "")
	client, bucket, _ := st.Client()

	backing, mnt := filepath.Join(dir, "backing"), filepath.Join(dir, "mnt")
	check(os.MkdirAll(mnt, 0o755))
	// One partition: a big rolled segment and a small active one.
	// Half the batches are gzip-compressed (kafkatest's pattern), which
	// shrinks their repeated-byte values: about 8.4 KB a batch on disk.
	batches := int(size / 8400)
	_, err = kafkatest.LogDir{Topic: "big", Partitions: 1, Segments: 2, Batches: batches, Records: 16, ValueSize: 1024, Age: time.Hour}.Write(backing)
	check(err)
	segPath := filepath.Join(mnt, "big-0", "00000000000000000000.log")
	fi, err := os.Stat(filepath.Join(backing, "big-0", "00000000000000000000.log"))
	check(err)
	size = fi.Size()
	mb := float64(size) / 1e6
	// A partition of many small segments for ls -l.
	many := filepath.Join(backing, "many-0")
	check(os.MkdirAll(many, 0o755))
	for i := range *segments {
		for _, ext := range []string{".log", ".index", ".timeindex"} {
			check(os.WriteFile(filepath.Join(many, fmt.Sprintf("%020d%s", i*1000, ext)), []byte("x"), 0o644))
		}
	}

	env := []string{"TIERFS_S3_ACCESS_KEY=" + srv.AccessKey, "TIERFS_S3_SECRET_KEY=" + srv.SecretKey}
	remote := "s3://bench/kafka?endpoint=" + srv.Endpoint
	mount := func(extra ...string) func() {
		env := append(env, extra...)
		if p := os.Getenv("BENCH_TIER_CPUPROFILE"); p != "" {
			env = append(env, "TIERFS_CPUPROFILE="+p)
		}
		unmount, err := benchutil.Mount(tierfsBin, filepath.Join(dir, "tierfs.log"), env, "--backing", backing, "--remote", remote, "--ship-after", "1m",
			"--local-retention-bytes", "1", "--tier-interval", "500ms", "--cache-bytes", "64MiB", mnt)
		check(err)
		return unmount
	}
	unmount := mount()
	fmt.Fprintln(os.Stderr, "waiting for the segment to ship and be evicted")
	check(benchutil.WaitFor(func() bool { return benchutil.Xattr(segPath, "user.tierfs.state") == "remote" }, 10*time.Minute, "eviction"))
	key := "kafka/" + benchutil.Xattr(segPath, "user.tierfs.rdi")

	// The peers are mounted once, before the runs.
	peerFiles := map[string]string{}
	if *peers {
		mounted, err := benchutil.MountPeers(dir, srv, "bench")
		check(err)
		for name, report := range map[string]string{benchutil.PeerS3fs: s3fsName, benchutil.PeerRclone: rcloneName} {
			if m, ok := mounted[name]; ok {
				peerFiles[report] = filepath.Join(m.Root, key)
			}
		}
	}
	const rawName, mountName = "raw ranged GETs, 1 stream", "tierfs mount, cold sequential read"
	names := []string{rawName, "raw ranged GETs, 8 streams", "chunkxfer.Reader alone (no FUSE), cold", mountName}
	var vars []string
	for _, v := range strings.Split(*variants, ",") {
		if v != "" {
			vars = append(vars, v)
			names = append(names, mountName+", "+v)
		}
	}
	for _, name := range []string{s3fsName, rcloneName} {
		if peerFiles[name] != "" {
			names = append(names, name)
		}
	}
	res := map[string][]float64{}
	// Each measurement starts with the page cache dropped, so the server
	// reads its disk cold for each of them alike.
	measure := func(name string, fn func()) {
		benchutil.DropCaches()
		res[name] = append(res[name], mb/benchutil.Time(fn).Seconds())
	}
	var firstByte, firstOpen, firstRead, firstGet, firstGet4k, firstGetBlock []float64
	for run := range *runs {
		fmt.Fprintf(os.Stderr, "run %d/%d\n", run+1, *runs)
		// Everything is measured in every run, in turn, so that each
		// run's ratios compare measurements taken moments apart.
		measure(rawName, func() { rawGet(ctx, client, bucket, key, size, 1) })
		measure("raw ranged GETs, 8 streams", func() { rawGet(ctx, client, bucket, key, size, 8) })
		measure("chunkxfer.Reader alone (no FUSE), cold", func() { readerAlone(ctx, st, strings.TrimPrefix(key, "kafka/")) })
		measure(mountName, func() { readFile(segPath, 1<<20) })
		// First byte at a random offset, cold.
		r := rand.New(rand.NewPCG(uint64(run), 9))
		for range 5 {
			off := r.Int64N(size - 4096)
			benchutil.DropCaches()
			open, read := preadOnce(segPath, off)
			firstByte = append(firstByte, (open+read).Seconds()*1000)
			firstOpen = append(firstOpen, open.Seconds()*1000)
			firstRead = append(firstRead, read.Seconds()*1000)
			benchutil.DropCaches()
			// What the mount's first read fetches, unless the kernel's
			// read crosses into the next block: the 256 KiB block
			// that holds the offset.
			b0 := off / blockSize * blockSize
			firstGetBlock = append(firstGetBlock, benchutil.Time(func() { rawGetRange(ctx, client, bucket, key, b0, min(blockSize, size-b0)) }).Seconds()*1000)
			benchutil.DropCaches()
			firstGet = append(firstGet, benchutil.Time(func() { rawGetRange(ctx, client, bucket, key, off/chunk*chunk, min(chunk, size-off/chunk*chunk)) }).Seconds()*1000)
			benchutil.DropCaches()
			firstGet4k = append(firstGet4k, benchutil.Time(func() { rawGetRange(ctx, client, bucket, key, off, 4096) }).Seconds()*1000)
		}
		if len(vars) > 0 {
			unmount()
			for _, v := range vars {
				unmountV := mount(v)
				measure(mountName+", "+v, func() { readFile(segPath, 1<<20) })
				unmountV()
			}
			unmount = mount()
		}
		for _, name := range []string{s3fsName, rcloneName} {
			if f := peerFiles[name]; f != "" {
				measure(name, func() { readFile(f, 1<<20) })
			}
		}
	}
	// ls -l of 10,000 segments (30,000 files), through the mount and native.
	var lsMount, lsNative []float64
	for range *runs {
		lsMount = append(lsMount, benchutil.Time(func() { run("ls", "-l", filepath.Join(mnt, "many-0")) }).Seconds())
		lsNative = append(lsNative, benchutil.Time(func() { run("ls", "-l", many) }).Seconds())
	}
	unmount()
	benchutil.UnmountPeers(dir)

	rep := benchutil.Report{
		Name:  "tier",
		Title: "Reads of an evicted segment",
		Notes: []string{fmt.Sprintf("versitygw v1.8.0 on 127.0.0.1; an evicted segment of %.0f MB read cold (page cache dropped, the mount's chunk memory 64 MiB) through the mount, next to raw aws-sdk-go-v2 ranged GETs of the same object and to s3fs and rclone mounts of it; medians of %d runs, ratios are medians of the per-run ratios to one raw GET stream; %s.",
			mb, *runs, benchutil.Machine())},
		Header:   []string{"reader", "MB/s", "× raw 1 GET"},
		Versions: map[string]string{"versitygw": "v1.8.0"},
	}
	ch := benchutil.Chart{Title: "Cold sequential read of an evicted segment", Unit: "MB/s"}
	for _, name := range names {
		m := benchutil.Median(res[name])
		rep.Rows = append(rep.Rows, []string{name, fmt.Sprintf("%.0f", m), fmt.Sprintf("%.2f", benchutil.Median(benchutil.Ratios(res[name], res[rawName])))})
		ch.Bars = append(ch.Bars, benchutil.Bar{Label: name, Value: m})
	}
	rep.Charts = []benchutil.Chart{ch}
	rep.After = []string{
		fmt.Sprintf("First byte at a random offset through the mount (cold, median of %d samples): %.1f ms (the open %.1f ms, the read %.1f ms); one raw GET of its 8 MiB chunk %.1f ms (× %.2f); of the 256 KiB block that holds it %.1f ms; of 4 KiB %.1f ms (× %.2f).",
			len(firstByte), benchutil.Median(firstByte), benchutil.Median(firstOpen), benchutil.Median(firstRead), benchutil.Median(firstGet), benchutil.Median(firstByte)/benchutil.Median(firstGet),
			benchutil.Median(firstGetBlock), benchutil.Median(firstGet4k), benchutil.Median(benchutil.Ratios(firstByte, firstGet4k))),
		fmt.Sprintf("ls -l of %d segments (%d files): mount %.3f s, native %.3f s (× %.2f).", *segments, 3**segments, benchutil.Median(lsMount), benchutil.Median(lsNative), benchutil.Median(lsMount)/benchutil.Median(lsNative)),
	}
	check(rep.Emit())
}

func readFile(path string, bs int) {
	f, err := os.Open(path)
	check(err)
	defer f.Close()
	buf := make([]byte, bs)
	for {
		_, err := f.Read(buf)
		if err == io.EOF {
			return
		}
		check(err)
	}
}

// preadOnce opens path and reads the byte at off; it returns how long
// the open and the read took.
func preadOnce(path string, off int64) (open, read time.Duration) {
	t0 := time.Now()
	f, err := os.Open(path)
	check(err)
	defer f.Close()
	open = time.Since(t0)
	buf := make([]byte, 1)
	t1 := time.Now()
	_, err = f.ReadAt(buf, off)
	check(err)
	return open, time.Since(t1)
}

func rawGetRange(ctx context.Context, c *s3.Client, bucket, key string, off, n int64) {
	out, err := c.GetObject(ctx, &s3.GetObjectInput{Bucket: &bucket, Key: &key, Range: aws.String(fmt.Sprintf("bytes=%d-%d", off, off+n-1))})
	check(err)
	_, err = io.Copy(io.Discard, out.Body)
	out.Body.Close()
	check(err)
}

func rawGet(ctx context.Context, c *s3.Client, bucket, key string, size int64, streams int) {
	check(benchutil.RawGet(ctx, c, bucket, key, size, chunk, streams, nil))
}

func run(name string, args ...string) {
	cmd := exec.Command(name, args...)
	cmd.Stdout = io.Discard
	check(cmd.Run())
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench-tier:", err)
		os.Exit(1)
	}
}

// readerAlone reads the object with chunkxfer's Reader as tierfs does,
// without FUSE in between (the store has the bucket root; tierfs's
// objects are under the kafka/ prefix).
func readerAlone(ctx context.Context, st *store.S3, key string) {
	ps, err := store.NewS3(ctx, func() store.S3Options { o := srvOpts; o.Prefix = "kafka/"; return o }())
	check(err)
	cache, err := chunkxfer.NewPool(64<<20, nil)
	check(err)
	defer cache.Close()
	r, err := chunkxfer.NewReader(ctx, ps, key, cache, chunkxfer.ReaderOptions{ReadAhead: 4})
	check(err)
	defer r.Close()
	buf := make([]byte, 1<<20)
	for off := int64(0); off < r.Size(); {
		n, err := r.ReadAt(buf, off)
		if err != nil && err != io.EOF {
			check(err)
		}
		off += int64(n)
	}
}

var srvOpts store.S3Options

const (
	s3fsName   = "s3fs (Debian), cold sequential read"
	rcloneName = "rclone mount (Debian), cold sequential read"
)
