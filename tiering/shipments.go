package tiering

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/tierfs/tierfs/idx/kafka"
	"github.com/tierfs/tierfs/internal/keylog"
)

// shipmentCatalog is every shipment in the state dir, one keyed log per
// partition (shipments/<partition>.klog, internal/keylog), read from
// disk once, at its first use, and from then on kept in memory: the
// tierer is the only writer of the directory, and each write and
// removal goes through here (to disk first, then to memory). A pass then
// reads no shipment, and a deletion looks only at its partition's
// shipments in memory. Shipments of versions before 2026-12, one file
// each (shipments/<partition>/<object>.json), are moved into the logs at
// the first load.
type shipmentCatalog struct {
	dir func() string // the state dir (known once the mount holds it)
	log *slog.Logger

	// writing has a lock for each partition, which a write holds across
	// its log's sync and the change of memory that follows.
	writing partitionLocks
	// mu guards the maps below and is never held across a disk write:
	// a write holds its partition's writing lock instead, so writes of
	// different partitions sync at once (a journalled file system joins
	// their syncs in one commit) while reads go on.
	mu     sync.Mutex
	loaded bool                               // GUARDED_BY(mu)
	byPart map[string]map[string]keptShipment // partition → object key → shipment; GUARDED_BY(mu)
	logs   map[string]*keylog.Log             // by partition; GUARDED_BY(mu)
	// Kept shipments hold their objects as in their log line (from the
	// stem mark on), each such name once for all (most are the same
	// eleven): a whole key per object would be most of the catalog's
	// memory.
	names map[string]string   // GUARDED_BY(mu)
	lists map[string][]string // object lists shared by shipments, never changed; GUARDED_BY(mu)
}

func newShipmentCatalog(dir func() string, log *slog.Logger) *shipmentCatalog {
	return &shipmentCatalog{dir: dir, log: log, byPart: map[string]map[string]keptShipment{}, logs: map[string]*keylog.Log{}, names: map[string]string{}, lists: map[string][]string{}}
}

func (c *shipmentCatalog) root() string { return filepath.Join(c.dir(), "shipments") }

// loadLocked reads every shipment log, once, moving legacy shipment
// files into them first.
func (c *shipmentCatalog) loadLocked() error {
	if c.loaded {
		return nil
	}
	ents, err := os.ReadDir(c.root())
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	// A partition has a log, a legacy directory, or both (a crash
	// while its files moved).
	var parts []string
	legacy := map[string]bool{}
	for _, e := range ents {
		if part, ok := strings.CutSuffix(e.Name(), keyLogExt); ok && e.Type().IsRegular() {
			parts = append(parts, part)
		} else if e.IsDir() {
			parts = append(parts, e.Name())
			legacy[e.Name()] = true
		}
	}
	byPart, logs := map[string]map[string]keptShipment{}, map[string]*keylog.Log{}
	for _, part := range parts {
		if logs[part] != nil {
			continue // both: done
		}
		path := c.logPath(part)
		keep := func(key string, val []byte) error {
			// Kept as the line has it: objects from the stem mark on.
			var s Shipment
			if err := json.Unmarshal(val, &s); err != nil {
				return fmt.Errorf("shipment %s in %s: %w", key, path, err)
			}
			if s.Key == key {
				s.Key = key // the log's copy of the string, not a second one
			}
			if byPart[part] == nil {
				byPart[part] = map[string]keptShipment{}
			}
			byPart[part][s.Key] = c.keptLocked(s)
			return nil
		}
		if !legacy[part] {
			// The log alone: its lines read and decoded once.
			l, err := openKeyLogEach(path, "shipment", c.log, keep)
			if err != nil {
				return err
			}
			logs[part] = l
			continue
		}
		l, err := c.openLog(part)
		if err != nil {
			return err
		}
		logs[part] = l
		if err := c.migrate(part, l); err != nil {
			return err
		}
		if err := l.Each(keep); err != nil {
			return err
		}
	}
	c.byPart, c.logs, c.loaded = byPart, logs, true
	return nil
}

func (c *shipmentCatalog) openLog(part string) (*keylog.Log, error) {
	return openKeyLog(c.logPath(part), "shipment", c.log)
}

// logPath is the file of partition part's shipment log.
func (c *shipmentCatalog) logPath(part string) string {
	return filepath.Join(c.root(), part+keyLogExt)
}

// migrate moves the legacy shipment files of a partition, if any, into
// its log, and removes their directory.
func (c *shipmentCatalog) migrate(part string, l *keylog.Log) error {
	dir := filepath.Join(c.root(), part)
	n, err := moveLegacyFiles(dir, l, func(p string, b []byte) (string, []byte, error) {
		var s Shipment
		if err := json.Unmarshal(b, &s); err != nil {
			return "", nil, fmt.Errorf("shipment %s: %w", p, err)
		}
		s.Version = 1
		v, err := encodeShipment(s)
		return s.Key, v, err
	})
	if err != nil {
		return err
	}
	if err := os.Remove(dir); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("legacy shipments of %s: %w", part, err)
	}
	if n > 0 {
		c.log.Info("moved shipment files into the partition's shipment log", "partition", part, "shipments", n)
	}
	return nil
}

