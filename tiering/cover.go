package tiering

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"

	"github.com/tierfs/tierfs/chunkxfer/store"
	"github.com/tierfs/tierfs/idx"
	"github.com/tierfs/tierfs/idx/kafka"
)

// coverage is how much of a segment, from its start, the store already
// holds in objects this mount did not ship (another broker's), matched
// batch by batch: same offsets, size, leader epoch and CRC32C.
type coverage struct {
	Extents []Extent // file bytes [0, End) onto other objects
	End     int64    // file position covered to
	Next    int64    // offset of the first batch not covered; -1 when End is the file's end
	// Why the rest cannot be taken from the store or shipped after it
	// ("" when the rest is simply not in the store yet).
	Why string
	// Own is set when coverage stopped at entries of this mount's own
	// shipment OwnKey of the rest: an interrupted ship, to resume.
	OwnKey string
}

// WaitError is a segment that is not shipped or mapped for now, and why.
type WaitError struct{ Why string }

func (e *WaitError) Error() string { return e.Why }

// entryRDI splits an RDI "key@position".
func entryRDI(e idx.Entry) (key string, pos int64, ok bool) {
	k, p, ok := strings.Cut(string(e.RDI), "@")
	if !ok {
		return "", 0, false
	}
	n, err := strconv.ParseInt(p, 10, 64)
	return k, n, err == nil && n >= 0
}

func batchesKey(key string) string { return strings.TrimSuffix(key, kafka.KindLog) + ".batches" }

// batchList is the batch list of an object, from the store (kept in
// memory for the pass).
func (t *Tierer) batchList(ctx context.Context, key string) ([]idx.BatchRef, error) {
	t.mu.Lock()
	bs, ok := t.batchLists[key]
	t.mu.Unlock()
	if ok {
		return bs, nil
	}
	b, err := store.ReadAll(t.cfg.Store.Get(ctx, batchesKey(key), 0, -1, store.GetOptions{}))
	if err != nil {
		return nil, err
	}
	bs, err = idx.ParseBatches(batchesKey(key), b)
	if err != nil {
		return nil, err
	}
	t.mu.Lock()
	if len(t.batchLists) > 1024 {
		clear(t.batchLists)
	}
	t.batchLists[key] = bs
	t.mu.Unlock()
	return bs, nil
}

// ownShipment says whether key is an object this mount shipped (its
// catalog holds a shipment of it).
func (t *Tierer) ownShipment(partition, key string) bool {
	_, err := os.Stat(shipmentPath(t.cfg.StateDir, partition, key))
	return err == nil
}

// cover works out a segment's coverage from the partition's index. keyAt
// names the object this mount would ship the rest in, from a batch
// offset on. It reads the segment (every batch's CRC is checked) only
// when the index holds some of its offsets.
func (t *Tierer) cover(ctx context.Context, seg Segment, f *idx.File, keyAt func(base int64) string) (coverage, []idx.BatchRef, error) {
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
	lf, err := os.Open(seg.Path)
	if err != nil {
		return cov, nil, err
	}
	batches, err := idx.BatchRefs(seg.Path, lf, seg.Size, 0)
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
		if t.ownShipment(seg.Partition, key) {
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
		list, err := t.batchList(ctx, key)
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
			m, err := t.fetchManifest(ctx, key)
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
