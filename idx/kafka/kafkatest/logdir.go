package kafkatest

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// LogDir describes a synthetic Kafka log directory, written as a broker
// leaves it: rolled segments with trimmed indexes, an active segment with
// preallocated (zero-tailed) indexes, and the checkpoint files.
type LogDir struct {
	Topic      string
	Partitions int
	Segments   int // per partition, the last one active
	Batches    int // per segment
	Records    int // per batch
	ValueSize  int
	// Unflushed is how many of the last rolled segments the recovery
	// point does not yet cover.
	Unflushed int
	// Age is how long ago the rolled segments were last written.
	Age time.Duration
	// Repeat makes every partition a copy of the first one's files
	// (encoded once, copied after): quick for benchmarks of many
	// partitions.
	Repeat bool
}

// Write creates the log dir under root and returns each partition's
// segment base offsets.
func (d LogDir) Write(root string) (map[string][]int64, error) {
	out := map[string][]int64{}
	var recovery, hw []string
	var firstHW int64 // the first partition's high watermark
	for p := range d.Partitions {
		name := fmt.Sprintf("%s-%d", d.Topic, p)
		dir := filepath.Join(root, name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
		if d.Repeat && p > 0 {
			first := fmt.Sprintf("%s-%d", d.Topic, 0)
			if err := copyDir(filepath.Join(root, first), dir); err != nil {
				return nil, err
			}
			bases := out[first]
			out[name] = bases
			recovery = append(recovery, fmt.Sprintf("%s %d %d", d.Topic, p, bases[max(0, len(bases)-1-d.Unflushed)]))
			hw = append(hw, fmt.Sprintf("%s %d %d", d.Topic, p, firstHW))
			continue
		}
		var off int64
		ts := time.Now().Add(-d.Age).UnixMilli()
		var bases []int64
		for s := range d.Segments {
			base := off
			bases = append(bases, base)
			var seg, index, timeIndex []byte
			for b := range d.Batches {
				batch := Encode(Batch{Base: off, Records: d.Records, ValueSize: d.ValueSize, TS: ts, Attrs: int16(b % 2)})
				if b > 0 && b%4 == 0 {
					// An index entry every few batches, as index.interval.bytes does.
					index = binary.BigEndian.AppendUint32(index, uint32(off+int64(d.Records)-1-base))
					index = binary.BigEndian.AppendUint32(index, uint32(len(seg)))
					timeIndex = binary.BigEndian.AppendUint64(timeIndex, uint64(ts+int64(d.Records)-1))
					timeIndex = binary.BigEndian.AppendUint32(timeIndex, uint32(off+int64(d.Records)-1-base))
				}
				seg = append(seg, batch...)
				off += int64(d.Records)
				ts += int64(d.Records)
			}
			active := s == d.Segments-1
			if active {
				index = append(index, make([]byte, 8*64)...)
				timeIndex = append(timeIndex, make([]byte, 12*64)...)
			}
			stem := filepath.Join(dir, fmt.Sprintf("%020d", base))
			for ext, b := range map[string][]byte{".log": seg, ".index": index, ".timeindex": timeIndex} {
				if err := os.WriteFile(stem+ext, b, 0o644); err != nil {
					return nil, err
				}
				if !active {
					mt := time.Now().Add(-d.Age)
					os.Chtimes(stem+ext, mt, mt)
				}
			}
		}
		if err := os.WriteFile(filepath.Join(dir, "leader-epoch-checkpoint"), []byte("0\n1\n0 0\n"), 0o644); err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(dir, "partition.metadata"), []byte("version: 0\ntopic_id: AAAAAAAAAAAAAAAAAAAAAA\n"), 0o644); err != nil {
			return nil, err
		}
		out[name] = bases
		flushed := bases[max(0, len(bases)-1-d.Unflushed)]
		recovery = append(recovery, fmt.Sprintf("%s %d %d", d.Topic, p, flushed))
		hw = append(hw, fmt.Sprintf("%s %d %d", d.Topic, p, off))
		firstHW = off
	}
	for name, lines := range map[string][]string{"recovery-point-offset-checkpoint": recovery, "replication-offset-checkpoint": hw, "log-start-offset-checkpoint": nil} {
		body := fmt.Sprintf("0\n%d\n", len(lines))
		for _, l := range lines {
			body += l + "\n"
		}
		if name == "log-start-offset-checkpoint" {
			body = "0\n0\n"
		}
		if err := os.WriteFile(filepath.Join(root, name), []byte(body), 0o644); err != nil {
			return nil, err
		}
	}
	return out, os.WriteFile(filepath.Join(root, "meta.properties"), []byte("version=1\nnode.id=1\n"), 0o644)
}

// copyDir copies the files of dir src into dst, with their
// modification times.
func copyDir(src, dst string) error {
	ents, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			return err
		}
		fi, err := e.Info()
		if err != nil {
			return err
		}
		to := filepath.Join(dst, e.Name())
		if err := os.WriteFile(to, b, fi.Mode().Perm()); err != nil {
			return err
		}
		if err := os.Chtimes(to, fi.ModTime(), fi.ModTime()); err != nil {
			return err
		}
	}
	return nil
}