// get is the shipment of key in partition; an error for which
// os.IsNotExist holds when there is none.
func (c *shipmentCatalog) get(partition, key string) (Shipment, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.loadLocked(); err != nil {
		return Shipment{}, err
	}
	s, ok := c.byPart[partition][key]
	if !ok {
		return Shipment{}, &os.PathError{Op: "shipment", Path: c.logPath(partition) + ": " + key, Err: os.ErrNotExist}
	}
	return expandShipment(partition, s), nil
}

// has says whether partition has a shipment of key.
func (c *shipmentCatalog) has(partition, key string) bool {
	_, err := c.get(partition, key)
	return err == nil
}

// put writes s (appended and synced) and keeps it.
func (c *shipmentCatalog) put(s Shipment) error { return c.putAll([]Shipment{s}) }

// putAll writes ss, shipments of one partition (one append and sync for
// all of them), and keeps them.
func (c *shipmentCatalog) putAll(ss []Shipment) error {
	if len(ss) == 0 {
		return nil
	}
	part := ss[0].Partition
	es := make([]keylog.Entry, len(ss))
	for i := range ss {
		if ss[i].Partition != part {
			return fmt.Errorf("shipments of %s and %s: not of one partition", part, ss[i].Partition)
		}
		ss[i].Version = 1
		b, err := encodeShipment(ss[i])
		if err != nil {
			return err
		}
		es[i] = keylog.Entry{Key: ss[i].Key, Val: b}
	}
	l, unlock, err := c.writeLog(part, true)
	if err != nil {
		return err
	}
	defer unlock()
	if err := l.PutAll(es); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.byPart[part] == nil {
		c.byPart[part] = map[string]keptShipment{}
	}
	for _, s := range ss {
		c.byPart[part][s.Key] = c.keptLocked(s)
	}
	return nil
}

// writeLog takes partition's writing lock and returns its log (opened
// if open, else nil), for a write and then the change of memory that
// follows it, both before unlock: writes of one partition, to its log
// and to memory, keep one order.
func (c *shipmentCatalog) writeLog(partition string, open bool) (l *keylog.Log, unlock func(), err error) {
	c.mu.Lock()
	err = c.loadLocked()
	c.mu.Unlock()
	if err != nil {
		return nil, nil, err
	}
	unlock = c.writing.lock(partition)
	c.mu.Lock()
	defer c.mu.Unlock()
	// Under the writing lock no other write opens or drops this
	// partition's log: there is never a second Log of its file.
	if l = c.logs[partition]; l == nil && open {
		if l, err = c.openLog(partition); err != nil {
			unlock()
			return nil, nil, err
		}
		c.logs[partition] = l
	}
	return l, unlock, nil
}

