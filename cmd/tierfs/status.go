package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/tierfs/tierfs/internal/tiered"
	"github.com/tierfs/tierfs/tiering"
	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"
)

func cmdStatus() *cli.Command {
	return &cli.Command{
		Name:      "status",
		Usage:     "per partition: segments local, shipped and remote, bytes on local disk and in the store, ship lag",
		ArgsUsage: "MOUNTPOINT|BACKING_DIR",
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "json", Usage: "print JSON (one object per partition) instead of a table"},
			&cli.BoolFlag{Name: "segments", Usage: "with --json: each shipped segment of each partition, and who shipped it (the brokers whose objects hold its bytes)"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return &exitError{code: 2, err: errors.New("status takes one argument: a tierfs mount point (or a backing directory)")}
			}
			root := c.Args().First()
			if c.Bool("json") {
				return statusJSON(c.App.Writer, root, lastErrors(root), c.Bool("segments"))
			}
			if c.Bool("segments") {
				return &exitError{code: 2, err: errors.New("--segments is a part of --json")}
			}
			if err := status(c.App.Writer, root, time.Now(), lastErrors(root)); err != nil {
				return err
			}
			printReturns(c.App.Writer, returns(root))
			return nil
		},
	}
}

// partitionJSON is one partition in tierfs status --json.
type partitionJSON struct {
	tiering.PartitionSummary
	LastError *tiering.PartitionError `json:"last_error,omitempty"`
	*partitionInfo
}

// partitionsArgs asks a mount about some of its partitions.
type partitionsArgs struct {
	Names    []string `json:"names"`
	Segments bool     `json:"segments"`
}

// partitionInfo is what a mount says of one partition: its role now,
// and who shipped its segments.
type partitionInfo struct {
	Role     tiering.PartitionRole `json:"role"`
	Uploaded int                   `json:"uploaded_segments"` // segments this mount uploaded (some of)
	Mapped   int                   `json:"mapped_segments"`   // segments mapped onto other brokers' objects alone
	Origins  []tiering.Origin      `json:"origins,omitempty"` // with --segments
}

func partitionInfos(t *tiering.Tierer, a partitionsArgs) (map[string]partitionInfo, error) {
	out := make(map[string]partitionInfo, len(a.Names))
	for _, name := range a.Names {
		p := partitionInfo{Role: t.PartitionRole(name)}
		origins, err := t.Origins(name)
		if err != nil {
			return nil, err
		}
		for _, o := range origins {
			if o.Uploaded {
				p.Uploaded++
			} else {
				p.Mapped++
			}
		}
		if a.Segments {
			p.Origins = origins
		}
		out[name] = p
	}
	return out, nil
}

