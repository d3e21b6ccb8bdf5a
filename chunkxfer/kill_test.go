package chunkxfer

import (
	"bufio"
	"bytes"
	"context"
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
// uploads a file, printing "resumed N" when it knows how many confirmed
// parts it kept ("fresh" first when it found no journal to resume) and
// "part N" after each confirmed part.
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
	up.onStart = func(resumed int, fresh bool) {
		if fresh {
			fmt.Printf("fresh\n")
		}
		fmt.Printf("resumed %d\n", resumed)
	}
	if _, err := up.Upload(context.Background(), path, key); err != nil {
		fmt.Println("error", err)
		return 1
	}
	fmt.Println("done")
	return 0
}

// TestUploadSurvivesKill kills the uploader subprocess with SIGKILL at a
// random part (and sometimes a little later, into completing the upload
// and writing the manifest), 20 times, resuming each time: every object
// must end byte-identical with a verifying manifest, no multipart upload
// may be left, and no part a killed run confirmed may be uploaded again.
func TestUploadSurvivesKill(t *testing.T) {
	for _, b := range backends(t) {
		if b.url == "" {
			continue // the in-memory store does not outlive a process
		}
		t.Run(b.name, func(t *testing.T) {
			ctx := context.Background()
			dir := t.TempDir()
			cs := b.chunk
			nParts := 16
			if b.name == "s3" {
				nParts = 8
			}
			path := filepath.Join(dir, "00000000000000000000.log")
			want := randomFile(t, path, int64(nParts)*cs-cs/3, 77)
			key := "kill/00000000000000000000.log"
			jdir := filepath.Join(dir, "journal")
			seed := uint64(time.Now().UnixNano())
			t.Logf("kill seed %d", seed)
			r := rand.New(rand.NewPCG(seed, 1))
			child := func() (*exec.Cmd, *bufio.Scanner) {
				cmd := exec.Command(os.Args[0], "-test.run=^$")
				cmd.Env = append(os.Environ(),
					childEnv+"="+strings.Join([]string{b.url, path, key, jdir, fmt.Sprint(cs)}, "\x1f"),
					"TIERFS_XFER_AK="+b.creds.AccessKey, "TIERFS_XFER_SK="+b.creds.SecretKey)
				cmd.Stderr = os.Stderr
				out, err := cmd.StdoutPipe()
				if err != nil {
					t.Fatal(err)
				}
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				return cmd, bufio.NewScanner(out)
			}
			finishedEarly := 0
			for cycle := range 20 {
				killAt := 1 + r.IntN(nParts)
				extra := time.Duration(0)
				if r.IntN(3) == 0 {
					extra = time.Duration(r.Int64N(int64(40 * time.Millisecond)))
				}
				cmd, sc := child()
				var first childLines
				for first.parts < killAt && sc.Scan() {
					first.add(sc.Text())
				}
				if extra > 0 {
					time.Sleep(extra)
				}
				cmd.Process.Signal(syscall.SIGKILL)
				for sc.Scan() {
					first.add(sc.Text()) // what it printed before dying
				}
				cmd.Wait()
				if first.done {
					finishedEarly++
				}
				cmd, sc = child()
				var second childLines
				for sc.Scan() {
					second.add(sc.Text())
				}
				if err := cmd.Wait(); err != nil || !second.done {
					t.Fatalf("cycle %d: resumed run: %v %s", cycle, err, second.err)
				}
				// Killed with every part confirmed, the run may have been
				// completing the upload; a store that was still completing
				// it (versitygw assembles the object after the upload is
				// gone) makes the next run start over, which is safe.
				completing := first.resumed+first.parts == nParts && second.fresh
				if !first.done && !completing && second.resumed < first.resumed+first.parts {
					t.Fatalf("cycle %d: killed after %d confirmed parts (had %d), the next run kept %d (fresh %v)",
						cycle, first.parts, first.resumed, second.resumed, second.fresh)
				}
				got, err := store.ReadAll(b.s.Get(ctx, key, 0, -1, store.GetOptions{}))
				if err != nil || !bytes.Equal(got, want) {
					t.Fatalf("cycle %d: object: %d bytes, %v", cycle, len(got), err)
				}
				m, err := LoadManifest(ctx, b.s, key)
				if err != nil {
					t.Fatalf("cycle %d: %v", cycle, err)
				}
				if err := Verify(ctx, b.s, m); err != nil {
					t.Fatalf("cycle %d: %v", cycle, err)
				}
				noUploads(t, b.s)
				if ents, _ := os.ReadDir(jdir); len(ents) != 0 {
					t.Fatalf("cycle %d: journals left: %v", cycle, ents)
				}
				b.s.Delete(ctx, key)
				b.s.Delete(ctx, ManifestKey(key))
			}
			t.Logf("%d of 20 killed runs had finished before the kill", finishedEarly)
		})
	}
}

type childLines struct {
	resumed int
	parts   int
	done    bool
	fresh   bool
	err     string
}

func (l *childLines) add(line string) {
	{
		f := strings.Fields(line)
		switch {
		case len(f) == 2 && f[0] == "resumed":
			l.resumed, _ = strconv.Atoi(f[1])
		case len(f) == 2 && f[0] == "part":
			l.parts++
		case len(f) == 1 && f[0] == "fresh":
			l.fresh = true
		case len(f) == 1 && f[0] == "done":
			l.done = true
		case len(f) > 0 && f[0] == "error":
			l.err = line
		}
	}
}
