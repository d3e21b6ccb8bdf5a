package cm

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/tierfs/tierfs/internal/fsutil"
)

// A dump is a directory with two files:
//
//	_metadata  a header line (DumpHeader, JSON), then the events from..to,
//	           one JSON object per line
//	_files     the state at event `to` of every path those events touched
//	           (and everything under them), one line per entry:
//	             path#sha256#cmroot-name#size#source   a file
//	             path#dir###                            a directory
//	             path#symlink#target##                  a symlink
//	           cmroot-name is set when the bytes are only in the cmroot;
//	           source is the file's path in the tree when it differs from
//	           path (it was renamed after the event); size shorter than the
//	           source means the version is its first size bytes. Fields are
//	           escaped: %, #, and control bytes as %XX.
//
// No file data is copied: a load reads each file from the source tree if
// its checksum still matches, else from the cmroot.

// DumpHeader is the first line of _metadata.
type DumpHeader struct {
	Version   int    `json:"version"`
	From      uint64 `json:"from"`
	To        uint64 `json:"to"`
	Bootstrap bool   `json:"bootstrap,omitempty"`
	// Source is the tree the files are read from, CMRoot the cmroot: as
	// a load on this machine reaches them without the mount's help.
	Source  string `json:"source"`
	CMRoot  string `json:"cmroot"`
	Created int64  `json:"created_ns"`
	Files   int    `json:"files"`
}

// FileLine is one line of _files.
type FileLine struct {
	Path   string
	Kind   string
	Target string // symlink
	Sum    string
	Name   string // cmroot name
	Size   int64
	Zeros  int64  // zero bytes after the Size bytes of the source
	Src    string // path in the source tree ("" when the bytes are only in the cmroot)
}

func escapeField(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == '%' || c == '#' || c < 0x20 || c == 0x7f {
			fmt.Fprintf(&b, "%%%02X", c)
		} else {
			b.WriteByte(c)
		}
	}
	return b.String()
}

func unescapeField(s string) (string, error) {
	if !strings.Contains(s, "%") {
		return s, nil
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '%' {
			b.WriteByte(s[i])
			continue
		}
		if i+3 > len(s) {
			return "", fmt.Errorf("bad escape at byte %d", i)
		}
		v, err := strconv.ParseUint(s[i+1:i+3], 16, 8)
		if err != nil {
			return "", fmt.Errorf("bad escape at byte %d", i)
		}
		b.WriteByte(byte(v))
		i += 2
	}
	return b.String(), nil
}

func (l FileLine) String() string {
	switch l.Kind {
	case KindDir:
		return escapeField(l.Path) + "#dir###"
	case KindSymlink:
		return escapeField(l.Path) + "#symlink#" + escapeField(l.Target) + "##"
	}
	src := ""
	if l.Src != l.Path {
		src = escapeField(l.Src)
	}
	if l.Src == "" {
		src = "-"
	}
	size := strconv.FormatInt(l.Size, 10)
	if l.Zeros > 0 {
		size += "+" + strconv.FormatInt(l.Zeros, 10)
	}
	return fmt.Sprintf("%s#%s#%s#%s#%s", escapeField(l.Path), l.Sum, escapeField(l.Name), size, src)
}

// parseFileLine parses one _files line (without its newline).
func parseFileLine(s string) (FileLine, error) {
	f := strings.Split(s, "#")
	if len(f) != 5 {
		return FileLine{}, fmt.Errorf("%d fields, want 5 (path#sha256#cmroot-name#size#source)", len(f))
	}
	var l FileLine
	var err error
	if l.Path, err = unescapeField(f[0]); err != nil {
		return l, err
	}
	if err := checkRel(l.Path); err != nil {
		return l, err
	}
	switch f[1] {
	case "dir":
		l.Kind = KindDir
		return l, nil
	case "symlink":
		l.Kind = KindSymlink
		l.Target, err = unescapeField(f[2])
		if l.Target == "" && err == nil {
			err = errors.New("symlink without a target")
		}
		return l, err
	}
	l.Kind = KindFile
	if !ValidSum(f[1]) {
		return l, fmt.Errorf("bad checksum %q (want %d lowercase hex digits of SHA-256)", f[1], SumLen)
	}
	l.Sum = f[1]
	if l.Name, err = unescapeField(f[2]); err != nil {
		return l, err
	}
	if l.Name != "" {
		if err := checkRel(l.Name); err != nil {
			return l, fmt.Errorf("cmroot name: %w", err)
		}
	}
	size, zeros, hasZeros := strings.Cut(f[3], "+")
	if l.Size, err = strconv.ParseInt(size, 10, 64); err != nil || l.Size < 0 {
		return l, fmt.Errorf("bad size %q", f[3])
	}
	if hasZeros {
		if l.Zeros, err = strconv.ParseInt(zeros, 10, 64); err != nil || l.Zeros <= 0 {
			return l, fmt.Errorf("bad size %q", f[3])
		}
	}
	switch f[4] {
	case "":
		l.Src = l.Path
	case "-":
		l.Src = ""
	default:
		if l.Src, err = unescapeField(f[4]); err != nil {
			return l, err
		}
		if err := checkRel(l.Src); err != nil {
			return l, fmt.Errorf("source: %w", err)
		}
	}
	return l, nil
}

