// Command xfer measures chunkxfer against versitygw on loopback, in one
// run: raw aws-sdk-go-v2 multipart PUT and ranged GETs (1 and 8 streams)
// as the limits, then the Uploader, Downloader and a sequential Reader on
// the same file, medians of several runs, with the reader's peak heap.
//
//	go run ./bench/xfer -size 1GiB -runs 3
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"github.com/tierfs/tierfs/bench/internal/benchutil"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"

	"github.com/tierfs/tierfs/chunkxfer"
	"github.com/tierfs/tierfs/chunkxfer/store"
	"github.com/tierfs/tierfs/chunkxfer/store/s3test"
)

const chunk = chunkxfer.DefaultChunkSize

func main() {
	sizeFlag := flag.String("size", "1GiB", "file size (bytes or KiB/MiB/GiB)")
	runs := flag.Int("runs", 3, "runs")
	parallel := flag.Int("parallel", 4, "parts in flight for PUTs and the Uploader")
	cacheMiB := flag.Int64("cache", 64, "reader cache, MiB")
	readAhead := flag.Int("readahead", 4, "reader read-ahead, chunks")
	workdir := flag.String("dir", "", "work directory (default a temporary one, removed after)")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the Reader runs here")
	flag.Parse()
	size, err := benchutil.ParseSize(*sizeFlag)
	check(err)
	dir := *workdir
	if dir == "" {
		dir, err = os.MkdirTemp("", "bench-xfer-")
		check(err)
		defer os.RemoveAll(dir)
	}
	srv, err := s3test.Start(filepath.Join(dir, "s3"))
	check(err)
	defer srv.Stop()
	ctx := context.Background()
	st, err := srv.NewStore(ctx, "bench", "")
	check(err)
	client, bucket, _ := st.Client()

	src := filepath.Join(dir, "src")
	writeRandom(src, size)
	mb := float64(size) / 1e6
	type result map[string][]float64
	res := result{}
	add := func(name string, d time.Duration) { res[name] = append(res[name], mb/d.Seconds()) }
	var peakHeap []float64

	for run := range *runs {
		fmt.Fprintf(os.Stderr, "run %d/%d\n", run+1, *runs)
		add("raw multipart PUT", benchutil.Time(func() { rawPut(ctx, client, bucket, "raw", src, size, *parallel) }))
		up := &chunkxfer.Uploader{Store: st, JournalDir: filepath.Join(dir, "journal"), Parallel: *parallel}
		key := fmt.Sprintf("ours-%d", run)
		add("Uploader", benchutil.Time(func() { _, err := up.Upload(ctx, src, key); check(err) }))
		add("raw ranged GET, 1 stream", benchutil.Time(func() { rawGet(ctx, client, bucket, key, size, 1, "") }))
		add("raw ranged GET, 8 streams", benchutil.Time(func() { rawGet(ctx, client, bucket, key, size, 8, "") }))
		rawDest := filepath.Join(dir, "rawdest")
		add("raw GET, 8 streams, to file+fsync", benchutil.Time(func() { rawGet(ctx, client, bucket, key, size, 8, rawDest) }))
		os.Remove(rawDest)
		dl := &chunkxfer.Downloader{Store: st, JournalDir: filepath.Join(dir, "journal"), Parallel: 8}
		dest := filepath.Join(dir, "dest")
		add("Downloader, 8 streams", benchutil.Time(func() { _, err := dl.Download(ctx, key, dest); check(err) }))
		os.Remove(dest)
		cache, err := chunkxfer.NewPool(*cacheMiB<<20, nil)
		check(err)
		var peak atomic.Uint64
		stop := sampleHeap(&peak)
		if *cpuprofile != "" {
			pf, err := os.Create(*cpuprofile)
			check(err)
			check(pprof.StartCPUProfile(pf))
		}
		add("Reader, sequential 1 MiB reads", benchutil.Time(func() { readSeq(ctx, st, key, cache, *readAhead) }))
		if *cpuprofile != "" {
			pprof.StopCPUProfile()
		}
		stop()
		peakHeap = append(peakHeap, float64(peak.Load())/(1<<20))
		cache.Close()
		check(st.Delete(ctx, key))
		check(st.Delete(ctx, chunkxfer.ManifestKey(key)))
		runtime.GC()
	}

	rep := benchutil.Report{
		Name:  "xfer",
		Title: "Transfers: chunkxfer against raw aws-sdk-go-v2",
		Notes: []string{fmt.Sprintf("versitygw v1.8.0 on 127.0.0.1, a %.0f MB file, %d MiB chunks/parts, %d parts in flight; medians of %d runs; %s. "+
			"Each of chunkxfer's transfers is given as a ratio to its limit: the Uploader to raw multipart PUT, the Downloader to raw 8-stream GETs written to a synced file (a durable download cannot beat the disk), the Reader to one raw stream.",
			mb, chunk>>20, *parallel, *runs, benchutil.Machine())},
		Header:   []string{"transfer", "MB/s", "× limit"},
		Versions: map[string]string{"versitygw": "v1.8.0"},
	}
	limits := map[string]string{
		"Uploader":                       "raw multipart PUT",
		"Downloader, 8 streams":          "raw GET, 8 streams, to file+fsync",
		"Reader, sequential 1 MiB reads": "raw ranged GET, 1 stream",
	}
	ch := benchutil.Chart{Title: "Transfers to and from versitygw", Unit: "MB/s"}
	for _, name := range []string{"raw multipart PUT", "Uploader", "raw ranged GET, 1 stream", "raw ranged GET, 8 streams", "raw GET, 8 streams, to file+fsync", "Downloader, 8 streams", "Reader, sequential 1 MiB reads"} {
		m := benchutil.Median(res[name])
		ratio := ""
		if l, ok := limits[name]; ok {
			ratio = fmt.Sprintf("%.2f", m/benchutil.Median(res[l]))
		}
		rep.Rows = append(rep.Rows, []string{name, fmt.Sprintf("%.0f", m), ratio})
		ch.Bars = append(ch.Bars, benchutil.Bar{Label: name, Value: m})
	}
	rep.Charts = []benchutil.Chart{ch}
	rep.After = []string{fmt.Sprintf("Reader peak heap: %.0f MiB (median; cache %d MiB, read-ahead %d × %d MiB).", benchutil.Median(peakHeap), *cacheMiB, *readAhead, chunk>>20)}
	check(rep.Emit())
}

