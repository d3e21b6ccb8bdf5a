package tiering

import (
	"strings"

	"github.com/tierfs/tierfs/idx/kafka"
	"github.com/tierfs/tierfs/internal/tiered"
)

// The methods below, with Open and Attr (file.go), are what the file
// system asks of the tierer (they implement fs.Tiering; cmd wires the
// two together).

// Tiered says whether rel (a path from the log dir root) is a segment
// that can be shipped: <live partition dir>/<base>.log, with any suffix
// Kafka adds while deleting or cleaning it.
func (t *Tierer) Tiered(rel string) bool {
	dir, name, ok := strings.Cut(rel, "/")
	if !ok || strings.Contains(name, "/") {
		return false
	}
	if _, ok := livePartitionDir(dir); !ok {
		return false
	}
	sn, ok := kafka.ParseSegmentName(name)
	return ok && sn.Kind == kafka.KindLog
}

// Hold keeps inode ino local while a handle that reads it directly is
// open (see Gate.Hold).
func (t *Tierer) Hold(ino uint64) func() { return t.cfg.Gate.Hold(ino) }

// OpenIfRemote opens the store copy of the file at path if it is
// evicted (change management reads an evicted file's original from it);
// ok is false for any other file.
func (t *Tierer) OpenIfRemote(path string) (r tiered.Reader, ok bool, err error) {
	rec, has, err := readRecord(path)
	if err != nil || !has || rec.State != StateRemote {
		return nil, false, err
	}
	if err := t.waitReady(); err != nil {
		return nil, false, err
	}
	src, err := t.copies.openSource(rec)
	return src, err == nil, err
}

// readAheadChunks is Config.ReadAheadChunks, with its default.
func (cs *copies) readAheadChunks() int {
	switch n := cs.t.cfg.ReadAheadChunks; {
	case n == 0:
		return 4
	case n < 0:
		return 0
	default:
		return n
	}
}
