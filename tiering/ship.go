package tiering

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/tierfs/tierfs/chunkxfer"
	"github.com/tierfs/tierfs/chunkxfer/store"
	"github.com/tierfs/tierfs/idx"
	"github.com/tierfs/tierfs/idx/kafka"
	"golang.org/x/sys/unix"
)

// shipper puts segments in the store: a pass over one partition
// (shipPartition), and each segment's shipment: mapped onto what other
// brokers shipped where the store's index holds its offsets, the rest
// uploaded, verified, and appended to the partition's index.
type shipper struct{ t *Tierer }

// cover works out a segment's coverage from the partition's index. keyAt
// names the object this mount would ship the rest in, from a batch
// offset on. It reads the segment (every batch's CRC is checked) only
// when the index holds some of its offsets.
func (sp *shipper) cover(ctx context.Context, seg Segment, f *idx.File, keyAt func(base int64) string) (coverage, []idx.BatchRef, error) {
	cov := coverage{Next: seg.Base}
	next := nextOrMax(seg.Next)
	var ents []idx.Entry
	f.View(func(x *idx.Index) {
		i := sort.Search(x.Len(), func(i int) bool { return x.Entry(i).LastOffset >= seg.Base })
		for ; i < x.Len() && x.Entry(i).FirstOffset < next; i++ {
			ents = append(ents, x.Entry(i))
		}
	})
	if len(ents) == 0 {
		return cov, nil, nil
	}
	logPath := seg.LogPath()
	lf, err := os.Open(logPath)
	if err != nil {
		return cov, nil, err
	}
	batches, err := idx.BatchRefs(logPath, lf, seg.Size, 0)
	lf.Close()
	var fe *idx.FormatError
	if errors.As(err, &fe) {
		cov.Why = fmt.Sprintf("offsets of it are in the store, but it is not whole record batches (%v): kept local", err)
		return cov, nil, nil
	}
	if err != nil {
		return cov, nil, err
	}
	if len(batches) == 0 {
		return cov, nil, nil // empty (the cleaner can leave such): nothing to map
	}
	containing := func(o int64) (idx.Entry, bool) {
		i := sort.Search(len(ents), func(i int) bool { return ents[i].LastOffset >= o })
		if i < len(ents) && ents[i].FirstOffset <= o && !ents[i].Opaque() {
			return ents[i], true
		}
		return idx.Entry{}, false
	}
	for _, b := range batches {
		e, ok := containing(b.Base)
		if !ok {
			cov.Next = b.Base
			for _, later := range ents {
				if later.FirstOffset > b.Base {
					cov.Why = fmt.Sprintf("offsets from %d are not in the store, but offsets from %d are: kept local", b.Base, later.FirstOffset)
					break
				}
			}
			return cov, batches, nil
		}
		key, pos, ok := entryRDI(e)
		if !ok {
			cov.Next, cov.Why = b.Base, fmt.Sprintf("the index entry of offset %d has a bad RDI %q", b.Base, e.RDI)
			return cov, batches, nil
		}
		if sp.ownShipment(seg.Partition, key) {
			cov.Next = b.Base
			resume := keyAt(b.Base) // the name of a tail shipped from here
			if cov.End == 0 {
				resume = keyAt(seg.Base) // of the whole file (its first batch may follow its base)
			}
			if key != resume {
				cov.Why = fmt.Sprintf("an earlier version of this segment is in the store (offset %d is in %s): ships once the broker has deleted that version", b.Base, key)
			} else {
				cov.OwnKey = key
			}
			return cov, batches, nil
		}
		list, err := sp.objectBatches(ctx, key)
		if err != nil {
			cov.Next, cov.Why = b.Base, fmt.Sprintf("offset %d is in %s, whose batch list cannot be read (%v): kept local", b.Base, key, err)
			return cov, batches, nil
		}
		lb, ok := idx.FindBatch(list, b.Base)
		if !ok || !lb.Same(b) || lb.Pos < pos || lb.Pos+int64(lb.Size) > pos+int64(e.DataLength) {
			cov.Next, cov.Why = b.Base, fmt.Sprintf("the batch at offset %d differs from the store's copy in %s (this replica's log diverged): kept local", b.Base, key)
			return cov, batches, nil
		}
		if n := len(cov.Extents); n > 0 && cov.Extents[n-1].Key == key && cov.Extents[n-1].Off+cov.Extents[n-1].Len == lb.Pos {
			cov.Extents[n-1].Len += int64(b.Size)
		} else {
			m, err := sp.t.copies.mappingManifest(ctx, key)
			if err != nil {
				cov.Next, cov.Why = b.Base, fmt.Sprintf("offset %d is in %s, whose manifest cannot be read (%v): kept local", b.Base, key, err)
				return cov, batches, nil
			}
			cov.Extents = append(cov.Extents, Extent{Pos: b.Pos, Len: int64(b.Size), Key: key, Off: lb.Pos, ETag: m.ETag})
		}
		cov.End = b.Pos + int64(b.Size)
	}
	cov.Next = -1
	return cov, batches, nil
}

// ownShipment says whether key is an object this mount shipped (its
// catalog holds a shipment of it).
func (sp *shipper) ownShipment(partition, key string) bool {
	return sp.t.shipments.has(partition, key)
}

// objectBatches is the batch list of an object, from the store (kept in
// memory for the pass): a small object's is in its manifest (fetched
// and kept as a local copy, as mapping onto it needs it), a larger
// one's, and that of any object shipped before 2026-12-07, is an object
// of its own.
func (sp *shipper) objectBatches(ctx context.Context, key string) ([]idx.BatchRef, error) {
	if bs, ok := sp.t.batches.get(key); ok {
		return bs, nil
	}
	name, b := chunkxfer.ManifestKey(key), []byte(nil)
	if m, err := sp.t.copies.mappingManifest(ctx, key); err == nil && m.Attached != nil {
		b = m.Attached
	} else {
		name = batchesKey(key)
		if b, err = store.ReadAll(sp.t.cfg.Store.Get(ctx, name, 0, -1, store.GetOptions{})); err != nil {
			return nil, err
		}
	}
	bs, err := idx.ParseBatches(name, b)
	if err != nil {
		return nil, err
	}
	sp.t.batches.put(key, bs)
	return bs, nil
}