// askPartitions asks the mount at mountpoint about the partitions of
// sums; nil when it does not answer.
func askPartitions(mountpoint string, sums []tiering.PartitionSummary, segments bool) map[string]partitionInfo {
	a := partitionsArgs{Segments: segments}
	for _, s := range sums {
		a.Names = append(a.Names, s.Name)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out map[string]partitionInfo
	if _, err := callMount(ctx, mountpoint, "partitions", a, &out); err != nil {
		return nil
	}
	return out
}

// summarize is the partitions' summary: from the mount at root, which
// knows the records of its segments, or else read through root.
func summarize(root string) ([]tiering.PartitionSummary, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var sums []tiering.PartitionSummary
	if _, err := callMount(ctx, root, "summary", struct{}{}, &sums); err == nil {
		return sums, nil
	}
	return tiering.Summarize(root, segmentState)
}

func statusJSON(w io.Writer, root string, lastErr map[string]tiering.PartitionError, segments bool) error {
	sums, err := summarize(root)
	if err != nil {
		return err
	}
	infos := askPartitions(root, sums, segments)
	out := make([]partitionJSON, 0, len(sums))
	for _, s := range sums {
		p := partitionJSON{PartitionSummary: s}
		if e, ok := lastErr[s.Name]; ok {
			p.LastError = &e
		}
		if in, ok := infos[s.Name]; ok {
			p.partitionInfo = &in
		}
		out = append(out, p)
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

// segmentState reads a segment's state through a mount (user.tierfs.state)
// or, on a backing directory, from tierfs's own attribute; a state it
// cannot read counts as local.
func segmentState(seg tiering.Segment) tiered.State {
	path := seg.LogPath()
	buf := make([]byte, 4096)
	if n, err := unix.Getxattr(path, tiered.XattrState, buf); err == nil {
		st, _ := tiered.ParseState(string(buf[:n]))
		return st
	}
	st, ok, err := tiering.RecordState(path)
	if err != nil || !ok {
		return tiering.StateLocal
	}
	return st
}

// status prints the table; lastErr holds the running mount's last error
// per partition, if it answered.
func status(w io.Writer, root string, now time.Time, lastErr map[string]tiering.PartitionError) error {
	sums, err := summarize(root)
	if err != nil {
		return err
	}
	infos := askPartitions(root, sums, false)
	tw := tabwriter.NewWriter(w, 2, 8, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "PARTITION\tROLE\tSEGMENTS\tLOCAL\tSHIPPED\tREMOTE\tON_DISK\tIN_STORE\tOLDEST_LOCAL\tSHIP_LAG\t  LAST_ERROR")
	var tot tiering.PartitionSummary
	for _, s := range sums {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%s\t%s\t%s\t%s\t  %s\n", s.Name, roleCell(infos, s.Name), s.Segments, s.Local, s.Shipped, s.Remote,
			bytesHuman(s.OnDisk), bytesHuman(s.InStore), age(now, s.OldestLocal), age(now, s.OldestUnshipped), errorCell(now, lastErr[s.Name]))
		tot.Segments += s.Segments
		tot.Local += s.Local
		tot.Shipped += s.Shipped
		tot.Remote += s.Remote
		tot.OnDisk += s.OnDisk
		tot.InStore += s.InStore
	}
	fmt.Fprintf(tw, "total\t\t%d\t%d\t%d\t%d\t%s\t%s\t\t\t\n", tot.Segments, tot.Local, tot.Shipped, tot.Remote, bytesHuman(tot.OnDisk), bytesHuman(tot.InStore))
	return tw.Flush()
}

// roleCell is a partition's role in the table: "leader e7" (the
// broker leads it, in leader epoch 7), "follower 2 e7" (broker 2 leads
// it), "follower", "leader" or "auto" (by hand, or no leadership known),
// "-" when no mount answered.
func roleCell(infos map[string]partitionInfo, name string) string {
	in, ok := infos[name]
	switch {
	case !ok:
		return "-"
	case in.Role.Lead == nil:
		return string(in.Role.Role)
	case in.Role.Lead.Self:
		return fmt.Sprintf("leader e%d", in.Role.Lead.Epoch)
	}
	return fmt.Sprintf("follower %d e%d", in.Role.Lead.Leader, in.Role.Lead.Epoch)
}

// errorCell is "<age> ago: <error>", or, with no error, why a segment
// is kept local ("kept local: <segment>: <why>"), cut to fit a line, or
// "-".
func errorCell(now time.Time, e tiering.PartitionError) string {
	if e.Err == "" {
		if e.Kept != "" {
			return cut("kept local: " + e.Kept)
		}
		return "-"
	}
	return age(now, e.Time) + " ago: " + cut(e.Err)
}

func cut(msg string) string {
	msg = strings.Join(strings.Fields(msg), " ")
	if r := []rune(msg); len(r) > 100 {
		msg = string(r[:99]) + "…"
	}
	return msg
}

// age is how long ago t was, "-" for none. SHIP_LAG is the age of the
// oldest rolled segment not yet shipped (it includes --ship-after).
func age(now, t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return now.Sub(t).Round(time.Second).String()
}

func bytesHuman(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// printReturns says what brought evicted segments back to local disk
// since the mount started: moves (a write, or a truncate to another
// size) and tierfs hydrate. Nothing else does (a broker's restart
// opens, syncs and closes segments without changing them).
func printReturns(w io.Writer, rs []returnCount) {
	if rs == nil {
		return
	}
	var parts []string
	var segs int64
	for _, r := range rs {
		segs += r.Segments
		if r.Segments > 0 || r.Moves > 0 {
			parts = append(parts, fmt.Sprintf("%s %d (%s)", r.Cause, r.Segments, bytesHuman(r.Bytes)))
		}
	}
	if segs == 0 && len(parts) == 0 {
		fmt.Fprintln(w, "\nbrought back to local disk since the mount started: none")
		return
	}
	fmt.Fprintf(w, "\nbrought back to local disk since the mount started, by cause: %s\n", strings.Join(parts, ", "))
}
