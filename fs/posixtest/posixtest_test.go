package posixtest

import (
	"os"
	"strings"
	"syscall"
	"testing"
)

func TestDiff(t *testing.T) {
	a, b := &Transcript{}, &Transcript{}
	a.Err("open", nil)
	b.Err("open", nil)
	if d := Diff(a, b); d != "" {
		t.Fatalf("equal transcripts differ: %s", d)
	}
	a.Err("rename", syscall.EXDEV)
	b.Err("rename", nil)
	d := Diff(a, b)
	if !strings.Contains(d, "EXDEV") || !strings.Contains(d, "rename: ok") {
		t.Fatalf("diff does not show both sides: %q", d)
	}
	a.Say("extra")
	if Diff(a, b) == "" {
		t.Fatal("a longer transcript compared equal")
	}
}

// TestCasesOnPlainDirectory runs the suite twice on plain directories: a
// case whose transcript is not reproducible would make every comparison
// with a mount flaky, so it is caught here, without a mount.
func TestCasesOnPlainDirectory(t *testing.T) {
	for _, c := range Cases() {
		t.Run(c.Name, func(t *testing.T) {
			if testing.Short() && strings.HasPrefix(c.Name, "rename-over-open") {
				t.Skip("slow")
			}
			x, y := &Transcript{}, &Transcript{}
			c.Run(t, t.TempDir(), x)
			c.Run(t, t.TempDir(), y)
			if len(x.Lines()) == 0 {
				t.Fatal("case observed nothing")
			}
			if d := Diff(x, y); d != "" {
				t.Fatalf("not reproducible:\n%s", d)
			}
		})
	}
}

func TestMain(m *testing.M) {
	RunHelperIfAsked()
	code := m.Run()
	RemoveRunner()
	os.Exit(code)
}
