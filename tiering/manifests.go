package tiering

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"

	"github.com/tierfs/tierfs/chunkxfer"
	"github.com/tierfs/tierfs/internal/keylog"
)

// manifestCopies are the local copies of objects' manifests (chunk sizes
// and checksums), so that a read needs no request to open an object: one
// keyed log per partition (manifests/<partition>.klog, by object key),
// opened at its first use. Versions before 2026-12 kept one file per
// object (manifests/<partition>/<object>.json); a partition's files move
// into its log when the log is first opened.
type manifestCopies struct {
	dir func() string // the state dir (known once the mount holds it)
	log *slog.Logger

	mu   sync.Mutex
	logs map[string]*keylog.Log // by partition; GUARDED_BY(mu)
}

func newManifestCopies(dir func() string, log *slog.Logger) *manifestCopies {
	return &manifestCopies{dir: dir, log: log, logs: map[string]*keylog.Log{}}
}

// group is the partition an object key belongs to: its directory.
func manifestGroup(key string) string {
	if g := filepath.Dir(key); g != "." {
		return g
	}
	return "_"
}

// logOf is the log of key's partition, opened (and migrated) once.
func (mc *manifestCopies) logOf(key string) (*keylog.Log, error) {
	g := manifestGroup(key)
	mc.mu.Lock()
	defer mc.mu.Unlock()
	if l := mc.logs[g]; l != nil {
		return l, nil
	}
	root := filepath.Join(mc.dir(), "manifests")
	l, err := openKeyLog(filepath.Join(root, g+keyLogExt), "manifest", mc.log)
	if err != nil {
		return nil, err
	}
	if err := mc.migrate(filepath.Join(root, g), g, l); err != nil {
		return nil, err
	}
	mc.logs[g] = l
	return l, nil
}

// migrate moves the legacy manifest files of group g (in dir), if any,
// into its log.
func (mc *manifestCopies) migrate(dir, g string, l *keylog.Log) error {
	n, err := moveLegacyFiles(dir, l, func(p string, b []byte) (string, []byte, error) {
		m, err := chunkxfer.ParseManifest(b)
		if err != nil {
			return "", nil, fmt.Errorf("manifest copy %s: %w", p, err)
		}
		if manifestGroup(m.Key) != g {
			return "", nil, fmt.Errorf("manifest copy %s: of %s, not an object of %s", p, m.Key, g)
		}
		return m.Key, b, nil
	})
	if err != nil {
		return err
	}
	os.Remove(dir) // once empty
	if n > 0 {
		mc.log.Info("moved manifest copies into the partition's manifest log", "partition", g, "manifests", n)
	}
	return nil
}

// get is the copy of key's manifest; an error for which os.IsNotExist
// holds when there is none.
func (mc *manifestCopies) get(key string) (*chunkxfer.Manifest, error) {
	l, err := mc.logOf(key)
	if err != nil {
		return nil, err
	}
	b, ok, err := l.Get(key)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, &os.PathError{Op: "manifest copy", Path: l.Path() + ": " + key, Err: os.ErrNotExist}
	}
	m, err := chunkxfer.ParseManifest(b)
	if err != nil {
		return nil, fmt.Errorf("manifest copy of %s in %s: %w", key, l.Path(), err)
	}
	if m.Key != key {
		return nil, fmt.Errorf("manifest copy of %s in %s is of %s", key, l.Path(), m.Key)
	}
	return m, nil
}

// put keeps a copy of m (appended and synced).
func (mc *manifestCopies) put(m *chunkxfer.Manifest) error {
	return mc.putAll([]*chunkxfer.Manifest{m})
}

// putAll keeps copies of ms, which are objects of one partition: one
// append and sync for all of them.
func (mc *manifestCopies) putAll(ms []*chunkxfer.Manifest) error {
	if len(ms) == 0 {
		return nil
	}
	l, err := mc.logOf(ms[0].Key)
	if err != nil {
		return err
	}
	es := make([]keylog.Entry, len(ms))
	for i, m := range ms {
		if manifestGroup(m.Key) != manifestGroup(ms[0].Key) {
			return fmt.Errorf("manifest copies of %s and %s: not of one partition", ms[0].Key, m.Key)
		}
		if m.Files != nil {
			// The files a manifest holds are read from the store's copy
			// (restoring a missing index, mirroring); reads of the
			// object need none of them.
			c := *m
			c.Files = nil
			m = &c
		}
		b, err := json.Marshal(m)
		if err != nil {
			return err
		}
		es[i] = keylog.Entry{Key: m.Key, Val: b}
	}
	return l.PutAll(es)
}

// remove drops the copy of key's manifest, if any.
func (mc *manifestCopies) remove(key string) error {
	l, err := mc.logOf(key)
	if err != nil {
		return err
	}
	// The log stays open, empty or not: a second Log of the same file
	// would append at its own idea of the end.
	return l.Delete(key)
}
