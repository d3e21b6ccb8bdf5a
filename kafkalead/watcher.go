// Package kafkalead learns from a Kafka cluster which partitions of a
// log dir its broker leads: a Watcher asks for the cluster's Metadata
// every few seconds, and sooner when asked (a partition's leader epoch
// moved on the local disk). It is how a mount of one broker's log dir
// ships the partitions that broker leads and follows the others.
package kafkalead

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Config configures a Watcher.
type Config struct {
	// Bootstrap are the brokers to ask (host:port); the mount's own
	// broker first.
	Bootstrap []string
	// Opts are more client options: TLS and SASL (ClientOptions reads
	// them from a client properties file).
	Opts []kgo.Opt
	// NodeID is this mount's broker's node.id, "" while it is not known
	// (the broker writes meta.properties at its first start).
	NodeID func() string
	// Interval is how often the cluster is asked (default 5s). An
	// answer older than three intervals counts as none: a mount whose
	// broker cannot be reached leads nothing.
	Interval time.Duration
	Log      *slog.Logger
	Now      func() time.Time
}

// DefaultInterval is how often the cluster is asked by default.
const DefaultInterval = 5 * time.Second

// Watcher holds the cluster's last answer: each partition's leader and
// leader epoch.
type Watcher struct {
	cfg     Config
	cl      *kgo.Client
	refresh chan struct{}

	mu      sync.Mutex
	parts   map[string]Partition // by log dir name (topic-N); GUARDED_BY(mu)
	asked   time.Time            // when the last answer came; GUARDED_BY(mu)
	lastErr error                // of the last try, nil when it answered; GUARDED_BY(mu)
	polls   int64                // answers; GUARDED_BY(mu)
}

// Partition is a partition's leadership as the cluster said.
type Partition struct {
	Leader int32 // node id; -1: none (offline)
	Epoch  int32
}

// New makes a Watcher; it asks nothing until Run.
func New(cfg Config) (*Watcher, error) {
	if len(cfg.Bootstrap) == 0 {
		return nil, errors.New("kafkalead: no bootstrap brokers")
	}
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.NodeID == nil {
		cfg.NodeID = func() string { return "" }
	}
	opts := append([]kgo.Opt{
		kgo.SeedBrokers(cfg.Bootstrap...),
		kgo.ClientID("tierfs"),
		kgo.DialTimeout(cfg.Interval),
		kgo.RequestRetries(1),
		kgo.RetryTimeout(cfg.Interval),
	}, cfg.Opts...)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("kafka client: %w", err)
	}
	return &Watcher{cfg: cfg, cl: cl, refresh: make(chan struct{}, 1), parts: map[string]Partition{}}, nil
}

// Close closes the client.
func (w *Watcher) Close() { w.cl.Close() }

// Run asks the cluster every interval, and when Refresh asks, until ctx
// ends.
func (w *Watcher) Run(ctx context.Context) {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-w.refresh:
			if !t.Stop() {
				select {
				case <-t.C:
				default:
				}
			}
		}
		w.Poll(ctx)
		t.Reset(w.cfg.Interval)
	}
}

// Refresh asks for an answer soon (it never waits).
func (w *Watcher) Refresh() {
	select {
	case w.refresh <- struct{}{}:
	default:
	}
}

// Poll asks the cluster once and keeps its answer.
func (w *Watcher) Poll(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 2*w.cfg.Interval)
	defer cancel()
	req := kmsg.NewPtrMetadataRequest() // every topic
	resp, err := req.RequestWith(ctx, w.cl)
	if err != nil {
		w.mu.Lock()
		first := w.lastErr == nil
		w.lastErr = err
		w.mu.Unlock()
		if first {
			w.cfg.Log.Info("cannot ask the Kafka cluster who leads its partitions: shipping nothing new until it answers", "bootstrap", w.cfg.Bootstrap, "err", err)
		}
		return err
	}
	parts := map[string]Partition{}
	for _, t := range resp.Topics {
		if t.Topic == nil || t.ErrorCode != 0 {
			continue
		}
		for _, p := range t.Partitions {
			// An offline partition has leader -1: known, led by no one.
			parts[*t.Topic+"-"+strconv.Itoa(int(p.Partition))] = Partition{Leader: p.Leader, Epoch: p.LeaderEpoch}
		}
	}
	w.mu.Lock()
	changed := w.changedLocked(parts)
	recovered := w.lastErr != nil
	w.parts, w.asked, w.lastErr = parts, w.cfg.Now(), nil
	w.polls++
	w.mu.Unlock()
	if recovered {
		w.cfg.Log.Info("the Kafka cluster answers again", "partitions", len(parts))
	}
	for _, c := range changed {
		w.cfg.Log.Info("partition leadership", "partition", c.name, "leader", c.now.Leader, "leader_epoch", c.now.Epoch, "was", c.was.Leader)
	}
	return nil
}

type change struct {
	name     string
	was, now Partition
}

// changedLocked lists the partitions whose leader moved (for the log; at
// most a few each poll, unless the whole cluster moved).
func (w *Watcher) changedLocked(parts map[string]Partition) []change {
	if w.polls == 0 {
		return nil
	}
	var out []change
	for name, p := range parts {
		if old, ok := w.parts[name]; ok && old.Leader != p.Leader {
			out = append(out, change{name, old, p})
		}
	}
	return out
}

// Lead is a partition's leader and leader epoch, and whether the leader
// is this mount's broker; known is false when the cluster has not
// answered within three intervals, does not know the partition, or this
// broker's node id is not known yet.
func (w *Watcher) Lead(partition string) (leader, epoch int32, self, known bool) {
	id := w.cfg.NodeID()
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.polls == 0 || w.cfg.Now().Sub(w.asked) > 3*w.cfg.Interval {
		return 0, 0, false, false
	}
	p, ok := w.parts[partition]
	if !ok || id == "" {
		return 0, 0, false, false
	}
	return p.Leader, p.Epoch, p.Leader >= 0 && strconv.Itoa(int(p.Leader)) == id, true
}

// Status is what the watcher knows, for tierfs status.
type Status struct {
	Bootstrap  []string  `json:"bootstrap"`
	Asked      time.Time `json:"asked,omitzero"` // when the cluster last answered
	Partitions int       `json:"partitions"`     // in its last answer
	Err        string    `json:"error,omitempty"`
}

// Status says what the watcher knows.
func (w *Watcher) Status() Status {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := Status{Bootstrap: w.cfg.Bootstrap, Asked: w.asked, Partitions: len(w.parts)}
	if w.lastErr != nil {
		s.Err = w.lastErr.Error()
	}
	return s
}
