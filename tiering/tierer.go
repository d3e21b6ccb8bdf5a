package tiering

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"golang.org/x/time/rate"

	"github.com/tierfs/tierfs/chunkxfer"
	"github.com/tierfs/tierfs/chunkxfer/store"
	"github.com/tierfs/tierfs/idx"
	"github.com/tierfs/tierfs/idx/kafka"
	"github.com/tierfs/tierfs/internal/tiered"
)

// Config configures a Tierer.
type Config struct {
	// Root is the backing log directory and StateDir tierfs's state in it
	// (journals, manifests, indexes). When the tierer serves a mount they
	// are known only once the mount holds the backing directory open:
	// leave them empty and call SetRoot.
	Root     string
	StateDir string
	Store    store.Store
	Policy   Policy
	// LocalRetentionAge frees the local bytes of shipped segments older
	// than this (0: no age limit). LocalRetentionBytes keeps at most this
	// many bytes of .log files local per partition, freeing the oldest
	// shipped segments first (0: no byte limit). With neither set,
	// segments are shipped but never freed.
	LocalRetentionAge   time.Duration
	LocalRetentionBytes int64
	// LocalRetentionTotalBytes keeps at most this many bytes of .log
	// files local in all partitions together, freeing the oldest shipped
	// segments (by mtime) anywhere first (0: no limit).
	LocalRetentionTotalBytes int64
	// ReadAheadChunks is how many chunks of an evicted file are fetched
	// ahead of a sequential reader (default 4; negative: none).
	ReadAheadChunks int
	Concurrency     int   // segments shipped at once (default 2)
	ShipRate        int64 // bytes per second of all uploads together (0: no limit)
	ChunkSize       int64 // transfer chunk size (default chunkxfer's)
	Gate            *Gate // shared with the file system (nil: a private one)
	// Pool is the chunk memory every read of an evicted file takes from
	// (nil: a private one of 256 MiB).
	Pool *chunkxfer.Pool
	// BeforeFree, when set, is called with a segment's path before its
	// local bytes are freed (change management caches its checksum
	// then, so retaining it later needs no download); an error keeps
	// the bytes.
	BeforeFree func(path string) error
	// Role is RoleAuto (the default: per partition, from Leadership) or
	// a manual override for every partition, RoleLeader or RoleFollower.
	Role Role
	// Leadership, when set, tells which partitions this mount's broker
	// leads: RoleAuto ships those and follows the others.
	Leadership Leadership
	// ShareGrace: with RoleAuto and no Leadership, a segment of a
	// partition that other brokers ship too waits this long (plus a
	// stagger of up to as long again, fixed per broker) past its
	// ship-after for their upload before this mount uploads it.
	ShareGrace time.Duration
	// BrokerID names this mount among the brokers that share the store;
	// empty: the node.id in the log dir's meta.properties, if any.
	BrokerID string
	// StoreID names the store (its URL, without credentials): two mounts
	// with the same StoreID hand evicted files over by reference.
	StoreID string
	Log     *slog.Logger
	Now     func() time.Time
	// CrashAt, when set, is called at each crash point (a step between
	// two writes that a crash there must not make unsafe); the tests of
	// crash safety make it kill the process.
	CrashAt func(CrashPoint)
}

// CrashPoint names a step of the tierer where a crash is tested.
type CrashPoint string

// The crash points.
const (
	// CrashEvictMarked: a segment is recorded remote (and unfreed), its
	// bytes not punched yet.
	CrashEvictMarked CrashPoint = "evict-marked"
	// CrashHydrateMarked: a hydration recorded the file unfreed, nothing
	// downloaded yet.
	CrashHydrateMarked CrashPoint = "hydrate-marked"
	// CrashHydrateFetched: a hydration's bytes are in the file, which is
	// still recorded remote.
	CrashHydrateFetched CrashPoint = "hydrate-fetched"
)

func (t *Tierer) crashPoint(p CrashPoint) {
	if t.cfg.CrashAt != nil {
		t.cfg.CrashAt(p)
	}
}

// Tierer ships and evicts the segments of one log directory.
type Tierer struct {
	cfg     Config
	ready   chan struct{} // closed once Root and StateDir are known
	up      *chunkxfer.Uploader
	mu      sync.Mutex
	indexes map[string]*idx.File   // by partition; GUARDED_BY(mu)
	plocks  map[string]*sync.Mutex // by partition: index changes; GUARDED_BY(mu)
	busy    map[string]bool        // segments being shipped or evicted, keys being shipped or deleted; GUARDED_BY(mu)

	shipping     map[uint64]bool // inodes being shipped; GUARDED_BY(mu)
	noHandleOnce sync.Once
	lastErr      map[string]PartitionError // by partition; GUARDED_BY(mu)
	kept         map[string]string         // by partition: why its first segment that waits is kept local; GUARDED_BY(mu)

	// draining stops new work; active counts the work under way (see
	// Drain).
	draining atomic.Bool
	active   atomic.Int64

	hydrations atomic.Uint64 // finished (see Hydrations)
	evictions  atomic.Uint64 // files recorded remote (see Evictions)

	stop        chan struct{} // closed by Close
	stopOnce    sync.Once
	moveMu      sync.Mutex       // one StartMove at a time
	moves       map[uint64]*Move // by inode; GUARDED_BY(mu)
	nmoves      atomic.Int64
	recoverOnce sync.Once

	counters Counters

	batchLists map[string][]idx.BatchRef // by object key, as read from the store; GUARDED_BY(mu)
	roles      *roles
}

// BrokerID names this mount's broker among those sharing the store:
// Config.BrokerID, or else the node.id of the log dir's meta.properties
// once the broker has written it (it does before it writes any segment;
// "" before).
func (t *Tierer) BrokerID() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.cfg.BrokerID == "" && t.cfg.Root != "" {
		t.cfg.BrokerID = brokerID(t.cfg.Root)
	}
	return t.cfg.BrokerID
}

