// Package testenv decides what a test does when this machine lacks
// something it needs (root, /dev/fuse, java, the Kafka jars, versitygw,
// a file system feature): on a developer's machine it is skipped, and
// under CI (CI=true, as .ci/run runs) it fails, naming what is missing,
// so that CI cannot pass by skipping what it should have run.
package testenv

import (
	"fmt"
	"os"
	"testing"
)

// InCI says whether the tests run under CI (CI=true).
func InCI() bool { return os.Getenv("CI") == "true" }

// Missing skips t, or under CI fails it, saying what is missing.
func Missing(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if InCI() {
		t.Fatalf("CI=true, and this test cannot run here: %s", msg)
	}
	t.Skip(msg)
}