// shipPartition finishes half-done evictions and ships the eligible
// segments of one partition, oldest first.
func (sp *shipper) shipPartition(ctx context.Context, p Partition, cp Checkpoints, now time.Time) Report {
	rep := Report{Waiting: map[string]int{}}
	blocked := ""
	synced := false
	// note counts how a segment's shipment ended: true if it shipped.
	note := func(partition string, seg Segment, err error) bool {
		var wait *WaitError
		switch {
		case errors.As(err, &wait):
			rep.Waiting[reasonKind(wait.Why)]++
			sp.t.status.noteKept(partition, seg, wait.Why)
			if !sp.t.roles.follows(partition) {
				// The index takes a leader's entries in order; a
				// follower maps each segment on its own.
				blocked = "an earlier segment waits"
			}
			return false
		case err != nil:
			rep.Errors = append(rep.Errors, sp.t.status.noteErr(partition, fmt.Errorf("ship %s: %w", seg.LogPath(), err)))
			blocked = "an earlier segment failed"
			return false
		}
		return true
	}
	// The segments planned and not uploaded yet, in offset order, and
	// their bytes. ship catalogs their shipments in one write, uploads
	// them, and commits those uploaded, up to the first that failed, in
	// one put of the partition's index.
	var planned []*shipCommit
	var plannedBytes int64
	ship := func() {
		cs := planned
		planned, plannedBytes = nil, 0
		if len(cs) == 0 {
			return
		}
		errs := sp.uploadAll(ctx, cs, nil)
		n := 0
		for n < len(cs) && errs[n] == nil {
			n++
		}
		for i, c := range cs[n:] {
			c.release()
			if i == 0 {
				note(p.Name, c.seg, errs[n])
			} else {
				rep.Waiting["an earlier segment failed"]++
			}
		}
		errs = sp.commitAll(ctx, p.Name, cs[:n])
		for i, c := range cs[:n] {
			if note(p.Name, c.seg, errs[i]) {
				rep.Shipped++
			}
		}
	}
	sp.t.status.noteKept(p.Name, Segment{}, "")
	sp.t.roles.checkEpoch(p.Name)
	for _, seg := range p.Segments {
		rs, err := sp.t.records.of(seg)
		if err != nil {
			rep.Errors = append(rep.Errors, sp.t.status.noteErr(p.Name, err))
			blocked = "an earlier segment failed"
			continue
		}
		has := rs.Has
		if has && rs.State == StateShipped && !rs.SameFile {
			// Changed after it shipped (Kafka truncated it): the copy is
			// stale. Forget it; followDeletions deletes it and the file
			// ships again when it is eligible.
			stale, _, _ := readRecord(seg.LogPath())
			sp.t.cfg.Log.Warn("shipped segment changed; its remote copy is stale", "segment", seg.LogPath(), "key", stale.Key)
			if err := unix.Removexattr(seg.LogPath(), recordXattr); err != nil {
				rep.Errors = append(rep.Errors, sp.t.status.noteErr(p.Name, err))
				blocked = "an earlier segment failed"
				continue
			}
			sp.t.changed(seg.Ino)
			has = false
		}
		if has {
			// An unfreed remote file is an eviction or a hydration
			// that tierfs died in: its local bytes go. One under way
			// now holds its claim.
			if ino := inodeClaim(seg.Ino); rs.State == StateRemote && !rs.Freed && sp.t.claims.take(ino) {
				if fixed, err := sp.t.evictor.finishEvictRead(seg); err != nil {
					rep.Errors = append(rep.Errors, sp.t.status.noteErr(p.Name, err))
				} else if fixed {
					rep.Recovered++
				}
				sp.t.claims.release(ino)
			}
			continue
		}
		if blocked != "" {
			rep.Waiting[blocked]++
			continue
		}
		if ok, why := sp.t.cfg.Policy.Eligible(seg, cp, now); !ok {
			rep.Waiting[reasonKind(why)]++
			blocked = "an earlier segment waits"
			if seg.Next < 0 {
				blocked = ""
			}
			continue
		}
		if !synced {
			unlock := sp.t.indexes.lock(p.Name)
			_, err := sp.t.share.syncIndex(ctx, p.Name)
			unlock()
			if errors.Is(err, store.ErrPrecondition) {
				// Other brokers changed it at each read: a race, not an
				// error; the next pass reads it again.
				rep.Waiting["the store's index kept changing while read"]++
				sp.t.status.noteKept(p.Name, seg, "the store's index kept changing while it was read: read again next pass")
				blocked = "an earlier segment waits"
				continue
			}
			if err != nil {
				rep.Errors = append(rep.Errors, sp.t.status.noteErr(p.Name, err))
				blocked = "an earlier segment failed"
				continue
			}
			synced = true
		}
		c, err := sp.plan(ctx, seg, false)
		if c != nil {
			planned = append(planned, c)
			if plannedBytes += c.st.Size - c.from; len(planned) == maxBatch || plannedBytes >= maxBatchBytes {
				ship()
			}
			continue
		}
		if note(p.Name, seg, err) {
			rep.Shipped++
		}
	}
	ship()
	return rep
}

// A pass commits the segments of a partition it uploaded together: one
// put of the partition's index for up to maxBatch segments or
// maxBatchBytes of them, not one a segment.
const (
	maxBatch      = 64
	maxBatchBytes = 256 << 20
)

// Ship puts a segment in the store. Where the store already holds its
// bytes, shipped by another broker (the same batches: Kafka replicas
// store the leader's), the file is mapped onto those objects and nothing
// is uploaded; the rest, if any, is uploaded with its index files and
// verified, its entries go into the partition's index, and the file is
// marked shipped. A follower uploads nothing: a segment the store does
// not hold yet waits (*WaitError). Every step can be repeated: after a
// crash the next pass resumes the upload and skips what is done.
func (sp *shipper) Ship(ctx context.Context, seg Segment, progress chunkxfer.Progress) error {
	return sp.ship(ctx, seg, progress, true)
}

