package tiering

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"sync"
)

// shipmentCatalog is every shipment in the state dir
// (shipments/<partition>/<object>.json), read from disk once, at its
// first use, and from then on kept in memory: the tierer is the only
// writer of the directory, and each write and removal goes through here
// (to disk first, then to memory). A pass then reads no shipment file,
// and a deletion looks only at its partition's shipments in memory.
type shipmentCatalog struct {
	dir func() string // the state dir (known once the mount holds it)

	mu     sync.Mutex
	loaded bool                           // GUARDED_BY(mu)
	byPart map[string]map[string]Shipment // partition → object file name → shipment; GUARDED_BY(mu)
}

func newShipmentCatalog(dir func() string) *shipmentCatalog {
	return &shipmentCatalog{dir: dir, byPart: map[string]map[string]Shipment{}}
}

// loadLocked reads every shipment file, once.
func (c *shipmentCatalog) loadLocked() error {
	if c.loaded {
		return nil
	}
	root := filepath.Join(c.dir(), "shipments")
	byPart := map[string]map[string]Shipment{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if os.IsNotExist(err) {
				return nil
			}
			return err
		}
		if d.IsDir() || filepath.Ext(p) != ".json" || filepath.Dir(filepath.Dir(p)) != root {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			if os.IsNotExist(err) {
				return nil
			}
			return err
		}
		var s Shipment
		if err := json.Unmarshal(b, &s); err != nil {
			return fmt.Errorf("shipment %s: %w", p, err)
		}
		part := filepath.Base(filepath.Dir(p))
		if byPart[part] == nil {
			byPart[part] = map[string]Shipment{}
		}
		byPart[part][filepath.Base(p)] = s
		return nil
	})
	if err != nil {
		return err
	}
	c.byPart, c.loaded = byPart, true
	return nil
}

func shipmentName(key string) string { return filepath.Base(key) + ".json" }

// get is the shipment of key in partition; an error for which
// os.IsNotExist holds when there is none (as reading its file would).
func (c *shipmentCatalog) get(partition, key string) (Shipment, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.loadLocked(); err != nil {
		return Shipment{}, err
	}
	s, ok := c.byPart[partition][shipmentName(key)]
	if !ok {
		return Shipment{}, &os.PathError{Op: "read", Path: shipmentPath(c.dir(), partition, key), Err: os.ErrNotExist}
	}
	return s, nil
}

// has says whether partition has a shipment of key.
func (c *shipmentCatalog) has(partition, key string) bool {
	_, err := c.get(partition, key)
	return err == nil
}

// put writes s (durably, atomically) and keeps it.
func (c *shipmentCatalog) put(s Shipment) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.loadLocked(); err != nil {
		return err
	}
	if err := writeShipment(c.dir(), s); err != nil {
		return err
	}
	s.Version = 1
	if c.byPart[s.Partition] == nil {
		c.byPart[s.Partition] = map[string]Shipment{}
	}
	c.byPart[s.Partition][shipmentName(s.Key)] = s
	return nil
}

// remove deletes the shipment of key in partition, if any.
func (c *shipmentCatalog) remove(partition, key string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.loadLocked(); err != nil {
		return err
	}
	if err := os.Remove(shipmentPath(c.dir(), partition, key)); err != nil && !os.IsNotExist(err) {
		return err
	}
	delete(c.byPart[partition], shipmentName(key))
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
		out = append(out, s)
	}
	sortShipments(out)
	return out, nil
}

// all are every shipment, by partition and base offset.
func (c *shipmentCatalog) all() ([]Shipment, error) {
	return c.except(func(string) bool { return false })
}

// except are the shipments of every partition but those skip names,
// by partition and base offset: a pass leaves out the settled ones
// without copying them.
func (c *shipmentCatalog) except(skip func(partition string) bool) ([]Shipment, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.loadLocked(); err != nil {
		return nil, err
	}
	var out []Shipment
	for part, ss := range c.byPart {
		if skip(part) {
			continue
		}
		for _, s := range ss {
			out = append(out, s)
		}
	}
	sortShipments(out)
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
