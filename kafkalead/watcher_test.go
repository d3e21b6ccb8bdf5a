package kafkalead

import (
	"context"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// watcherWithProps is the watcher of node 0 of c, with the client
// options of a client properties file's text.
func watcherWithProps(t *testing.T, c *kfake.Cluster, text string) *Watcher {
	t.Helper()
	props, err := ParseProperties("client.properties", []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	opts, err := ClientOptions(props)
	if err != nil {
		t.Fatal(err)
	}
	return newWatcher(t, c, 0, nil, opts...)
}

func newWatcher(t *testing.T, c *kfake.Cluster, node int32, now func() time.Time, opts ...kgo.Opt) *Watcher {
	t.Helper()
	w, err := New(Config{Bootstrap: c.ListenAddrs(), Opts: opts, Interval: time.Second, Now: now,
		NodeID: func() string { return strconv.Itoa(int(node)) }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Close)
	return w
}

// TestWatcherFollowsLeadership: a cluster of three brokers; each
// broker's watcher says which partitions it leads, and a move of a
// partition's leader shows at the next poll with its new epoch.
func TestWatcherFollowsLeadership(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(3), kfake.SeedTopics(6, "orders"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	var ws []*Watcher
	for node := int32(0); node < 3; node++ {
		w := newWatcher(t, c, node, nil)
		if _, _, _, known := w.Lead("orders-0"); known {
			t.Fatal("known before the first answer")
		}
		if err := w.Poll(ctx); err != nil {
			t.Fatal(err)
		}
		ws = append(ws, w)
	}
	for p := int32(0); p < 6; p++ {
		name := "orders-" + strconv.Itoa(int(p))
		want := c.LeaderFor("orders", p)
		leads := 0
		for node, w := range ws {
			leader, _, self, known := w.Lead(name)
			if !known || leader != want || self != (int32(node) == want) {
				t.Fatalf("broker %d on %s: leader %d self %v known %v; the cluster says %d", node, name, leader, self, known, want)
			}
			if self {
				leads++
			}
		}
		if leads != 1 {
			t.Fatalf("%s: %d brokers lead it", name, leads)
		}
	}
	if _, _, _, known := ws[0].Lead("payments-0"); known {
		t.Fatal("a partition the cluster does not have is known")
	}
	_, epoch, _, _ := ws[0].Lead("orders-2")
	to := (c.LeaderFor("orders", 2) + 1) % 3
	if err := c.MoveTopicPartition("orders", 2, to); err != nil {
		t.Fatal(err)
	}
	for _, w := range ws {
		w.Poll(ctx)
	}
	leader, epoch2, self, _ := ws[to].Lead("orders-2")
	if leader != to || !self || epoch2 <= epoch {
		t.Fatalf("after the move: leader %d (want %d) self %v epoch %d (was %d)", leader, to, self, epoch2, epoch)
	}
}

// TestWatcherForgetsAStaleAnswer: an answer older than three intervals
// counts as none (a mount whose broker is gone leads nothing), and an
// unknown node id leads nothing.
func TestWatcherForgetsAStaleAnswer(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "orders"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var now atomic.Int64
	now.Store(time.Now().UnixNano())
	w := newWatcher(t, c, 0, func() time.Time { return time.Unix(0, now.Load()) })
	if err := w.Poll(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, _, self, known := w.Lead("orders-0"); !known || !self {
		t.Fatal("the only broker does not lead")
	}
	now.Add(int64(4 * time.Second))
	if _, _, _, known := w.Lead("orders-0"); known {
		t.Fatal("a four-interval-old answer is still known")
	}
	w.cfg.NodeID = func() string { return "" }
	now.Add(-int64(4 * time.Second))
	if _, _, _, known := w.Lead("orders-0"); known {
		t.Fatal("known with no node id")
	}
}

// TestWatcherRunPollsAndRefreshes: Run answers at once, then every
// interval, and at once again on Refresh.
func TestWatcherRunPollsAndRefreshes(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(2), kfake.SeedTopics(1, "orders"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	w, err := New(Config{Bootstrap: c.ListenAddrs(), Interval: time.Hour, NodeID: func() string { return "1" }})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go w.Run(ctx)
	polls := func() int64 {
		w.mu.Lock()
		defer w.mu.Unlock()
		return w.polls
	}
	waitUntil(t, "the first answer", func() bool { return polls() == 1 })
	to := 1 - c.LeaderFor("orders", 0)
	c.MoveTopicPartition("orders", 0, to)
	w.Refresh()
	waitUntil(t, "the refreshed answer", func() bool { l, _, _, _ := w.Lead("orders-0"); return l == to })
	if s := w.Status(); s.Partitions != 1 || s.Err != "" || s.Asked.IsZero() {
		t.Fatalf("status: %+v", s)
	}
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("no %s in 10s", what)
}

// TestWatcherWithSASL: a cluster that takes SASL only is asked with the
// user and password of a client properties file, PLAIN and SCRAM; a
// wrong password gets no answer.
func TestWatcherWithSASL(t *testing.T) {
	for _, mech := range []string{"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"} {
		t.Run(mech, func(t *testing.T) {
			c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "orders"), kfake.EnableSASL(), kfake.Superuser(mech, "tierfs", "s3cret"))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			for pass, ok := range map[string]bool{"s3cret": true, "wrong": false} {
				w := watcherWithProps(t, c, "security.protocol=SASL_PLAINTEXT\nsasl.mechanism="+mech+
					"\nsasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required \\\n  username=\"tierfs\" password=\""+pass+"\";\n")
				err = w.Poll(context.Background())
				if (err == nil) != ok {
					t.Fatalf("password %q: %v", pass, err)
				}
				if _, _, self, _ := w.Lead("orders-0"); self != ok {
					t.Fatalf("password %q: leads %v", pass, self)
				}
			}
		})
	}
}

func TestClientOptionsRefuses(t *testing.T) {
	for _, c := range []struct{ props, want string }{
		{"security.protocol=KERBEROS", "security.protocol"},
		{"security.protocol=SASL_PLAINTEXT\nsasl.mechanism=GSSAPI\nsasl.jaas.config=x required username=\"a\";", "sasl.mechanism"},
		{"security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN", "username"},
		{"security.protocol=SSL\nssl.truststore.type=JKS\nssl.truststore.location=/etc/kafka/trust.jks", "PEM"},
		{"security.protocol=SSL\nssl.truststore.location=/nonexistent.pem", "ssl.truststore.location"},
		{"security.protocol=SSL\nssl.truststore.certificates=not a certificate", "no PEM certificate"},
	} {
		props, err := ParseProperties("p", []byte(c.props))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ClientOptions(props); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want an error about %s", c.props, err, c.want)
		}
	}
	if _, err := ParseProperties("p", []byte("a=1\n= no key\n")); err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Errorf("a line with no key: %v", err)
	}
	props, err := ParseProperties("p", []byte("# comment\n! also\n  a = 1\nb:2\nc=x\\\n  y\nd e f\nlone\nesc\\=aped=tab\\there\\u0041\\\\\nclient.id=ignored\n"))
	want := map[string]string{"a": "1", "b": "2", "c": "xy", "d": "e f", "lone": "", "esc=aped": "tab\there" + "A\\", "client.id": "ignored"}
	if err != nil || len(props) != len(want) {
		t.Fatalf("%q %v", props, err)
	}
	for k, v := range want {
		if props[k] != v {
			t.Errorf("%s: %q, want %q", k, props[k], v)
		}
	}
	if opts, err := ClientOptions(props); err != nil || len(opts) != 0 {
		t.Fatalf("plaintext: %d options, %v", len(opts), err)
	}
}