// ship is Ship; sync false skips reading the store's index (the pass
// read it for the partition already).
func (sp *shipper) ship(ctx context.Context, seg Segment, progress chunkxfer.Progress, sync bool) error {
	c, err := sp.plan(ctx, seg, sync)
	if c == nil {
		return err
	}
	cs := []*shipCommit{c}
	if err := sp.uploadAll(ctx, cs, progress)[0]; err != nil {
		c.release()
		return err
	}
	return sp.commitAll(ctx, seg.Partition, cs)[0]
}

// shipCommit is a segment on its way to the store: planned (plan), its
// shipment catalogued and its objects uploaded and verified (uploadAll),
// then its entries appended to the partition's index and the file marked
// shipped (commitAll). It holds the segment's claims until release.
type shipCommit struct {
	seg           Segment
	st            syscall.Stat_t
	cov           coverage
	batches       []idx.BatchRef // as cover read them; nil: read at the upload
	key           string
	from, objBase int64
	keyAt         func(int64) string
	m             *chunkxfer.Manifest
	sh            Shipment
	// fresh says sh is catalogued by this shipment, not found from an
	// earlier, interrupted one: none of its objects can be in the store.
	fresh bool
	// unstored are the keys sh lists that the upload did not store:
	// the objects of files stored in their manifests alone (empty and
	// small files), and both keys of files held by the .log's manifest;
	// with fresh, none of them is in the store, and the shipment recorded
	// shipped lists them no more (a deletion sends no request for them).
	unstoredMu sync.Mutex
	unstored   []string // GUARDED_BY(unstoredMu)
	undo       []func() // run by release, last first
}

// unstore notes keys that the upload did not store (unstored).
func (c *shipCommit) unstore(keys ...string) {
	c.unstoredMu.Lock()
	defer c.unstoredMu.Unlock()
	c.unstored = append(c.unstored, keys...)
}

// release lets go of what c holds: its claims, and its file counts as
// shipping no more.
func (c *shipCommit) release() {
	for i := len(c.undo) - 1; i >= 0; i-- {
		c.undo[i]()
	}
	c.undo = nil
}

// plan decides a segment's shipment up to its upload: the segment is
// mapped onto the store's copy, or waits, or fails (a nil *shipCommit
// and the outcome), or a *shipCommit says what to upload and the
// shipment to catalog first. Nothing is written for it yet but its
// claims.
func (sp *shipper) plan(ctx context.Context, seg Segment, sync bool) (_ *shipCommit, err error) {
	c := &shipCommit{seg: seg}
	defer func() {
		if err != nil {
			c.release()
		}
	}()
	logPath := seg.LogPath()
	if !sp.t.claims.take(pathClaim(logPath)) {
		return nil, nil
	}
	c.undo = append(c.undo, func() { sp.t.claims.release(pathClaim(logPath)) })
	st := &c.st
	if err := syscall.Stat(logPath, st); err != nil {
		return nil, err
	}
	key := sp.objectKey(seg, st, ".log")
	if !sp.t.claims.take(objectClaim(key)) {
		c.release()
		return nil, nil
	}
	c.undo = append(c.undo, func() { sp.t.claims.release(objectClaim(key)) })
	doneShipping := sp.t.claims.startShipping(st.Ino)
	sp.t.changed(st.Ino)
	c.undo = append(c.undo, func() {
		doneShipping()
		sp.t.changed(st.Ino)
	})
	if sync {
		unlock := sp.t.indexes.lock(seg.Partition)
		_, err := sp.t.share.syncIndex(ctx, seg.Partition)
		unlock()
		if err != nil {
			return nil, err
		}
	}
	f, err := sp.t.indexes.file(seg.Partition)
	if err != nil {
		return nil, err
	}
	c.keyAt = func(base int64) string {
		s := seg
		s.Base = base
		return sp.objectKey(s, st, ".log")
	}
	role := sp.t.roles.of(seg.Partition)
	if role.Role == RoleFollower && !sp.maybeCovered(seg, f) {
		return nil, &WaitError{Why: "not in the store yet (a follower ships nothing; the leader has not shipped these offsets): " + role.Why}
	}
	cov, batches, err := sp.cover(ctx, seg, f, c.keyAt)
	if err != nil {
		return nil, err
	}
	switch {
	case cov.Next < 0 && len(cov.Extents) > 0:
		err := sp.mapOnto(ctx, seg, st, key, cov)
		c.release()
		return nil, err
	case cov.Why != "":
		return nil, &WaitError{Why: cov.Why}
	case role.Role == RoleFollower:
		return nil, &WaitError{Why: fmt.Sprintf("offsets from %d are not in the store yet (a follower ships nothing): %s", cov.Next, role.Why)}
	case role.Role == RoleAuto && cov.OwnKey == "" && sp.t.share.loadStoreState(seg.Partition).Shared:
		// No leadership to go by, and other brokers ship this
		// partition too: give the leader's upload time to land.
		if wait := sp.t.cfg.Policy.ShipAfter + graceFor(sp.t.cfg.ShareGrace, sp.t.BrokerID()) - sp.t.cfg.Now().Sub(seg.Mtime); wait > 0 {
			return nil, &WaitError{Why: fmt.Sprintf("other brokers ship this partition too: waiting %v more for their upload of offsets from %d (no --kafka-bootstrap to tell the leader)", wait.Round(time.Second), cov.Next)}
		}
	}
	c.cov, c.batches = cov, batches
	c.from, c.objBase = cov.End, seg.Base
	if c.from > 0 {
		c.objBase = cov.Next
	}
	c.key = c.keyAt(c.objBase)
	if c.from > 0 {
		tail := c.key
		if !sp.t.claims.take(objectClaim(tail)) {
			return nil, &WaitError{Why: "its tail is being shipped already"}
		}
		c.undo = append(c.undo, func() { sp.t.claims.release(objectClaim(tail)) })
	}
	if c.sh, c.fresh, err = sp.shipmentOf(seg, st, c.key, c.from, refsOf(extentKeys(cov.Extents), holderOf(c.key))); err != nil {
		return nil, err
	}
	return c, nil
}

