package tiering

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/tierfs/tierfs/internal/keylog"
)

// keyLogExt ends the name of a keyed log (internal/keylog) in the state dir.
const keyLogExt = ".klog"

// openKeyLog opens the keyed log at path, logging a torn append it cut
// off (what names the log's kind).
func openKeyLog(path, what string, log *slog.Logger) (*keylog.Log, error) {
	return openKeyLogEach(path, what, log, nil)
}

// openKeyLogEach is openKeyLog that also hands fn every live key and
// value, as Each would, from the one read of the file (keylog.OpenEach);
// fn nil is openKeyLog.
func openKeyLogEach(path, what string, log *slog.Logger, fn func(key string, val []byte) error) (*keylog.Log, error) {
	var l *keylog.Log
	var cut int64
	var err error
	if fn == nil {
		l, cut, err = keylog.Open(path)
	} else {
		l, cut, err = keylog.OpenEach(path, fn)
	}
	if err != nil {
		return nil, err
	}
	if cut > 0 {
		log.Warn("cut a torn append off a "+what+" log", "path", l.Path(), "bytes", cut)
	}
	return l, nil
}

// moveLegacyFiles moves the files (*.json) that versions before 2026-12
// kept in dir, one per key, into the keyed log l (see moveFiles). It
// says how many it moved; no dir is none. dir itself is left to the
// caller.
func moveLegacyFiles(dir string, l *keylog.Log, value func(path string, b []byte) (key string, val []byte, err error)) (int, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	var paths []string
	for _, e := range ents {
		if e.Type().IsRegular() && filepath.Ext(e.Name()) == ".json" {
			paths = append(paths, filepath.Join(dir, e.Name()))
		}
	}
	return moveFiles(paths, l, value)
}

// moveFiles moves legacy state files, one per key, into the keyed log
// l: value gives a file's key and log value (its errors name the file).
// Each is appended (and synced) before its file is removed, so a crash
// in between leaves both, the same. It says how many it moved.
func moveFiles(paths []string, l *keylog.Log, value func(path string, b []byte) (key string, val []byte, err error)) (int, error) {
	n := 0
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			return n, err
		}
		key, val, err := value(p, b)
		if err != nil {
			return n, err
		}
		if err := l.Put(key, val); err != nil {
			return n, err
		}
		if err := os.Remove(p); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}
