package chunkxfer

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tierfs/tierfs/chunkxfer/store"
)

const childEnv = "TIERFS_XFER_CHILD"

// runChild is the uploader subprocess of TestUploadSurvivesKill: it
// uploads a file, printing "resumed N" when it starts with N journaled
// parts and "part N" after each confirmed part.
func runChild() int {
	a := strings.Split(os.Getenv(childEnv), "\x1f")
	url, path, key, jdir := a[0], a[1], a[2], a[3]
	cs, _ := strconv.ParseInt(a[4], 10, 64)
	creds := store.S3Options{AccessKey: os.Getenv("TIERFS_XFER_AK"), SecretKey: os.Getenv("TIERFS_XFER_SK")}
	s, err := store.Open(context.Background(), url, creds)
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	up := &Uploader{Store: s, JournalDir: jdir, ChunkSize: cs, Parallel: 3}
	up.afterPart = func(n int32) {
		fmt.Printf("part %d\n", n)
		time.Sleep(15 * time.Millisecond) // spread the parts over time for the killer
	}
	var hdr uploadHeader
	parts := 0
	readJournal(journalPath(jdir, "upload", key), &hdr, func(json.RawMessage) error { parts++; return nil })
	fmt.Printf("resumed %d\n", parts)
	if _, err := up.Upload(context.Background(), path, key); err != nil {
		fmt.Println("error", err)
		return 1
	}
	fmt.Println("done")
	return 0
}

// TestUploadSurvivesKill kills the uploader subprocess with SIGKILL at
// random moments, 20 times, then lets it finish: the object must be
// byte-identical, no multipart upload may be left, and every part a
// killed run confirmed must still count when the next run resumes.
func TestUploadSurvivesKill(t *testing.T) {
	for _, b := range backends(t) {
		if b.url == "" {
			continue // the in-memory store does not outlive a process
		}
		t.Run(b.name, func(t *testing.T) {
			dir := t.TempDir()
			cs := b.chunk
			nParts := int64(24)
			if b.name == "s3" {
				nParts = 10
			}
			path := filepath.Join(dir, "00000000000000000000.log")
			want := randomFile(t, path, nParts*cs-cs/3, 77)
			key := "kill/00000000000000000000.log"
			jdir := filepath.Join(dir, "journal")
			r := rand.New(rand.NewPCG(42, 1))
			resumedAny := false
			confirmed := 0
			for run := range 21 {
				cmd := exec.Command(os.Args[0], "-test.run=^$")
				cmd.Env = append(os.Environ(),
					childEnv+"="+strings.Join([]string{b.url, path, key, jdir, fmt.Sprint(cs)}, "\x1f"),
					"TIERFS_XFER_AK="+b.creds.AccessKey, "TIERFS_XFER_SK="+b.creds.SecretKey)
				var out bytes.Buffer
				cmd.Stdout = &out
				cmd.Stderr = os.Stderr
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				last := run == 20
				if !last {
					time.Sleep(time.Duration(r.Int64N(int64(600 * time.Millisecond))))
					cmd.Process.Signal(syscall.SIGKILL)
				}
				err := cmd.Wait()
				lines := parseChild(out.String())
				if lines.resumed < 0 {
					// Killed before it could say anything.
					continue
				}
				if lines.resumed < confirmed {
					t.Fatalf("run %d resumed with %d parts; the killed run before it confirmed %d", run, lines.resumed, confirmed)
				}
				if lines.resumed > 0 {
					resumedAny = true
				}
				if lines.done {
					confirmed = 0
				} else {
					confirmed = max(confirmed, lines.resumed) + lines.parts
				}
				if last && (err != nil || !lines.done) {
					t.Fatalf("final run: %v\n%s", err, out.String())
				}
				if lines.err != "" && !last {
					t.Logf("run %d: %s", run, lines.err)
				}
			}
			if !resumedAny {
				t.Fatal("no run resumed from a journal")
			}
			ctx := context.Background()
			got, err := store.ReadAll(b.s.Get(ctx, key, 0, -1, store.GetOptions{}))
			if err != nil || !bytes.Equal(got, want) {
				t.Fatalf("object: %d bytes, %v", len(got), err)
			}
			m, err := LoadManifest(ctx, b.s, key)
			if err != nil {
				t.Fatal(err)
			}
			if err := Verify(ctx, b.s, m); err != nil {
				t.Fatal(err)
			}
			noUploads(t, b.s)
		})
	}
}

type childLines struct {
	resumed int
	parts   int
	done    bool
	err     string
}

func parseChild(out string) childLines {
	l := childLines{resumed: -1}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) == 2 && f[0] == "resumed":
			l.resumed, _ = strconv.Atoi(f[1])
		case len(f) == 2 && f[0] == "part":
			l.parts++
		case len(f) == 1 && f[0] == "done":
			l.done = true
		case len(f) > 0 && f[0] == "error":
			l.err = sc.Text()
		}
	}
	return l
}
