package tiering

import (
	"strings"
	"syscall"

	"github.com/tierfs/tierfs/idx/kafka"
)

// The methods below are what the file system asks of the tierer (they
// implement fs.Tiering; cmd wires the two together).

// Tiered says whether rel (a path from the log dir root) is a segment
// that can be shipped: <live partition dir>/<base>.log, with any suffix
// Kafka adds while deleting or cleaning it.
func (t *Tierer) Tiered(rel string) bool {
	dir, name, ok := strings.Cut(rel, "/")
	if !ok || strings.Contains(name, "/") {
		return false
	}
	pd, ok := kafka.ParsePartitionDir(dir)
	if !ok || pd.State != kafka.DirLive || pd.Topic == "__cluster_metadata" {
		return false
	}
	sn, ok := kafka.ParseSegmentName(name)
	return ok && sn.Kind == kafka.KindLog
}

// RLock holds inode ino against eviction.
func (t *Tierer) RLock(ino uint64) func() { return t.cfg.Gate.RLock(ino) }

// Hold keeps inode ino local while a handle that reads it directly is
// open (see Gate.Hold).
func (t *Tierer) Hold(ino uint64) func() { return t.cfg.Gate.Hold(ino) }

// State is the state and RDI of the file at path.
func (t *Tierer) State(path string) (state, rdi string, err error) {
	rec, has, err := readRecord(path)
	if err != nil {
		return "", "", err
	}
	if !has {
		var st syscall.Stat_t
		if syscall.Stat(path, &st) == nil {
			t.mu.Lock()
			shipping := t.shipping[st.Ino]
			t.mu.Unlock()
			if shipping {
				return StateShipping, "", nil
			}
		}
		return StateLocal, "", nil
	}
	return rec.State, rec.Key, nil
}

// RemoteReader reads a file's bytes from the store (an alias, as
// Mover).
type RemoteReader = interface {
	ReadAt(p []byte, off int64) (int, error)
	Close() error
}

// OpenRemote opens the store copy of the file at path through the
// manifest kept in the state dir (no request until the first read).
func (t *Tierer) OpenRemote(path string) (RemoteReader, error) {
	rec, _, err := readRecord(path)
	if err != nil {
		return nil, err
	}
	if err := t.waitReady(); err != nil {
		return nil, err
	}
	return t.openSource(rec)
}

var _ interface {
	RemoteCopy(string) ([]byte, error)
	Tiered(string) bool
	RLock(uint64) func()
	State(string) (string, string, error)
	Hydrations() uint64
	Evictions() uint64
} = (*Tierer)(nil)

// readAheadChunks is Config.ReadAheadChunks, with its default.
func (t *Tierer) readAheadChunks() int {
	switch n := t.cfg.ReadAheadChunks; {
	case n == 0:
		return 4
	case n < 0:
		return 0
	default:
		return n
	}
}