// follows says whether the mount ships nothing of partition now (it
// maps its segments onto other brokers' uploads).
func (t *Tierer) follows(partition string) bool {
	return t.roles.of(partition).Role == RoleFollower
}

// SetRole makes the mount a leader or a follower of every partition, or
// auto again (per partition, from the leadership), from its next step on
// (by hand: the broker's leadership moved). A new leader continues from
// what the store holds: it uploads only what no broker shipped.
func (t *Tierer) SetRole(role Role) error {
	if _, err := ParseRole(string(role)); err != nil {
		return err
	}
	if t.roles.set(role) {
		t.cfg.Log.Info("role changed", "role", role)
	}
	return nil
}

// Role is the mount's role now: auto, or an override.
func (t *Tierer) Role() Role { return t.roles.get() }

// PartitionRole is what the mount does with one partition now.
func (t *Tierer) PartitionRole(partition string) PartitionRole { return t.roles.of(partition) }

// Counters count what the tierer did since it started (for metrics).
type Counters struct {
	ShippedSegments, ShippedBytes atomic.Int64
	EvictedSegments, FreedBytes   atomic.Int64
	DeletedSegments               atomic.Int64 // remote copies of segments the broker deleted
	MappedSegments, MappedBytes   atomic.Int64 // segments (or heads of segments) found in the store, shipped by another broker
	// Evicted segments brought back to local disk, and their bytes, by
	// cause (a move after a write or a truncate, or tierfs hydrate);
	// Moves counts the moves started, by cause.
	HydratedSegments, HydratedBytes [tiered.NumCauses]atomic.Int64
	Moves                           [tiered.NumCauses]atomic.Int64
	Errors                          atomic.Int64 // failed steps (each also a partition's last error or a pass's error)
	// IndexRaces counts appends to a partition's index in the store that
	// another broker's append beat (each cost a retry of the append, not
	// an upload). WastedSegments and WastedBytes count uploads another
	// broker's upload of the same offsets made needless (deleted again);
	// OverlapBytes the bytes at the start of an upload that another
	// broker's upload holds too (they stay in the object, unindexed,
	// until the segment is deleted).
	IndexRaces                  atomic.Int64
	WastedSegments, WastedBytes atomic.Int64
	OverlapBytes                atomic.Int64
}

// Counters are the tierer's running counts.
func (t *Tierer) Counters() *Counters { return &t.counters }

// PartitionError is the last thing that went wrong with a partition.
type PartitionError struct {
	Time time.Time `json:"time,omitzero"`
	Err  string    `json:"error,omitempty"`
	Kept string    `json:"kept_local,omitempty"` // why a segment is kept local, if one waits for more than its age
}

// noteErr remembers err as the partition's last error and returns it.
func (t *Tierer) noteErr(partition string, err error) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.lastErr[partition] = PartitionError{Time: t.cfg.Now(), Err: err.Error()}
	return err
}

// LastErrors are the last error of each partition that had one, and
// why segments of it are kept local, where they wait for something other
// than their age.
func (t *Tierer) LastErrors() map[string]PartitionError {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := maps.Clone(t.lastErr)
	for p, why := range t.kept {
		e := out[p]
		e.Kept = why
		out[p] = e
	}
	return out
}

// noteKept remembers why segment seg of a partition waits (the first
// in the pass); an empty why starts the pass over.
func (t *Tierer) noteKept(partition string, seg Segment, why string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if why == "" {
		delete(t.kept, partition)
		return
	}
	if _, ok := t.kept[partition]; !ok {
		t.kept[partition] = fmt.Sprintf("%s: %s", filepath.Base(seg.Path), why)
	}
}

