package tiering

import (
	"strconv"
	"strings"

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
