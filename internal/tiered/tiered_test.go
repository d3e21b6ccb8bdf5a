package tiered

import "testing"

// Every cause has its own name: metrics label by it, and a catch-up log
// records the cause by number.
func TestCauseNames(t *testing.T) {
	seen := map[string]Cause{}
	for c := range NumCauses {
		name := c.String()
		if name == "unknown" {
			t.Errorf("cause %d has no name", c)
		}
		if prev, ok := seen[name]; ok {
			t.Errorf("causes %d and %d are both %q", prev, c, name)
		}
		seen[name] = c
	}
	if NumCauses.String() != "unknown" {
		t.Errorf("NumCauses is named %q", NumCauses.String())
	}
}

// A state's bytes are the backing file's, or the store's, or a move's:
// exactly one.
func TestStateWhereTheBytesAre(t *testing.T) {
	for s := range numStates {
		local, store, moving := s.LocalBytes(), s.InStore(), s == StateMoving
		if n := btoi(local) + btoi(store) + btoi(moving); n != 1 {
			t.Errorf("%s: local %v, store %v, moving %v", s, local, store, moving)
		}
	}
	if !StateShipped.LocalBytes() || StateRemote.LocalBytes() || !StateRemote.InStore() {
		t.Error("shipped bytes are local, remote ones in the store")
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
