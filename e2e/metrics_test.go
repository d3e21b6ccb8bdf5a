package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tierfs/tierfs/idx/kafka/kafkatest"
)

// TestMetricsAndStatusJSON: a mount with --metrics-listen serves
// Prometheus metrics that agree with tierfs status --json: segments by
// state per partition, bytes shipped, chunks fetched by a read.
func TestMetricsAndStatusJSON(t *testing.T) {
	requireRoot(t)
	dir, backing, mnt := mountDirs(t)
	bases, err := kafkatest.LogDir{Topic: "orders", Partitions: 2, Segments: 5, Batches: 30, Records: 16, ValueSize: 1000, Unflushed: 1, Age: time.Hour}.Write(backing)
	if err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	m := startMount(t, nil, "--backing", backing, "--remote", "file://"+filepath.Join(dir, "remote"), "--ship-after", "1m",
		"--local-retention-bytes", "1", "--tier-interval", "200ms", "--metrics-listen", addr, mnt)
	// Segments 0-2 of each partition ship and are evicted; 3 is not
	// flushed, 4 is active.
	waitFor(t, time.Minute, "3 segments of each partition evicted", func() bool {
		_, a := segments(t, filepath.Join(mnt, "orders-0"), "remote")
		_, b := segments(t, filepath.Join(mnt, "orders-1"), "remote")
		return a == 3 && b == 3
	}, m.Log)
	seg := filepath.Join(mnt, "orders-0", fmt.Sprintf("%020d.log", bases["orders-0"][0]))
	sums(t, filepath.Dir(seg)) // reads every file, the evicted ones from the store

	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	text := string(body)
	for _, want := range []string{
		`tierfs_segments{partition="orders-0",state="remote"} 3`,
		`tierfs_segments{partition="orders-1",state="local"} 2`,
		`tierfs_remote_copy_segments_total 6`,
		`tierfs_evicted_segments_total 6`,
		`tierfs_remote_fetch_errors_total 0`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("no %q in the scrape:\n%s", want, grepLines(text, "tierfs_"))
		}
	}
	if strings.Contains(text, "tierfs_remote_fetch_requests_total 0\n") {
		t.Error("reading evicted segments fetched nothing")
	}
	// Every FUSE request is counted and timed; reads served from the
	// store apart.
	for _, want := range []string{
		`tierfs_fuse_requests_total{op="lookup",result="ok"}`,
		`tierfs_fuse_requests_total{op="read_remote",result="ok"}`,
		`tierfs_fuse_request_duration_seconds_count{op="read_remote"}`,
		`tierfs_fuse_request_duration_seconds_count{op="read"}`,
	} {
		if !strings.Contains(text, want+" ") || strings.Contains(text, want+" 0\n") {
			t.Errorf("%s missing or 0:\n%s", want, grepLines(text, "tierfs_fuse_requests"))
		}
	}

	out, code := tierfs(t, nil, "status", "--json", mnt)
	if code != 0 {
		t.Fatalf("status --json: %s", out)
	}
	var parts []struct {
		Partition              string
		Segments               int
		Local, Shipped, Remote int
		InStore                int64 `json:"in_store_bytes"`
		Role                   struct{ Role, Why string }
		Uploaded               int `json:"uploaded_segments"`
	}
	if err := json.Unmarshal([]byte(out), &parts); err != nil {
		t.Fatalf("status --json: %v\n%s", err, out)
	}
	// A single mount with no --kafka-bootstrap: auto, and it uploaded
	// what it shipped.
	if len(parts) != 2 || parts[0].Partition != "orders-0" || parts[0].Segments != 5 || parts[0].Remote != 3 || parts[0].Local != 2 || parts[0].InStore <= 0 ||
		parts[0].Role.Role != "auto" || parts[0].Uploaded != 3 {
		t.Errorf("status --json: %+v", parts)
	}
}

// grepLines keeps the lines of text that start with prefix.
func grepLines(text, prefix string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
