// Command segscan measures how fast idx/kafka scans a Kafka segment from
// the page cache: batch headers only, and with CRC32C verification, next
// to `cat FILE > /dev/null` on the same file, in one run, as medians.
//
//	go run ./bench/segscan -size 1GiB -runs 5 [-file /tmp/seg.log]
package main

import (
	"bufio"
	"flag"
	"fmt"
	"github.com/tierfs/tierfs/bench/internal/benchutil"
	"os"
	"os/exec"
	"time"

	"github.com/tierfs/tierfs/idx"
	"github.com/tierfs/tierfs/idx/kafka"
	"github.com/tierfs/tierfs/idx/kafka/kafkatest"
)

func main() {
	sizeFlag := flag.String("size", "1GiB", "segment size (bytes, or with KiB/MiB/GiB)")
	runs := flag.Int("runs", 5, "runs of each measurement")
	file := flag.String("file", "", "segment file to scan (written when missing; default a temporary file, removed after)")
	recSize := flag.Int("record", 1024, "record value size")
	perBatch := flag.Int("batch", 16, "records per batch")
	flag.Parse()
	size, err := benchutil.ParseSize(*sizeFlag)
	if err != nil {
		fail(err)
	}
	path := *file
	if path == "" {
		f, err := os.CreateTemp("", "segscan-*.log")
		if err != nil {
			fail(err)
		}
		f.Close()
		path = f.Name()
		defer os.Remove(path)
		if err := writeSegment(path, size, *recSize, *perBatch); err != nil {
			fail(err)
		}
	} else if _, err := os.Stat(path); err != nil {
		if err := writeSegment(path, size, *recSize, *perBatch); err != nil {
			fail(err)
		}
	}
	st, err := os.Stat(path)
	if err != nil {
		fail(err)
	}
	mb := float64(st.Size()) / 1e6

	measure := map[string]func() error{
		"cat": func() error {
			cmd := exec.Command("sh", "-c", `cat "$0" > /dev/null`, path)
			cmd.Stderr = os.Stderr
			return cmd.Run()
		},
		"headers": func() error { return scan(path, false) },
		"crc":     func() error { return scan(path, true) },
		"chunk": func() error {
			f, err := os.Open(path)
			if err != nil {
				return err
			}
			defer f.Close()
			c, err := idx.ChunkSegment(path, f, st.Size(), 0, idx.ChunkOptions{VerifyCRC: true})
			if err == nil && c.Opaque {
				err = c.Reason
			}
			return err
		},
	}
	order := []string{"cat", "headers", "crc", "chunk"}
	// Warm the page cache.
	if err := measure["cat"](); err != nil {
		fail(err)
	}
	times := map[string][]float64{}
	for range *runs {
		for _, name := range order {
			t0 := time.Now()
			if err := measure[name](); err != nil {
				fail(fmt.Errorf("%s: %w", name, err))
			}
			times[name] = append(times[name], time.Since(t0).Seconds())
		}
	}
	rep := benchutil.Report{
		Name:  "segscan",
		Title: "Segment scanning",
		Notes: []string{fmt.Sprintf("A %.0f MB segment of %d-byte records, %d per batch, page cache warm; medians of %d runs, next to cat > /dev/null; %s.",
			mb, *recSize, *perBatch, *runs, benchutil.Machine())},
		Header: []string{"measurement", "MB/s", "× cat"},
	}
	catMed := benchutil.Median(times["cat"])
	labels := map[string]string{"cat": "cat > /dev/null", "headers": "scan, headers only", "crc": "scan, with CRC32C", "chunk": "chunker (CRC, 8 MiB chunks)"}
	ch := benchutil.Chart{Title: "Segment scan (page cache warm)", Unit: "MB/s"}
	for _, name := range order {
		m := benchutil.Median(times[name])
		rep.Rows = append(rep.Rows, []string{labels[name], fmt.Sprintf("%.0f", mb/m), fmt.Sprintf("%.2f", catMed/m)})
		ch.Bars = append(ch.Bars, benchutil.Bar{Label: labels[name], Value: mb / m})
	}
	rep.Charts = []benchutil.Chart{ch}
	if err := rep.Emit(); err != nil {
		fail(err)
	}
}

func scan(path string, crc bool) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	res, err := kafka.ScanBatches(path, f, st.Size(), kafka.ScanOptions{VerifyCRC: crc}, func(kafka.Batch) error { return nil })
	if err == nil && (res.Torn || res.End != st.Size()) {
		err = fmt.Errorf("scan ended at %d of %d", res.End, st.Size())
	}
	return err
}

// writeSegment writes real record batches up to about size bytes.
func writeSegment(path string, size int64, recSize, perBatch int) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := bufio.NewWriterSize(f, 1<<20)
	var n, off int64
	ts := time.Now().UnixMilli()
	for n < size {
		b := kafkatest.Encode(kafkatest.Batch{Base: off, Records: perBatch, ValueSize: recSize, TS: ts + off})
		if _, err := w.Write(b); err != nil {
			f.Close()
			return err
		}
		n += int64(len(b))
		off += int64(perBatch)
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "segscan:", err)
	os.Exit(1)
}
