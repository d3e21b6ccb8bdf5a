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
