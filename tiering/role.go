package tiering

import (
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/tierfs/tierfs/idx/kafka"
)

// Role is what a mount does with a partition of its log dir.
type Role string

// The roles. A mount's role is RoleAuto unless set by hand; RoleAuto
// resolves, per partition, to leader or follower (with a Leadership) or
// stays auto (without one).
const (
	// RoleAuto: with Config.Leadership, a partition this mount's broker
	// leads is shipped and the others are followed; without it every
	// partition ships what the store lacks, waiting Config.ShareGrace for
	// another broker's upload in partitions other brokers ship too.
	RoleAuto Role = "auto"
	// RoleLeader ships every partition (a manual override).
	RoleLeader Role = "leader"
	// RoleFollower ships nothing: it maps its segments onto what other
	// brokers shipped, once the store holds all of a segment's batches (a
	// manual override, and what a partition led by another broker gets).
	RoleFollower Role = "follower"
)

// ParseRole reads a role's name; "" is RoleAuto.
func ParseRole(s string) (Role, error) {
	switch r := Role(s); r {
	case "":
		return RoleAuto, nil
	case RoleAuto, RoleLeader, RoleFollower:
		return r, nil
	}
	return "", fmt.Errorf("role %q: auto, leader or follower", s)
}

// Leadership tells, per partition, which broker leads it, as the
// broker's cluster says (kafkalead.Watcher, through cmd/tierfs).
type Leadership interface {
	// Lead is the partition's leader now; known is false while the
	// cluster has not said (the broker is not up, or the partition is
	// new to it).
	Lead(partition string) (l Lead, known bool)
	// Refresh asks the cluster again soon: a partition's leader epoch
	// moved on the local disk before the last answer said so.
	Refresh()
}

// Lead is a partition's leadership: its leader's node id and leader
// epoch, and whether the leader is this mount's broker.
type Lead struct {
	Leader int32 `json:"leader"`
	Epoch  int32 `json:"leader_epoch"`
	Self   bool  `json:"self"`
}

// PartitionRole is what the mount does with one partition now, and why.
type PartitionRole struct {
	Role Role   `json:"role"`
	Why  string `json:"why"`
	Lead *Lead  `json:"lead,omitempty"`
}

// roles decides each partition's role: a manual override, or the
// leadership the cluster reports, or auto.
type roles struct {
	lead   Leadership // nil: none (fixed at New)
	root   func() string
	mu     sync.Mutex
	role   Role             // GUARDED_BY(mu)
	epochs map[string]epoch // by partition: its leader-epoch-checkpoint as last read; GUARDED_BY(mu)
}

// epoch is the last leader epoch a partition's leader-epoch-checkpoint
// held, and the file's mtime and size when it was read (it is read again
// only when they change).
type epoch struct {
	mtime time.Time
	size  int64
	epoch int32
}

func newRoles(role Role, lead Leadership, root func() string) *roles {
	return &roles{role: role, lead: lead, root: root, epochs: map[string]epoch{}}
}

func (r *roles) set(role Role) (changed bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	changed, r.role = r.role != role, role
	return changed
}

func (r *roles) get() Role {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.role
}

// of is partition's role now.
// follows says whether the mount ships nothing of partition now (it
// maps its segments onto other brokers' uploads).
func (r *roles) follows(partition string) bool { return r.of(partition).Role == RoleFollower }

func (r *roles) of(partition string) PartitionRole {
	switch role := r.get(); {
	case role == RoleLeader || role == RoleFollower:
		return PartitionRole{Role: role, Why: "set by hand (--role or tierfs role)"}
	case r.lead == nil:
		return PartitionRole{Role: RoleAuto, Why: "no --kafka-bootstrap: ships what the store lacks"}
	}
	l, ok := r.lead.Lead(partition)
	if !ok {
		return PartitionRole{Role: RoleFollower, Why: "its leader is not known yet: nothing is uploaded until the broker says"}
	}
	if l.Self {
		return PartitionRole{Role: RoleLeader, Why: "the broker leads it", Lead: &l}
	}
	return PartitionRole{Role: RoleFollower, Why: fmt.Sprintf("broker %d leads it", l.Leader), Lead: &l}
}

// checkEpoch asks the cluster again when the partition's
// leader-epoch-checkpoint holds an epoch newer than the leadership known
// (the broker became leader or follower since the last answer); it reads
// the file only when it changed.
func (r *roles) checkEpoch(partition string) {
	if r.lead == nil || r.get() != RoleAuto {
		return
	}
	p := filepath.Join(r.root(), partition, "leader-epoch-checkpoint")
	fi, err := os.Stat(p)
	if err != nil {
		return
	}
	r.mu.Lock()
	e, ok := r.epochs[partition]
	r.mu.Unlock()
	if !ok || !e.mtime.Equal(fi.ModTime()) || e.size != fi.Size() {
		e = epoch{mtime: fi.ModTime(), size: fi.Size(), epoch: -1}
		if data, err := os.ReadFile(p); err == nil {
			if es, err := kafka.ParseLeaderEpochCheckpoint(p, data); err == nil && len(es) > 0 {
				e.epoch = es[len(es)-1].Epoch
			}
		}
		r.mu.Lock()
		r.epochs[partition] = e
		r.mu.Unlock()
	}
	if l, known := r.lead.Lead(partition); !known || e.epoch > l.Epoch {
		r.lead.Refresh()
	}
}

// forget drops what is kept of partitions no longer in the log dir.
func (r *roles) forget(live map[string]bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for p := range r.epochs {
		if !live[p] {
			delete(r.epochs, p)
		}
	}
}

// graceFor is how long past its ship-after a segment of a partition other
// brokers ship too waits for their upload, when no leadership is known:
// ShareGrace plus a stagger of up to ShareGrace, fixed per broker, so
// that mounts with no leadership to go by rarely upload the same offsets
// at once.
func graceFor(grace time.Duration, broker string) time.Duration {
	if grace <= 0 {
		return 0
	}
	h := fnv.New32a()
	h.Write([]byte(broker))
	return grace + time.Duration(h.Sum32()%1024)*grace/1024
}
