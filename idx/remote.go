package idx

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"sort"

	"github.com/tierfs/tierfs/internal/fsutil"
)

// The remote offset index and remote timestamp index of a segment have the
// shape of Kafka's .index and .timeindex, but their positions point into
// the partition's remote log segment index file (docs/formats.md). There is
// one pair per segment, named after its base offset, so relative offsets
// fit in int32 as they do in Kafka:
//
//	<base>.rindex      8-byte entries: relative offset int32, index position int32
//	<base>.rtimeindex 12-byte entries: timestamp int64, index position int32
//
// The offset index has an entry for each index entry of the segment (one
// per opaque run); the timestamp index one each time the segment's largest
// timestamp so far grows. Both grow strictly and have no preallocated tail.

const (
	remoteOffsetEntrySize = 8
	remoteTimeEntrySize   = 12
)

// RemoteOffsetIndexName and RemoteTimeIndexName name a segment's remote
// indexes.
func RemoteOffsetIndexName(base int64) string { return fmt.Sprintf("%020d.rindex", base) }

// RemoteTimeIndexName names a segment's remote timestamp index.
func RemoteTimeIndexName(base int64) string { return fmt.Sprintf("%020d.rtimeindex", base) }

// RemoteOffset is a remote offset index entry, made absolute.
type RemoteOffset struct {
	Offset   int64
	Position int64 // of the index entry in the index file
}

// RemoteTime is a remote timestamp index entry.
type RemoteTime struct {
	Timestamp int64
	Position  int64
}

// RemoteIndexes are a segment's two remote indexes.
type RemoteIndexes struct {
	Base    int64
	Offsets []RemoteOffset
	Times   []RemoteTime
}

// BuildRemoteIndexes derives the remote indexes of segment [base, next)
// from the index file.
func (x *Index) BuildRemoteIndexes(base, next int64) (RemoteIndexes, error) {
	ri := RemoteIndexes{Base: base}
	lo, hi := x.Segment(base, next)
	maxT := int64(math.MinInt64)
	for i := lo; i < hi; i++ {
		e, pos := x.ents[i], x.pos[i]
		if pos > math.MaxInt32 {
			return RemoteIndexes{}, fmt.Errorf("index position %d does not fit a remote index", pos)
		}
		if i > lo && pos <= x.pos[i-1] {
			return RemoteIndexes{}, fmt.Errorf("the entries of segment %d are not in file order", base)
		}
		if e.FirstOffset-base > math.MaxInt32 {
			return RemoteIndexes{}, fmt.Errorf("offset %d is too far from segment base %d", e.FirstOffset, base)
		}
		if i == lo || !(e.Opaque() && x.ents[i-1].Opaque() && x.ents[i-1].FirstOffset == e.FirstOffset) {
			ri.Offsets = append(ri.Offsets, RemoteOffset{Offset: e.FirstOffset, Position: pos})
		}
		if !e.Opaque() && e.LastTimestamp > maxT {
			maxT = e.LastTimestamp
			ri.Times = append(ri.Times, RemoteTime{Timestamp: maxT, Position: pos})
		}
	}
	return ri, nil
}

// MarshalOffsets encodes the remote offset index.
func (ri RemoteIndexes) MarshalOffsets() []byte {
	b := make([]byte, 0, len(ri.Offsets)*remoteOffsetEntrySize)
	for _, o := range ri.Offsets {
		b = binary.BigEndian.AppendUint32(b, uint32(o.Offset-ri.Base))
		b = binary.BigEndian.AppendUint32(b, uint32(o.Position))
	}
	return b
}

// MarshalTimes encodes the remote timestamp index.
func (ri RemoteIndexes) MarshalTimes() []byte {
	b := make([]byte, 0, len(ri.Times)*remoteTimeEntrySize)
	for _, t := range ri.Times {
		b = binary.BigEndian.AppendUint64(b, uint64(t.Timestamp))
		b = binary.BigEndian.AppendUint32(b, uint32(t.Position))
	}
	return b
}

// ParseRemoteOffsetIndex decodes a remote offset index of the segment with
// base offset base. Every entry must be whole and grow strictly.
func ParseRemoteOffsetIndex(name string, base int64, data []byte) ([]RemoteOffset, error) {
	if len(data)%remoteOffsetEntrySize != 0 {
		return nil, formatErr(name, int64(len(data)-len(data)%remoteOffsetEntrySize), "length %d is not a multiple of %d", len(data), remoteOffsetEntrySize)
	}
	out := make([]RemoteOffset, 0, len(data)/remoteOffsetEntrySize)
	for off := 0; off < len(data); off += remoteOffsetEntrySize {
		rel := int32(binary.BigEndian.Uint32(data[off:]))
		pos := int32(binary.BigEndian.Uint32(data[off+4:]))
		if rel < 0 || pos < 0 {
			return nil, formatErr(name, int64(off), "negative relative offset %d or position %d", rel, pos)
		}
		o := RemoteOffset{Offset: base + int64(rel), Position: int64(pos)}
		if n := len(out); n > 0 && (o.Offset <= out[n-1].Offset || o.Position <= out[n-1].Position) {
			return nil, formatErr(name, int64(off), "entry (%d, %d) does not follow (%d, %d)", o.Offset, o.Position, out[n-1].Offset, out[n-1].Position)
		}
		out = append(out, o)
	}
	return out, nil
}