// New makes a Tierer; it touches nothing until RunOnce.
func New(cfg Config) (*Tierer, error) {
	if cfg.Store == nil {
		return nil, errors.New("tiering: no store")
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 2
	}
	if cfg.ChunkSize == 0 {
		cfg.ChunkSize = chunkxfer.DefaultChunkSize
	}
	if cfg.Gate == nil {
		cfg.Gate = NewGate()
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Pool == nil {
		p, err := chunkxfer.NewPool(256<<20, cfg.Log)
		if err != nil {
			return nil, err
		}
		cfg.Pool = p
	}
	t := &Tierer{cfg: cfg, indexes: map[string]*idx.File{}, plocks: map[string]*sync.Mutex{}, lastErr: map[string]PartitionError{}, kept: map[string]string{}, shipping: map[uint64]bool{}, batchLists: map[string][]idx.BatchRef{}, busy: map[string]bool{}, moves: map[uint64]*Move{}, stop: make(chan struct{}), ready: make(chan struct{})}
	role, err := ParseRole(string(cfg.Role))
	if err != nil {
		return nil, err
	}
	t.roles = newRoles(role, cfg.Leadership, func() string { return t.cfg.Root })
	if cfg.Root != "" && cfg.StateDir != "" {
		t.SetRoot(cfg.Root, cfg.StateDir)
	}
	return t, nil
}

// SetRoot tells the tierer where the log directory and its state are;
// call it once, before RunOnce.
func (t *Tierer) SetRoot(root, stateDir string) {
	t.cfg.Root, t.cfg.StateDir = root, stateDir
	t.up = &chunkxfer.Uploader{Store: t.cfg.Store, JournalDir: filepath.Join(stateDir, "journal"), ChunkSize: t.cfg.ChunkSize, Parallel: 4, Log: t.cfg.Log, Broker: t.BrokerID}
	if t.cfg.ShipRate > 0 {
		t.up.Limit = rate.NewLimiter(rate.Limit(t.cfg.ShipRate), int(min(t.cfg.ShipRate, 1<<20)))
	}
	close(t.ready)
	// Moves a crash interrupted are under way again before the mount
	// is announced, so their files show their sizes from the start.
	t.recoverOnce.Do(t.recoverMoves)
}

// waitReady waits (briefly) for SetRoot.
func (t *Tierer) waitReady() error {
	select {
	case <-t.ready:
		return nil
	case <-time.After(30 * time.Second):
		return errors.New("tiering: the log directory is not set")
	}
}

// Close closes the partition index files, and stops retrying moves.
func (t *Tierer) Close() error {
	t.stopOnce.Do(func() { close(t.stop) })
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, f := range t.indexes {
		f.Close()
	}
	t.indexes = map[string]*idx.File{}
	return nil
}

// Report says what one pass did.
type Report struct {
	Shipped, Evicted, Recovered int
	Deleted                     int            // remote copies of segments the broker deleted
	Waiting                     map[string]int // segments not eligible, by reason
	Errors                      []error
}

// RunOnce deletes the remote copies of segments the broker deleted,
// finishes half-done evictions, ships every eligible segment and evicts
// under the local retention.
func (t *Tierer) RunOnce(ctx context.Context) Report {
	rep := Report{Waiting: map[string]int{}}
	defer func() {
		t.counters.DeletedSegments.Add(int64(rep.Deleted))
		t.counters.Errors.Add(int64(len(rep.Errors)))
	}()
	if err := t.waitReady(); err != nil {
		rep.Errors = append(rep.Errors, err)
		return rep
	}
	t.recoverOnce.Do(t.recoverMoves)
	if t.begin() != nil {
		return rep // unmounting
	}
	defer t.end()
	// The uploads of a pass share their part buffers; between passes
	// they are not held (memory outside the chunk budget).
	defer t.up.DropBuffers()
	parts, err := Scan(t.cfg.Root)
	if err != nil {
		rep.Errors = append(rep.Errors, err)
		return rep
	}
	live := make(map[string]bool, len(parts))
	for _, p := range parts {
		live[p.Name] = true
	}
	t.roles.forget(live)
	cp, err := ReadCheckpoints(t.cfg.Root)
	if err != nil {
		rep.Errors = append(rep.Errors, err)
		return rep
	}
	// Deletions first: the copies of segments the broker deleted go, and
	// their index entries with them, before anything new takes their place.
	rep.Deleted, rep.Errors = t.followDeletions(ctx)
	now := t.cfg.Now()
	var mu sync.Mutex
	sem := make(chan struct{}, t.cfg.Concurrency)
	var wg sync.WaitGroup
	// Partitions ship in parallel; the segments of one partition in
	// offset order, stopping at the first that cannot ship, because the
	// partition's index takes entries in offset order only.
	for _, p := range parts {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			r := t.shipPartition(ctx, p, cp, now)
			mu.Lock()
			defer mu.Unlock()
			rep.Shipped += r.Shipped
			rep.Recovered += r.Recovered
			rep.Errors = append(rep.Errors, r.Errors...)
			for k, v := range r.Waiting {
				rep.Waiting[k] += v
			}
		}()
	}
	wg.Wait()
	n, errs := t.evictUnderRetention(ctx, parts, now)
	rep.Evicted += n
	rep.Errors = append(rep.Errors, errs...)
	return rep
}

// shipPartition finishes half-done evictions and ships the eligible
// segments of one partition, oldest first.
func (t *Tierer) shipPartition(ctx context.Context, p Partition, cp Checkpoints, now time.Time) Report {
	rep := Report{Waiting: map[string]int{}}
	blocked := ""
	synced := false
	t.noteKept(p.Name, Segment{}, "")
	t.roles.checkEpoch(p.Name)
	for _, seg := range p.Segments {
		rec, has, err := readRecord(seg.Path)
		if err != nil {
			rep.Errors = append(rep.Errors, t.noteErr(p.Name, err))
			blocked = "an earlier segment failed"
			continue
		}
		if has && rec.State == StateShipped && (rec.Ino != seg.Ino || rec.Size != seg.Size || rec.MtimeNs != seg.Mtime.UnixNano()) {
			// Changed after it shipped (Kafka truncated it): the copy is
			// stale. Forget it; followDeletions deletes it and the file
			// ships again when it is eligible.
			t.cfg.Log.Warn("shipped segment changed; its remote copy is stale", "segment", seg.Path, "key", rec.Key)
			if err := unix.Removexattr(seg.Path, recordXattr); err != nil {
				rep.Errors = append(rep.Errors, t.noteErr(p.Name, err))
				blocked = "an earlier segment failed"
				continue
			}
			has = false
		}
		if has {
			// An unfreed remote file is an eviction or a hydration
			// that tierfs died in: its local bytes go. One under way
			// now holds its claim.
			if ino := "ino:" + strconv.FormatUint(seg.Ino, 10); rec.State == StateRemote && !rec.Freed && t.claim(ino) {
				if fixed, err := t.finishEvict(seg, rec); err != nil {
					rep.Errors = append(rep.Errors, t.noteErr(p.Name, err))
				} else if fixed {
					rep.Recovered++
				}
				t.release(ino)
			}
			continue
		}
		if blocked != "" {
			rep.Waiting[blocked]++
			continue
		}
		if ok, why := t.cfg.Policy.Eligible(seg, cp, now); !ok {
			rep.Waiting[reasonKind(why)]++
			blocked = "an earlier segment waits"
			if seg.Next < 0 {
				blocked = ""
			}
			continue
		}
		if !synced {
			unlock := t.lockPartition(p.Name)
			_, err := t.syncIndex(ctx, p.Name)
			unlock()
			if errors.Is(err, store.ErrPrecondition) {
				// Other brokers changed it at each read: a race, not an
				// error; the next pass reads it again.
				rep.Waiting["the store's index kept changing while read"]++
				t.noteKept(p.Name, seg, "the store's index kept changing while it was read: read again next pass")
				blocked = "an earlier segment waits"
				continue
			}
			if err != nil {
				rep.Errors = append(rep.Errors, t.noteErr(p.Name, err))
				blocked = "an earlier segment failed"
				continue
			}
			synced = true
		}
		var wait *WaitError
		switch err := t.ship(ctx, seg, nil, false); {
		case errors.As(err, &wait):
			rep.Waiting[reasonKind(wait.Why)]++
			t.noteKept(p.Name, seg, wait.Why)
			if !t.follows(p.Name) {
				// The index takes a leader's entries in order; a
				// follower maps each segment on its own.
				blocked = "an earlier segment waits"
			}
			continue
		case err != nil:
			rep.Errors = append(rep.Errors, t.noteErr(p.Name, fmt.Errorf("ship %s: %w", seg.Path, err)))
			blocked = "an earlier segment failed"
			continue
		}
		rep.Shipped++
	}
	return rep
}