// checkRel refuses a path that is not a plain relative path inside a tree.
func checkRel(p string) error {
	switch {
	case p == "":
		return errors.New("empty path")
	case len(p) > 4096:
		return errors.New("path longer than 4096 bytes")
	case strings.HasPrefix(p, "/"):
		return fmt.Errorf("absolute path %q", p)
	case strings.ContainsRune(p, 0):
		return fmt.Errorf("path %q has a NUL byte", p)
	case filepath.Clean(p) != p:
		return fmt.Errorf("path %q is not clean", p)
	}
	for _, c := range strings.Split(p, "/") {
		if c == ".." || c == "." {
			return fmt.Errorf("path %q leaves its tree", p)
		}
	}
	return nil
}

// Dump writes to dir (new, or empty) the changes of events from..to (to 0:
// the newest). With bootstrap it dumps the whole tree at to instead.
// source and cmroot are written to the header, for a load.
func (m *Manager) Dump(dir string, from, to uint64, bootstrap bool, source string) (DumpHeader, error) {
	h := DumpHeader{Version: 1, From: from, To: to, Bootstrap: bootstrap, Source: source, CMRoot: m.dir}
	if err := m.wait(); err != nil {
		return h, err
	}
	if to == 0 {
		h.To = m.log.lastID()
	}
	if bootstrap {
		h.From = 1
	} else if from == 0 || from > h.To {
		return h, fmt.Errorf("--from %d: must be between 1 and %d (--to)", from, h.To)
	}
	m.flushFiler()
	first, err := firstID(m.log.dir)
	if err != nil {
		return h, err
	}
	if !bootstrap && h.From < first {
		return h, fmt.Errorf("events before %d have expired (--cm-retain): cannot dump from %d; dump with --bootstrap", first, from)
	}
	events, err := readResolved(m.log.dir, h.From, h.To)
	if err != nil {
		return h, err
	}
	roots := map[string]bool{}
	for _, ev := range events {
		roots[ev.Path] = true
		if ev.To != "" {
			roots[ev.To] = true
		}
	}
	rs := []string{""}
	if !bootstrap {
		rs = rs[:0]
		for r := range roots {
			rs = append(rs, r)
		}
		sort.Strings(rs)
	}
	s, err := m.stateAt(h.To, rs)
	if err != nil {
		return h, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return h, err
	}
	if ents, _ := os.ReadDir(dir); len(ents) > 0 {
		return h, fmt.Errorf("%s is not empty", dir)
	}
	var files strings.Builder
	for _, p := range s.paths() {
		files.WriteString(lineOf(p, s.tree[p]).String())
		files.WriteByte('\n')
		h.Files++
	}
	h.Created = m.cfg.Now().UnixNano()
	var meta strings.Builder
	hb, _ := json.Marshal(h)
	meta.Write(hb)
	meta.WriteByte('\n')
	for _, ev := range events {
		b, _ := json.Marshal(ev)
		meta.Write(b)
		meta.WriteByte('\n')
	}
	// _metadata last: a dump is complete once it exists.
	if err := writeFileSync(filepath.Join(dir, "_files"), files.String()); err != nil {
		return h, err
	}
	return h, writeFileSync(filepath.Join(dir, "_metadata"), meta.String())
}

func lineOf(p string, e *entry) FileLine {
	l := FileLine{Path: p, Kind: e.Kind, Target: e.Target}
	if e.Kind == KindFile {
		l.Sum, l.Name, l.Size, l.Zeros, l.Src = e.Sum, e.Name, e.Size, e.Zeros, e.Cur
	}
	return l
}

