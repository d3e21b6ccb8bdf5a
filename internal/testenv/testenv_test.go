package testenv

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestMissingFailsUnderCI: the same missing thing skips a test outside
// CI and fails it under CI=true, with what is missing in the failure.
func TestMissingFailsUnderCI(t *testing.T) {
	if os.Getenv("TESTENV_CHILD") != "" {
		Missing(t, "no widget on PATH")
		return
	}
	for _, ci := range []string{"", "true"} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestMissingFailsUnderCI$", "-test.v")
		cmd.Env = append(os.Environ(), "TESTENV_CHILD=1", "CI="+ci)
		out, err := cmd.CombinedOutput()
		switch {
		case ci == "" && (err != nil || !strings.Contains(string(out), "SKIP")):
			t.Errorf("outside CI: %v\n%s", err, out)
		case ci == "true" && (err == nil || !strings.Contains(string(out), "no widget on PATH")):
			t.Errorf("under CI: %v\n%s", err, out)
		}
	}
}
