package tiering

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tierfs/tierfs/chunkxfer"
	"github.com/tierfs/tierfs/chunkxfer/store"
	"github.com/tierfs/tierfs/idx/kafka"
)

// mirror makes a read-only mount show the store's files (tierfs
// mount --mirror): each a remote file, made and updated from the store's
// listing.
type mirror struct{ t *Tierer }

// The reader role: a mount of the store alone. Mirror makes the root a
// log dir of every segment shipped to the store, each an evicted file
// (its bytes read from the store), with its indexes, snapshot and the
// partition's leader-epoch-checkpoint as small local files. Nothing is
// ever shipped, evicted or deleted from the store by it.

// objectName is <base20>-<id8><kind> (see identityKey).
var objectName = regexp.MustCompile(`^([0-9]{20})-([0-9a-f]{8})(\.log|\.index|\.timeindex|\.txnindex|\.snapshot|\.leader-epoch-checkpoint)$`)

// MirrorReport says what a mirror pass changed.
type MirrorReport struct {
	Segments         int // segments mirrored after the pass
	Added, Removed   int // files
	Errors           []error
	PartitionsListed int
}

// mirrorCatalog is what the mirror put in the root: rel path → object key.
type mirrorCatalog map[string]string

func (mr *mirror) catalogPath() string { return filepath.Join(mr.t.cfg.StateDir, "mirror.json") }

func (mr *mirror) loadCatalog() (mirrorCatalog, error) {
	c := mirrorCatalog{}
	b, err := os.ReadFile(mr.catalogPath())
	if os.IsNotExist(err) {
		return c, nil
	}
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, fmt.Errorf("%s: %w", mr.catalogPath(), err)
	}
	return c, nil
}

// Mirror brings the root in line with the store: segments shipped since
// the last pass appear, those whose objects went disappear.
func (mr *mirror) Mirror(ctx context.Context) MirrorReport {
	var rep MirrorReport
	if err := mr.t.waitReady(); err != nil {
		rep.Errors = append(rep.Errors, err)
		return rep
	}
	objs, err := mr.t.cfg.Store.List(ctx, "")
	if err != nil {
		rep.Errors = append(rep.Errors, fmt.Errorf("list the store: %w", err))
		return rep
	}
	want := wantedFiles(objs)
	partitions := map[string]bool{}
	for rel := range want {
		partitions[path.Dir(rel)] = true
		if path.Ext(rel) == kafka.KindLog {
			rep.Segments++
		}
	}
	rep.PartitionsListed = len(partitions)
	have, err := mr.loadCatalog()
	if err != nil {
		rep.Errors = append(rep.Errors, err)
		return rep
	}
	// Gone or replaced first, then what is new; the catalog is saved
	// after each change, so a crash leaves nothing it does not know of.
	for rel, key := range have {
		if _, still := want[rel]; still {
			continue // the same, or replaced below by a rename over it
		}
		if err := os.Remove(filepath.Join(mr.t.cfg.Root, rel)); err != nil && !os.IsNotExist(err) {
			rep.Errors = append(rep.Errors, err)
			continue
		}
		mr.t.manifests.remove(key)
		delete(have, rel)
		rep.Removed++
		os.Remove(filepath.Join(mr.t.cfg.Root, path.Dir(rel))) // the partition dir, once empty
		if err := mr.saveCatalog(have); err != nil {
			rep.Errors = append(rep.Errors, err)
			return rep
		}
	}
	rels := make([]string, 0, len(want))
	for rel := range want {
		rels = append(rels, rel)
	}
	sort.Strings(rels)
	for _, rel := range rels {
		o := want[rel]
		if have[rel] == o.Key {
			continue
		}
		if err := mr.mirrorFile(ctx, rel, o); err != nil {
			rep.Errors = append(rep.Errors, fmt.Errorf("mirror %s: %w", o.Key, err))
			continue
		}
		if old := have[rel]; old != "" {
			mr.t.manifests.remove(old) // the version it replaced
		}
		have[rel] = o.Key
		rep.Added++
		if err := mr.saveCatalog(have); err != nil {
			rep.Errors = append(rep.Errors, err)
			return rep
		}
	}
	return rep
}

func (mr *mirror) saveCatalog(c mirrorCatalog) error {
	b, err := json.Marshal(c)
	if err != nil {
		return err
	}
	return writeFileAtomic(mr.catalogPath(), b)
}

