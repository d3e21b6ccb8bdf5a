// Package fsutil holds the small file system steps several packages take
// to make their state durable.
package fsutil

import (
	"os"
	"path/filepath"
)

// SyncDir makes the entries of dir (names created, renamed or removed in
// it) durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// WriteFileAtomic replaces the file at path with data, durably: written
// to a new file beside it, synced, renamed over it, and the directory
// synced. After a crash at any point the file is either its old content
// or data, never a mix, and once this returns it is data. A leftover
// temporary file (named path.tmp-*) is removed by nothing: callers that
// list the directory skip such names.
func WriteFileAtomic(path string, data []byte, perm os.FileMode) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(perm)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	return SyncDir(dir)
}
