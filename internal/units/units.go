// Package units reads the sizes users write on command lines.
package units

import (
	"fmt"
	"strconv"
	"strings"
)

// ParseSize reads a size in bytes: a whole number with an optional
// suffix, binary (KiB, MiB, GiB, TiB) or decimal (KB, MB, GB, TB).
// Negative sizes are refused; zero is allowed.
func ParseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		m      int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}} {
		if strings.HasSuffix(t, u.suffix) {
			t, mult = strings.TrimSpace(strings.TrimSuffix(t, u.suffix)), u.m
			break
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n < 0 || n > (1<<63-1)/mult {
		return 0, fmt.Errorf("bad size %q (a whole number of bytes, or with KiB, MiB, GiB, TiB, KB, MB, GB, TB)", s)
	}
	return n * mult, nil
}

// FormatSize writes n bytes for people: "512 B", "3.4 MiB".
func FormatSize(n int64) string {
	if n < 1024 {
		return fmt.Sprintf("%d B", n)
	}
	x := float64(n)
	for _, u := range []string{"KiB", "MiB", "GiB", "TiB"} {
		x /= 1024
		if x < 1024 || u == "TiB" {
			return fmt.Sprintf("%.1f %s", x, u)
		}
	}
	return ""
}
