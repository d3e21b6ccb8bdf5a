package kafka

import (
	"fmt"
	"strconv"
	"strings"
)

// File kinds of a partition directory.
const (
	KindLog       = ".log"
	KindIndex     = ".index"
	KindTimeIndex = ".timeindex"
	KindTxnIndex  = ".txnindex"
	KindSnapshot  = ".snapshot"
)

// Suffixes Kafka appends to a segment file while it goes away or is
// rewritten by the cleaner.
const (
	SuffixDeleted = ".deleted"
	SuffixCleaned = ".cleaned"
	SuffixSwap    = ".swap"
)

// SegmentName is a parsed segment file name such as
// 00000000000000001234.log or 00000000000000001234.index.deleted.
type SegmentName struct {
	BaseOffset int64
	Kind       string // KindLog, ...
	Suffix     string // "", SuffixDeleted, SuffixCleaned or SuffixSwap
}

// String formats the name as Kafka does.
func (s SegmentName) String() string {
	return fmt.Sprintf("%020d%s%s", s.BaseOffset, s.Kind, s.Suffix)
}

// ParseSegmentName parses a segment file name; ok is false for any other
// file.
func ParseSegmentName(name string) (SegmentName, bool) {
	var s SegmentName
	for _, suf := range []string{SuffixDeleted, SuffixCleaned, SuffixSwap} {
		if strings.HasSuffix(name, suf) {
			s.Suffix = suf
			name = strings.TrimSuffix(name, suf)
			break
		}
	}
	if len(name) < 21 {
		return SegmentName{}, false
	}
	digits, kind := name[:20], name[20:]
	switch kind {
	case KindLog, KindIndex, KindTimeIndex, KindTxnIndex, KindSnapshot:
	default:
		return SegmentName{}, false
	}
	for i := 0; i < len(digits); i++ {
		if digits[i] < '0' || digits[i] > '9' {
			return SegmentName{}, false
		}
	}
	off, err := strconv.ParseInt(digits, 10, 64)
	if err != nil {
		return SegmentName{}, false
	}
	s.BaseOffset, s.Kind = off, kind
	return s, true
}

// Partition directory states.
const (
	DirLive   = ""
	DirDelete = "delete"
	DirFuture = "future"
	DirStray  = "stray"
)

// PartitionDir is a parsed partition directory name: topic-N, or
// topic-N.<32 hex>-delete / -future / -stray.
type PartitionDir struct {
	Topic     string
	Partition int32
	State     string // DirLive, DirDelete, DirFuture or DirStray
	UniqueID  string // the 32 hex digits of a -delete/-future/-stray dir
}

// ParsePartitionDir parses a partition directory name; ok is false for
// any other name.
func ParsePartitionDir(name string) (PartitionDir, bool) {
	var p PartitionDir
	for _, st := range []string{DirDelete, DirFuture, DirStray} {
		suf := "-" + st
		if !strings.HasSuffix(name, suf) {
			continue
		}
		rest := strings.TrimSuffix(name, suf)
		dot := strings.LastIndexByte(rest, '.')
		if dot < 0 || !isHex(rest[dot+1:], 32) {
			return PartitionDir{}, false
		}
		p.State, p.UniqueID, name = st, rest[dot+1:], rest[:dot]
		break
	}
	dash := strings.LastIndexByte(name, '-')
	if dash <= 0 || dash == len(name)-1 {
		return PartitionDir{}, false
	}
	num := name[dash+1:]
	if len(num) > 1 && num[0] == '0' {
		return PartitionDir{}, false
	}
	n, err := strconv.ParseInt(num, 10, 32)
	if err != nil || n < 0 || num[0] == '+' {
		return PartitionDir{}, false
	}
	p.Topic, p.Partition = name[:dash], int32(n)
	if !validTopic(p.Topic) {
		return PartitionDir{}, false
	}
	return p, true
}

// validTopic checks Kafka's topic name rule: 1 to 249 of [a-zA-Z0-9._-],
// and not "." or "..".
func validTopic(t string) bool {
	if t == "" || len(t) > 249 || t == "." || t == ".." {
		return false
	}
	for i := 0; i < len(t); i++ {
		c := t[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

func isHex(s string, n int) bool {
	if len(s) != n {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}