func rawPut(ctx context.Context, c *s3.Client, bucket, key, path string, size int64, parallel int) {
	f, err := os.Open(path)
	check(err)
	defer f.Close()
	out, err := c.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{Bucket: &bucket, Key: &key})
	check(err)
	n := int((size + chunk - 1) / chunk)
	parts := make([]types.CompletedPart, n)
	sem := make(chan struct{}, parallel)
	var wg sync.WaitGroup
	for i := range n {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			off := int64(i) * chunk
			ln := min(chunk, size-off)
			buf := make([]byte, ln)
			_, err := f.ReadAt(buf, off)
			check(err)
			p, err := c.UploadPart(ctx, &s3.UploadPartInput{Bucket: &bucket, Key: &key, UploadId: out.UploadId,
				PartNumber: aws.Int32(int32(i + 1)), Body: bytes.NewReader(buf), ContentLength: aws.Int64(ln)})
			check(err)
			parts[i] = types.CompletedPart{PartNumber: aws.Int32(int32(i + 1)), ETag: p.ETag}
		}()
	}
	wg.Wait()
	_, err = c.CompleteMultipartUpload(ctx, &s3.CompleteMultipartUploadInput{Bucket: &bucket, Key: &key, UploadId: out.UploadId,
		MultipartUpload: &types.CompletedMultipartUpload{Parts: parts}})
	check(err)
}

// rawGet fetches the object in chunk ranges with streams goroutines,
// into dest (written at the offsets, then synced) when it is not "".
func rawGet(ctx context.Context, c *s3.Client, bucket, key string, size int64, streams int, dest string) {
	var dst io.WriterAt
	if dest != "" {
		f, err := os.Create(dest)
		check(err)
		defer func() { check(f.Sync()); check(f.Close()) }()
		dst = f
	}
	check(benchutil.RawGet(ctx, c, bucket, key, size, chunk, streams, dst))
}

func readSeq(ctx context.Context, s store.Store, key string, cache *chunkxfer.Pool, readAhead int) {
	r, err := chunkxfer.NewReader(ctx, s, key, cache, chunkxfer.ReaderOptions{ReadAhead: readAhead})
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

// sampleHeap records the peak in-use heap until stop is called.
func sampleHeap(peak *atomic.Uint64) (stop func()) {
	runtime.GC()
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		var ms runtime.MemStats
		for {
			runtime.ReadMemStats(&ms)
			if ms.HeapInuse > peak.Load() {
				peak.Store(ms.HeapInuse)
			}
			select {
			case <-done:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	return func() { close(done); wg.Wait() }
}

func writeRandom(path string, size int64) {
	f, err := os.Create(path)
	check(err)
	r := rand.New(rand.NewPCG(1, 2))
	buf := make([]byte, 1<<20)
	for left := size; left > 0; {
		for i := 0; i < len(buf); i += 8 {
			v := r.Uint64()
			for j := range 8 {
				buf[i+j] = byte(v >> (8 * j))
			}
		}
		n := min(left, int64(len(buf)))
		_, err := f.Write(buf[:n])
		check(err)
		left -= n
	}
	check(f.Close())
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench-xfer:", err)
		os.Exit(1)
	}
}
