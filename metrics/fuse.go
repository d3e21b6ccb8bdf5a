package metrics

import (
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"
)

// FUSEOps counts FUSE requests by op and result and times them
// (fs.OpObserver). Reads of local segment bytes that the kernel serves
// by passthrough never reach tierfs and are not here; "read_remote" is
// the reads served from the store.
type FUSEOps struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec

	// The label children of each op and result, resolved once: the
	// observer runs on every request.
	mu       sync.RWMutex
	counters map[opResult]prometheus.Counter // GUARDED_BY(mu)
	timers   map[string]prometheus.Observer  // GUARDED_BY(mu)
}

type opResult struct {
	op     string
	result string
}

// NewFUSEOps registers the FUSE request metrics in reg.
func NewFUSEOps(reg prometheus.Registerer) *FUSEOps {
	o := &FUSEOps{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tierfs_fuse_requests_total",
			Help: "FUSE requests by op and result (ok, or the errno's name)."}, []string{"op", "result"}),
		// 10 µs (a cached getattr) to about 40 s (a read waiting on a slow store).
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "tierfs_fuse_request_duration_seconds",
			Help: "Time tierfs took to answer FUSE requests, by op.", Buckets: prometheus.ExponentialBuckets(10e-6, 4, 12)}, []string{"op"}),
		counters: map[opResult]prometheus.Counter{},
		timers:   map[string]prometheus.Observer{},
	}
	reg.MustRegister(o.requests, o.duration)
	return o
}

// ObserveOp records one request.
func (o *FUSEOps) ObserveOp(op string, d time.Duration, st fuse.Status) {
	result := "ok"
	if !st.Ok() {
		result = unix.ErrnoName(syscall.Errno(st))
		if result == "" {
			result = "errno_other"
		}
	}
	k := opResult{op, result}
	o.mu.RLock()
	c, t := o.counters[k], o.timers[op]
	o.mu.RUnlock()
	if c == nil || t == nil {
		o.mu.Lock()
		if c = o.counters[k]; c == nil {
			c = o.requests.WithLabelValues(op, result)
			o.counters[k] = c
		}
		if t = o.timers[op]; t == nil {
			t = o.duration.WithLabelValues(op)
			o.timers[op] = t
		}
		o.mu.Unlock()
	}
	c.Inc()
	t.Observe(d.Seconds())
}
