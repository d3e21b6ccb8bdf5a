package fs

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tierfs/tierfs/fs/posixtest"
)

// TestConformance runs every posixtest case on a plain directory and on a
// tierfs mount, with and without kernel passthrough, and requires the same
// observations.
func TestConformance(t *testing.T) {
	for _, variant := range []struct {
		name        string
		passthrough bool
		maxNodeFds  int
		skip        map[string]string
		observe     bool // every request goes through the Config.Ops wrapper
		cm          bool // change management on
	}{
		{"passthrough", true, 0, nil, false, false},
		{"fuse-io", false, 0, nil, false, false},
		// Two descriptors: almost every node is reached by file handle.
		{"handles", true, 2, map[string]string{
			"rename-over-open": "past the descriptor budget an open racing two rename-overs can get ESTALE (documented in README)",
		}, false, false},
		{"observed", false, 0, nil, true, false},
		// Change management retains what every unlink, rename-over,
		// truncate and overwrite loses: none of it may show.
		{"cm", true, 0, nil, false, true},
	} {
		t.Run(variant.name, func(t *testing.T) {
			if variant.observe {
				t.Setenv(serveObserveEnv, "1")
			}
			if variant.cm {
				t.Setenv(serveCMEnv, "1")
			}
			srv := mountTestWith(t, "", variant.passthrough, variant.maxNodeFds)
			mnt := srv.Mountpoint
			if variant.passthrough && !srv.Passthrough {
				t.Fatalf("passthrough requested but off:\n%s", srv.Log())
			}
			native := t.TempDir()
			for _, c := range posixtest.Cases() {
				t.Run(c.Name, func(t *testing.T) {
					if why, ok := variant.skip[c.Name]; ok {
						t.Skip(why)
					}
					want := runCase(t, c, filepath.Join(native, c.Name))
					got := runCase(t, c, filepath.Join(mnt, c.Name))
					if d := posixtest.Diff(want, got); d != "" {
						t.Errorf("mount differs from native:\n%s", d)
					}
				})
			}
			if srv.PassthroughLost() {
				t.Errorf("passthrough was lost during the run")
			}
			if variant.observe {
				srv.Stop(t)
				log := srv.Log()
				for _, op := range []string{"lookup:", "create:", "open:", "read:", "writev:", "setattr:", "rename:", "unlink:", "readdirplus:", "fsync:", "getxattr:ENODATA:", "rename:ENOTEMPTY:"} {
					if !strings.Contains(log, " "+op) && !strings.Contains(log, "["+op) {
						t.Errorf("the observer saw no %s request: %s", strings.TrimSuffix(op, ":"), lastLine(log, "OBSERVED"))
					}
				}
			}
		})
	}
}

// lastLine is the last line of log that contains s.
func lastLine(log, s string) string {
	lines := strings.Split(log, "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.Contains(lines[i], s) {
			return lines[i]
		}
	}
	return "(no " + s + " line)"
}

func runCase(t *testing.T, c posixtest.Case, dir string) *posixtest.Transcript {
	t.Helper()
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	tr := &posixtest.Transcript{}
	c.Run(t, dir, tr)
	return tr
}