// Run calls RunOnce every interval until ctx ends, logging what it did.
func (t *Tierer) Run(ctx context.Context, interval time.Duration) {
	for {
		rep := t.RunOnce(ctx)
		if rep.Shipped+rep.Evicted+rep.Recovered+rep.Deleted > 0 || len(rep.Errors) > 0 {
			t.cfg.Log.Info("tiering pass", "shipped", rep.Shipped, "evicted", rep.Evicted, "recovered", rep.Recovered, "deleted", rep.Deleted, "errors", len(rep.Errors))
		}
		for _, err := range rep.Errors {
			t.cfg.Log.Warn("tiering", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(interval):
		}
	}
}

// reasonKind groups reasons for the report ("not flushed: ..." → "not flushed").
func reasonKind(why string) string {
	if i := strings.IndexAny(why, ":("); i >= 0 {
		return strings.TrimSpace(why[:i])
	}
	return why
}

// objectKey names a segment's objects: <partition>/<base20>-<id><suffix>,
// where id tells apart two files that had the same base offset (a
// segment rewritten after a truncation).
func (t *Tierer) objectKey(seg Segment, st *syscall.Stat_t, suffix string) string {
	return t.identityKey(seg, st.Ino, st.Size, st.Mtim.Nano(), suffix)
}

func (t *Tierer) identityKey(seg Segment, ino uint64, size, mtimeNs int64, suffix string) string {
	h := fnv.New32a()
	if id := t.BrokerID(); id != "" {
		// Brokers share the store: their inode numbers may meet.
		fmt.Fprintf(h, "broker %s/", id)
	}
	fmt.Fprintf(h, "%d/%d/%d", ino, size, mtimeNs)
	return fmt.Sprintf("%s/%020d-%08x%s", seg.Partition, seg.Base, h.Sum32(), suffix)
}

func (t *Tierer) lockPartition(partition string) (unlock func()) {
	t.mu.Lock()
	m := t.plocks[partition]
	if m == nil {
		m = &sync.Mutex{}
		t.plocks[partition] = m
	}
	t.mu.Unlock()
	m.Lock()
	return m.Unlock
}

func (t *Tierer) claim(path string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.busy[path] {
		return false
	}
	t.busy[path] = true
	return true
}

func (t *Tierer) release(path string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.busy, path)
}

// Ship puts a segment in the store. Where the store already holds its
// bytes, shipped by another broker (the same batches: Kafka replicas
// store the leader's), the file is mapped onto those objects and nothing
// is uploaded; the rest, if any, is uploaded with its index files and
// verified, its entries go into the partition's index, and the file is
// marked shipped. A follower uploads nothing: a segment the store does
// not hold yet waits (*WaitError). Every step can be repeated: after a
// crash the next pass resumes the upload and skips what is done.
func (t *Tierer) Ship(ctx context.Context, seg Segment, progress chunkxfer.Progress) error {
	return t.ship(ctx, seg, progress, true)
}

// ship is Ship; sync false skips reading the store's index (the pass
// read it for the partition already).
func (t *Tierer) ship(ctx context.Context, seg Segment, progress chunkxfer.Progress, sync bool) error {
	if !t.claim(seg.Path) {
		return nil
	}
	defer t.release(seg.Path)
	var st syscall.Stat_t
	if err := syscall.Stat(seg.Path, &st); err != nil {
		return err
	}
	key := t.objectKey(seg, &st, ".log")
	if !t.claim("key:" + key) {
		return nil
	}
	defer t.release("key:" + key)
	t.mu.Lock()
	t.shipping[st.Ino] = true
	t.mu.Unlock()
	defer func() {
		t.mu.Lock()
		delete(t.shipping, st.Ino)
		t.mu.Unlock()
	}()
	if sync {
		unlock := t.lockPartition(seg.Partition)
		_, err := t.syncIndex(ctx, seg.Partition)
		unlock()
		if err != nil {
			return err
		}
	}
	f, err := t.indexFile(seg.Partition)
	if err != nil {
		return err
	}
	keyAt := func(base int64) string {
		s := seg
		s.Base = base
		return t.objectKey(s, &st, ".log")
	}
	role := t.roles.of(seg.Partition)
	if role.Role == RoleFollower && !t.maybeCovered(seg, f) {
		return &WaitError{Why: "not in the store yet (a follower ships nothing; the leader has not shipped these offsets): " + role.Why}
	}
	cov, batches, err := t.cover(ctx, seg, f, keyAt)
	if err != nil {
		return err
	}
	switch {
	case cov.Next < 0 && len(cov.Extents) > 0:
		return t.adopt(ctx, seg, &st, key, cov)
	case cov.Why != "":
		return &WaitError{Why: cov.Why}
	case role.Role == RoleFollower:
		return &WaitError{Why: fmt.Sprintf("offsets from %d are not in the store yet (a follower ships nothing): %s", cov.Next, role.Why)}
	case role.Role == RoleAuto && cov.OwnKey == "" && t.loadStoreState(seg.Partition).Shared:
		// No leadership to go by, and other brokers ship this
		// partition too: give the leader's upload time to land.
		if wait := t.cfg.Policy.ShipAfter + graceFor(t.cfg.ShareGrace, t.BrokerID()) - t.cfg.Now().Sub(seg.Mtime); wait > 0 {
			return &WaitError{Why: fmt.Sprintf("other brokers ship this partition too: waiting %v more for their upload of offsets from %d (no --kafka-bootstrap to tell the leader)", wait.Round(time.Second), cov.Next)}
		}
	}
	return t.shipRest(ctx, seg, &st, cov, batches, keyAt, progress)
}

