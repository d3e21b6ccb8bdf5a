package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/tierfs/tierfs/tiering"
	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"
)

func cmdStatus() *cli.Command {
	return &cli.Command{
		Name:      "status",
		Usage:     "per partition: segments local, shipped and remote, bytes on local disk and in the store, ship lag",
		ArgsUsage: "MOUNTPOINT|BACKING_DIR",
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return &exitError{code: 2, err: errors.New("status takes one argument: a tierfs mount point (or a backing directory)")}
			}
			return status(c.App.Writer, c.Args().First(), time.Now(), lastErrors(c.Args().First()))
		},
	}
}

// segmentState reads a segment's state through a mount (user.tierfs.state)
// or, on a backing directory, from tierfs's own attribute.
func segmentState(path string) string {
	buf := make([]byte, 4096)
	if n, err := unix.Getxattr(path, "user.tierfs.state", buf); err == nil {
		return string(buf[:n])
	}
	n, err := unix.Getxattr(path, "trusted.tierfs", buf)
	if err != nil {
		return tiering.StateLocal
	}
	var rec struct{ State string }
	if json.Unmarshal(buf[:n], &rec) != nil || rec.State == "" {
		return "unknown"
	}
	return rec.State
}

// status prints the table; lastErr holds the running mount's last error
// per partition, if it answered.
func status(w io.Writer, root string, now time.Time, lastErr map[string]tiering.PartitionError) error {
	parts, err := tiering.Scan(root)
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(w, 2, 8, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "PARTITION\tSEGMENTS\tLOCAL\tSHIPPED\tREMOTE\tON_DISK\tIN_STORE\tOLDEST_LOCAL\tSHIP_LAG\t  LAST_ERROR")
	var tot [6]int64
	for _, p := range parts {
		var local, shipped, remote, onDisk, inStore int64
		var oldestLocal, oldestUnshipped time.Time
		for _, seg := range p.Segments {
			var st syscall.Stat_t
			if syscall.Stat(seg.Path, &st) != nil {
				continue
			}
			onDisk += st.Blocks * 512
			switch segmentState(seg.Path) {
			case tiering.StateRemote:
				remote++
				inStore += seg.Size
			case tiering.StateShipped:
				shipped++
				inStore += seg.Size
				if oldestLocal.IsZero() {
					oldestLocal = seg.Mtime
				}
			default:
				local++
				if oldestLocal.IsZero() {
					oldestLocal = seg.Mtime
				}
				if seg.Next >= 0 && oldestUnshipped.IsZero() {
					oldestUnshipped = seg.Mtime
				}
			}
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%s\t%s\t%s\t%s\t  %s\n", p.Name, len(p.Segments), local, shipped, remote,
			bytesHuman(onDisk), bytesHuman(inStore), age(now, oldestLocal), age(now, oldestUnshipped), errorCell(now, lastErr[p.Name]))
		for i, v := range []int64{int64(len(p.Segments)), local, shipped, remote, onDisk, inStore} {
			tot[i] += v
		}
	}
	fmt.Fprintf(tw, "total\t%d\t%d\t%d\t%d\t%s\t%s\t\t\t\n", tot[0], tot[1], tot[2], tot[3], bytesHuman(tot[4]), bytesHuman(tot[5]))
	return tw.Flush()
}

// errorCell is "<age> ago: <error>", cut to fit a line, or "-".
func errorCell(now time.Time, e tiering.PartitionError) string {
	if e.Err == "" {
		return "-"
	}
	msg := strings.Join(strings.Fields(e.Err), " ")
	if r := []rune(msg); len(r) > 100 {
		msg = string(r[:99]) + "…"
	}
	return age(now, e.Time) + " ago: " + msg
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
