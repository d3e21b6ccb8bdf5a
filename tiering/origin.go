package tiering

import (
	"slices"
	"sort"
)

// Origin is who shipped one of a partition's segments: the brokers
// whose objects hold its bytes (tierfs status --segments).
type Origin struct {
	Base  int64         `json:"base"`
	Key   string        `json:"key"`   // the segment's object name (its own, even when mapped)
	State ShipmentState `json:"state"` // shipping, shipped or deleting
	// Uploaded: this mount uploaded (some of) its bytes; otherwise they
	// are all in other brokers' objects, mapped.
	Uploaded bool `json:"uploaded"`
	// By are the brokers whose objects hold its bytes, this one
	// included when it uploaded some; "?" for an object whose manifest
	// names no broker (uploaded by an older tierfs).
	By []string `json:"shipped_by"`
}

// Origins lists who shipped each catalogued segment of a partition,
// oldest first. It reads this mount's catalog and its copies of other
// brokers' manifests; it touches no store.
func (t *Tierer) Origins(partition string) ([]Origin, error) {
	if err := t.waitReady(); err != nil {
		return nil, err
	}
	ships, err := t.shipments.of(partition)
	if err != nil {
		return nil, err
	}
	self := t.BrokerID()
	var out []Origin
	for _, s := range ships {
		o := Origin{Base: s.Base, Key: s.Key, State: s.State}
		for _, k := range s.Objects {
			by := self
			if isRefKey(k) {
				by = "?"
				if m, err := t.manifests.get(refTarget(k)); err == nil && m.Broker != "" {
					by = m.Broker
				}
			} else if k == s.Key {
				o.Uploaded = true
			} else {
				continue
			}
			if !slices.Contains(o.By, by) {
				o.By = append(o.By, by)
			}
		}
		out = append(out, o)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Base < out[j].Base })
	return out, nil
}
