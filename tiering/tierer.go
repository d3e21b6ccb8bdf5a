package tiering

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sync/semaphore"
	"golang.org/x/time/rate"

	"github.com/tierfs/tierfs/chunkxfer"
	"github.com/tierfs/tierfs/chunkxfer/store"
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
	// Concurrency is how many segments uploaded in parts (more than
	// 1 MiB) upload at once (default 2). Smaller segments are bound by
	// their latency, not their bytes: up to partitionsPerUpload times as
	// many partitions ship at once, within the memory that many large
	// uploads would take (uploadMemory).
	Concurrency int

	ShipRate  int64 // bytes per second of all uploads together (0: no limit)
	ChunkSize int64 // transfer chunk size (default chunkxfer's)
	// BlockSize is the block a first read of an evicted file fetches
	// alone (chunkxfer.Uploader.BlockSize: 0 its default, negative none).
	BlockSize int64
	Gate      *Gate // shared with the file system (nil: a private one)
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
	// RescanInterval is how often a pass scans every partition, changed
	// or not (0: every pass). In between, a pass scans only the
	// partitions that may have changed (see partScans).
	RescanInterval time.Duration
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
	cfg   Config
	ready chan struct{} // closed once Root and StateDir are known
	up    *chunkxfer.Uploader
	upMem *semaphore.Weighted // the bytes uploads hold in memory (uploadMemory)
	// uploading bounds the segments that upload at once, in all
	// partitions: as many as partitions ship at once.
	uploading chan struct{}
	uploads   store.Store // where a shipment's objects are put: cfg.Store or its deferred view (deferrer)
	mu        sync.Mutex  // guards cfg.BrokerID, learnt late
	indexes   *partIndexes
	// checkpoints are the broker's checkpoint files as last parsed.
	checkpoints checkpointFiles
	batches     batchLists
	status      *partStatus
	work        work
	claims      *claims
	handles     *handles
	shipments   *shipmentCatalog
	manifests   *manifestCopies
	records     *records
	scans       *partScans
	moves       *moves

	// The parts of the work, each in its own file.
	shipper  *shipper
	share    *storeIndex
	deleter  *deleter
	evictor  *evictor
	copies   *copies
	mirror   *mirror
	hydrator *hydrator

	noHandleOnce sync.Once

	stop        chan struct{} // closed by Close
	stopOnce    sync.Once
	recoverOnce sync.Once

	counters Counters

	roles *roles
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
	// PartitionScans counts the partitions a pass listed and looked at
	// again; a settled, unchanged partition is not (see partScans).
	PartitionScans atomic.Int64
	// ViewScans counts the partitions status and the metrics scanned
	// again (changed since their last scan; see partScans.view).
	ViewScans atomic.Int64
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

// LastErrors are the last error of each partition that had one, and
// why segments of it are kept local, where they wait for something other
// than their age.
func (t *Tierer) LastErrors() map[string]PartitionError { return t.status.all() }

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
	t := &Tierer{cfg: cfg, claims: newClaims(), handles: newHandles(), stop: make(chan struct{}), ready: make(chan struct{})}
	t.moves = newMoves(t)
	t.shipments = newShipmentCatalog(func() string { return t.cfg.StateDir }, cfg.Log)
	t.manifests = newManifestCopies(func() string { return t.cfg.StateDir }, cfg.Log)
	t.records = newRecords(cfg.Now)
	t.scans = newPartScans(cfg.Log)
	t.shipper, t.share, t.deleter, t.evictor = &shipper{t}, &storeIndex{t: t}, &deleter{t}, &evictor{t}
	t.copies, t.mirror, t.hydrator = &copies{t}, &mirror{t}, &hydrator{t}
	t.indexes = newPartIndexes(func() string { return t.cfg.StateDir }, cfg.Log)
	t.status = newPartStatus(cfg.Now)
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

// uploadParallel is how many parts of one multipart upload go up at
// once, each read into a chunk-sized buffer of its own.
const uploadParallel = 4

// partitionsPerUpload is how many partitions ship at once per large
// upload allowed (Config.Concurrency). A small segment's shipment is a
// handful of puts, each a request (on a directory store, a sync) whose
// latency, not its bytes, is its cost: more of them in flight at once is
// what makes them ship faster, and on a journalled file system the
// syncs of concurrent puts share journal commits.
const partitionsPerUpload = 4

// uploadCap is the most one segment's upload holds in memory: the part
// buffers of a multipart upload.
func (t *Tierer) uploadCap() int64 { return uploadParallel * t.cfg.ChunkSize }

// uploadMemory is what uploading n bytes of a .log takes of the uploads'
// memory, which is Concurrency times uploadCap: an upload sent in one
// request (up to 1 MiB) reads it whole and takes its size, a multipart
// upload takes uploadCap whatever its size (its parts in flight hold a
// chunk each). So segments uploaded in parts go at most Concurrency at
// once, and smaller ones ship from more partitions at once, in no more
// memory. (A segment's trimmed .index and .timeindex, put alongside, are
// a few hundredths of its bytes.)
func (t *Tierer) uploadMemory(n int64) int64 {
	if t.up.OneRequest(n) {
		return max(n, 1)
	}
	return t.uploadCap()
}