// remove deletes the shipment of key in partition, if any.
func (c *shipmentCatalog) remove(partition, key string) error {
	l, unlock, err := c.writeLog(partition, false)
	if err != nil {
		return err
	}
	defer unlock()
	if l != nil {
		if err := l.Delete(key); err != nil {
			return err
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if l != nil && l.Len() == 0 {
		delete(c.logs, partition)
	}
	delete(c.byPart[partition], key)
	if len(c.byPart[partition]) == 0 {
		delete(c.byPart, partition)
	}
	return nil
}

// of are the shipments of one partition, by base offset.
func (c *shipmentCatalog) of(partition string) ([]Shipment, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.loadLocked(); err != nil {
		return nil, err
	}
	out := make([]Shipment, 0, len(c.byPart[partition]))
	for _, s := range c.byPart[partition] {
		out = append(out, expandShipment(partition, s))
	}
	sortShipments(out)
	return out, nil
}

// partitions are the partitions with shipments but those skip names,
// sorted: a pass leaves out the settled ones, and takes the others'
// shipments one partition at a time.
func (c *shipmentCatalog) partitions(skip func(partition string) bool) ([]string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.loadLocked(); err != nil {
		return nil, err
	}
	var out []string
	for part := range c.byPart {
		if !skip(part) {
			out = append(out, part)
		}
	}
	slices.Sort(out)
	return out, nil
}

func sortShipments(ss []Shipment) {
	sort.Slice(ss, func(i, j int) bool {
		if ss[i].Partition != ss[j].Partition {
			return ss[i].Partition < ss[j].Partition
		}
		if ss[i].Base != ss[j].Base {
			return ss[i].Base < ss[j].Base
		}
		return ss[i].Key < ss[j].Key
	})
}

// stemMark stands for a shipment's key without its kind (".log") at the
// start of one of its objects, in a shipment log line: eleven objects of
// one segment repeat it. No object key starts with "~" (Kafka's topic
// names do not).
const stemMark = "~"

// keptShipment is a shipment as the catalog keeps it, about two thirds
// of a Shipment: no partition (the catalog's map has it) or version,
// its time in nanoseconds, its handle a string, its objects as in its
// log line (from the stem mark on), each such name and most lists
// shared.
type keptShipment struct {
	State      ShipmentState // one shared copy of the name
	Key        string
	Objects    []string
	Manifest   string
	Handle     string
	Base       int64
	Ino        uint64
	SinceNs    int64
	HandleType int32
}

// keptLocked is s as the catalog keeps it.
func (c *shipmentCatalog) keptLocked(s Shipment) keptShipment {
	objs := make([]string, len(s.Objects))
	for i, o := range s.Objects {
		if o = stemForm(s.Key, o); strings.HasPrefix(o, stemMark) {
			o = c.name(o)
		} else if target, ok := ownRef(s.Key, o); ok {
			o = refMark + target
		}
		objs[i] = o
	}
	// Most shipments have the same list: one copy of it for all.
	id := strings.Join(objs, "\x00")
	if shared, ok := c.lists[id]; ok {
		objs = shared
	} else if !slices.ContainsFunc(objs, func(o string) bool { return !strings.HasPrefix(o, stemMark) }) {
		c.lists[id] = objs // only lists of the stem's names repeat
	}
	k := keptShipment{State: ShipmentState(c.name(string(s.State))), Key: s.Key, Objects: objs, Manifest: s.Manifest,
		Base: s.Base, Ino: s.Ino, HandleType: s.HandleType}
	if len(s.Handle) > 0 {
		k.Handle = string(s.Handle)
	}
	if !s.Since.IsZero() {
		k.SinceNs = s.Since.UnixNano()
	}
	return k
}

// name is the one kept copy of a string many shipments hold.
func (c *shipmentCatalog) name(v string) string {
	if n, ok := c.names[v]; ok {
		return n
	}
	c.names[v] = v
	return v
}

// stemForm is object o of the shipment of key as its log line writes
// it: from the stem mark on, if it starts with the stem (the key
// without its kind); as it is otherwise (already so, or another
// broker's object).
func stemForm(key, o string) string {
	stem := strings.TrimSuffix(key, kafka.KindLog)
	if rest, ok := strings.CutPrefix(o, stem); ok && stem != "" {
		return stemMark + rest
	}
	return o
}

// refMark stands, in a kept shipment only (never in a log line), for
// a reference the shipment's own file holds: refMark and the key of the
// object it references. A follower's every shipment holds such
// references to the leader's objects, and their holder part (".refs/"
// and the file's own name) would be a third of its catalog's memory
// for objects. No object key starts with "^" (Kafka's topic names do
// not).
const refMark = "^"

// ownRef says whether o is a reference that the file shipped as key
// holds, and to which object.
func ownRef(key, o string) (target string, ok bool) {
	if !isRefKey(o) || refHolder(o) != holderOf(key) {
		return "", false
	}
	return refTarget(o), true
}

// wholeForm is object o of the shipment of key as a whole key.
func wholeForm(key, o string) string {
	if rest, ok := strings.CutPrefix(o, stemMark); ok {
		return strings.TrimSuffix(key, kafka.KindLog) + rest
	}
	if rest, ok := strings.CutPrefix(o, refMark); ok {
		return refKey(rest, holderOf(key))
	}
	return o
}

// expandShipment is the kept shipment k of partition as a Shipment,
// with whole object keys in a slice of its own.
func expandShipment(partition string, k keptShipment) Shipment {
	s := Shipment{Version: 1, State: k.State, Partition: partition, Base: k.Base, Key: k.Key, Manifest: k.Manifest,
		Ino: k.Ino, HandleType: k.HandleType, Objects: make([]string, len(k.Objects))}
	for i, o := range k.Objects {
		s.Objects[i] = wholeForm(k.Key, o)
	}
	if k.Handle != "" {
		s.Handle = []byte(k.Handle)
	}
	if k.SinceNs != 0 {
		s.Since = time.Unix(0, k.SinceNs).UTC()
	}
	return s
}

// encodeShipment is s (with whole object keys) as a shipment log value:
// its objects that start with its stem are written from the mark on.
func encodeShipment(s Shipment) ([]byte, error) {
	objs := make([]string, len(s.Objects))
	for i, o := range s.Objects {
		if strings.HasPrefix(o, stemMark) || strings.HasPrefix(o, refMark) {
			return nil, fmt.Errorf("shipment of %s: object %q starts with %q or %q", s.Key, o, stemMark, refMark)
		}
		objs[i] = stemForm(s.Key, o)
	}
	s.Objects = objs
	return json.Marshal(s)
}