// ParseRemoteTimeIndex decodes a remote timestamp index. Every entry must
// be whole and grow strictly.
func ParseRemoteTimeIndex(name string, data []byte) ([]RemoteTime, error) {
	if len(data)%remoteTimeEntrySize != 0 {
		return nil, formatErr(name, int64(len(data)-len(data)%remoteTimeEntrySize), "length %d is not a multiple of %d", len(data), remoteTimeEntrySize)
	}
	out := make([]RemoteTime, 0, len(data)/remoteTimeEntrySize)
	for off := 0; off < len(data); off += remoteTimeEntrySize {
		t := RemoteTime{Timestamp: int64(binary.BigEndian.Uint64(data[off:])), Position: int64(int32(binary.BigEndian.Uint32(data[off+8:])))}
		if t.Position < 0 {
			return nil, formatErr(name, int64(off), "negative position %d", t.Position)
		}
		if n := len(out); n > 0 && (t.Timestamp <= out[n-1].Timestamp || t.Position <= out[n-1].Position) {
			return nil, formatErr(name, int64(off), "entry (%d, %d) does not follow (%d, %d)", t.Timestamp, t.Position, out[n-1].Timestamp, out[n-1].Position)
		}
		out = append(out, t)
	}
	return out, nil
}

// LookupOffset returns the index file position to read from for offset
// off: that of the last entry at or below it (the first entry when off is
// below them all). ok is false for an empty index.
func (ri RemoteIndexes) LookupOffset(off int64) (int64, bool) {
	if len(ri.Offsets) == 0 {
		return 0, false
	}
	i := sort.Search(len(ri.Offsets), func(i int) bool { return ri.Offsets[i].Offset > off })
	return ri.Offsets[max(i-1, 0)].Position, true
}

// LookupTimestamp returns the index file position of the first entry with
// a timestamp at or after ts. ok is false when the segment never reaches ts.
func (ri RemoteIndexes) LookupTimestamp(ts int64) (int64, bool) {
	i := sort.Search(len(ri.Times), func(i int) bool { return ri.Times[i].Timestamp >= ts })
	if i == len(ri.Times) {
		return 0, false
	}
	return ri.Times[i].Position, true
}

// CheckRemoteIndexes verifies that the remote indexes are exactly those the index file
// gives for segment [base, next); name is used in the error.
func (x *Index) CheckRemoteIndexes(name string, ri RemoteIndexes, next int64) error {
	want, err := x.BuildRemoteIndexes(ri.Base, next)
	if err != nil {
		return err
	}
	for i := range max(len(want.Offsets), len(ri.Offsets)) {
		if i >= len(want.Offsets) || i >= len(ri.Offsets) || want.Offsets[i] != ri.Offsets[i] {
			return formatErr(name+"/"+RemoteOffsetIndexName(ri.Base), int64(i*remoteOffsetEntrySize), "does not match the index file (rebuild it)")
		}
	}
	for i := range max(len(want.Times), len(ri.Times)) {
		if i >= len(want.Times) || i >= len(ri.Times) || want.Times[i] != ri.Times[i] {
			return formatErr(name+"/"+RemoteTimeIndexName(ri.Base), int64(i*remoteTimeEntrySize), "does not match the index file (rebuild it)")
		}
	}
	return nil
}

// LoadRemoteIndexes reads segment [base, next)'s remote indexes from dir,
// checked against x. Missing ones are rebuilt from x and written (rebuilt
// reports it); present ones that do not match are an error.
func LoadRemoteIndexes(dir string, x *Index, base, next int64) (ri RemoteIndexes, rebuilt bool, err error) {
	oPath := filepath.Join(dir, RemoteOffsetIndexName(base))
	tPath := filepath.Join(dir, RemoteTimeIndexName(base))
	ob, oerr := os.ReadFile(oPath)
	tb, terr := os.ReadFile(tPath)
	if errors.Is(oerr, fs.ErrNotExist) || errors.Is(terr, fs.ErrNotExist) {
		if ri, err = x.BuildRemoteIndexes(base, next); err != nil {
			return RemoteIndexes{}, false, err
		}
		if err := WriteRemoteIndexes(dir, ri); err != nil {
			return RemoteIndexes{}, false, err
		}
		return ri, true, nil
	}
	if oerr != nil {
		return RemoteIndexes{}, false, oerr
	}
	if terr != nil {
		return RemoteIndexes{}, false, terr
	}
	ri.Base = base
	if ri.Offsets, err = ParseRemoteOffsetIndex(oPath, base, ob); err != nil {
		return RemoteIndexes{}, false, err
	}
	if ri.Times, err = ParseRemoteTimeIndex(tPath, tb); err != nil {
		return RemoteIndexes{}, false, err
	}
	if err := x.CheckRemoteIndexes(dir, ri, next); err != nil {
		return RemoteIndexes{}, false, err
	}
	return ri, false, nil
}

// WriteRemoteIndexes writes a segment's remote indexes into dir, each
// atomically (a synced temporary file renamed into place).
func WriteRemoteIndexes(dir string, ri RemoteIndexes) error {
	if err := fsutil.WriteFileAtomic(filepath.Join(dir, RemoteOffsetIndexName(ri.Base)), ri.MarshalOffsets(), 0o644); err != nil {
		return err
	}
	if err := fsutil.WriteFileAtomic(filepath.Join(dir, RemoteTimeIndexName(ri.Base)), ri.MarshalTimes(), 0o644); err != nil {
		return err
	}
	return syncDir(dir)
}
