// Package benchutil holds what the benchmark commands share: medians,
// sizes given on the command line, timing, and the raw S3 GET limit.
package benchutil

import (
	"github.com/tierfs/tierfs/internal/units"

	"context"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"slices"
)

// Median is the middle value (the mean of the two middle ones of an even
// count: of two runs, not the better one); 0 for none.
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 0 {
		return (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return s[len(s)/2]
}

// ParseSize reads a positive size in bytes (units.ParseSize).
func ParseSize(s string) (int64, error) {
	n, err := units.ParseSize(s)
	if err == nil && n == 0 {
		err = fmt.Errorf("size %q is zero", s)
	}
	return n, err
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
