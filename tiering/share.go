package tiering

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"

	"github.com/tierfs/tierfs/chunkxfer/store"
	"github.com/tierfs/tierfs/idx"
	"github.com/tierfs/tierfs/internal/keylog"
)

// storeIndex keeps each partition's index in the store in step with the
// local one: read when another broker changed it, appended to by
// compare-and-swap, and the references that keep shared objects alive.
type storeIndex struct {
	t *Tierer

	statesMu sync.Mutex
	states   *keylog.Log // idx/store-states.klog, opened at first use; GUARDED_BY(statesMu)
}

// Several brokers share one store (docs/design.md): each mount of a
// partition's replicas sees the same store prefix.
//
//   - Objects of a shipment carry the broker in their id (identityKey),
//     so two brokers never write the same object name.
//   - <partition>/RemoteLogSegmentIndex is shared. Whoever ships (the
//     leader) appends to it with a compare-and-swap (PutIf on the ETag it
//     last saw), so two brokers that both believe they lead cannot lose
//     each other's entries; the loser reads the store's index and decides
//     again. Every mount keeps a local copy, replaced when the store's
//     changes (syncIndex).
//   - A file another broker maps onto an object holds a reference,
//     <object>.refs/<holder>, and the object's owner does not delete it
//     while references remain (see takeRefs and deleteOwn).

// ErrIndexMoved is a compare-and-swap of a partition's index that lost:
// another broker changed it since this one last read it.
var ErrIndexMoved = errors.New("the partition's index in the store was changed by another broker")

// brokerID is the node.id (or broker.id) in the log dir's meta.properties,
// "" when there is none.
func brokerID(root string) string {
	f, err := os.Open(filepath.Join(root, "meta.properties"))
	if err != nil {
		return ""
	}
	defer f.Close()
	id := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), "=")
		if ok && (k == "node.id" || k == "broker.id" && id == "") {
			id = strings.TrimSpace(v)
		}
	}
	return id
}

// storeState is what a mount knows of a partition's index in the store.
type storeState struct {
	ETag string `json:"etag"` // of the store's index as this mount last read or wrote it
	// Shared is set once the store's index was found changed by another
	// broker: other brokers ship this partition too.
	Shared bool `json:"shared,omitempty"`
}

// The store states of every partition are one keyed log,
// idx/store-states.klog (key: the partition), so that saving one, at
// every shipment, is an append and not a file made and renamed.
// Versions before 2026-12 kept one file per partition,
// idx/<partition>/store.json: they are moved into the log when it is
// first opened (at the first pass).

func (si *storeIndex) statesLog() (*keylog.Log, error) {
	si.statesMu.Lock()
	defer si.statesMu.Unlock()
	if si.states == nil {
		l, err := openKeyLog(filepath.Join(si.t.cfg.StateDir, "idx", "store-states"+keyLogExt), "store state", si.t.cfg.Log)
		if err != nil {
			return nil, err
		}
		if err := si.moveLegacyStates(l); err != nil {
			return nil, err
		}
		si.states = l
	}
	return si.states, nil
}

// moveLegacyStates moves the store.json files of versions before
// 2026-12 into the log (moveFiles), each under its partition.
func (si *storeIndex) moveLegacyStates(l *keylog.Log) error {
	files, err := filepath.Glob(filepath.Join(si.t.cfg.StateDir, "idx", "*", "store.json"))
	if err != nil {
		return err
	}
	n, err := moveFiles(files, l, func(p string, b []byte) (string, []byte, error) {
		var s storeState
		if err := json.Unmarshal(b, &s); err != nil {
			return "", nil, fmt.Errorf("store state %s: %w", p, err)
		}
		v, err := json.Marshal(s)
		return filepath.Base(filepath.Dir(p)), v, err
	})
	if err != nil {
		return err
	}
	if n > 0 {
		si.t.cfg.Log.Info("moved the partitions' store states into one log", "partitions", n, "path", l.Path())
	}
	return nil
}

// loadStoreState is what this mount knows of the partition's index in
// the store (nothing yet: the zero state).
func (si *storeIndex) loadStoreState(partition string) storeState {
	var s storeState
	l, err := si.statesLog()
	if err != nil {
		si.t.cfg.Log.Warn("cannot read the store states", "err", err)
		return s
	}
	if b, ok, err := l.Get(partition); err == nil && ok {
		json.Unmarshal(b, &s)
	}
	return s
}

