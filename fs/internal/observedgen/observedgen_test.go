package observedgen

import (
	"os"
	"testing"
)

// TestUpToDate: fs/ops_observed.go is what Source writes for the go-fuse
// this module builds with (go generate ./fs after an upgrade).
func TestUpToDate(t *testing.T) {
	want, err := Source()
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("../../ops_observed.go")
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		t.Fatal("fs/ops_observed.go is out of date: run go generate ./fs")
	}
}
