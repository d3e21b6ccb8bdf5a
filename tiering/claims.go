package tiering

import "sync"

// A claim keeps two steps of the tierer off one thing at a time: a
// segment's path (shipping, evicting, hydrating it), an inode (an
// eviction that a crash interrupted, a hydration, a move) or an object
// key (its upload or its deletion). The kinds never collide.
type claimKind uint8

const (
	claimPath   claimKind = iota // a file, by its path
	claimInode                   // a file, by its inode
	claimObject                  // an object in the store, by its key
)

type claimKey struct {
	kind claimKind
	name string // path or key
	ino  uint64
}

func pathClaim(path string) claimKey  { return claimKey{kind: claimPath, name: path} }
func inodeClaim(ino uint64) claimKey  { return claimKey{kind: claimInode, ino: ino} }
func objectClaim(key string) claimKey { return claimKey{kind: claimObject, name: key} }

// claims are the claims held, and the inodes being shipped (a file being
// shipped shows the state "shipping" before its record says "shipped").
type claims struct {
	mu       sync.Mutex
	held     map[claimKey]struct{} // GUARDED_BY(mu)
	shipping map[uint64]struct{}   // GUARDED_BY(mu)
}

func newClaims() *claims {
	return &claims{held: map[claimKey]struct{}{}, shipping: map[uint64]struct{}{}}
}

// take claims k; false if something else holds it.
func (c *claims) take(k claimKey) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.held[k]; ok {
		return false
	}
	c.held[k] = struct{}{}
	return true
}

// release lets k go.
func (c *claims) release(k claimKey) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.held, k)
}

// startShipping marks inode ino as being shipped until done is called.
func (c *claims) startShipping(ino uint64) (done func()) {
	c.mu.Lock()
	c.shipping[ino] = struct{}{}
	c.mu.Unlock()
	return func() {
		c.mu.Lock()
		delete(c.shipping, ino)
		c.mu.Unlock()
	}
}

// shippingIno says whether inode ino is being shipped.
func (c *claims) shippingIno(ino uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.shipping[ino]
	return ok
}
