package units

import "testing"

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{"0": 0, "17": 17, "4KiB": 4096, "1MiB": 1 << 20, "3GiB": 3 << 30, "2TiB": 2 << 40, "50MB": 50e6, " 8 MiB ": 8 << 20, "1KB": 1000} {
		if got, err := ParseSize(in); err != nil || got != want {
			t.Errorf("%q: %d %v, want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "-1", "1.5GiB", "MiB", "10XB", "9999999999TiB"} {
		if _, err := ParseSize(in); err == nil {
			t.Errorf("%q accepted", in)
		}
	}
}
