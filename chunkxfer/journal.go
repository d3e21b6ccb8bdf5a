package chunkxfer

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"

	"github.com/tierfs/tierfs/internal/fsutil"
)

// A journal is a JSON-lines file: a header line naming the transfer, then
// one line per confirmed chunk. Lines are appended; a torn last line
// (a crash mid-write) is skipped when it is read back.
type journal struct {
	path string
	mu   sync.Mutex
	f    *os.File
	sync bool // fsync each record
}

func journalPath(dir, kind, key string) string {
	sum := sha256.Sum256([]byte(key))
	return filepath.Join(dir, hex.EncodeToString(sum[:12])+"."+kind)
}

// readJournal decodes a journal into its header and records; a missing
// file gives ok false.
func readJournal(path string, header any, record func(json.RawMessage) error) (ok bool, err error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	if !sc.Scan() || json.Unmarshal(sc.Bytes(), header) != nil {
		// A header torn by a crash: the journal never started.
		return false, nil
	}
	for sc.Scan() {
		if len(sc.Bytes()) == 0 {
			continue
		}
		// A line that does not decode was torn by a crash; reopening
		// started a new line after it, so later records are whole.
		record(json.RawMessage(sc.Bytes()))
	}
	if err := sc.Err(); err != nil {
		return false, fmt.Errorf("journal %s: %w", path, err)
	}
	return true, nil
}

// createJournal starts a journal with its header, durably.
func createJournal(path string, header any, syncRecords bool) (*journal, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	b, err := json.Marshal(header)
	if err != nil {
		return nil, err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return nil, err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return nil, err
	}
	if err := os.Rename(tmp, path); err != nil {
		f.Close()
		return nil, err
	}
	if err := fsutil.SyncDir(filepath.Dir(path)); err != nil {
		f.Close()
		return nil, err
	}
	return &journal{path: path, f: f, sync: syncRecords}, nil
}

// reopenJournal appends to an existing journal.
func reopenJournal(path string, syncRecords bool) (*journal, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return nil, err
	}
	// A torn last line must not glue onto the next record.
	if _, err := f.Write([]byte("\n")); err != nil {
		f.Close()
		return nil, err
	}
	return &journal{path: path, f: f, sync: syncRecords}, nil
}

func (j *journal) append(rec any) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if _, err := j.f.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("journal %s: %w", j.path, err)
	}
	if j.sync {
		if err := j.f.Sync(); err != nil {
			return fmt.Errorf("journal %s: %w", j.path, err)
		}
	}
	return nil
}

// remove deletes the journal: the transfer is over.
func (j *journal) remove() error {
	j.f.Close()
	if err := os.Remove(j.path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return fsutil.SyncDir(filepath.Dir(j.path))
}

func (j *journal) close() { j.f.Close() }
