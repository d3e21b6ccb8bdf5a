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
	"strings"
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
	newest := newestLogs(want)
	for rel, key := range have {
		if _, still := want[rel]; still {
			continue // the same, or replaced below by a rename over it
		}
		logKey, kind, isHeld := parseHeldKey(key)
		if isHeld {
			if kind == kindEpochs && newest[path.Dir(rel)] != "" {
				continue // replaced below from the newest segment's manifest
			}
			if kind != kindEpochs && want[strings.TrimSuffix(rel, kind)+kafka.KindLog].Key == logKey {
				continue // held by a segment still mirrored
			}
		}
		if err := os.Remove(filepath.Join(mr.t.cfg.Root, rel)); err != nil && !os.IsNotExist(err) {
			rep.Errors = append(rep.Errors, err)
			continue
		}
		if !isHeld {
			mr.t.manifests.remove(key)
		}
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
	held := map[string]*chunkxfer.Manifest{} // of the segments mirrored in this pass
	for _, rel := range rels {
		o := want[rel]
		if have[rel] == o.Key {
			continue
		}
		m, err := mr.mirrorFile(ctx, rel, o)
		if err != nil {
			rep.Errors = append(rep.Errors, fmt.Errorf("mirror %s: %w", o.Key, err))
			continue
		}
		if old := have[rel]; old != "" {
			mr.t.manifests.remove(old) // the version it replaced
		}
		have[rel] = o.Key
		rep.Added++
		if m != nil {
			held[o.Key] = m
			// The files its manifest holds, beside it (the leader-epoch
			// checkpoint below, from the partition's newest segment).
			for _, f := range m.Files {
				frel := strings.TrimSuffix(rel, kafka.KindLog) + f.Name
				if !slices.Contains(segmentFileKinds, f.Name) {
					continue // the leader-epoch checkpoint, or not a file of a segment
				}
				if _, listed := want[frel]; listed {
					continue // an object of its own too (an older shipment's)
				}
				if err := mr.placeFile(frel, f.Data, o.ModTime); err != nil {
					rep.Errors = append(rep.Errors, fmt.Errorf("mirror %s of %s: %w", f.Name, o.Key, err))
					continue
				}
				have[frel] = heldKey(o.Key, f.Name)
				rep.Added++
			}
		}
		if err := mr.saveCatalog(have); err != nil {
			rep.Errors = append(rep.Errors, err)
			return rep
		}
	}
	// Each partition's leader-epoch-checkpoint, where its newest segment
	// has no object of it: the one that segment's manifest holds.
	for dir, logRel := range newest {
		rel := dir + "/leader-epoch-checkpoint"
		o := want[logRel]
		if _, listed := want[rel]; listed || have[rel] == heldKey(o.Key, kindEpochs) {
			continue
		}
		m := held[o.Key]
		if m == nil {
			var err error
			if m, err = chunkxfer.ReadManifest(ctx, mr.t.cfg.Store, o.Key); err != nil {
				rep.Errors = append(rep.Errors, fmt.Errorf("mirror the leader-epoch-checkpoint of %s: %w", dir, err))
				continue
			}
		}
		if b, ok := m.File(kindEpochs); ok {
			if err := mr.placeFile(rel, b, o.ModTime); err != nil {
				rep.Errors = append(rep.Errors, fmt.Errorf("mirror the leader-epoch-checkpoint of %s: %w", dir, err))
				continue
			}
			rep.Added++
		} else if err := os.Remove(filepath.Join(mr.t.cfg.Root, rel)); err == nil {
			rep.Removed++
		}
		// Decided from that segment (held or not): not read again until
		// another is the newest.
		have[rel] = heldKey(o.Key, kindEpochs)
		if err := mr.saveCatalog(have); err != nil {
			rep.Errors = append(rep.Errors, err)
			return rep
		}
	}
	return rep
}

// segmentFileKinds are the files of a segment that its .log's manifest
// may hold (besides the partition's leader-epoch checkpoint).
var segmentFileKinds = []string{kafka.KindIndex, kafka.KindTimeIndex, kafka.KindTxnIndex, kafka.KindSnapshot}

