// Package fsutil holds the small file system steps several packages take
// to make their state durable.
package fsutil

import "os"

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