// maybeCovered says whether the index reaches the segment's last offset
// (that of the batch before the next segment's base): if not, the store
// cannot hold all of it, and it need not be read to tell.
func (sp *shipper) maybeCovered(seg Segment, f *idx.File) bool {
	if seg.Next < 0 {
		return false
	}
	ok := false
	f.View(func(x *idx.Index) {
		for i := x.Len() - 1; i >= 0; i-- {
			if e := x.Entry(i); !e.Opaque() {
				ok = e.LastOffset >= seg.Next-1
				return
			}
		}
	})
	return ok
}

// mapOnto marks a segment shipped whose bytes are all in other brokers'
// objects: it references each of them (so they are kept while the file
// reads from them), and records its extents. Nothing is uploaded.
func (sp *shipper) mapOnto(ctx context.Context, seg Segment, st *syscall.Stat_t, key string, cov coverage) error {
	logPath := seg.LogPath()
	holder := holderOf(key)
	if old, err := sp.t.shipments.get(seg.Partition, key); err == nil {
		// An upload of this file that lost the race to the index: its
		// objects are nobody's now.
		if own := ownObjects(old); len(own) > 0 {
			if err := sp.t.share.deleteOwn(ctx, old.Key, own); err != nil {
				return err
			}
		}
	} else if !os.IsNotExist(err) {
		return err
	}
	keys := extentKeys(cov.Extents)
	sh := Shipment{State: ShipmentShipping, Partition: seg.Partition, Base: seg.Base, Key: key, Ino: st.Ino, Since: sp.t.cfg.Now(), Objects: refsOf(keys, holder)}
	var err error
	if sh.HandleType, sh.Handle, err = fileHandle(logPath); err != nil {
		sp.t.cfg.Log.Debug("no file handle", "segment", logPath, "err", err)
	}
	if err := sp.t.shipments.put(sh); err != nil {
		return err
	}
	if err := sp.t.share.takeRefs(ctx, cov.Extents, holder); err != nil {
		return err
	}
	if err := sameFile(logPath, st); err != nil {
		return err
	}
	rec := Record{State: StateShipped, Key: key, Size: st.Size, MtimeNs: st.Mtim.Nano(), Ino: st.Ino, Extents: cov.Extents}
	if err := writeRecord(logPath, rec); err != nil {
		return err
	}
	sh.State, sh.Since = ShipmentShipped, sp.t.cfg.Now()
	if err := sp.t.shipments.put(sh); err != nil {
		return err
	}
	sp.t.counters.MappedSegments.Add(1)
	sp.t.counters.MappedBytes.Add(st.Size)
	sp.t.cfg.Log.Info("mapped onto the store's copy", "segment", logPath, "objects", len(keys), "bytes", st.Size)
	return nil
}

// uploadsAtOnce bounds the segments of one partition that upload at
// once (uploadAll). All partitions together upload no more than
// Tierer.uploading lets, each within the uploads' memory (uploadMemory).
const uploadsAtOnce = 4

