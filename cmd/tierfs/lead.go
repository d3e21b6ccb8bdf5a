package main

import (
	"fmt"
	"log/slog"

	"github.com/tierfs/tierfs/kafkalead"
	"github.com/tierfs/tierfs/tiering"
	"github.com/urfave/cli/v2"
)

// leadership is the mount's broker's cluster, asked who leads each
// partition (--kafka-bootstrap), seen by the tierer as a
// tiering.Leadership.
type leadership struct {
	w    *kafkalead.Watcher
	node func() string // this broker's node id, once the tierer knows it
}

func newLeadership(c *cli.Context, log *slog.Logger) (*leadership, error) {
	l := &leadership{node: func() string { return "" }}
	var props map[string]string
	if p := c.String("kafka-client-properties"); p != "" {
		var err error
		if props, err = kafkalead.ReadProperties(p); err != nil {
			return nil, &exitError{code: 2, err: fmt.Errorf("--kafka-client-properties: %w", err)}
		}
	}
	opts, err := kafkalead.ClientOptions(props)
	if err != nil {
		return nil, &exitError{code: 2, err: fmt.Errorf("--kafka-client-properties %s: %w", c.String("kafka-client-properties"), err)}
	}
	l.w, err = kafkalead.New(kafkalead.Config{
		Bootstrap: c.StringSlice("kafka-bootstrap"),
		Opts:      opts,
		NodeID:    func() string { return l.node() },
		Interval:  c.Duration("kafka-poll-interval"),
		Log:       log,
	})
	if err != nil {
		return nil, &exitError{code: 2, err: fmt.Errorf("--kafka-bootstrap: %w", err)}
	}
	log.Info("partition leadership from the Kafka cluster", "bootstrap", c.StringSlice("kafka-bootstrap"), "poll_interval", c.Duration("kafka-poll-interval"))
	return l, nil
}

// view is the tierer's view of l: nil (no leadership) when l is.
func (l *leadership) view() tiering.Leadership {
	if l == nil {
		return nil
	}
	return l
}

func (l *leadership) Close() { l.w.Close() }

func (l *leadership) Lead(partition string) (tiering.Lead, bool) {
	leader, epoch, self, known := l.w.Lead(partition)
	return tiering.Lead{Leader: leader, Epoch: epoch, Self: self}, known
}

func (l *leadership) Refresh() { l.w.Refresh() }
