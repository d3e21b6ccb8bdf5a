package kafka

import (
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"testing"
)

// TestFreePortReserved: a port FreePort gave is not given again, in this
// process (even after a collection) nor in another one, until this
// process exits.
func TestFreePortReserved(t *testing.T) {
	if p := os.Getenv("TIERFS_TEST_RESERVE_PORT"); p != "" {
		port, _ := strconv.Atoi(p)
		if reservePort(port) {
			os.Exit(3)
		}
		os.Exit(0)
	}
	port, err := FreePort()
	if err != nil {
		t.Fatal(err)
	}
	runtime.GC()
	runtime.GC()
	if reservePort(port) {
		t.Fatalf("port %d reserved twice in one process", port)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestFreePortReserved$")
	cmd.Env = append(os.Environ(), "TIERFS_TEST_RESERVE_PORT="+strconv.Itoa(port))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("another process reserved port %d too: %v\n%s", port, err, out)
	}
}