// deferrer is a store that can put objects whose names become durable
// at its next conditional put instead of before each put returns
// (store.Dir: one directory sync for a segment's objects, not one each).
// A shipment's objects are put through it: the partition's index, which
// names them, is such a conditional put, and nothing counts an object
// shipped before the index names it.
type deferrer interface {
	Deferred() store.Store
}

// SetRoot tells the tierer where the log directory and its state are;
// call it once, before RunOnce.
func (t *Tierer) SetRoot(root, stateDir string) {
	t.cfg.Root, t.cfg.StateDir = root, stateDir
	t.uploads = t.cfg.Store
	if d, ok := t.cfg.Store.(deferrer); ok {
		t.uploads = d.Deferred()
	}
	t.up = &chunkxfer.Uploader{Store: t.uploads, JournalDir: filepath.Join(stateDir, "journal"), ChunkSize: t.cfg.ChunkSize, BlockSize: t.cfg.BlockSize, Parallel: uploadParallel, Log: t.cfg.Log, Broker: t.BrokerID}
	t.upMem = semaphore.NewWeighted(int64(t.cfg.Concurrency) * t.uploadCap())
	t.uploading = make(chan struct{}, t.cfg.Concurrency*partitionsPerUpload)
	if t.cfg.ShipRate > 0 {
		t.up.Limit = rate.NewLimiter(rate.Limit(t.cfg.ShipRate), int(min(t.cfg.ShipRate, 1<<20)))
	}
	close(t.ready)
	// Moves a crash interrupted are under way again before the mount
	// is announced, so their files show their sizes from the start.
	t.recoverOnce.Do(t.moves.recoverMoves)
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
	t.indexes.close()
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
	t.recoverOnce.Do(t.moves.recoverMoves)
	if _, err := t.share.statesLog(); err != nil {
		rep.Errors = append(rep.Errors, fmt.Errorf("store states: %w", err))
		return rep
	}
	if t.work.begin() != nil {
		return rep // unmounting
	}
	defer t.work.end()
	// The uploads of a pass share their part buffers; between passes
	// they are not held (memory outside the chunk budget).
	defer t.up.DropBuffers()
	now := t.cfg.Now()
	full := t.scans.fullDue(now, t.cfg.RescanInterval)
	parts, from, scanned, err := t.scans.scan(t.cfg.Root, full, now)
	if err != nil {
		rep.Errors = append(rep.Errors, err)
		return rep
	}
	t.counters.PartitionScans.Add(int64(len(scanned)))
	live := make(map[string]bool, len(parts))
	// By inode: the segments scanned now (pointers into the scans, not
	// copies: at a full scan this is every segment of the mount).
	segs := map[uint64]*Segment{}
	for _, p := range parts {
		live[p.Name] = true
		if scanned[p.Name] {
			for i := range p.Segments {
				segs[p.Segments[i].Ino] = &p.Segments[i]
			}
		}
	}
	t.roles.forget(live)
	if full {
		t.records.keep(segs)
	}
	cp, err := t.checkpoints.read(t.cfg.Root, now)
	if err != nil {
		rep.Errors = append(rep.Errors, err)
		return rep
	}
	// Deletions first: the copies of segments the broker deleted go, and
	// their index entries with them, before anything new takes their place.
	// A settled partition that was not scanned changed no name: its
	// shipments' files are where they were.
	settledNow := func(partition string) bool { return live[partition] && !scanned[partition] }
	var unsure map[string]bool
	rep.Deleted, rep.Errors, unsure = t.deleter.followDeletions(ctx, segs, settledNow)
	var mu sync.Mutex
	sem := make(chan struct{}, t.cfg.Concurrency*partitionsPerUpload)
	var wg sync.WaitGroup
	// Partitions ship in parallel; the segments of one partition in
	// offset order, stopping at the first that cannot ship, because the
	// partition's index takes entries in offset order only.
	for _, p := range parts {
		if !scanned[p.Name] {
			continue // settled, and unchanged
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			r := t.shipper.shipPartition(ctx, p, cp, now)
			t.scans.settle(p.Name, settledPassOf(r) && !unsure[p.Name], t.evictor.retentionDue(p))
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
	n, errs := t.evictor.evictUnderRetention(ctx, parts, from, now)
	rep.Evicted += n
	rep.Errors = append(rep.Errors, errs...)
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

type sidecarKey struct{ path, key, kind string }

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
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

func nextOrMax(n int64) int64 {
	if n < 0 {
		return math.MaxInt64
	}
	return n
}

// ErrHeldOpen refuses to free a file that a process has open for direct
// reads (it was opened under a name that is not a segment's and renamed
// since): that reader would see the freed bytes as zeros. It is freed
// once the handle is closed.
var ErrHeldOpen = errors.New("open by a process that reads it directly (opened under a non-segment name); freed once closed")

func (cs *copies) loadManifest(rec Record) (*chunkxfer.Manifest, error) {
	if err := cs.t.waitReady(); err != nil {
		return nil, err
	}
	m, err := cs.t.manifests.get(rec.Key)
	if err != nil {
		return nil, err
	}
	if m.ETag != rec.ETag || m.Size != rec.Size {
		return nil, fmt.Errorf("the manifest copy of %s is of etag %s, %d bytes; the file's record says etag %s, %d bytes", rec.Key, m.ETag, m.Size, rec.ETag, rec.Size)
	}
	return m, nil
}