func (si *storeIndex) saveStoreState(partition string, s storeState) error {
	b, err := json.Marshal(s)
	if err != nil {
		return err
	}
	l, err := si.statesLog()
	if err != nil {
		return err
	}
	return l.Put(partition, b)
}

// forgetStoreState drops a partition's store state (its index is gone,
// here and in the store).
func (si *storeIndex) forgetStoreState(partition string) error {
	l, err := si.statesLog()
	if err != nil {
		return err
	}
	return l.Delete(partition) // the last one removes the file; a later save makes it again
}

// syncIndex makes the local copy of a partition's index the store's, if
// the store's changed since this mount last read or wrote it; it says
// whether it did. An index another broker changes between its HEAD and
// its GET is read again (up to maxIndexTries times). Call it with the
// partition locked.
func (si *storeIndex) syncIndex(ctx context.Context, partition string) (bool, error) {
	for try := 1; ; try++ {
		took, err := si.syncIndexOnce(ctx, partition)
		if !errors.Is(err, store.ErrPrecondition) || try == maxIndexTries {
			return took, err
		}
		si.t.cfg.Log.Debug("the store's index changed while it was read; reading it again", "partition", partition, "try", try)
	}
}

func (si *storeIndex) syncIndexOnce(ctx context.Context, partition string) (bool, error) {
	key := partition + "/" + idx.FileName
	st := si.loadStoreState(partition)
	info, err := si.t.cfg.Store.Head(ctx, key)
	switch {
	case errors.Is(err, store.ErrNotFound):
		if st.ETag == "" {
			return false, nil // never in the store, or this mount's first put failed
		}
		info = store.ObjectInfo{} // dropped by another broker: empty
	case err != nil:
		return false, fmt.Errorf("look for the index of %s in the store: %w", partition, err)
	case info.ETag == st.ETag:
		return false, nil
	}
	var data []byte
	if info.ETag != "" {
		data, err = store.ReadAll(si.t.cfg.Store.Get(ctx, key, 0, -1, store.GetOptions{IfMatch: info.ETag}))
		if err != nil {
			return false, fmt.Errorf("read the index of %s from the store: %w", partition, err)
		}
		if _, valid, err := idx.ParseIndex(key, data); err != nil {
			return false, err
		} else if valid != int64(len(data)) {
			return false, fmt.Errorf("the store's %s has a torn entry at %d", key, valid)
		}
	}
	if err := si.replaceIndex(partition, data); err != nil {
		return false, err
	}
	if err := si.saveStoreState(partition, storeState{ETag: info.ETag, Shared: st.Shared || info.ETag != ""}); err != nil {
		return false, err
	}
	si.t.cfg.Log.Debug("took the store's index", "partition", partition, "bytes", len(data))
	return true, nil
}

// replaceIndex replaces the local index file of a partition with data.
func (si *storeIndex) replaceIndex(partition string, data []byte) error {
	si.t.indexes.forget(partition)
	dir := si.t.indexes.path(partition)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return writeFileAtomic(filepath.Join(dir, idx.FileName), data)
}

// putIndex ships the partition's index file as it is now, on the
// condition that the store's is still the one this mount last saw
// (ErrIndexMoved otherwise). Call it with the partition locked.
func (si *storeIndex) putIndex(ctx context.Context, partition string, f *idx.File) error {
	var data []byte
	var err error
	f.View(func(x *idx.Index) {
		data, err = os.ReadFile(f.Path())
		data = data[:min(int64(len(data)), x.Size())]
	})
	if err != nil {
		return err
	}
	st := si.loadStoreState(partition)
	cond := store.PutCond{IfMatch: st.ETag, IfNoneMatch: st.ETag == ""}
	info, err := si.t.cfg.Store.PutIf(ctx, partition+"/"+idx.FileName, bytes.NewReader(data), int64(len(data)), cond)
	if errors.Is(err, store.ErrPrecondition) {
		// What this mount appended is dropped; the next pass decides
		// again from the store's index.
		if _, serr := si.syncIndex(ctx, partition); errors.Is(serr, store.ErrPrecondition) {
			// It changed again between its HEAD and GET: another race,
			// taken at the next try.
			si.t.cfg.Log.Debug("the store's index changed while it was read", "partition", partition)
		} else if serr != nil {
			si.t.cfg.Log.Warn("cannot read the store's index after losing a race to it", "partition", partition, "err", serr)
		}
		return fmt.Errorf("%s: %w", partition, ErrIndexMoved)
	}
	if err != nil {
		return err
	}
	if info.ETag == "" {
		if info, err = si.t.cfg.Store.Head(ctx, partition+"/"+idx.FileName); err != nil {
			return err
		}
	}
	return si.saveStoreState(partition, storeState{ETag: info.ETag, Shared: st.Shared})
}

