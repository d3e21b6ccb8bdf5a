package fs

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"testing"
	"time"
)

// observedListings is how many READDIR and READDIRPLUS requests a server
// that observed its requests answered (its OBSERVED line, at exit).
func observedListings(t *testing.T, log string) int {
	t.Helper()
	line := lastLine(log, "OBSERVED")
	if line == "" {
		t.Fatalf("the server printed no request counts:\n%s", log)
	}
	n := 0
	for _, m := range regexp.MustCompile(`\b(readdir|readdirplus):(\d+)`).FindAllStringSubmatch(line, -1) {
		k, _ := strconv.Atoi(m[2])
		n += k
	}
	return n
}

// A directory listed again is served by the kernel from the listing it
// kept: listing a directory of 400 names six times costs tierfs the
// requests of one listing. (A broker lists each partition directory
// about seven times at start-up.)
func TestDirListingsCached(t *testing.T) {
	requireMount(t)
	listings := func(times int) int {
		backing := filepath.Join(t.TempDir(), "backing")
		dir := filepath.Join(backing, "topic-0")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for i := range 400 {
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("%020d.log", i)), nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		t.Setenv(serveObserveEnv, "1")
		srv := mountTest(t, backing, false)
		for range times {
			ents, err := os.ReadDir(filepath.Join(srv.Mountpoint, "topic-0"))
			if err != nil {
				t.Fatal(err)
			}
			if len(ents) != 400 {
				t.Fatalf("listed %d names, want 400", len(ents))
			}
		}
		srv.Stop(t)
		return observedListings(t, srv.Log())
	}
	once, six := listings(1), listings(6)
	if once < 2 {
		t.Fatalf("one listing of 400 names took %d requests: the test cannot tell a cached listing", once)
	}
	if six != once {
		t.Errorf("six listings took %d READDIR(PLUS) requests, one took %d: the kernel did not keep the listing", six, once)
	}
}

// A kept listing never hides a change: one made through the mount shows
// at once, one made in the backing directory behind the mount's back
// within the attribute timeout (a second here).
func TestDirListingFollowsChanges(t *testing.T) {
	backing := filepath.Join(t.TempDir(), "backing")
	if err := os.MkdirAll(filepath.Join(backing, "p"), 0o755); err != nil {
		t.Fatal(err)
	}
	srv := mountTest(t, backing, true)
	dir := filepath.Join(srv.Mountpoint, "p")
	names := func() []string {
		t.Helper()
		ents, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, e := range ents {
			out = append(out, e.Name())
		}
		return out
	}
	expect := func(want ...string) {
		t.Helper()
		if got := names(); !slices.Equal(got, want) {
			t.Fatalf("listed %q, want %q", got, want)
		}
	}
	expect()
	for _, n := range []string{"a", "b"} {
		if err := os.WriteFile(filepath.Join(dir, n), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		names() // kept
	}
	expect("a", "b")
	if err := os.Rename(filepath.Join(dir, "a"), filepath.Join(dir, "c")); err != nil {
		t.Fatal(err)
	}
	expect("b", "c")
	if err := os.Remove(filepath.Join(dir, "b")); err != nil {
		t.Fatal(err)
	}
	expect("c")
	if err := os.Mkdir(filepath.Join(dir, "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	expect("c", "d")

	// Behind the mount's back.
	if err := os.WriteFile(filepath.Join(backing, "p", "e"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(backing, "p", "c")); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		got := names()
		if slices.Equal(got, []string{"d", "e"}) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("5 s after changes behind the mount, it lists %q, want [d e]", got)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// A listing with attributes (READDIRPLUS) sends the names the kernel
// holds already without attributes: the kernel keeps its own, so what a
// listing shows after changes through the mount (a write that grew a
// file, a rename over a name, a create that drops the kept listing) is
// what the backing directory holds, for names seen before and new ones.
func TestDirListingOfKnownNames(t *testing.T) {
	backing := filepath.Join(t.TempDir(), "backing")
	if err := os.MkdirAll(filepath.Join(backing, "p"), 0o755); err != nil {
		t.Fatal(err)
	}
	for i := range 300 {
		if err := os.WriteFile(filepath.Join(backing, "p", fmt.Sprintf("f%03d", i)), make([]byte, i), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	srv := mountTest(t, backing, true)
	dir := filepath.Join(srv.Mountpoint, "p")
	// listed checks a listing with each entry's attributes against the
	// backing directory.
	listed := func(what string) {
		t.Helper()
		ents, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		want, err := os.ReadDir(filepath.Join(backing, "p"))
		if err != nil {
			t.Fatal(err)
		}
		if len(ents) != len(want) {
			t.Fatalf("%s: %d names listed, the backing directory has %d", what, len(ents), len(want))
		}
		for i, e := range ents {
			fi, err := e.Info()
			if err != nil {
				t.Fatalf("%s: %s: %v", what, e.Name(), err)
			}
			bi, err := want[i].Info()
			if err != nil {
				t.Fatal(err)
			}
			if e.Name() != bi.Name() || fi.Size() != bi.Size() || fi.Mode() != bi.Mode() || !fi.ModTime().Equal(bi.ModTime()) {
				t.Fatalf("%s: listed %s %d %v %v, the backing directory has %s %d %v %v", what, e.Name(), fi.Size(), fi.Mode(), fi.ModTime(), bi.Name(), bi.Size(), bi.Mode(), bi.ModTime())
			}
		}
	}
	listed("first listing")
	f, err := os.OpenFile(filepath.Join(dir, "f007"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(make([]byte, 5000)); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := os.Chmod(filepath.Join(dir, "f008"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(dir, "f009"), filepath.Join(dir, "f010")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "new"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	listed("after a write, a chmod, a rename over a name and a create")
}
