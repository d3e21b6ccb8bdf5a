package tiering

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/tierfs/tierfs/idx/kafka"
)

// A partition moves to another broker: the files still local go over
// the wire (tierfs pull), the evicted ones do not. The sending mount
// describes where an evicted file's bytes are (RemoteCopy); the
// receiving mount, on the same store, makes the file an evicted file of
// its own that reads from those objects and references them
// (AdoptRemote), so they stay while it needs them.

// RemoteCopy is where an evicted file's bytes are in the store.
type RemoteCopy struct {
	Store   string   `json:"store"` // Config.StoreID of the mount that describes it
	Size    int64    `json:"size"`
	MtimeNs int64    `json:"mtime_ns"`
	Extents []Extent `json:"extents"`
}

// ErrOtherStore is a remote copy in a store this mount does not use.
var ErrOtherStore = errors.New("its bytes are in another store than this mount's")

// remoteCopy describes the file of record rec, if it is evicted.
func (cs *copies) remoteCopy(rec Record) ([]byte, error) {
	if rec.State != StateRemote || !rec.Freed || rec.Size == 0 || cs.t.moves.of(rec.Ino) != nil {
		return nil, nil
	}
	es := rec.Extents
	if len(es) == 0 {
		m, err := cs.loadManifest(rec)
		if err != nil {
			return nil, err
		}
		es = []Extent{{Pos: 0, Len: rec.Size, Key: rec.Key, Off: 0, ETag: m.ETag}}
	}
	return json.Marshal(RemoteCopy{Store: cs.t.cfg.StoreID, Size: rec.Size, MtimeNs: rec.MtimeNs, Extents: es})
}

// AdoptRemote makes a new evicted file, named rel (a segment, from the
// root) with a temporary name beside it, whose bytes are the remote copy
// desc (from RemoteCopy on another mount of the same store). It returns
// the temporary name (from the root): the caller renames it into place
// through the mount, so the kernel learns of the name. Nothing is
// downloaded: the objects are checked (manifest and ETag), referenced,
// and read from when the file is.
func (t *Tierer) AdoptRemote(ctx context.Context, rel string, desc []byte, mode uint32) (string, error) {
	if err := t.waitReady(); err != nil {
		return "", err
	}
	var rc RemoteCopy
	if err := json.Unmarshal(desc, &rc); err != nil {
		return "", fmt.Errorf("remote copy of %s: %w", rel, err)
	}
	if t.cfg.StoreID == "" || rc.Store != t.cfg.StoreID {
		return "", fmt.Errorf("%s: %w (%q, this mount's %q)", rel, ErrOtherStore, rc.Store, t.cfg.StoreID)
	}
	if err := checkExtents(rc.Extents, rc.Size); err != nil {
		return "", fmt.Errorf("remote copy of %s: %w", rel, err)
	}
	rel = filepath.Clean(rel)
	dir, name, ok := strings.Cut(rel, "/")
	sn, isSeg := kafka.ParseSegmentName(name)
	if !ok || strings.Contains(name, "/") || !isSeg || sn.Kind != kafka.KindLog || sn.Suffix != "" || strings.HasPrefix(dir, ".") {
		return "", fmt.Errorf("%s is not a segment (<partition dir>/<base offset>.log)", rel)
	}
	if _, ok := kafka.ParsePartitionDir(dir); !ok {
		return "", fmt.Errorf("%s is not in a partition dir", rel)
	}
	for _, k := range extentKeys(rc.Extents) {
		m, err := t.copies.fetchManifest(ctx, k)
		if err != nil {
			return "", err
		}
		for _, e := range rc.Extents {
			if e.Key == k && (e.ETag != m.ETag || e.Off+e.Len > m.Size) {
				return "", fmt.Errorf("%s: its object %s is not the one described (etag %s, %d bytes)", rel, k, m.ETag, m.Size)
			}
		}
	}
	tmpRel := filepath.Join(dir, "."+name+".tierfs-adopt")
	tmp := filepath.Join(t.cfg.Root, tmpRel)
	os.Remove(tmp) // of an attempt that died: its shipment goes as a deleted file's
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_EXCL, os.FileMode(mode&0o7777))
	if err != nil {
		return "", err
	}
	ok = false
	defer func() {
		f.Close()
		if !ok {
			os.Remove(tmp)
		}
	}()
	if err := f.Truncate(rc.Size); err != nil {
		return "", err
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		return "", err
	}
	seg := segmentAt(tmp)
	seg.Partition, seg.Base = dir, sn.BaseOffset
	key := t.shipper.identityKey(seg, st.Ino, rc.Size, rc.MtimeNs, kafka.KindLog)
	holder := holderOf(key)
	sh := Shipment{State: ShipmentShipping, Partition: dir, Base: sn.BaseOffset, Key: key, Ino: st.Ino, Since: t.cfg.Now(), Objects: refsOf(extentKeys(rc.Extents), holder)}
	if sh.HandleType, sh.Handle, err = fileHandle(tmp); err != nil {
		t.cfg.Log.Debug("no file handle", "file", tmp, "err", err)
	}
	if err := t.shipments.put(sh); err != nil {
		return "", err
	}
	if err := t.share.takeRefs(ctx, rc.Extents, holder); err != nil {
		return "", err
	}
	rec := Record{State: StateRemote, Key: key, Size: rc.Size, MtimeNs: rc.MtimeNs, Ino: st.Ino, Extents: rc.Extents, Freed: true}
	if err := writeRecordFd(int(f.Fd()), tmp, rec); err != nil {
		return "", err
	}
	ts := unix.NsecToTimespec(rc.MtimeNs)
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, procPath(f), []unix.Timespec{ts, ts}, 0); err != nil {
		return "", err
	}
	if err := f.Sync(); err != nil {
		return "", err
	}
	sh.State, sh.Since = ShipmentShipped, t.cfg.Now()
	if err := t.shipments.put(sh); err != nil {
		return "", err
	}
	ok = true
	t.counters.MappedSegments.Add(1)
	t.counters.MappedBytes.Add(rc.Size)
	t.cfg.Log.Info("took over an evicted file: it reads from the store", "file", rel, "bytes", rc.Size, "objects", len(extentKeys(rc.Extents)))
	return tmpRel, nil
}
