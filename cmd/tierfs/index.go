package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/tierfs/tierfs/idx"
	"github.com/tierfs/tierfs/idx/kafka"
	"github.com/urfave/cli/v2"
)

// File kinds the index command reads, named as --type takes them.
const (
	kindIndexFile   = "index"       // remote log segment index (idx.FileName)
	kindSegment     = "log"         // Kafka segment
	kindOffsetIndex = "offsetindex" // Kafka .index
	kindTimeIndex   = "timeindex"   // Kafka .timeindex
	kindROffset     = "rindex"      // remote offset index
	kindRTime       = "rtimeindex"  // remote timestamp index
	kindCheckpoint  = "checkpoint"  // offset checkpoint files
	kindEpochs      = "leader-epoch-checkpoint"
)

var kinds = []string{kindIndexFile, kindSegment, kindOffsetIndex, kindTimeIndex, kindROffset, kindRTime, kindCheckpoint, kindEpochs}

func cmdIndex() *cli.Command {
	typeFlag := &cli.StringFlag{Name: "type", Usage: "file kind, when the name does not say: " + strings.Join(kinds, ", ")}
	return &cli.Command{
		Name:  "index",
		Usage: "read tierfs's and Kafka's index and segment files",
		Subcommands: []*cli.Command{
			{
				Name:      "dump",
				Usage:     "print a file as a table",
				ArgsUsage: "PATH",
				Flags:     []cli.Flag{typeFlag},
				Action: func(c *cli.Context) error {
					path, kind, err := indexArgs(c)
					if err != nil {
						return err
					}
					return indexDump(c.App.Writer, path, kind)
				},
			},
			{
				Name: "verify",
				Usage: "check a file; exit 1 naming the file and byte offset of the first problem " +
					"(a segment is checked with its .index and .timeindex when they are beside it)",
				ArgsUsage: "PATH",
				Flags:     []cli.Flag{typeFlag},
				Action: func(c *cli.Context) error {
					path, kind, err := indexArgs(c)
					if err != nil {
						return err
					}
					summary, err := indexVerify(path, kind)
					if err != nil {
						return &exitError{code: 1, err: err}
					}
					fmt.Fprintf(c.App.Writer, "%s: ok: %s\n", path, summary)
					return nil
				},
			},
		},
	}
}

func indexArgs(c *cli.Context) (path, kind string, err error) {
	if c.NArg() != 1 {
		return "", "", &exitError{code: 2, err: fmt.Errorf("index %s takes one argument: the file", c.Command.Name)}
	}
	path = c.Args().First()
	if kind = c.String("type"); kind == "" {
		if kind = kindOf(path); kind == "" {
			return "", "", &exitError{code: 2, err: fmt.Errorf("%s: cannot tell the file kind from its name; say --type (%s)", path, strings.Join(kinds, ", "))}
		}
	}
	for _, k := range kinds {
		if k == kind {
			return path, kind, nil
		}
	}
	return "", "", &exitError{code: 2, err: fmt.Errorf("--type %q: want one of %s", kind, strings.Join(kinds, ", "))}
}

// kindOf tells a file's kind from its name.
func kindOf(path string) string {
	name := filepath.Base(path)
	switch name {
	case idx.FileName:
		return kindIndexFile
	case "recovery-point-offset-checkpoint", "replication-offset-checkpoint", "log-start-offset-checkpoint", "cleaner-offset-checkpoint":
		return kindCheckpoint
	case "leader-epoch-checkpoint":
		return kindEpochs
	}
	switch {
	case strings.HasSuffix(name, ".rindex"):
		return kindROffset
	case strings.HasSuffix(name, ".rtimeindex"):
		return kindRTime
	}
	if s, ok := kafka.ParseSegmentName(name); ok {
		switch s.Kind {
		case kafka.KindLog:
			return kindSegment
		case kafka.KindIndex:
			return kindOffsetIndex
		case kafka.KindTimeIndex:
			return kindTimeIndex
		}
	}
	return ""
}

// baseOffsetOf is the base offset in a segment-style name, or 0.
func baseOffsetOf(path string) int64 {
	name := filepath.Base(path)
	if s, ok := kafka.ParseSegmentName(name); ok {
		return s.BaseOffset
	}
	var base int64
	if n, _ := fmt.Sscanf(name, "%020d.", &base); n == 1 {
		return base
	}
	return 0
}

