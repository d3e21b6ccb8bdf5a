// Package crcline frames the lines of tierfs's append-only logs (change
// management's event log, the keyed logs of internal/keylog): the CRC32C
// (Castagnoli) of the line's body as 8 lowercase hex digits, a space,
// the body, and a newline. A line torn by a crash, or changed on disk,
// is told from a whole one by its checksum.
package crcline

import (
	"errors"
	"fmt"
	"hash/crc32"
	"strconv"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Prefix is how many bytes come before the body: the checksum and the
// space.
const Prefix = 9

const hexDigits = "0123456789abcdef"

// Append appends the line of body, newline included, to dst.
func Append(dst, body []byte) []byte {
	dst = append(dst, "00000000 "...)
	start := len(dst) - Prefix
	dst = append(dst, body...)
	Seal(dst[start:])
	return append(dst, '\n')
}

// Seal fills in the checksum of a line built in place: Prefix bytes
// (any), then the body, without the newline.
func Seal(line []byte) {
	sum := crc32.Checksum(line[Prefix:], castagnoli)
	for i := 7; i >= 0; i-- {
		line[i] = hexDigits[sum&0xf]
		sum >>= 4
	}
	line[8] = ' '
}

// Body checks a line (without its newline) against its checksum and
// returns its body.
func Body(line []byte) ([]byte, error) {
	if len(line) < Prefix || line[8] != ' ' {
		return nil, errors.New("not a CRC and a space")
	}
	want, err := strconv.ParseUint(string(line[:8]), 16, 32)
	if err != nil {
		return nil, fmt.Errorf("bad CRC %q", line[:8])
	}
	body := line[Prefix:]
	if got := crc32.Checksum(body, castagnoli); uint32(want) != got {
		return nil, fmt.Errorf("CRC32C %08x, line says %08x", got, want)
	}
	return body, nil
}