// maybeCovered says whether the index reaches the segment's last offset
// (that of the batch before the next segment's base): if not, the store
// cannot hold all of it, and it need not be read to tell.
func (t *Tierer) maybeCovered(seg Segment, f *idx.File) bool {
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

// adopt marks a segment shipped whose bytes are all in other brokers'
// objects: it references each of them (so they are kept while the file
// reads from them), and records its extents. Nothing is uploaded.
func (t *Tierer) adopt(ctx context.Context, seg Segment, st *syscall.Stat_t, key string, cov coverage) error {
	holder := holderOf(key)
	if old, err := loadShipment(t.cfg.StateDir, seg.Partition, key); err == nil {
		// An upload of this file that lost the race to the index: its
		// objects are nobody's now.
		if own := ownObjects(old); len(own) > 0 {
			if err := t.deleteOwn(ctx, old.Key, own); err != nil {
				return err
			}
		}
	} else if !os.IsNotExist(err) {
		return err
	}
	keys := extentKeys(cov.Extents)
	sh := Shipment{State: StateShipping, Partition: seg.Partition, Base: seg.Base, Key: key, Ino: st.Ino, Since: t.cfg.Now(), Objects: refsOf(keys, holder)}
	var err error
	if sh.HandleType, sh.Handle, err = fileHandle(seg.Path); err != nil {
		t.cfg.Log.Debug("no file handle", "segment", seg.Path, "err", err)
	}
	if err := writeShipment(t.cfg.StateDir, sh); err != nil {
		return err
	}
	if err := t.takeRefs(ctx, cov.Extents, holder); err != nil {
		return err
	}
	if err := sameFile(seg.Path, st); err != nil {
		return err
	}
	rec := Record{State: StateShipped, Key: key, Size: st.Size, MtimeNs: st.Mtim.Nano(), Ino: st.Ino, Extents: cov.Extents}
	if err := writeRecord(seg.Path, rec); err != nil {
		return err
	}
	sh.State, sh.Since = StateShipped, t.cfg.Now()
	if err := writeShipment(t.cfg.StateDir, sh); err != nil {
		return err
	}
	t.counters.MappedSegments.Add(1)
	t.counters.MappedBytes.Add(st.Size)
	t.cfg.Log.Info("mapped onto the store's copy", "segment", seg.Path, "objects", len(keys), "bytes", st.Size)
	return nil
}

// sameFile fails if path is no longer the file st was taken of.
func sameFile(path string, st *syscall.Stat_t) error {
	var now syscall.Stat_t
	if err := syscall.Stat(path, &now); err != nil {
		return err
	}
	if now.Ino != st.Ino || now.Size != st.Size || now.Mtim != st.Mtim {
		return fmt.Errorf("%s changed while it was shipped: %w", path, chunkxfer.ErrSourceChanged)
	}
	return nil
}

// shipRest uploads a segment from where its coverage ends (from its
// start when nothing of it is in the store), with its batch list, its
// index files (whole segments only) and its index entries.
func (t *Tierer) shipRest(ctx context.Context, seg Segment, st *syscall.Stat_t, cov coverage, batches []idx.BatchRef, keyAt func(int64) string, progress chunkxfer.Progress) error {
	from, objBase := cov.End, seg.Base
	if from > 0 {
		objBase = cov.Next
	}
	key := keyAt(objBase)
	if from > 0 && !t.claim("key:"+key) {
		return nil
	}
	if from > 0 {
		defer t.release("key:" + key)
	}
	holder := holderOf(key)
	manRel := manifestRel(key)
	sh, err := t.startShipment(seg, st, key, manRel, from, refsOf(extentKeys(cov.Extents), holder))
	if err != nil {
		return err
	}
	if err := t.takeRefs(ctx, cov.Extents, holder); err != nil {
		return err
	}
	m, err := t.up.UploadFrom(ctx, seg.Path, key, from, progress)
	if err != nil {
		return err
	}
	if err := chunkxfer.Verify(ctx, t.cfg.Store, m); err != nil {
		return fmt.Errorf("remote copy does not verify: %w", err)
	}
	if from == 0 {
		for _, sk := range t.sidecarKeys(seg, st)[1:] {
			if !slices.Contains(sh.Objects, sk.key) {
				// Appeared after the shipment was catalogued: kept local only.
				continue
			}
			if _, err := t.up.Upload(ctx, sk.path, sk.key); err != nil {
				return fmt.Errorf("ship %s: %w", filepath.Base(sk.path), err)
			}
		}
	}
	if err := t.putBatchList(ctx, seg, key, from, batches); err != nil {
		return err
	}
	var covered *coveredError
	switch err := t.index(ctx, seg, key, from, objBase, keyAt); {
	case errors.As(err, &covered):
		// Mapped instead; what this mount uploaded goes again.
		t.counters.WastedSegments.Add(1)
		t.counters.WastedBytes.Add(st.Size - from)
		t.cfg.Log.Info("another broker shipped the same offsets first: mapping onto its copy and deleting this upload", "segment", seg.Path, "key", key, "bytes", st.Size-from)
		return t.adopt(ctx, seg, st, key, covered.cov)
	case err != nil:
		return err
	}
	if err := writeManifestCopy(filepath.Join(t.cfg.StateDir, manRel), m); err != nil {
		return err
	}
	// The file must still be what was uploaded.
	if err := sameFile(seg.Path, st); err != nil {
		return err
	}
	rec := Record{State: StateShipped, Key: key, ETag: m.ETag, Size: st.Size, MtimeNs: st.Mtim.Nano(), Ino: st.Ino, Manifest: manRel}
	if from > 0 {
		rec.Extents = append(slices.Clone(cov.Extents), Extent{Pos: from, Len: st.Size - from, Key: key, ETag: m.ETag})
	}
	if err := writeRecord(seg.Path, rec); err != nil {
		return err
	}
	sh.State, sh.Since = StateShipped, t.cfg.Now()
	if err := writeShipment(t.cfg.StateDir, sh); err != nil {
		return err
	}
	t.counters.ShippedSegments.Add(1)
	t.counters.ShippedBytes.Add(st.Size - from)
	if from > 0 {
		t.counters.MappedBytes.Add(from)
	}
	t.cfg.Log.Info("shipped", "segment", seg.Path, "key", key, "bytes", st.Size-from, "from", from)
	return nil
}

// putBatchList ships the batch list of the object key (the segment from
// position from). A segment that is not whole record batches has none:
// no other broker can map its bytes.
func (t *Tierer) putBatchList(ctx context.Context, seg Segment, key string, from int64, batches []idx.BatchRef) error {
	var list []idx.BatchRef
	if batches != nil {
		for _, b := range batches {
			if b.Pos >= from {
				b.Pos -= from
				list = append(list, b)
			}
		}
	} else {
		f, err := os.Open(seg.Path)
		if err != nil {
			return err
		}
		list, err = idx.BatchRefs(seg.Path, f, seg.Size, from)
		f.Close()
		var fe *idx.FormatError
		if errors.As(err, &fe) {
			t.cfg.Log.Debug("no batch list: not whole record batches", "segment", seg.Path, "err", err)
			return nil
		}
		if err != nil {
			return err
		}
	}
	b, err := idx.MarshalBatches(list)
	if err != nil {
		return fmt.Errorf("batch list of %s: %w", seg.Path, err)
	}
	_, err = t.cfg.Store.Put(ctx, batchesKey(key), bytes.NewReader(b), int64(len(b)))
	return err
}

// startShipment catalogs the objects a segment is about to put in the
// store (or finds them catalogued by an earlier, interrupted Ship): the
// object of its bytes from position from, its batch list and remote
// indexes, for a whole segment its index files too, and refs, the
// references it takes on other brokers' objects.
func (t *Tierer) startShipment(seg Segment, st *syscall.Stat_t, key, manRel string, from int64, refs []string) (Shipment, error) {
	if sh, err := loadShipment(t.cfg.StateDir, seg.Partition, key); err == nil {
		if sh.State == StateDeleting {
			return sh, fmt.Errorf("%s: its remote copy is being deleted", seg.Path)
		}
		return sh, nil
	} else if !os.IsNotExist(err) {
		return sh, err
	}
	sh := Shipment{State: StateShipping, Partition: seg.Partition, Base: seg.Base, Key: key, Manifest: manRel, Ino: st.Ino, Since: t.cfg.Now()}
	var err error
	if sh.HandleType, sh.Handle, err = fileHandle(seg.Path); err != nil {
		t.cfg.Log.Debug("no file handle", "segment", seg.Path, "err", err)
	}
	if from == 0 {
		for _, k := range t.sidecarKeys(seg, st) {
			sh.Objects = append(sh.Objects, k.key, chunkxfer.ManifestKey(k.key))
		}
	} else {
		sh.Objects = append(sh.Objects, key, chunkxfer.ManifestKey(key))
	}
	base := strings.TrimSuffix(key, kafka.KindLog)
	sh.Objects = append(sh.Objects, base+".batches", base+".rindex", base+".rtimeindex")
	sh.Objects = append(sh.Objects, refs...)
	return sh, writeShipment(t.cfg.StateDir, sh)
}

type sidecarKey struct{ path, key string }

// sidecarKeys are the files shipped for a segment and their keys: the
// .log first, then its indexes, snapshot and the partition's
// leader-epoch-checkpoint, those that exist.
func (t *Tierer) sidecarKeys(seg Segment, st *syscall.Stat_t) []sidecarKey {
	out := []sidecarKey{{seg.Path, t.objectKey(seg, st, ".log")}}
	for _, kind := range []string{kafka.KindIndex, kafka.KindTimeIndex, kafka.KindTxnIndex, kafka.KindSnapshot} {
		if p := sidecar(seg, kind); fileExists(p) {
			out = append(out, sidecarKey{p, t.objectKey(seg, st, kind)})
		}
	}
	if p := filepath.Join(filepath.Dir(seg.Path), "leader-epoch-checkpoint"); fileExists(p) {
		out = append(out, sidecarKey{p, t.objectKey(seg, st, ".leader-epoch-checkpoint")})
	}
	return out
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// manifestRel is where the local copy of the manifest of key lives,
// relative to the state dir: manifests/<partition>/<object>.json.
func manifestRel(key string) string {
	return filepath.Join("manifests", filepath.Dir(key), filepath.Base(key)+".json")
}

func writeManifestCopy(path string, m *chunkxfer.Manifest) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	return writeFileAtomic(path, b)
}

// index appends the entries of object key (the segment's bytes from
// position from, whose first batch has offset objBase) to the
// partition's index file (once), and ships the index file, on the
// condition that no other broker changed it meanwhile, and the object's
// remote indexes. Losing that race to another broker costs a retry of
// the append, never an upload: the store's index is taken, and what it
// still lacks of this object's offsets is appended again (entries that
// point into the object past what the other broker shipped). Where the
// other broker's upload holds every offset of the segment, the segment
// is mapped onto it instead (*coveredError); after maxIndexTries lost
// races it waits for the next pass (*WaitError).
func (t *Tierer) index(ctx context.Context, seg Segment, key string, from, objBase int64, keyAt func(int64) string) error {
	unlock := t.lockPartition(seg.Partition)
	defer unlock()
	at := from // where the object's entries start in the file
	for try := 1; ; try++ {
		err := t.appendIndex(ctx, seg, key, from, at, objBase)
		if err == nil {
			t.counters.OverlapBytes.Add(at - from)
		}
		if !errors.Is(err, ErrIndexMoved) {
			return err
		}
		t.counters.IndexRaces.Add(1)
		t.cfg.Log.Info("another broker changed the partition's index first: appending again", "segment", seg.Path, "key", key, "try", try)
		if try == maxIndexTries {
			return &WaitError{Why: fmt.Sprintf("lost the race to the store's index %d times (other brokers ship this partition too): appended again next pass", try)}
		}
		// putIndex took the store's index: what does it hold now?
		f, err := t.indexFile(seg.Partition)
		if err != nil {
			return err
		}
		cov, _, err := t.cover(ctx, seg, f, keyAt)
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
}

// maxIndexTries is how many times index appends an object's entries
// before it leaves the rest to the next pass.
const maxIndexTries = 5

// coveredError is an upload another broker's upload made needless while
// it was made: the store's index holds every offset of the segment in
// other objects.
type coveredError struct{ cov coverage }

func (e *coveredError) Error() string {
	return "another broker shipped every offset of the segment meanwhile"
}

// appendIndex is one try of index: the entries of object key from file
// position at on (the object starts at from), with offsets from objBase.
// Call it with the partition locked.
func (t *Tierer) appendIndex(ctx context.Context, seg Segment, key string, from, at, objBase int64) error {
	f, err := t.indexFile(seg.Partition)
	if err != nil {
		return err
	}
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
	if !have {
		lf, err := os.Open(seg.Path)
		if err != nil {
			return err
		}
		c, err := idx.ChunkSegment(seg.Path, io.NewSectionReader(lf, at, seg.Size-at), seg.Size-at, objBase, idx.ChunkOptions{})
		lf.Close()
		if err != nil {
			return err
		}
		if c.Opaque {
			t.cfg.Log.Warn("segment is not well-formed record batches; indexed as opaque chunks", "segment", seg.Path, "why", c.Reason)
		}
		var es []idx.Entry
		for _, ch := range c.Chunks {
			e := ch.Entry
			e.RDI = []byte(fmt.Sprintf("%s@%d", key, at-from+ch.Position))
			es = append(es, e)
		}
		if err := f.Append(es...); err != nil {
			return err
		}
	}
	var ri idx.RemoteIndexes
	f.View(func(x *idx.Index) { ri, err = x.BuildRemoteIndexes(objBase, next) })
	if err != nil {
		return err
	}
	if err := idx.WriteRemoteIndexes(filepath.Dir(f.Path()), ri); err != nil {
		return err
	}
	base := strings.TrimSuffix(key, kafka.KindLog)
	for name, b := range map[string][]byte{base + ".rindex": ri.MarshalOffsets(), base + ".rtimeindex": ri.MarshalTimes()} {
		if _, err := t.cfg.Store.Put(ctx, name, bytes.NewReader(b), int64(len(b))); err != nil {
			return err
		}
	}
	return t.putIndex(ctx, seg.Partition, f)
}

func nextOrMax(n int64) int64 {
	if n < 0 {
		return math.MaxInt64
	}
	return n
}

func (t *Tierer) indexFile(partition string) (*idx.File, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if f := t.indexes[partition]; f != nil {
		return f, nil
	}
	dir := filepath.Join(t.cfg.StateDir, "idx", partition)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	f, err := idx.OpenFile(filepath.Join(dir, idx.FileName))
	if err != nil {
		return nil, err
	}
	if f.Cut() > 0 {
		t.cfg.Log.Warn("cut a torn tail off an index file", "path", f.Path(), "bytes", f.Cut())
	}
	t.indexes[partition] = f
	return f, nil
}

// evictUnderRetention frees shipped segments past the local retention:
// by age, then the oldest first in each partition over its byte limit,
// then the oldest first anywhere while the total is over its limit.
func (t *Tierer) evictUnderRetention(ctx context.Context, parts []Partition, now time.Time) (int, []error) {
	c := t.cfg
	if c.LocalRetentionAge == 0 && c.LocalRetentionBytes == 0 && c.LocalRetentionTotalBytes == 0 {
		return 0, nil
	}
	type cand struct {
		part string
		seg  Segment
	}
	evicted := 0
	var errs []error
	var rest []cand // shipped segments still local after the per-partition pass
	var total int64 // local .log bytes of all partitions
	for _, p := range parts {
		var shipped []cand
		var local int64
		for _, seg := range p.Segments {
			rec, has, err := readRecord(seg.Path)
			if err != nil {
				errs = append(errs, t.noteErr(p.Name, err))
				continue
			}
			if has && rec.State == StateRemote {
				continue
			}
			local += seg.Size
			if has && rec.State == StateShipped {
				shipped = append(shipped, cand{p.Name, seg})
			}
		}
		sort.Slice(shipped, func(i, j int) bool { return shipped[i].seg.Base < shipped[j].seg.Base })
		for _, cd := range shipped {
			old := c.LocalRetentionAge > 0 && now.Sub(cd.seg.Mtime) > c.LocalRetentionAge
			over := c.LocalRetentionBytes > 0 && local > c.LocalRetentionBytes
			if !old && !over {
				rest = append(rest, cd)
				continue
			}
			if err := t.Evict(cd.seg.Path); err != nil {
				errs = append(errs, t.noteErr(p.Name, fmt.Errorf("evict %s: %w", cd.seg.Path, err)))
				rest = append(rest, cd)
				continue
			}
			local -= cd.seg.Size
			evicted++
		}
		total += local
	}
	if c.LocalRetentionTotalBytes > 0 && total > c.LocalRetentionTotalBytes {
		sort.SliceStable(rest, func(i, j int) bool { return rest[i].seg.Mtime.Before(rest[j].seg.Mtime) })
		for _, cd := range rest {
			if total <= c.LocalRetentionTotalBytes {
				break
			}
			if err := t.Evict(cd.seg.Path); err != nil {
				errs = append(errs, t.noteErr(cd.part, fmt.Errorf("evict %s: %w", cd.seg.Path, err)))
				continue
			}
			total -= cd.seg.Size
			evicted++
		}
	}
	return evicted, errs
}

// ErrHeldOpen refuses to free a file that a process has open for direct
// reads (it was opened under a name that is not a segment's and renamed
// since): that reader would see the freed bytes as zeros. It is freed
// once the handle is closed.
var ErrHeldOpen = errors.New("open by a process that reads it directly (opened under a non-segment name); freed once closed")

// Evict frees the local bytes of a shipped segment: under the gate, it
// marks the file remote, punches out its bytes (keeping its size) and
// restores its mtime. A crash in between is finished by the next pass.
func (t *Tierer) Evict(path string) error {
	if !t.claim(path) {
		return nil
	}
	defer t.release(path)
	rec, has, err := readRecord(path)
	if err != nil {
		return err
	}
	if !has || rec.State != StateShipped {
		return fmt.Errorf("%s is not shipped", path)
	}
	// The copy was verified when it shipped; it must still be there,
	// unchanged, now.
	if err := t.checkCopies(rec); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			// Gone or replaced: forget the copy; the segment ships again.
			unix.Removexattr(path, recordXattr)
		}
		return fmt.Errorf("not freeing the local bytes of %s: %w", path, err)
	}
	if t.cfg.BeforeFree != nil {
		if err := t.cfg.BeforeFree(path); err != nil {
			return fmt.Errorf("%s: not freeing local bytes: %w", path, err)
		}
	}
	// Under the gate no read or write of the file is under way, so the
	// identity checked here is what gets freed.
	unlock := t.cfg.Gate.Lock(rec.Ino)
	defer unlock()
	if t.cfg.Gate.Held(rec.Ino) {
		return fmt.Errorf("%s: %w", path, ErrHeldOpen)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return err
	}
	if st.Ino != rec.Ino || st.Size != rec.Size || st.Mtim.Nano() != rec.MtimeNs {
		// Changed since it was shipped: the copy is stale. Forget it;
		// the next pass ships the file again if it is still eligible.
		if err := unix.Removexattr(path, recordXattr); err != nil {
			return err
		}
		return fmt.Errorf("%s changed since it was shipped; shipping it again: %w", path, chunkxfer.ErrSourceChanged)
	}
	rec.State = StateRemote
	t.evictions.Add(1) // before the record: see Evictions
	if err := writeRecord(path, rec); err != nil {
		return err
	}
	t.crashPoint(CrashEvictMarked)
	if _, err := t.finishEvict(Segment{Path: path}, rec); err != nil {
		return err
	}
	t.counters.EvictedSegments.Add(1)
	t.counters.FreedBytes.Add(st.Blocks * 512)
	t.cfg.Log.Info("evicted", "segment", path, "freed_bytes", st.Blocks*512)
	return nil
}