func indexDump(w io.Writer, path, kind string) error {
	tw := tabwriter.NewWriter(w, 2, 8, 2, ' ', tabwriter.AlignRight)
	defer tw.Flush()
	row := func(cols ...any) {
		for i, c := range cols {
			if i > 0 {
				fmt.Fprint(tw, "\t")
			}
			fmt.Fprint(tw, c)
		}
		fmt.Fprint(tw, "\t\n")
	}
	if kind == kindSegment {
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		st, err := f.Stat()
		if err != nil {
			return err
		}
		row("POSITION", "SIZE", "BASE", "LAST", "EPOCH", "RECORDS", "BASE_TS", "MAX_TS", "CODEC", "FLAGS", "PRODUCER")
		res, err := kafka.ScanBatches(path, f, st.Size(), kafka.ScanOptions{}, func(b kafka.Batch) error {
			flags := "-"
			switch {
			case b.Control():
				flags = "control"
			case b.Transactional():
				flags = "txn"
			}
			row(b.Position, b.Size, b.BaseOffset, b.LastOffset, b.LeaderEpoch, b.RecordCount, ts(b.BaseTimestamp), ts(b.MaxTimestamp), codec(b.Compression()), flags, b.ProducerID)
			return nil
		})
		tw.Flush()
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "%d batches, %d bytes", res.Batches, res.End)
		if res.Torn {
			fmt.Fprintf(w, ", torn tail of %d bytes at %d", st.Size()-res.End, res.End)
		}
		fmt.Fprintln(w)
		return nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	base := baseOffsetOf(path)
	switch kind {
	case kindIndexFile:
		x, valid, err := idx.ParseIndex(path, data)
		if err != nil {
			return err
		}
		row("#", "POSITION", "FIRST", "LAST", "FIRST_TS", "LAST_TS", "LENGTH", "RDI")
		for i, e := range x.All() {
			if e.Opaque() {
				row(i, x.Position(i), e.FirstOffset, "opaque", "-", "-", e.DataLength, rdiString(e.RDI))
				continue
			}
			row(i, x.Position(i), e.FirstOffset, e.LastOffset, ts(e.FirstTimestamp), ts(e.LastTimestamp), e.DataLength, rdiString(e.RDI))
		}
		tw.Flush()
		fmt.Fprintf(w, "%d entries, %d tombstones (deleted data), %d bytes", x.Len(), x.Tombstones(), valid)
		if valid < int64(len(data)) {
			fmt.Fprintf(w, ", torn tail of %d bytes at %d (cut on the next open)", int64(len(data))-valid, valid)
		}
		fmt.Fprintln(w)
	case kindOffsetIndex:
		es, err := kafka.ParseOffsetIndex(path, base, data)
		if err != nil {
			return err
		}
		row("OFFSET", "POSITION")
		for _, e := range es {
			row(e.Offset, e.Position)
		}
	case kindTimeIndex:
		es, err := kafka.ParseTimeIndex(path, base, data)
		if err != nil {
			return err
		}
		row("TIMESTAMP", "OFFSET")
		for _, e := range es {
			row(ts(e.Timestamp), e.Offset)
		}
	case kindROffset:
		es, err := idx.ParseRemoteOffsetIndex(path, base, data)
		if err != nil {
			return err
		}
		row("OFFSET", "INDEX_POSITION")
		for _, e := range es {
			row(e.Offset, e.Position)
		}
	case kindRTime:
		es, err := idx.ParseRemoteTimeIndex(path, data)
		if err != nil {
			return err
		}
		row("TIMESTAMP", "INDEX_POSITION")
		for _, e := range es {
			row(ts(e.Timestamp), e.Position)
		}
	case kindCheckpoint:
		cp, err := kafka.ParseOffsetCheckpoint(path, data)
		if err != nil {
			return err
		}
		row("TOPIC", "PARTITION", "OFFSET")
		for _, tp := range sortedPartitions(cp) {
			row(tp.Topic, tp.Partition, cp[tp])
		}
	case kindEpochs:
		es, err := kafka.ParseLeaderEpochCheckpoint(path, data)
		if err != nil {
			return err
		}
		row("EPOCH", "START_OFFSET")
		for _, e := range es {
			row(e.Epoch, e.StartOffset)
		}
	}
	return nil
}