// newestLogs are, of the files wanted, each partition's newest .log.
func newestLogs(want map[string]store.ObjectInfo) map[string]string {
	out := map[string]string{}
	for rel := range want {
		if path.Ext(rel) != kafka.KindLog {
			continue
		}
		if dir := path.Dir(rel); out[dir] == "" || path.Base(rel) > path.Base(out[dir]) {
			out[dir] = rel // base offsets of 20 digits: by name is by offset
		}
	}
	return out
}

// heldKey is what the mirror's catalog says of a file that the manifest
// of the object logKey holds (kind, as Manifest.Files names it): no
// store key has a '#'.
func heldKey(logKey, kind string) string { return logKey + "#" + kind }

// parseHeldKey is the object and kind of a heldKey.
func parseHeldKey(k string) (logKey, kind string, ok bool) { return strings.Cut(k, "#") }

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
// mount never shows a stub without its record. It returns a .log's
// manifest, as the store has it (with the files it holds).
func (mr *mirror) mirrorFile(ctx context.Context, rel string, o store.ObjectInfo) (*chunkxfer.Manifest, error) {
	var logM *chunkxfer.Manifest
	err := mr.writeFile(rel, o.ModTime, func(f *os.File, tmp string) error {
		m, err := mr.fill(ctx, f, tmp, rel, o)
		logM = m
		return err
	})
	return logM, err
}

// placeFile puts a file of bytes b in place (as mirrorFile).
func (mr *mirror) placeFile(rel string, b []byte, mtime time.Time) error {
	return mr.writeFile(rel, mtime, func(f *os.File, _ string) error {
		_, err := f.Write(b)
		return err
	})
}

// writeFile makes the file rel with fill, in the state dir, then gives
// it its mode and mtime and renames it into place.
func (mr *mirror) writeFile(rel string, mtime time.Time, fill func(f *os.File, tmp string) error) error {
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
	if err := fill(f, tmp); err != nil {
		return err
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

// fill writes into f (at tmp) the file rel of the store's object o
// (mirrorFile), and returns a .log's manifest.
func (mr *mirror) fill(ctx context.Context, f *os.File, tmp, rel string, o store.ObjectInfo) (*chunkxfer.Manifest, error) {
	if path.Ext(rel) == kafka.KindLog {
		m, err := chunkxfer.LoadManifest(ctx, mr.t.cfg.Store, o.Key)
		if err != nil {
			return nil, err
		}
		if m.ETag != o.ETag || m.Size != o.Size {
			return nil, fmt.Errorf("its manifest is of another version (etag %s, %d bytes; the object's %s, %d bytes)", m.ETag, m.Size, o.ETag, o.Size)
		}
		if err := f.Truncate(m.Size); err != nil {
			return nil, err
		}
		var st syscall.Stat_t
		if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
			return nil, err
		}
		if err := mr.t.manifests.put(m); err != nil {
			return nil, err
		}
		rec := Record{State: StateRemote, Key: o.Key, ETag: m.ETag, Size: m.Size, MtimeNs: o.ModTime.UnixNano(), Ino: st.Ino, Freed: true}
		return m, writeRecord(tmp, rec)
	} else if o.ETag == "" && o.Size == 0 {
		// Only its manifest is stored: it must say the file is empty,
		// or hold its bytes (checked against its checksum).
		m, err := chunkxfer.LoadManifest(ctx, mr.t.cfg.Store, o.Key)
		if err != nil {
			return nil, err
		}
		if !m.NoObject() {
			return nil, fmt.Errorf("its object is missing, and its manifest is of %d bytes", m.Size)
		}
		if _, err := f.Write(m.Inline); err != nil {
			return nil, err
		}
	} else {
		b, err := store.ReadAll(mr.t.cfg.Store.Get(ctx, o.Key, 0, -1, store.GetOptions{}))
		if err != nil {
			return nil, err
		}
		if int64(len(b)) != o.Size {
			return nil, fmt.Errorf("read %d bytes of %d", len(b), o.Size)
		}
		if _, err := f.Write(b); err != nil {
			return nil, err
		}
	}
	return nil, nil
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
