// Package benchutil holds what the benchmark commands share: medians,
// sizes given on the command line, timing, and the raw S3 GET limit.
package benchutil

import (
	"context"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"slices"
	"strconv"
	"strings"
)

// Median is the middle value (the upper one of an even count); 0 for none.
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// ParseSize reads a positive size in bytes, with an optional KiB, MiB or
// GiB suffix.
func ParseSize(s string) (int64, error) {
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		m      int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}} {
		if strings.HasSuffix(s, u.suffix) {
			s, mult = strings.TrimSuffix(s, u.suffix), u.m
			break
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("bad size %q", s)
	}
	return n * mult, nil
}

// Time runs fn and says how long it took.
func Time(fn func()) time.Duration {
	t0 := time.Now()
	fn()
	return time.Since(t0)
}

// RawGet fetches size bytes of key with plain aws-sdk-go-v2 ranged GETs
// of chunk bytes, streams at a time: the limit tierfs's transfers are
// measured against. With dst set, each range is written there at its
// offset.
func RawGet(ctx context.Context, c *s3.Client, bucket, key string, size, chunk int64, streams int, dst io.WriterAt) error {
	n := (size + chunk - 1) / chunk
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, streams)
	for range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, chunk)
			for {
				i := next.Add(1) - 1
				if i >= n {
					return
				}
				off := i * chunk
				ln := min(chunk, size-off)
				out, err := c.GetObject(ctx, &s3.GetObjectInput{Bucket: &bucket, Key: &key, Range: aws.String(fmt.Sprintf("bytes=%d-%d", off, off+ln-1))})
				if err == nil {
					_, err = io.ReadFull(out.Body, buf[:ln])
					out.Body.Close()
				}
				if err == nil && dst != nil {
					_, err = dst.WriteAt(buf[:ln], off)
				}
				if err != nil {
					errs <- err
					next.Store(n) // stop the others
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}
