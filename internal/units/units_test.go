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

func TestFormatSize(t *testing.T) {
	for n, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 3 << 20: "3.0 MiB", 5 << 40: "5.0 TiB", 1 << 52: "4096.0 TiB"} {
		if got := FormatSize(n); got != want {
			t.Errorf("%d: %q, want %q", n, got, want)
		}
	}
}