// indexVerify checks a file and returns a one-line summary, or the first
// problem as an error naming the file and byte offset.
func indexVerify(path, kind string) (string, error) {
	if kind == kindSegment {
		return verifySegment(path)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	base := baseOffsetOf(path)
	switch kind {
	case kindIndexFile:
		x, valid, err := idx.ParseIndex(path, data)
		if err != nil {
			return "", err
		}
		if valid < int64(len(data)) {
			return "", &idx.FormatError{File: path, Offset: valid, Msg: fmt.Sprintf("torn tail of %d bytes (an interrupted append; cut on the next open)", int64(len(data))-valid)}
		}
		return fmt.Sprintf("%d entries", x.Len()), nil
	case kindOffsetIndex, kindTimeIndex:
		if log := siblingLog(path); log != "" {
			return verifySegment(log)
		}
		var n int
		if kind == kindOffsetIndex {
			es, err := kafka.ParseOffsetIndex(path, base, data)
			if err != nil {
				return "", err
			}
			n = len(es)
		} else {
			es, err := kafka.ParseTimeIndex(path, base, data)
			if err != nil {
				return "", err
			}
			n = len(es)
		}
		return fmt.Sprintf("%d entries (no .log beside it to check them against)", n), nil
	case kindROffset:
		es, err := idx.ParseRemoteOffsetIndex(path, base, data)
		return fmt.Sprintf("%d entries", len(es)), err
	case kindRTime:
		es, err := idx.ParseRemoteTimeIndex(path, data)
		return fmt.Sprintf("%d entries", len(es)), err
	case kindCheckpoint:
		cp, err := kafka.ParseOffsetCheckpoint(path, data)
		return fmt.Sprintf("%d partitions", len(cp)), err
	case kindEpochs:
		es, err := kafka.ParseLeaderEpochCheckpoint(path, data)
		return fmt.Sprintf("%d epochs", len(es)), err
	}
	return "", fmt.Errorf("%s: cannot verify kind %q", path, kind)
}

// siblingLog is the .log of the same segment as an index file, if present.
func siblingLog(path string) string {
	s, ok := kafka.ParseSegmentName(filepath.Base(path))
	if !ok {
		return ""
	}
	s.Kind, s.Suffix = kafka.KindLog, ""
	log := filepath.Join(filepath.Dir(path), s.String())
	if _, err := os.Stat(log); err != nil {
		return ""
	}
	return log
}

// verifySegment checks every batch's header and CRC, that offsets grow
// from the name's base offset, that there is no torn tail, and the
// segment's .index and .timeindex, when they are beside it, against it.
func verifySegment(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return "", err
	}
	base := baseOffsetOf(path)
	type span struct{ first, last int64 }
	starts := map[int64]span{}
	last, maxTS := base-1, int64(-1)
	res, err := kafka.ScanBatches(path, f, st.Size(), kafka.ScanOptions{VerifyCRC: true}, func(b kafka.Batch) error {
		if b.BaseOffset <= last {
			return &kafka.FormatError{File: path, Offset: b.Position, Msg: fmt.Sprintf("batch offsets %d..%d do not follow offset %d", b.BaseOffset, b.LastOffset, last)}
		}
		last, maxTS = b.LastOffset, max(maxTS, b.MaxTimestamp)
		starts[b.Position] = span{b.BaseOffset, b.LastOffset}
		return nil
	})
	if err != nil {
		return "", err
	}
	if res.Torn {
		return "", &kafka.FormatError{File: path, Offset: res.End, Msg: fmt.Sprintf("torn batch: %d bytes after the last whole batch", st.Size()-res.End)}
	}
	summary := fmt.Sprintf("%d batches, offsets %d..%d, CRCs good", res.Batches, base, last)
	s, _ := kafka.ParseSegmentName(filepath.Base(path))
	dir := filepath.Dir(path)
	s.Suffix = ""
	s.Kind = kafka.KindIndex
	if data, err := os.ReadFile(filepath.Join(dir, s.String())); err == nil {
		name := filepath.Join(dir, s.String())
		es, err := kafka.ParseOffsetIndex(name, base, data)
		if err != nil {
			return "", err
		}
		for i, e := range es {
			sp, ok := starts[e.Position]
			if !ok || e.Offset < sp.first || e.Offset > sp.last {
				return "", &kafka.FormatError{File: name, Offset: int64(i * 8), Msg: fmt.Sprintf("entry (offset %d, position %d) is not a batch holding that offset in %s", e.Offset, e.Position, filepath.Base(path))}
			}
		}
		summary += fmt.Sprintf(", .index %d entries good", len(es))
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", err
	}
	s.Kind = kafka.KindTimeIndex
	if data, err := os.ReadFile(filepath.Join(dir, s.String())); err == nil {
		name := filepath.Join(dir, s.String())
		es, err := kafka.ParseTimeIndex(name, base, data)
		if err != nil {
			return "", err
		}
		for i, e := range es {
			if e.Offset > last || e.Timestamp > maxTS {
				return "", &kafka.FormatError{File: name, Offset: int64(i * 12), Msg: fmt.Sprintf("entry (timestamp %d, offset %d) is past the segment (last offset %d, max timestamp %d)", e.Timestamp, e.Offset, last, maxTS)}
			}
		}
		summary += fmt.Sprintf(", .timeindex %d entries good", len(es))
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", err
	}
	return summary, nil
}

func ts(ms int64) string {
	if ms < 0 {
		return fmt.Sprint(ms)
	}
	return time.UnixMilli(ms).UTC().Format("2006-01-02T15:04:05.000Z")
}

func codec(c int) string {
	names := []string{"none", "gzip", "snappy", "lz4", "zstd"}
	if c < len(names) {
		return names[c]
	}
	return fmt.Sprintf("codec%d", c)
}

func rdiString(b []byte) string {
	if utf8.Valid(b) && !strings.ContainsFunc(string(b), func(r rune) bool { return r < ' ' || r == 0x7f }) {
		return fmt.Sprintf("%q", b)
	}
	return fmt.Sprintf("%x", b)
}

func sortedPartitions(cp kafka.OffsetCheckpoint) []kafka.TopicPartition {
	out := make([]kafka.TopicPartition, 0, len(cp))
	for tp := range cp {
		out = append(out, tp)
	}
	slices.SortFunc(out, func(a, b kafka.TopicPartition) int {
		if c := strings.Compare(a.Topic, b.Topic); c != 0 {
			return c
		}
		return int(a.Partition) - int(b.Partition)
	})
	return out
}
