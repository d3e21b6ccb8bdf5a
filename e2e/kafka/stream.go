package kafka

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// TSBase is the timestamp of record 0 of every stream; record i has
// TSBase+i ms. It lies in 2023, so time retention must be off (-1) for
// topics that keep a stream.
const TSBase = 1_700_000_000_000

// Stream is a deterministic record stream for one partition: record i
// depends on i only, so a consumer can check every record it gets
// against the one produced at that offset, compacted or not.
type Stream struct {
	Topic string
	Size  int // value bytes
	// Keys, when set, makes keys repeat: record i has key i % Keys (for
	// compacted topics). Zero gives every record its own key.
	Keys int
	// Partition is the partition the stream is produced to (the same
	// records in each partition of a topic).
	Partition int32
}

func (s Stream) key(i int) []byte {
	if s.Keys > 0 {
		i %= s.Keys
	}
	return []byte(fmt.Sprintf("key-%07d", i))
}

// Record is record i: a key, two headers, a value half random and half
// repetitive (compresses like real payloads), a timestamp.
func (s Stream) Record(i int) *kgo.Record {
	v := make([]byte, s.Size)
	r := rand.New(rand.NewPCG(uint64(i), 77))
	for j := 0; j < s.Size/2; j++ {
		v[j] = byte(r.Uint32())
	}
	pat := []byte(fmt.Sprintf("event-%d;", i))
	copy(v[s.Size/2:], bytes.Repeat(pat, (s.Size+1)/2/len(pat)+1))
	return &kgo.Record{
		Topic:     s.Topic,
		Partition: s.Partition,
		Key:       s.key(i),
		Value:     v,
		Timestamp: time.UnixMilli(TSBase + int64(i)),
		Headers:   []kgo.RecordHeader{{Key: "seq", Value: []byte(strconv.Itoa(i))}, {Key: "src", Value: []byte("tierfs-e2e")}},
	}
}

// Check says how r differs from the record produced at its offset.
func (s Stream) Check(r *kgo.Record) error {
	want := s.Record(int(r.Offset))
	switch {
	case !bytes.Equal(r.Key, want.Key):
		return fmt.Errorf("offset %d: key %q, want %q", r.Offset, r.Key, want.Key)
	case !bytes.Equal(r.Value, want.Value):
		return fmt.Errorf("offset %d: value differs from what was produced", r.Offset)
	case !r.Timestamp.Equal(want.Timestamp):
		return fmt.Errorf("offset %d: timestamp %v, want %v", r.Offset, r.Timestamp, want.Timestamp)
	case !sameHeaders(r.Headers, want.Headers):
		return fmt.Errorf("offset %d: headers %v", r.Offset, r.Headers)
	}
	return nil
}

func sameHeaders(a, b []kgo.RecordHeader) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Key != b[i].Key || !bytes.Equal(a[i].Value, b[i].Value) {
			return false
		}
	}
	return true
}

// Produce writes records [from, to) of s to its partition (with
// ProducerOpts' manual partitioner) and waits until all are acknowledged.
func Produce(ctx context.Context, c *kgo.Client, s Stream, from, to int) error {
	failed := make(chan error, 1) // the first failure
	for i := from; i < to; i++ {
		c.Produce(ctx, s.Record(i), func(_ *kgo.Record, err error) {
			if err != nil {
				select {
				case failed <- err:
				default:
				}
			}
		})
	}
	if err := c.Flush(ctx); err != nil {
		return err
	}
	select {
	case err := <-failed:
		return err
	default:
		return nil
	}
}

// Consumed is what a consumer got.
type Consumed struct {
	Records int
	Bytes   int64  // keys and values
	Offsets []int  // in order
	Digest  string // of every record's offset, key, value, headers and time
}

// ErrStop ends Consume early when returned by Between.
var ErrStop = errors.New("stop")