func writeFileSync(path, data string) error {
	return fsutil.WriteFileAtomic(path, []byte(data), 0o644)
}

// ReadDump reads and checks a dump: its header, its events and its lines.
// Every error names the file and line.
func ReadDump(dir string) (DumpHeader, []Event, []FileLine, error) {
	var h DumpHeader
	var events []Event
	metaPath := filepath.Join(dir, "_metadata")
	n := 0
	err := eachLine(metaPath, func(line []byte) error {
		n++
		if n == 1 {
			if err := json.Unmarshal(line, &h); err != nil {
				return fmt.Errorf("header: %w", err)
			}
			if h.Version != 1 {
				return fmt.Errorf("dump version %d, this tierfs reads 1", h.Version)
			}
			return nil
		}
		var ev Event
		if err := json.Unmarshal(line, &ev); err != nil {
			return err
		}
		if err := checkRel(ev.Path); err != nil {
			return err
		}
		if ev.To != "" {
			if err := checkRel(ev.To); err != nil {
				return err
			}
		}
		events = append(events, ev)
		return nil
	})
	if err != nil {
		return h, nil, nil, err
	}
	if n == 0 {
		return h, nil, nil, fmt.Errorf("%s: empty", metaPath)
	}
	var lines []FileLine
	err = eachLine(filepath.Join(dir, "_files"), func(line []byte) error {
		l, err := parseFileLine(string(line))
		if err != nil {
			return err
		}
		lines = append(lines, l)
		return nil
	})
	return h, events, lines, err
}

// eachLine hands each line of the file at path (without its newline) to
// fn; lines over maxLine bytes are an error.
func eachLine(path string, fn func([]byte) error) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	r := bufio.NewReaderSize(f, 64<<10)
	for no := 1; ; no++ {
		line, err := readLogLine(r)
		if len(line) == 0 && errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil && !errors.Is(err, io.EOF) {
			return fmt.Errorf("%s line %d: %w", path, no, err)
		}
		line = []byte(strings.TrimSuffix(string(line), "\n"))
		if err := fn(line); err != nil {
			return fmt.Errorf("%s line %d: %w", path, no, err)
		}
	}
}

// Events returns the retained events with id >= since (and, when path is
// set, about path or anything under it), at most limit (0: all), oldest
// first.
func (m *Manager) Events(path string, since uint64, sinceTime time.Time, limit int) ([]Event, error) {
	if err := m.wait(); err != nil {
		return nil, err
	}
	m.flushFiler()
	all, err := readResolved(m.log.dir, since, ^uint64(0))
	var out []Event
	for _, ev := range all {
		if path != "" && !under(ev.Path, path) && (ev.To == "" || !under(ev.To, path)) {
			continue
		}
		if !sinceTime.IsZero() && time.Unix(0, ev.TimeNs).Before(sinceTime) {
			continue
		}
		out = append(out, ev)
	}
	if limit > 0 && len(out) > limit {
		out = out[len(out)-limit:]
	}
	return out, err
}

// EventAt returns the id of the newest event at or before t.
func (m *Manager) EventAt(t time.Time) (uint64, error) {
	if err := m.wait(); err != nil {
		return 0, err
	}
	var id uint64
	err := readEvents(m.log.dir, 0, ^uint64(0), func(ev Event) error {
		if !time.Unix(0, ev.TimeNs).After(t) {
			id = ev.ID
		}
		return nil
	})
	return id, err
}

// RestorePoint is the default event to restore path to: just before the
// most recent run of deletions of it (an rm -rf is one run), or, when it
// was not deleted, just before its most recent change.
func (m *Manager) RestorePoint(path string) (uint64, error) {
	evs, err := m.Events(path, 0, time.Time{}, 0)
	if err != nil {
		return 0, err
	}
	if len(evs) == 0 {
		return 0, fmt.Errorf("no retained event about %s", path)
	}
	i := len(evs) - 1
	for i > 0 && isRemoval(evs[i-1], path) && isRemoval(evs[i], path) {
		i--
	}
	return evs[i].ID - 1, nil
}

func isRemoval(ev Event, path string) bool {
	return ev.Type == EvDelete || (ev.Type == EvRename && under(ev.Path, path))
}
