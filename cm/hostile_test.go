package cm

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// craftDump writes a bootstrap dump whose _files is files, reading from
// source.
func craftDump(t *testing.T, source, files string) string {
	t.Helper()
	dir := t.TempDir()
	meta := `{"version":1,"from":1,"to":9,"bootstrap":true,"source":"` + source + `","cmroot":""}` + "\n"
	os.WriteFile(filepath.Join(dir, "_metadata"), []byte(meta), 0o644)
	os.WriteFile(filepath.Join(dir, "_files"), []byte(files), 0o644)
	return dir
}

func sumOf(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}

// TestHostileDumps: a dump cannot make a load write outside its target,
// and every bad line is a clear error that names the file and line.
func TestHostileDumps(t *testing.T) {
	source := t.TempDir()
	os.WriteFile(filepath.Join(source, "ok"), []byte("fine"), 0o644)
	good := sumOf("fine")
	cases := []struct {
		name, files, want string
	}{
		{"dot-dot", "../escaped#" + good + "##4#ok\n", "leaves its tree"},
		{"dot-dot inside", "a/../../escaped#" + good + "##4#ok\n", "not clean"},
		{"absolute", "/tmp/escaped#" + good + "##4#ok\n", "absolute path"},
		{"source outside", "x#" + good + "##4#../../etc/passwd\n", "source: path"},
		{"cmroot name outside", "x#" + good + "#../../x#4#-\n", "cmroot name"},
		{"bad checksum", "x#not-a-sum##4#ok\n", "bad checksum"},
		{"upper-case checksum", "x#" + strings.ToUpper(good) + "##4#ok\n", "bad checksum"},
		{"fields", "x#" + good + "\n", "fields"},
		{"negative size", "x#" + good + "##-1#ok\n", "bad size"},
		{"bad escape", "x%zz#" + good + "##4#ok\n", "bad escape"},
		{"NUL", "x%00y#" + good + "##4#ok\n", "NUL"},
		{"huge line", strings.Repeat("a", 100<<10) + "#" + good + "##4#ok\n", "too long"},
		{"through a symlink it made", "s#symlink#OUTSIDE##\ns/f#" + good + "##4#ok\n", "s/f"},
		{"wrong checksum for the source", "x#" + sumOf("other") + "##4#ok\n", "neither in the source tree"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			outside := t.TempDir()
			files := strings.ReplaceAll(c.files, "OUTSIDE", outside)
			dump := craftDump(t, source, files)
			target := filepath.Join(t.TempDir(), "target")
			_, err := Load(dump, target, LoadOptions{})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("load: %v; want an error with %q", err, c.want)
			}
			if ents, _ := os.ReadDir(outside); len(ents) != 0 {
				t.Fatalf("written outside the target: %v", ents)
			}
			if _, err := os.Stat(filepath.Join(filepath.Dir(target), "escaped")); err == nil {
				t.Fatal("written beside the target")
			}
			if strings.Contains(c.want, "bad") || c.want == "fields" || c.want == "too long" {
				if !strings.Contains(err.Error(), "_files line 1") {
					t.Fatalf("error %q does not name the file and line", err)
				}
			}
		})
	}
}

// TestLoadRefusesSymlinksInTheTarget: a symlink already in the target is
// not followed.
func TestLoadRefusesSymlinksInTheTarget(t *testing.T) {
	source := t.TempDir()
	os.WriteFile(filepath.Join(source, "f"), []byte("fine"), 0o644)
	outside := t.TempDir()
	target := t.TempDir()
	os.Symlink(outside, filepath.Join(target, "d"))
	dump := craftDump(t, source, "d/f#"+sumOf("fine")+"##4#f\n")
	if _, err := Load(dump, target, LoadOptions{}); err == nil {
		// The bootstrap replaces the symlink d by a directory: allowed,
		// as long as nothing lands in outside.
		if fi, err := os.Lstat(filepath.Join(target, "d")); err != nil || !fi.IsDir() {
			t.Fatalf("d: %v %v", fi, err)
		}
	}
	if ents, _ := os.ReadDir(outside); len(ents) != 0 {
		t.Fatalf("written through the target's symlink: %v", ents)
	}
}

func FuzzParseFileLine(f *testing.F) {
	f.Add("a/b#" + sumOf("x") + "#files/a/b_x#1#")
	f.Add("d#dir###")
	f.Add("s#symlink#%2Ftmp##")
	f.Add("p%23q#" + sumOf("") + "##0#-")
	f.Fuzz(func(t *testing.T, s string) {
		l, err := parseFileLine(s)
		if err != nil {
			return
		}
		if checkRel(l.Path) != nil {
			t.Fatalf("accepted path %q", l.Path)
		}
		back, err := parseFileLine(l.String())
		if err != nil || back != l {
			t.Fatalf("%q → %+v → %q → %+v, %v", s, l, l.String(), back, err)
		}
	})
}

func FuzzLogLine(f *testing.F) {
	f.Add([]byte("1b2c3d4e {\"id\":1,\"type\":\"create\",\"path\":\"a\"}\n"))
	f.Fuzz(func(t *testing.T, line []byte) {
		ev, err := parseLine(line, nil)
		if err == nil && (ev.ID == 0 || ev.Type == "") {
			t.Fatalf("accepted %q as %+v", line, ev)
		}
	})
}
