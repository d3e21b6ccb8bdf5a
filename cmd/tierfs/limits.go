package main

import (
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/tierfs/tierfs/idx/kafka"
)

// fdHeadroom is what a process needs besides one descriptor per segment
// (tierfs's own files and connections; the broker's jars and sockets).
const fdHeadroom = 1024

// countSegments counts the segment files (.log) in the partition
// directories of the log dir at dir, without opening them.
func countSegments(dir string) (int, error) {
	parts, err := os.ReadDir(dir)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, p := range parts {
		if !p.IsDir() {
			continue
		}
		if _, ok := kafka.ParsePartitionDir(p.Name()); !ok {
			continue
		}
		ents, err := os.ReadDir(filepath.Join(dir, p.Name()))
		if err != nil {
			continue // deleted meanwhile
		}
		for _, e := range ents {
			if sn, ok := kafka.ParseSegmentName(e.Name()); ok && sn.Kind == kafka.KindLog {
				n++
			}
		}
	}
	return n, nil
}

// fileLimitAdvice says whether an open-file limit is enough for a log
// dir of segments: a broker keeps every segment open, and a tierfs mount
// holds one backing descriptor for each file the broker has open. It
// returns "" when the limit is enough, else what to do.
func fileLimitAdvice(who string, limit uint64, segments int) string {
	need := uint64(segments) + uint64(segments)/10 + fdHeadroom
	if limit >= need {
		return ""
	}
	return fmt.Sprintf("%s's open-file limit is %d, and the log dir has %d segments: a broker keeps each one open, and tierfs holds a descriptor for each file the broker has open. "+
		"Raise the limit of both the broker and tierfs to at least %d (systemd: LimitNOFILE=%d in both units; a shell: ulimit -n)", who, limit, segments, need, roundUp(need))
}

// roundUp rounds n up to a round number to suggest (1000s, or 10,000s
// past 100,000).
func roundUp(n uint64) uint64 {
	step := uint64(1000)
	if n > 100_000 {
		step = 10_000
	}
	return (n + step - 1) / step * step
}

func fileLimit() (soft, hard uint64) {
	var lim unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_NOFILE, &lim) != nil {
		return 0, 0
	}
	return lim.Cur, lim.Max
}
