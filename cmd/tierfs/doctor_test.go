package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestKernelAtLeast(t *testing.T) {
	for release, want := range map[string]bool{
		"6.18.44-fc-v1147": true, "6.9.0": true, "6.9": true, "7.0.1": true, "6.8.12-amd64": false,
		"5.15.0-105-generic": false, "6.10rc1": true, "": false, "six.nine": false,
	} {
		if got := kernelAtLeast(release, 6, 9); got != want {
			t.Errorf("%q: %v", release, got)
		}
	}
}

// TestFileLimitAdvice: a limit below what a log dir's segments need (one
// descriptor each in the broker and in tierfs, a tenth more for growth,
// and headroom) is named with what to set; one above it is fine.
func TestFileLimitAdvice(t *testing.T) {
	if a := fileLimitAdvice("tierfs", 20000, 19000); !strings.Contains(a, "LimitNOFILE=22000") || !strings.Contains(a, "19000 segments") {
		t.Errorf("advice for 19,000 segments at 20,000: %q", a)
	}
	if a := fileLimitAdvice("tierfs", 20000, 11174); a != "" {
		t.Errorf("advice for 11,174 segments at 20,000: %q", a)
	}
	dir := t.TempDir()
	for _, p := range []string{"t-0/00000000000000000000.log", "t-0/00000000000000000000.index", "t-0/00000000000000000100.log", "t-1/00000000000000000000.log", "not-a-partition.txt"} {
		os.MkdirAll(filepath.Join(dir, filepath.Dir(p)), 0o755)
		os.WriteFile(filepath.Join(dir, p), nil, 0o644)
	}
	if n, err := countSegments(dir); err != nil || n != 3 {
		t.Errorf("countSegments: %d %v, want 3", n, err)
	}
}