// References. A holder is a file of this mount, named by its own key's
// base name (which has the broker in its id).

func refPrefix(key string) string      { return key + ".refs/" }
func refKey(key, holder string) string { return refPrefix(key) + holder }
func deletingKey(key string) string    { return key + ".deleting" }
func isRefKey(key string) bool         { return strings.Contains(key, ".refs/") }
func refHolder(ref string) string      { _, h, _ := strings.Cut(ref, ".refs/"); return h }
func refTarget(ref string) string      { k, _, _ := strings.Cut(ref, ".refs/"); return k }
func holderOf(key string) string       { return strings.TrimSuffix(path.Base(key), ".log") }
func ownedBy(key, holder string) bool  { return holderOf(key) == holder }

// refsOf are the references holder takes on keys (none on its own).
func refsOf(keys []string, holder string) []string {
	var out []string
	for _, k := range keys {
		if !ownedBy(k, holder) {
			out = append(out, refKey(k, holder))
		}
	}
	return out
}

// ErrObjectDeleting is an object its owner is deleting: no new
// reference to it can be taken.
var ErrObjectDeleting = errors.New("its owner is deleting it")

// takeRef makes holder a referrer of key: the reference is put first,
// then the object must have no deletion marker and still be etag. An
// owner puts its marker before it lists the references, so either it
// sees this reference and keeps the object, or this sees its marker (or
// the object gone) and takes nothing.
func (si *storeIndex) takeRef(ctx context.Context, key, etag, holder string) error {
	ref := refKey(key, holder)
	if _, err := si.t.cfg.Store.Put(ctx, ref, bytes.NewReader(nil), 0); err != nil {
		return err
	}
	_, err := si.t.cfg.Store.Head(ctx, deletingKey(key))
	switch {
	case err == nil:
		err = fmt.Errorf("%s: %w", key, ErrObjectDeleting)
	case errors.Is(err, store.ErrNotFound):
		var info store.ObjectInfo
		info, err = si.t.cfg.Store.Head(ctx, key)
		if err == nil && info.ETag != etag {
			err = fmt.Errorf("%s was replaced (etag %s, mapped %s): %w", key, info.ETag, etag, store.ErrNotFound)
		}
	}
	if err != nil {
		deleteObject(ctx, si.t.cfg.Store, ref)
		return err
	}
	return nil
}

// takeRefs references every object of extents for holder.
func (si *storeIndex) takeRefs(ctx context.Context, es []Extent, holder string) error {
	for _, k := range extentKeys(es) {
		if ownedBy(k, holder) {
			continue
		}
		etag := ""
		for _, e := range es {
			if e.Key == k {
				etag = e.ETag
				break
			}
		}
		if err := si.takeRef(ctx, k, etag, holder); err != nil {
			return err
		}
	}
	return nil
}

// errReferenced keeps an object another broker's file still maps onto.
var errReferenced = errors.New("another broker's files still read from it")

// deleteOwn deletes objects of this mount's (data objects, with their
// manifests) unless another broker references one of them: a deletion
// marker goes first, then the references are listed; with none, the
// objects go, and the marker last.
func (si *storeIndex) deleteOwn(ctx context.Context, key string, objs []string) error {
	if err := putEmpty(ctx, si.t.cfg.Store, deletingKey(key)); err != nil {
		return err
	}
	refs, err := si.t.cfg.Store.List(ctx, refPrefix(key))
	if err != nil {
		return err
	}
	if len(refs) > 0 {
		if err := deleteObject(ctx, si.t.cfg.Store, deletingKey(key)); err != nil {
			return err
		}
		return fmt.Errorf("%s: %d references, the first %s: %w", key, len(refs), refHolder(refs[0].Key), errReferenced)
	}
	for _, k := range objs {
		if err := deleteObject(ctx, si.t.cfg.Store, k); err != nil {
			return err
		}
	}
	return deleteObject(ctx, si.t.cfg.Store, deletingKey(key))
}

func putEmpty(ctx context.Context, s store.Store, key string) error {
	_, err := s.Put(ctx, key, bytes.NewReader(nil), 0)
	return err
}
