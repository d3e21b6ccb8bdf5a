package main

import "testing"

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
