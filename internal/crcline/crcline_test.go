package crcline

import (
	"bytes"
	"fmt"
	"hash/crc32"
	"strings"
	"testing"
)

func TestRoundTripAndDamage(t *testing.T) {
	line := Append([]byte("before\n"), []byte(`{"k":"a"}`))
	want := fmt.Sprintf("before\n%08x %s\n", crc32.Checksum([]byte(`{"k":"a"}`), crc32.MakeTable(crc32.Castagnoli)), `{"k":"a"}`)
	if string(line) != want {
		t.Fatalf("line %q, want %q", line, want)
	}
	one := line[len("before\n") : len(line)-1]
	body, err := Body(one)
	if err != nil || string(body) != `{"k":"a"}` {
		t.Fatalf("body %q %v", body, err)
	}
	// Sealing in place gives the same line.
	inPlace := append([]byte("xxxxxxxxx"), `{"k":"a"}`...)
	Seal(inPlace)
	if !bytes.Equal(inPlace, one) {
		t.Fatalf("sealed %q, appended %q", inPlace, one)
	}
	for _, c := range []struct{ line, want string }{
		{"", "not a CRC"},
		{"12345678x{}", "not a CRC"},
		{"zzzzzzzz {}", "bad CRC"},
		{"00000000 " + `{"k":"a"}`, "CRC32C"},
	} {
		if _, err := Body([]byte(c.line)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want %q", c.line, err, c.want)
		}
	}
	damaged := bytes.Clone(one)
	damaged[len(damaged)-2] ^= 1
	if _, err := Body(damaged); err == nil {
		t.Fatal("a flipped bit went unseen")
	}
}