// ConsumeOptions tune Consume.
type ConsumeOptions struct {
	// Between, if set, is called between polls; an error from it ends
	// Consume (ErrStop: without error).
	Between func() error
	// Unchecked skips comparing each record with the stream (and the
	// digest), for throughput measurements.
	Unchecked bool
}

// Consume reads s's partition of s.Topic from offset 0 with c (made with
// ConsumerOpts, or PartitionConsumerOpts) until it has read the record
// before offset end; each record is checked against s.
func Consume(ctx context.Context, c *kgo.Client, s Stream, end int, o ConsumeOptions) (Consumed, error) {
	var out Consumed
	h := sha256.New()
	last := -1
	for last < end-1 {
		fs := c.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return out, fmt.Errorf("consumed up to offset %d of %d: %w", last+1, end, err)
		}
		for _, e := range fs.Errors() {
			return out, fmt.Errorf("fetch %s/%d: %w", e.Topic, e.Partition, e.Err)
		}
		var bad error
		fs.EachRecord(func(r *kgo.Record) {
			if bad != nil {
				return
			}
			if int(r.Offset) <= last {
				bad = fmt.Errorf("offset %d after %d", r.Offset, last)
				return
			}
			last = int(r.Offset)
			out.Records++
			out.Bytes += int64(len(r.Key) + len(r.Value))
			if o.Unchecked {
				return
			}
			if err := s.Check(r); err != nil {
				bad = err
				return
			}
			out.Offsets = append(out.Offsets, last)
			fmt.Fprintf(h, "%d/%x/%x/%d/%v\n", r.Offset, r.Key, r.Value, r.Timestamp.UnixMilli(), r.Headers)
		})
		if bad != nil {
			return out, bad
		}
		if o.Between != nil {
			if err := o.Between(); errors.Is(err, ErrStop) {
				break
			} else if err != nil {
				return out, err
			}
		}
	}
	out.Digest = fmt.Sprintf("%x", h.Sum(nil))
	return out, nil
}

// ConsumerOpts are the options of a consumer that reads s from the
// start in a group of its own.
func ConsumerOpts(s Stream) []kgo.Opt {
	return []kgo.Opt{
		kgo.ConsumerGroup(fmt.Sprintf("check-%d", time.Now().UnixNano())),
		kgo.ConsumeTopics(s.Topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxBytes(16 << 20),
	}
}

// PartitionConsumerOpts are the options of a consumer that reads s's
// partition alone from the start, in no group.
func PartitionConsumerOpts(s Stream) []kgo.Opt {
	return []kgo.Opt{
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{s.Topic: {s.Partition: kgo.NewOffset().AtStart()}}),
		kgo.FetchMaxBytes(16 << 20),
	}
}

// ProducerOpts are the options of a producer of streams: every record to
// its stream's partition, batches as a busy producer makes them.
func ProducerOpts() []kgo.Opt {
	return []kgo.Opt{kgo.ProducerLinger(5 * time.Millisecond), kgo.RecordPartitioner(kgo.ManualPartitioner())}
}

// ProduceRounds writes rounds records to each of partitions partitions
// of topic, round by round: record j of every partition is stamped
// TSBase+j ms and acknowledged before round j+1 is sent. With the
// topic's segment.ms at n-1, each partition rolls a segment every n
// records (Kafka rolls by record time), so many small segments are
// quick to make.
func ProduceRounds(ctx context.Context, c *kgo.Client, topic string, partitions, rounds, size int) error {
	value := make([]byte, size)
	for i := range value {
		value[i] = byte(i*7 + i/13)
	}
	for j := range rounds {
		for p := range partitions {
			c.Produce(ctx, &kgo.Record{Topic: topic, Partition: int32(p), Key: []byte(fmt.Sprintf("k-%d-%d", p, j)), Value: value,
				Timestamp: time.UnixMilli(TSBase + int64(j))}, nil)
		}
		if err := c.Flush(ctx); err != nil {
			return err
		}
	}
	return nil
}