// uploadAll catalogs the shipments of planned segments cs, of one
// partition, in one write of the partition's shipment log, then uploads
// them, at most uploadsAtOnce at a time: a shipment is catalogued before
// its first object is sent, so a crash never leaves an object in the
// store that no shipment names. It returns each one's outcome; progress,
// if not nil, hears of the bytes of all.
func (sp *shipper) uploadAll(ctx context.Context, cs []*shipCommit, progress chunkxfer.Progress) []error {
	errs := make([]error, len(cs))
	var fresh []Shipment
	for _, c := range cs {
		if c.fresh {
			fresh = append(fresh, c.sh)
		}
	}
	if err := sp.t.shipments.putAll(fresh); err != nil {
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	// Once one fails, those after it are not started: the partition's
	// index cannot take them before it. (Their shipments stay
	// catalogued; the next pass resumes them.)
	var failed atomic.Bool
	var wg sync.WaitGroup
	sem := make(chan struct{}, uploadsAtOnce)
	for i, c := range cs {
		sem <- struct{}{}
		sp.t.uploading <- struct{}{}
		if failed.Load() {
			<-sp.t.uploading
			<-sem
			errs[i] = &WaitError{Why: "an earlier segment failed"}
			continue
		}
		wg.Go(func() {
			defer func() { <-sp.t.uploading; <-sem }()
			if errs[i] = sp.upload(ctx, c, progress); errs[i] != nil {
				failed.Store(true)
			}
		})
	}
	wg.Wait()
	return errs
}

// upload puts a planned segment's objects in the store: its bytes from
// where its coverage ends (from its start when nothing of it is in the
// store), with its batch list and its index files (whole segments
// only), and takes its references on other brokers' objects.
func (sp *shipper) upload(ctx context.Context, c *shipCommit, progress chunkxfer.Progress) error {
	seg, st, key, from, sh := c.seg, &c.st, c.key, c.from, c.sh
	if err := sp.t.share.takeRefs(ctx, c.cov.Extents, holderOf(key)); err != nil {
		return err
	}
	// A shipment catalogued just now has put nothing in the store yet:
	// there is no finished upload of its objects to look for.
	opts := chunkxfer.UploadOptions{From: from, Progress: progress, Fresh: c.fresh}
	var puts []func() error
	if st.Size-from <= attachBatchesUpTo {
		// A small object's batch list goes in its manifest: a request
		// fewer for it, and one fewer for each broker that maps onto it.
		list, err := sp.batchList(seg, from, c.batches)
		if err != nil {
			return err
		}
		if len(list) <= maxAttachedBatches {
			opts.Attach = list
		} else {
			puts = append(puts, func() error { return sp.putBatches(ctx, key, list) })
		}
	} else {
		puts = append(puts, func() error { return sp.putBatchList(ctx, seg, key, from, c.batches) })
	}
	if from == 0 {
		held := 0
		// The files the shipment lists are those that were there when it
		// was catalogued (sidecarKeys): not looked for again.
		for _, sk := range sp.segmentFiles(seg, st) {
			if !slices.Contains(sh.Objects, sk.key) {
				// Appeared after the shipment was catalogued: kept local only.
				continue
			}
			// Its small files (the indexes of a segment of up to about
			// 13 MiB, the snapshot, the leader-epoch checkpoint) go in
			// its .log's manifest: no request, and no key, of their own.
			b, ok, err := readSmallFile(sk.path, maxHeldFiles-held)
			if os.IsNotExist(err) {
				continue // gone since it was catalogued: nothing to ship
			}
			if err != nil {
				return fmt.Errorf("ship %s: %w", filepath.Base(sk.path), err)
			}
			if ok {
				held += len(b)
				opts.Files = append(opts.Files, chunkxfer.NewFile(sk.kind, b))
				c.unstore(sk.key, chunkxfer.ManifestKey(sk.key))
				continue
			}
			// One over those limits is stored in its own manifest
			// alone when small (one of 64 KiB when the others took the
			// room), else as an object.
			puts = append(puts, func() error {
				m, err := sp.t.up.UploadSmall(ctx, sk.path, sk.key, c.fresh)
				if err != nil {
					return fmt.Errorf("ship %s: %w", filepath.Base(sk.path), err)
				}
				if m.NoObject() {
					c.unstore(sk.key)
				}
				return nil
			})
		}
	}
	// The segment's objects go up at once: each is a request (and, on a
	// directory store, a sync) of its own, and a small segment's cost is
	// their latency, not its bytes. None is pointed at before all are in:
	// the partition's index takes the segment's entries only after.
	puts = append(puts, func() (err error) {
		if c.m, err = sp.t.up.UploadWith(ctx, seg.LogPath(), key, opts); err != nil {
			return err
		}
		if err := sp.t.up.Verify(ctx, sp.t.cfg.Store, c.m); err != nil {
			return fmt.Errorf("remote copy does not verify: %w", err)
		}
		return nil
	})
	mem := sp.t.uploadMemory(st.Size - from)
	if err := sp.t.upMem.Acquire(ctx, mem); err != nil {
		return err
	}
	defer sp.t.upMem.Release(mem)
	return all(puts)
}

// commitAll appends the entries of uploaded segments cs (of one
// partition, in offset order) to the partition's index and ships it
// once for all of them, then marks each shipped; it releases their
// claims. Where another broker changed the store's index meanwhile, each
// is appended again on its own (index), in order, and the first that
// cannot be leaves the rest for the next pass. It returns each one's
// outcome.
func (sp *shipper) commitAll(ctx context.Context, partition string, cs []*shipCommit) []error {
	errs := make([]error, len(cs))
	if len(cs) == 0 {
		return errs
	}
	defer func() {
		for _, c := range cs {
			c.release()
		}
	}()
	unlock := sp.t.indexes.lock(partition)
	n, appendErr := sp.appendAll(ctx, partition, cs)
	var putErr error
	if n > 0 {
		f, err := sp.t.indexes.file(partition)
		if err == nil {
			err = sp.t.share.putIndex(ctx, partition, f)
		}
		putErr = err
	}
	unlock()
	if errors.Is(putErr, ErrIndexMoved) {
		// putIndex took the store's index: each is decided again
		// against what it holds now.
		sp.t.counters.IndexRaces.Add(1)
		sp.t.cfg.Log.Info("another broker changed the partition's index first: appending again", "partition", partition, "segments", n)
		for i, c := range cs {
			if errs[i] = sp.finish(ctx, c, sp.index(ctx, c, true)); errs[i] != nil {
				for j := i + 1; j < len(cs); j++ {
					errs[j] = &WaitError{Why: "an earlier segment was not committed"}
				}
				break
			}
		}
		return errs
	}
	if putErr == nil {
		copy(errs, sp.finishAll(cs[:n]))
	}
	for i := range cs {
		switch {
		case i < n && putErr != nil:
			errs[i] = putErr
		case i == n:
			errs[i] = appendErr
		case i > n:
			errs[i] = &WaitError{Why: "an earlier segment was not committed"}
		}
	}
	return errs
}

// appendAll appends the entries of each of cs to the partition's index
// file, in one append (and sync) for all, and puts the remote indexes of
// each, at most putsAtOnce at a time: it returns how many of cs, from the
// first, were done, and the failure of the next. Call it with the
// partition locked.
func (sp *shipper) appendAll(ctx context.Context, partition string, cs []*shipCommit) (int, error) {
	f, err := sp.t.indexes.file(partition)
	if err != nil {
		return 0, err
	}
	var es []idx.Entry
	n := 0
	var appendErr error
	for _, c := range cs {
		more, err := sp.entriesOf(f, c.seg, c.key, c.from, c.from, c.objBase)
		if err != nil {
			appendErr = err
			break
		}
		es = append(es, more...)
		n++
	}
	if len(es) > 0 {
		if err := f.Append(es...); err != nil {
			return 0, err
		}
	}
	var groups [][]func() error
	for _, c := range cs[:n] {
		puts, err := sp.remoteIndexPuts(ctx, f, c.seg, c.key, c.objBase, c.sh.Objects)
		if err != nil {
			appendErr = err
			break
		}
		groups = append(groups, puts)
	}
	for i, err := range allGroups(groups, putsAtOnce) {
		if err != nil {
			return i, err
		}
	}
	return len(groups), appendErr
}

// putsAtOnce bounds the remote-index puts of a commit that run at once.
const putsAtOnce = 16

// allGroups runs every function of groups, at most limit at once, and
// returns each group's first error.
func allGroups(groups [][]func() error, limit int) []error {
	errs := make([]error, len(groups))
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, limit)
	for i, g := range groups {
		for _, f := range g {
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				if err := f(); err != nil {
					mu.Lock()
					if errs[i] == nil {
						errs[i] = err
					}
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	return errs
}

// finish marks a committed segment shipped: its manifest kept, its
// record written (the file must still be what was uploaded) and its
// shipment done. indexed is how its index append ended.
func (sp *shipper) finish(ctx context.Context, c *shipCommit, indexed error) error {
	seg, st, key, from := c.seg, &c.st, c.key, c.from
	var covered *coveredError
	switch {
	case errors.As(indexed, &covered):
		// Mapped instead; what this mount uploaded goes again.
		sp.t.counters.WastedSegments.Add(1)
		sp.t.counters.WastedBytes.Add(st.Size - from)
		sp.t.cfg.Log.Info("another broker shipped the same offsets first: mapping onto its copy and deleting this upload", "segment", seg.LogPath(), "key", key, "bytes", st.Size-from)
		return sp.mapOnto(ctx, seg, st, key, covered.cov)
	case indexed != nil:
		return indexed
	}
	return sp.finishAll([]*shipCommit{c})[0]
}

// finishAll marks segments of one partition whose entries the store's
// index holds (in offset order) shipped, as finish does one. Each
// segment takes the steps in finish's order, and each step is taken for
// all of them at once where it can: their manifest copies are one
// append (and sync) of the partition's manifest log, their shipments one
// of its shipment log.
func (sp *shipper) finishAll(cs []*shipCommit) []error {
	errs := make([]error, len(cs))
	ms := make([]*chunkxfer.Manifest, len(cs))
	for i, c := range cs {
		ms[i] = c.m
	}
	if err := sp.t.manifests.putAll(ms); err != nil {
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	var shs []Shipment
	var marked []int
	for i, c := range cs {
		sh, err := sp.recordShipped(c)
		if errs[i] = err; err == nil {
			shs = append(shs, sh)
			marked = append(marked, i)
		}
	}
	err := sp.t.shipments.putAll(shs)
	for _, i := range marked {
		if errs[i] = err; err == nil {
			sp.noteShipped(cs[i])
		}
	}
	return errs
}

// recordShipped marks c's file shipped (its record), if it is still the
// file that was uploaded, and returns its shipment as shipped.
func (sp *shipper) recordShipped(c *shipCommit) (Shipment, error) {
	seg, st, key, from := c.seg, &c.st, c.key, c.from
	logPath := seg.LogPath()
	if err := sameFile(logPath, st); err != nil {
		return Shipment{}, err
	}
	rec := Record{State: StateShipped, Key: key, ETag: c.m.ETag, Size: st.Size, MtimeNs: st.Mtim.Nano(), Ino: st.Ino}
	if from > 0 {
		rec.Extents = append(slices.Clone(c.cov.Extents), Extent{Pos: from, Len: st.Size - from, Key: key, ETag: c.m.ETag})
	}
	if err := writeRecord(logPath, rec); err != nil {
		return Shipment{}, err
	}
	sh := c.sh
	sh.State, sh.Since = ShipmentShipped, sp.t.cfg.Now()
	if c.fresh {
		// Nothing of an earlier upload can be under the names of the
		// files held by their manifests: not listed, not deleted.
		c.unstoredMu.Lock()
		sh.Objects = slices.DeleteFunc(slices.Clone(sh.Objects), func(k string) bool { return slices.Contains(c.unstored, k) })
		c.unstoredMu.Unlock()
	}
	return sh, nil
}

// noteShipped counts and logs c's segment as shipped.
func (sp *shipper) noteShipped(c *shipCommit) {
	size, from := c.st.Size, c.from
	sp.t.counters.ShippedSegments.Add(1)
	sp.t.counters.ShippedBytes.Add(size - from)
	if from > 0 {
		sp.t.counters.MappedBytes.Add(from)
	}
	sp.t.cfg.Log.Info("shipped", "segment", c.seg.LogPath(), "key", c.key, "bytes", size-from, "from", from)
}

// An object's batch list goes in its manifest rather than an object of
// its own (.batches) when the object is of at most attachBatchesUpTo
// bytes and its list of at most maxAttachedBatches (170 batches, at 24
// bytes a batch): the manifest, and each local copy of it, stays small.
const (
	attachBatchesUpTo  = 1 << 20
	maxAttachedBatches = 4 << 10
)

// putBatchList ships the batch list of the object key (the segment from
// position from) as an object of its own. A segment that is not whole
// record batches has none: no other broker can map its bytes.
func (sp *shipper) putBatchList(ctx context.Context, seg Segment, key string, from int64, batches []idx.BatchRef) error {
	b, err := sp.batchList(seg, from, batches)
	if err != nil {
		return err
	}
	return sp.putBatches(ctx, key, b)
}

// putBatches puts b, the batch list of the object key, as an object of
// its own; nil (no list) puts nothing.
func (sp *shipper) putBatches(ctx context.Context, key string, b []byte) error {
	if b == nil {
		return nil
	}
	_, err := sp.t.uploads.Put(ctx, batchesKey(key), bytes.NewReader(b), int64(len(b)))
	return err
}

// batchList is the batch list of a segment from position from, as
// stored (docs/formats.md), from batches (all of the segment's) when
// they were read already; nil for a segment that is not whole record
// batches.
func (sp *shipper) batchList(seg Segment, from int64, batches []idx.BatchRef) ([]byte, error) {
	logPath := seg.LogPath()
	var list []idx.BatchRef
	if batches != nil {
		for _, b := range batches {
			if b.Pos >= from {
				b.Pos -= from
				list = append(list, b)
			}
		}
	} else {
		f, err := os.Open(logPath)
		if err != nil {
			return nil, err
		}
		list, err = idx.BatchRefs(logPath, f, seg.Size, from)
		f.Close()
		var fe *idx.FormatError
		if errors.As(err, &fe) {
			sp.t.cfg.Log.Debug("no batch list: not whole record batches", "segment", logPath, "err", err)
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
	}
	b, err := idx.MarshalBatches(list)
	if err != nil {
		return nil, fmt.Errorf("batch list of %s: %w", logPath, err)
	}
	return b, nil
}

// shipmentOf is the shipment of the objects a segment is about to put
// in the store, to be catalogued before the first is sent, or the one an
// earlier, interrupted shipment catalogued: the object of its bytes from
// position from, its batch list and remote indexes, for a whole segment
// its index files too, and refs, the references it takes on other
// brokers' objects. fresh says it is new: none of its objects can be in
// the store.
func (sp *shipper) shipmentOf(seg Segment, st *syscall.Stat_t, key string, from int64, refs []string) (sh Shipment, fresh bool, err error) {
	if sh, err := sp.t.shipments.get(seg.Partition, key); err == nil {
		if sh.State == ShipmentDeleting {
			return sh, false, fmt.Errorf("%s: its remote copy is being deleted", seg.LogPath())
		}
		return sh, false, nil
	} else if !os.IsNotExist(err) {
		return sh, false, err
	}
	sh = Shipment{State: ShipmentShipping, Partition: seg.Partition, Base: seg.Base, Key: key, Ino: st.Ino, Since: sp.t.cfg.Now()}
	if sh.HandleType, sh.Handle, err = fileHandle(seg.LogPath()); err != nil {
		sp.t.cfg.Log.Debug("no file handle", "segment", seg.LogPath(), "err", err)
	}
	if from == 0 {
		for _, k := range sp.sidecarKeys(seg, st) {
			sh.Objects = append(sh.Objects, k.key, chunkxfer.ManifestKey(k.key))
		}
	} else {
		sh.Objects = append(sh.Objects, key, chunkxfer.ManifestKey(key))
	}
	base := strings.TrimSuffix(key, kafka.KindLog)
	sh.Objects = append(sh.Objects, base+".batches")
	if st.Size-from > idx.DefaultChunkSize {
		// An object of one index entry (no bigger than an entry's
		// chunk) has no remote indexes: that entry is all they would
		// say.
		sh.Objects = append(sh.Objects, base+".rindex", base+".rtimeindex")
	}
	sh.Objects = append(sh.Objects, refs...)
	return sh, true, nil
}

// sidecarKeys are the files shipped for a segment and their keys: the
// .log first, then its indexes, snapshot and the partition's
// leader-epoch-checkpoint, those that exist.
func (sp *shipper) sidecarKeys(seg Segment, st *syscall.Stat_t) []sidecarKey {
	out := []sidecarKey{{seg.LogPath(), sp.objectKey(seg, st, kafka.KindLog), kafka.KindLog}}
	for _, sk := range sp.segmentFiles(seg, st) {
		if fileExists(sk.path) {
			out = append(out, sk)
		}
	}
	return out
}

// segmentFiles are the files that may be shipped beside a segment, and
// their keys, whether they exist or not: its indexes, snapshot and the
// partition's leader-epoch-checkpoint.
func (sp *shipper) segmentFiles(seg Segment, st *syscall.Stat_t) []sidecarKey {
	out := make([]sidecarKey, 0, len(segmentFileKinds)+1)
	for _, kind := range segmentFileKinds {
		out = append(out, sidecarKey{sidecar(seg, kind), sp.objectKey(seg, st, kind), kind})
	}
	return append(out, sidecarKey{filepath.Join(seg.Dir, "leader-epoch-checkpoint"), sp.objectKey(seg, st, kindEpochs), kindEpochs})
}

// HeldFileOf says, of a key that would name a file shipped beside a
// segment (its index files, snapshot or copy of the leader-epoch
// checkpoint), which .log object's manifest would hold that file
// (Manifest.Files), and its name there.
func HeldFileOf(key string) (logKey, name string, ok bool) {
	for _, kind := range append(slices.Clone(segmentFileKinds), kindEpochs) {
		if stem, cut := strings.CutSuffix(key, kind); cut && stem != "" && !strings.HasSuffix(stem, "/") {
			return stem + kafka.KindLog, kind, true
		}
	}
	return "", "", false
}

// kindEpochs ends the key of a segment's copy of its partition's
// leader-epoch-checkpoint, and names it among the files its .log's
// manifest holds.
const kindEpochs = ".leader-epoch-checkpoint"

// A segment's index files, snapshot and leader-epoch checkpoint are held
// by its .log's manifest (chunkxfer.Manifest.Files, named by their kind:
// ".index", ...) while all of them together are of at most maxHeldFiles
// bytes (at Kafka's default index interval, the indexes of a segment of
// up to about 13 MiB): the manifest, read by every broker that maps onto
// the object, stays small. Those that do not fit are stored in manifests
// or objects of their own.
const maxHeldFiles = 64 << 10

// readSmallFile reads the file at p if it has at most max bytes (ok).
func readSmallFile(p string, max int) (b []byte, ok bool, err error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, false, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || fi.Size() > int64(max) {
		return nil, false, err
	}
	b = make([]byte, fi.Size())
	if _, err := io.ReadFull(f, b); err != nil {
		return nil, false, fmt.Errorf("read %s: %w", p, err)
	}
	return b, true, nil
}

// index appends the entries of c's object (the segment's bytes from
// position c.from, whose first batch has offset c.objBase) to the
// partition's index file (once), puts the object's remote indexes, and
// ships the index file, on the condition that no other broker changed
// it meanwhile. Losing that race to another broker costs a retry of the
// append, never an upload: the store's index is taken, and what it
// still lacks of this object's offsets is appended again (entries that
// point into the object past what the other broker shipped). Where the
// other broker's upload holds every offset of the segment, the segment
// is mapped onto it instead (*coveredError); after maxIndexTries lost
// races it waits for the next pass (*WaitError). raced says a race was
// lost already: the store's index is what the local file holds now.
func (sp *shipper) index(ctx context.Context, c *shipCommit, raced bool) error {
	seg, key, from, objBase := c.seg, c.key, c.from, c.objBase
	unlock := sp.t.indexes.lock(seg.Partition)
	defer unlock()
	at := from // where the object's entries start in the file
	for try := 1; ; try++ {
		if raced {
			// What does the store's index hold of this segment now?
			f, err := sp.t.indexes.file(seg.Partition)
			if err != nil {
				return err
			}
			cov, _, err := sp.cover(ctx, seg, f, c.keyAt)
			switch {
			case err != nil:
				return err
			case cov.Next < 0 && len(cov.Extents) > 0:
				return &coveredError{cov: cov}
			case cov.Why != "" || cov.End < at:
				return &WaitError{Why: fmt.Sprintf("another broker changed the partition's index while this segment shipped (%s): decided again next pass", cmp.Or(cov.Why, "it holds fewer of its offsets than before"))}
			case cov.End > at:
				at, objBase = cov.End, cov.Next
			}
		}
		puts, err := sp.appendLocal(ctx, seg, key, from, at, objBase, c.sh.Objects)
		if err == nil {
			err = all(puts)
		}
		if err == nil {
			f, ferr := sp.t.indexes.file(seg.Partition)
			if ferr != nil {
				return ferr
			}
			err = sp.t.share.putIndex(ctx, seg.Partition, f)
		}
		if err == nil {
			sp.t.counters.OverlapBytes.Add(at - from)
		}
		if !errors.Is(err, ErrIndexMoved) {
			return err
		}
		sp.t.counters.IndexRaces.Add(1)
		sp.t.cfg.Log.Info("another broker changed the partition's index first: appending again", "segment", seg.LogPath(), "key", key, "try", try)
		if try == maxIndexTries {
			return &WaitError{Why: fmt.Sprintf("lost the race to the store's index %d times (other brokers ship this partition too): appended again next pass", try)}
		}
		raced = true
	}
}

// appendLocal is one try of index but its puts: the entries of object
// key from file position at on (the object starts at from), with
// offsets from objBase, appended to the partition's index file unless
// there already. It returns the puts of the object's remote indexes,
// for the caller to run (those the shipment lists). Call it with the
// partition locked.
func (sp *shipper) appendLocal(ctx context.Context, seg Segment, key string, from, at, objBase int64, listed []string) ([]func() error, error) {
	f, err := sp.t.indexes.file(seg.Partition)
	if err != nil {
		return nil, err
	}
	es, err := sp.entriesOf(f, seg, key, from, at, objBase)
	if err != nil {
		return nil, err
	}
	if len(es) > 0 {
		if err := f.Append(es...); err != nil {
			return nil, err
		}
	}
	return sp.remoteIndexPuts(ctx, f, seg, key, objBase, listed)
}

// entriesOf are the index entries of object key from file position at
// on (the object starts at from), with offsets from objBase: none if f
// has them already.
func (sp *shipper) entriesOf(f *idx.File, seg Segment, key string, from, at, objBase int64) ([]idx.Entry, error) {
	next := nextOrMax(seg.Next)
	var have bool
	f.View(func(x *idx.Index) {
		lo, hi := x.Segment(objBase, next)
		for i := lo; i < hi; i++ {
			if strings.HasPrefix(string(x.Entry(i).RDI), key+"@") {
				have = true
				return
			}
		}
	})
	if have {
		return nil, nil
	}
	logPath := seg.LogPath()
	lf, err := os.Open(logPath)
	if err != nil {
		return nil, err
	}
	c, err := idx.ChunkSegment(logPath, io.NewSectionReader(lf, at, seg.Size-at), seg.Size-at, objBase, idx.ChunkOptions{})
	lf.Close()
	if err != nil {
		return nil, err
	}
	if c.Opaque {
		sp.t.cfg.Log.Warn("segment is not well-formed record batches; indexed as opaque chunks", "segment", logPath, "why", c.Reason)
	}
	es := make([]idx.Entry, 0, len(c.Chunks))
	for _, ch := range c.Chunks {
		e := ch.Entry
		e.RDI = []byte(fmt.Sprintf("%s@%d", key, at-from+ch.Position))
		es = append(es, e)
	}
	return es, nil
}

// remoteIndexPuts are the puts of the remote indexes of the object of
// key (offsets from objBase), built from f, for the caller to run: none
// unless listed (its shipment's objects) names them, so that every
// object put is one its shipment deletes.
func (sp *shipper) remoteIndexPuts(ctx context.Context, f *idx.File, seg Segment, key string, objBase int64, listed []string) ([]func() error, error) {
	base := strings.TrimSuffix(key, kafka.KindLog)
	if !slices.Contains(listed, base+".rindex") {
		return nil, nil
	}
	var ri idx.RemoteIndexes
	var err error
	f.View(func(x *idx.Index) { ri, err = x.BuildRemoteIndexes(objBase, nextOrMax(seg.Next)) })
	if err != nil {
		return nil, err
	}
	var puts []func() error
	for name, b := range map[string][]byte{base + ".rindex": ri.MarshalOffsets(), base + ".rtimeindex": ri.MarshalTimes()} {
		puts = append(puts, func() error {
			_, err := sp.t.uploads.Put(ctx, name, bytes.NewReader(b), int64(len(b)))
			return err
		})
	}
	return puts, nil
}

// all runs fs at once and returns when every one has: nil if none
// failed, else the first error in fs's order.
func all(fs []func() error) error {
	if len(fs) == 0 {
		return nil
	}
	errs := make([]error, len(fs))
	var wg sync.WaitGroup
	for i, f := range fs[1:] {
		wg.Go(func() { errs[i+1] = f() })
	}
	errs[0] = fs[0]()
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// objectKey names a segment's objects: <partition>/<base20>-<id><suffix>,
// where id tells apart two files that had the same base offset (a
// segment rewritten after a truncation).
func (sp *shipper) objectKey(seg Segment, st *syscall.Stat_t, suffix string) string {
	return sp.identityKey(seg, st.Ino, st.Size, st.Mtim.Nano(), suffix)
}

func (sp *shipper) identityKey(seg Segment, ino uint64, size, mtimeNs int64, suffix string) string {
	h := fnv.New32a()
	if id := sp.t.BrokerID(); id != "" {
		// Brokers share the store: their inode numbers may meet.
		fmt.Fprintf(h, "broker %s/", id)
	}
	fmt.Fprintf(h, "%d/%d/%d", ino, size, mtimeNs)
	return fmt.Sprintf("%s/%020d-%08x%s", seg.Partition, seg.Base, h.Sum32(), suffix)
}

// findSegment is the segment at rel, with what eligibility needs.
func (sp *shipper) findSegment(rel string) (Segment, error) {
	if err := sp.t.waitReady(); err != nil {
		return Segment{}, err
	}
	rel = filepath.Clean(rel)
	dir, name, ok := strings.Cut(rel, "/")
	if !ok || strings.Contains(name, "/") || dir == ".." || filepath.IsAbs(rel) {
		return Segment{}, fmt.Errorf("%s is not a segment (<partition dir>/<base offset>.log)", rel)
	}
	p, err := ScanPartition(sp.t.cfg.Root, dir)
	if err != nil {
		return Segment{}, err
	}
	for _, seg := range p.Segments {
		if filepath.Base(seg.LogPath()) == name {
			return seg, nil
		}
	}
	return Segment{}, fmt.Errorf("%s is not a segment (<partition dir>/<base offset>.log)", rel)
}