// wantedFiles picks, from a listing of the store, the files of a log dir:
// for each partition and base offset the newest complete shipment (its
// .log and the .log's manifest), its sidecars, and the partition's
// leader-epoch-checkpoint from its newest segment.
func wantedFiles(objs []store.ObjectInfo) map[string]store.ObjectInfo {
	byKey := map[string]store.ObjectInfo{}
	for _, o := range objs {
		byKey[o.Key] = o
	}
	// An empty or small file is its manifest alone: listed as an object
	// of no bytes and no ETag (appended to a slice of its own, not into the
	// caller's).
	objs = slices.Clip(objs)
	for _, o := range objs {
		if k, ok := chunkxfer.ManifestOf(o.Key); ok {
			if _, there := byKey[k]; !there {
				objs = append(objs, store.ObjectInfo{Key: k, ModTime: o.ModTime})
			}
		}
	}
	type version struct {
		log  store.ObjectInfo
		side map[string]store.ObjectInfo // kind → object
	}
	// partition → base → id → version
	parts := map[string]map[string]map[string]*version{}
	for _, o := range objs {
		dir, name := path.Split(o.Key)
		dir = path.Clean(dir)
		if pd, ok := kafka.ParsePartitionDir(dir); !ok || pd.State != kafka.DirLive || path.Dir(dir) != "." {
			continue
		}
		m := objectName.FindStringSubmatch(name)
		if m == nil {
			continue
		}
		base, id, kind := m[1], m[2], m[3]
		if parts[dir] == nil {
			parts[dir] = map[string]map[string]*version{}
		}
		if parts[dir][base] == nil {
			parts[dir][base] = map[string]*version{}
		}
		v := parts[dir][base][id]
		if v == nil {
			v = &version{side: map[string]store.ObjectInfo{}}
			parts[dir][base][id] = v
		}
		if kind == kafka.KindLog {
			v.log = o
		} else {
			v.side[kind] = o
		}
	}
	out := map[string]store.ObjectInfo{}
	for dir, bases := range parts {
		var newestBase int64 = -1
		var newest *version
		for base, ids := range bases {
			var pick *version
			for _, v := range ids {
				if v.log.Key == "" {
					continue
				}
				if _, ok := byKey[chunkxfer.ManifestKey(v.log.Key)]; !ok {
					continue // not complete (being shipped, or being deleted)
				}
				if pick == nil || v.log.ModTime.After(pick.log.ModTime) {
					pick = v
				}
			}
			if pick == nil {
				continue
			}
			out[dir+"/"+base+kafka.KindLog] = pick.log
			for kind, o := range pick.side {
				if kind == ".leader-epoch-checkpoint" {
					continue
				}
				out[dir+"/"+base+kind] = o
			}
			if b, _ := strconv.ParseInt(base, 10, 64); b > newestBase {
				newestBase, newest = b, pick
			}
		}
		if newest != nil {
			if o, ok := newest.side[".leader-epoch-checkpoint"]; ok {
				out[dir+"/leader-epoch-checkpoint"] = o
			}
		}
	}
	return out
}

// mirrorFile puts one file in place: a .log as an evicted stub (its
// size, its record and manifest; no bytes), anything else downloaded.
// It is made in the state dir and renamed into place whole, so the
// mount never shows a stub without its record.
func (mr *mirror) mirrorFile(ctx context.Context, rel string, o store.ObjectInfo) error {
	tmpDir := filepath.Join(mr.t.cfg.StateDir, "mirror-tmp")
	if err := os.MkdirAll(tmpDir, 0o700); err != nil {
		return err
	}
	f, err := os.CreateTemp(tmpDir, "file-")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp)
	defer f.Close()
	mtime := o.ModTime
	if path.Ext(rel) == kafka.KindLog {
		m, err := chunkxfer.LoadManifest(ctx, mr.t.cfg.Store, o.Key)
		if err != nil {
			return err
		}
		if m.ETag != o.ETag || m.Size != o.Size {
			return fmt.Errorf("its manifest is of another version (etag %s, %d bytes; the object's %s, %d bytes)", m.ETag, m.Size, o.ETag, o.Size)
		}
		if err := f.Truncate(m.Size); err != nil {
			return err
		}
		var st syscall.Stat_t
		if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
			return err
		}
		if err := mr.t.manifests.put(m); err != nil {
			return err
		}
		rec := Record{State: StateRemote, Key: o.Key, ETag: m.ETag, Size: m.Size, MtimeNs: mtime.UnixNano(), Ino: st.Ino, Freed: true}
		if err := writeRecord(tmp, rec); err != nil {
			return err
		}
	} else if o.ETag == "" && o.Size == 0 {
		// Only its manifest is stored: it must say the file is empty,
		// or hold its bytes (checked against its checksum).
		m, err := chunkxfer.LoadManifest(ctx, mr.t.cfg.Store, o.Key)
		if err != nil {
			return err
		}
		if !m.NoObject() {
			return fmt.Errorf("its object is missing, and its manifest is of %d bytes", m.Size)
		}
		if _, err := f.Write(m.Inline); err != nil {
			return err
		}
	} else {
		b, err := store.ReadAll(mr.t.cfg.Store.Get(ctx, o.Key, 0, -1, store.GetOptions{}))
		if err != nil {
			return err
		}
		if int64(len(b)) != o.Size {
			return fmt.Errorf("read %d bytes of %d", len(b), o.Size)
		}
		if _, err := f.Write(b); err != nil {
			return err
		}
	}
	if err := f.Chmod(0o644); err != nil {
		return err
	}
	ts := unix.NsecToTimespec(mtime.UnixNano())
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, tmp, []unix.Timespec{ts, ts}, 0); err != nil {
		return err
	}
	dst := filepath.Join(mr.t.cfg.Root, rel)
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	return os.Rename(tmp, dst)
}

// RunMirror mirrors the store every interval until ctx ends (the
// reader role's loop in place of Run).
func (mr *mirror) RunMirror(ctx context.Context, interval time.Duration) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		rep := mr.Mirror(ctx)
		for _, err := range rep.Errors {
			mr.t.counters.Errors.Add(1)
			mr.t.cfg.Log.Warn("mirror", "err", err)
		}
		if rep.Added+rep.Removed > 0 {
			mr.t.cfg.Log.Info("mirrored the store", "segments", rep.Segments, "added", rep.Added, "removed", rep.Removed)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// Mirror brings the root in line with the store now (a reader's mount
// does before it is announced), then every interval until ctx ends (0:
// only now), and says what the first pass did.
func (t *Tierer) Mirror(ctx context.Context, interval time.Duration) MirrorReport {
	rep := t.mirror.Mirror(ctx)
	if interval > 0 {
		go t.mirror.RunMirror(ctx, interval)
	}
	return rep
}