// finishEvict makes a remote-marked file hold no local bytes and carry
// its recorded mtime, then records that; it reports whether it had
// anything to do.
func (t *Tierer) finishEvict(seg Segment, rec Record) (bool, error) {
	if rec.Freed {
		return false, nil
	}
	f, err := os.OpenFile(seg.Path, os.O_RDWR, 0)
	if err != nil {
		return false, err
	}
	defer f.Close()
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		return false, err
	}
	if st.Ino != rec.Ino || st.Size != rec.Size {
		return false, fmt.Errorf("%s is marked remote but is another file now (inode %d, %d bytes; recorded %d, %d bytes)", seg.Path, st.Ino, st.Size, rec.Ino, rec.Size)
	}
	if st.Size == 0 {
		// Nothing to free (the cleaner can leave empty segments).
	} else if err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 0, st.Size); err != nil {
		return false, fmt.Errorf("free %s: %w", seg.Path, err)
	}
	mt := unix.NsecToTimespec(rec.MtimeNs)
	at := unix.Timespec{Sec: st.Atim.Sec, Nsec: st.Atim.Nsec}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, seg.Path, []unix.Timespec{at, mt}, 0); err != nil {
		return false, err
	}
	if err := f.Sync(); err != nil {
		return false, err
	}
	rec.Freed = true
	return true, writeRecord(seg.Path, rec)
}

func (t *Tierer) loadManifest(rec Record) (*chunkxfer.Manifest, error) {
	if err := t.waitReady(); err != nil {
		return nil, err
	}
	b, err := os.ReadFile(filepath.Join(t.cfg.StateDir, rec.Manifest))
	if err != nil {
		return nil, err
	}
	m, err := chunkxfer.ParseManifest(b)
	if err != nil {
		return nil, err
	}
	if m.Key != rec.Key || m.ETag != rec.ETag || m.Size != rec.Size {
		return nil, fmt.Errorf("manifest %s is not of %s (etag %s)", rec.Manifest, rec.Key, rec.ETag)
	}
	return m, nil
}
