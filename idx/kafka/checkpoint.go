package kafka

import (
	"bytes"
	"strconv"
	"strings"
)

// TopicPartition names one partition.
type TopicPartition struct {
	Topic     string
	Partition int32
}

// OffsetCheckpoint is a parsed recovery-point-offset-checkpoint,
// replication-offset-checkpoint or log-start-offset-checkpoint file:
//
//	0                 version
//	2                 number of entries
//	orders 0 1234     topic partition offset
//	orders 1 99
type OffsetCheckpoint map[TopicPartition]int64

// maxCheckpointLine bounds one line; Kafka's lines are a topic name (at
// most 249 bytes) and two numbers.
const maxCheckpointLine = 512

// ParseOffsetCheckpoint parses an offset checkpoint. name is used in errors.
func ParseOffsetCheckpoint(name string, data []byte) (OffsetCheckpoint, error) {
	out := OffsetCheckpoint{}
	err := parseCheckpoint(name, data, 3, func(off int64, f []string) error {
		p, err := strconv.ParseInt(f[1], 10, 32)
		if err != nil || p < 0 {
			return formatErr(name, off, "bad partition %q", f[1])
		}
		o, err := strconv.ParseInt(f[2], 10, 64)
		if err != nil {
			return formatErr(name, off, "bad offset %q", f[2])
		}
		if !validTopic(f[0]) {
			return formatErr(name, off, "bad topic %q", f[0])
		}
		tp := TopicPartition{f[0], int32(p)}
		if _, dup := out[tp]; dup {
			return formatErr(name, off, "%s-%d listed twice", tp.Topic, tp.Partition)
		}
		out[tp] = o
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// EpochEntry is one line of a leader-epoch-checkpoint: the first offset
// written under a leader epoch.
type EpochEntry struct {
	Epoch       int32
	StartOffset int64
}

// ParseLeaderEpochCheckpoint parses a partition's leader-epoch-checkpoint.
func ParseLeaderEpochCheckpoint(name string, data []byte) ([]EpochEntry, error) {
	var out []EpochEntry
	err := parseCheckpoint(name, data, 2, func(off int64, f []string) error {
		e, err := strconv.ParseInt(f[0], 10, 32)
		if err != nil || e < 0 {
			return formatErr(name, off, "bad epoch %q", f[0])
		}
		o, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil || o < 0 {
			return formatErr(name, off, "bad start offset %q", f[1])
		}
		out = append(out, EpochEntry{int32(e), o})
		return nil
	})
	return out, err
}

// parseCheckpoint reads the version line (which must be 0), the count line
// and exactly count entry lines of fields fields each.
func parseCheckpoint(name string, data []byte, fields int, entry func(off int64, f []string) error) error {
	var off int64
	next := func() (string, int64, bool) {
		if len(data) == 0 {
			return "", off, false
		}
		start := off
		i := bytes.IndexByte(data, '\n')
		var line []byte
		if i < 0 {
			line, data = data, nil
		} else {
			line, data = data[:i], data[i+1:]
		}
		off += int64(len(line)) + 1
		return strings.TrimSuffix(string(line), "\r"), start, true
	}
	line, at, ok := next()
	if !ok {
		// As Kafka's own reader: an empty file (the broker creates
		// cleaner-offset-checkpoint empty) is an empty checkpoint.
		return nil
	}
	if line != "0" {
		return formatErr(name, at, "unsupported version %q (want 0)", trunc(line))
	}
	line, at, ok = next()
	if !ok {
		return formatErr(name, at, "missing count line")
	}
	count, err := strconv.Atoi(line)
	if err != nil || count < 0 {
		return formatErr(name, at, "bad count %q", trunc(line))
	}
	for i := range count {
		line, at, ok = next()
		if !ok {
			return formatErr(name, at, "count says %d entries, found %d", count, i)
		}
		if len(line) > maxCheckpointLine {
			return formatErr(name, at, "line of %d bytes is too long", len(line))
		}
		f := strings.Fields(line)
		if len(f) != fields {
			return formatErr(name, at, "want %d fields, got %d in %q", fields, len(f), trunc(line))
		}
		if err := entry(at, f); err != nil {
			return err
		}
	}
	for {
		line, at, ok = next()
		if !ok {
			return nil
		}
		if strings.TrimSpace(line) != "" {
			return formatErr(name, at, "count says %d entries, but more follow", count)
		}
	}
}

func trunc(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}
