package main

import (
	"net"
	"path/filepath"
	"testing"
	"time"
)

func TestSdNotify(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "")
	if err := sdNotify("READY=1"); err != nil {
		t.Fatalf("without a socket: %v", err)
	}
	for _, addr := range []string{filepath.Join(t.TempDir(), "notify"), "@tierfs-test-notify-" + t.Name()} {
		l, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: addr, Net: "unixgram"})
		if err != nil {
			t.Fatal(err)
		}
		t.Setenv("NOTIFY_SOCKET", addr)
		if err := sdNotify("READY=1\nSTATUS=serving /x"); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 256)
		l.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, err := l.Read(buf)
		l.Close()
		if err != nil || string(buf[:n]) != "READY=1\nSTATUS=serving /x" {
			t.Fatalf("%s: got %q, %v", addr, buf[:n], err)
		}
	}
}
