// Package tiered holds the values that cross the seam between the file
// system (fs) and the tierer (tiering): fs imports no tierfs package, and
// tiering does not import fs, so what both must name lives here.
package tiered

// Cause says why an evicted file's bytes came back to local disk.
type Cause uint8

// The causes. A move (an evicted file changed through the mount, its
// bytes coming back in the background) starts only on a change that
// alters bytes or size: a write, or a truncate to another size. Opening
// for writing, fsync, flush, and a truncate to the size the file has are
// not changes.
const (
	CauseWrite    Cause = iota // a write to the evicted file
	CauseTruncate              // a truncate to another size (or an open with O_TRUNC)
	CauseHydrate               // tierfs hydrate (the control command)
	NumCauses                  // how many causes there are
)

// String is the cause's name in logs, metrics and status.
func (c Cause) String() string {
	switch c {
	case CauseWrite:
		return "write"
	case CauseTruncate:
		return "truncate"
	case CauseHydrate:
		return "hydrate"
	}
	return "unknown"
}
