package store

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Dir is a Store in a local directory (file:///path): each object is a
// file at its key. A new object is written as an unnamed file in its
// directory (O_TMPFILE), synced and linked in; one that replaces another
// goes to a temporary file that is synced and renamed over it. Either
// way an object is always whole. Multipart uploads
// live in a reserved directory under the root, which keys cannot name.
//
// Unlike S3, a key cannot be both an object and a prefix of another
// ("a" and "a/b"); such a Put fails.
//
// A Put returns once the object and its name are durable (its directory
// synced), except through a view from Deferred: there a new object's
// bytes and name are durable once the store's next conditional put
// (PutIf, of any view) or Flush returns (an object that replaces another
// has its bytes synced before it does, as any replacement).
type Dir struct {
	root     string
	deferred bool         // a view from Deferred
	pending  *pendingDirs // shared by every view
	// syncDir makes a directory's entries durable (syncPath), and
	// syncFiles the bytes of files (syncAll); tests count the calls.
	syncDir   func(dir string) error
	syncFiles func(paths []string) error
}

// pendingDirs are the new objects deferred puts wrote and the
// directories they named them in, not yet synced: those no Flush took
// yet, and those Flushes are syncing now.
type pendingDirs struct {
	mu       sync.Mutex
	next     *syncBatch   // what the next Flush takes; GUARDED_BY(mu)
	inFlight []*syncBatch // taken by Flushes not yet done; GUARDED_BY(mu)
}

// syncBatch is what one Flush syncs: its err is set, and done closed,
// when it is done.
type syncBatch struct {
	dirs, files map[string]struct{}
	done        chan struct{}
	err         error
}

func newSyncBatch() *syncBatch {
	return &syncBatch{dirs: map[string]struct{}{}, files: map[string]struct{}{}, done: make(chan struct{})}
}

// dirReserved holds temporary files and uploads; no key may start with it.
const dirReserved = ".tierfs-store"

// NewDir uses (and creates) root as a store.
func NewDir(root string) (*Dir, error) {
	if !filepath.IsAbs(root) {
		return nil, fmt.Errorf("store directory %q is not absolute", root)
	}
	if err := os.MkdirAll(filepath.Join(root, dirReserved, "uploads"), 0o755); err != nil {
		return nil, err
	}
	removeStaleTemps(filepath.Join(root, dirReserved), time.Now().Add(-time.Hour))
	return &Dir{root: root, pending: &pendingDirs{next: newSyncBatch()}, syncDir: syncPath, syncFiles: syncAll}, nil
}

// Deferred is a view of the store whose puts of new objects do not wait
// for the object's bytes or the directory that names it to be synced:
// the store's next conditional put or Flush syncs them, before it does
// anything else. A shipper puts a segment's objects through it and then
// the partition's index with PutIf: every object the index names is
// durable before the index is. On a journalled file system each sync
// of a new file is a journal commit, and the syncs of one Flush share
// one (see syncAll) instead of taking one each.
//
// A machine crash before the Flush can leave an object's name durable
// and its bytes not (an empty or short file): no index names it, and an
// upload that finds it resumes it only when it has the size and ETag its
// manifest gives (chunkxfer.LoadManifest), else sends it again.
func (d *Dir) Deferred() Store {
	v := *d
	v.deferred = true
	return &v
}

// Flush makes every deferred put so far durable: the new objects' bytes,
// then the directories that name them. A file or directory removed since
// is skipped: nothing in it is named any more. Flushes run at once: each
// syncs what no other took, then waits for those that took some before
// it (a journalled file system joins their syncs in its commits).
func (d *Dir) Flush(ctx context.Context) error {
	pd := d.pending
	pd.mu.Lock()
	b := pd.next
	earlier := slices.Clone(pd.inFlight)
	if len(b.dirs)+len(b.files) > 0 {
		pd.next = newSyncBatch()
		pd.inFlight = append(pd.inFlight, b)
	} else {
		b = nil
	}
	pd.mu.Unlock()
	var err error
	if b != nil {
		err = d.syncBatch(b)
		pd.mu.Lock()
		pd.inFlight = slices.DeleteFunc(pd.inFlight, func(o *syncBatch) bool { return o == b })
		if err != nil {
			// Synced by a later Flush, which fails too if this one
			// cannot succeed.
			maps.Copy(pd.next.dirs, b.dirs)
			maps.Copy(pd.next.files, b.files)
		}
		pd.mu.Unlock()
		b.err = err
		close(b.done)
	}
	for _, e := range earlier {
		<-e.done
		if err == nil {
			err = e.err
		}
	}
	return err
}

// syncBatch syncs b's files, then its directories.
func (d *Dir) syncBatch(b *syncBatch) error {
	if len(b.files) > 0 {
		if err := d.syncFiles(slices.Collect(maps.Keys(b.files))); err != nil {
			return err
		}
	}
	for dir := range b.dirs {
		if err := d.syncDir(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return nil
}

// Unsynced are the directories whose deferred puts' names are not yet
// durable, sorted.
func (d *Dir) Unsynced() []string {
	d.pending.mu.Lock()
	defer d.pending.mu.Unlock()
	set := maps.Clone(d.pending.next.dirs)
	for _, b := range d.pending.inFlight {
		maps.Copy(set, b.dirs)
	}
	return slices.Sorted(maps.Keys(set))
}

// named makes the name of an object just put in dir durable, or leaves
// it to the next Flush on a deferred view.
func (d *Dir) named(dir string) error {
	if !d.deferred {
		return d.syncDir(dir)
	}
	d.pending.mu.Lock()
	d.pending.next.dirs[dir] = struct{}{}
	d.pending.mu.Unlock()
	return nil
}

// removeStaleTemps drops temporary files and upload directories that a
// crashed writer left (anything in use is far younger than an hour).
func removeStaleTemps(dir string, before time.Time) {
	des, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, de := range des {
		if !strings.HasPrefix(de.Name(), "tmp-") {
			continue
		}
		if fi, err := de.Info(); err == nil && fi.ModTime().Before(before) {
			os.RemoveAll(filepath.Join(dir, de.Name()))
		}
	}
}

func (d *Dir) path(key string) (string, error) {
	if err := CheckKey(key); err != nil {
		return "", err
	}
	if key == dirReserved || strings.HasPrefix(key, dirReserved+"/") {
		return "", fmt.Errorf("key %q is reserved by the directory store", key)
	}
	return filepath.Join(d.root, filepath.FromSlash(key)), nil
}

// dirETag identifies a file's content as stored: a rename of a new file
// changes the inode, a rewrite in place (which Dir never does) the ctime.
func dirETag(fi fs.FileInfo) string {
	st := fi.Sys().(*syscall.Stat_t)
	return fmt.Sprintf(`"%x-%x-%x"`, st.Ino, st.Ctim.Nano(), st.Size)
}

func notFound(op, key string, err error) error {
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
		return fmt.Errorf("%s %s: %w", op, key, ErrNotFound)
	}
	return fmt.Errorf("%s %s: %w", op, key, err)
}

func (d *Dir) Get(ctx context.Context, key string, off, n int64, opt GetOptions) (io.ReadCloser, error) {
	p, err := d.path(key)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(p)
	if err != nil {
		return nil, notFound("get", key, err)
	}
	fi, err := f.Stat()
	if err != nil || fi.IsDir() {
		f.Close()
		return nil, notFound("get", key, fs.ErrNotExist)
	}
	if opt.IfMatch != "" && opt.IfMatch != dirETag(fi) {
		f.Close()
		return nil, fmt.Errorf("get %s: %w", key, ErrPrecondition)
	}
	if off < 0 || off > fi.Size() {
		f.Close()
		return nil, fmt.Errorf("get %s: offset %d outside %d bytes", key, off, fi.Size())
	}
	if n < 0 || off+n > fi.Size() {
		n = fi.Size() - off
	}
	return sectionCloser{io.NewSectionReader(f, off, n), f}, nil
}

type sectionCloser struct {
	*io.SectionReader
	f *os.File
}

func (s sectionCloser) Close() error { return s.f.Close() }

func (d *Dir) Head(ctx context.Context, key string) (ObjectInfo, error) {
	p, err := d.path(key)
	if err != nil {
		return ObjectInfo{}, err
	}
	fi, err := os.Stat(p)
	if err != nil || fi.IsDir() {
		return ObjectInfo{}, notFound("head", key, fs.ErrNotExist)
	}
	return ObjectInfo{Key: key, Size: fi.Size(), ETag: dirETag(fi), ModTime: fi.ModTime()}, nil
}

// writeTemp copies size bytes of body into a synced temporary file.
func (d *Dir) writeTemp(body io.Reader, size int64) (string, error) {
	return d.fillTemp(func(f *os.File) error { return writeBody(f, body, size) })
}

// fillTemp makes a temporary file of what fill writes (and syncs) into
// it, and returns its name; on failure nothing is left.
func (d *Dir) fillTemp(fill func(f *os.File) error) (string, error) {
	f, err := os.CreateTemp(filepath.Join(d.root, dirReserved), "tmp-")
	if err != nil {
		return "", err
	}
	fail := func(err error) (string, error) {
		f.Close()
		os.Remove(f.Name())
		return "", err
	}
	if err := fill(f); err != nil {
		return fail(err)
	}
	if err := f.Close(); err != nil {
		return fail(err)
	}
	return f.Name(), nil
}

// writeBody copies size bytes of body into f, which must take exactly
// that many, and syncs f.
func writeBody(f *os.File, body io.Reader, size int64) error {
	if err := copyExactly(f, body, size); err != nil {
		return err
	}
	return f.Sync()
}

// copyExactly copies size bytes of r to f; r must have that many. From
// a file, the kernel copies them (copy_file_range) without bringing them
// up here.
func copyExactly(f *os.File, r io.Reader, size int64) error {
	if n, err := io.Copy(f, io.LimitReader(r, size)); err != nil {
		return err
	} else if n != size {
		return fmt.Errorf("body has %d bytes, want %d", n, size)
	}
	return nil
}

// install renames a synced temporary file to key's path. The name is
// durable when it returns if now (a conditional put: it commits), else
// as named says.
func (d *Dir) install(tmp, key, p string, now bool) (ObjectInfo, error) {
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		os.Remove(tmp)
		return ObjectInfo{}, fmt.Errorf("put %s: %w", key, err)
	}
	if err := os.Rename(tmp, p); err != nil {
		os.Remove(tmp)
		return ObjectInfo{}, fmt.Errorf("put %s: %w", key, err)
	}
	durable := d.named
	if now {
		durable = d.syncDir
	}
	if err := durable(filepath.Dir(p)); err != nil {
		return ObjectInfo{}, err
	}
	fi, err := os.Stat(p)
	if err != nil {
		return ObjectInfo{}, err
	}
	return ObjectInfo{Key: key, Size: fi.Size(), ETag: dirETag(fi), ModTime: fi.ModTime()}, nil
}

func (d *Dir) Put(ctx context.Context, key string, body io.ReadSeeker, size int64) (ObjectInfo, error) {
	return d.put(key, body, size, nil)
}

// PutIf checks the condition and renames the new object into place under
// an exclusive lock on the store's lock file, which every PutIf of every
// process takes (plain Puts do not: keys written conditionally must only
// be written with PutIf).
func (d *Dir) PutIf(ctx context.Context, key string, body io.ReadSeeker, size int64, cond PutCond) (ObjectInfo, error) {
	if err := cond.check(key); err != nil {
		return ObjectInfo{}, err
	}
	// A conditional put commits what earlier puts wrote (a partition's
	// index names its objects): their names are made durable first.
	if err := d.Flush(ctx); err != nil {
		return ObjectInfo{}, fmt.Errorf("put %s: %w", key, err)
	}
	return d.put(key, body, size, &cond)
}

func (d *Dir) put(key string, body io.ReadSeeker, size int64, cond *PutCond) (ObjectInfo, error) {
	p, err := d.path(key)
	if err != nil {
		return ObjectInfo{}, err
	}
	if cond == nil {
		if info, done, err := d.putNew(key, p, body, size); done {
			return info, err
		}
	}
	if _, err := body.Seek(0, io.SeekStart); err != nil {
		return ObjectInfo{}, err
	}
	tmp, err := d.writeTemp(body, size)
	if err != nil {
		return ObjectInfo{}, fmt.Errorf("put %s: %w", key, err)
	}
	if cond != nil {
		unlock, err := d.checkCond(key, p, *cond)
		if err != nil {
			os.Remove(tmp)
			return ObjectInfo{}, err
		}
		defer unlock()
	}
	return d.install(tmp, key, p, cond != nil)
}

// putNew writes a new object as an unnamed file in its own directory
// (O_TMPFILE), synced, then links it in under its name: no temporary
// name is made and removed, and writers of different directories never
// contend for one directory of temporary files. done is false where that
// cannot be done (an object there already, which a rename must replace;
// a file system without O_TMPFILE; no /proc): the caller puts it the
// other way.
func (d *Dir) putNew(key, p string, body io.ReadSeeker, size int64) (info ObjectInfo, done bool, err error) {
	dir := filepath.Dir(p)
	// The directory is made only when it is missing, and an object there
	// already shows at the link: a new object in an existing directory
	// costs no more system calls than it must.
	fd, err := unix.Open(dir, unix.O_TMPFILE|unix.O_WRONLY|unix.O_CLOEXEC, 0o600)
	if errors.Is(err, unix.ENOENT) {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return ObjectInfo{}, true, fmt.Errorf("put %s: %w", key, err)
		}
		fd, err = unix.Open(dir, unix.O_TMPFILE|unix.O_WRONLY|unix.O_CLOEXEC, 0o600)
	}
	if err != nil {
		return ObjectInfo{}, false, nil
	}
	f := os.NewFile(uintptr(fd), p)
	defer f.Close()
	if _, err := body.Seek(0, io.SeekStart); err != nil {
		return ObjectInfo{}, true, err
	}
	if err := copyExactly(f, body, size); err != nil {
		return ObjectInfo{}, true, fmt.Errorf("put %s: %w", key, err)
	}
	// Through a deferred view the next Flush syncs the bytes, with
	// those of every other new object.
	if !d.deferred {
		if err := f.Sync(); err != nil {
			return ObjectInfo{}, true, fmt.Errorf("put %s: %w", key, err)
		}
	}
	err = unix.Linkat(unix.AT_FDCWD, "/proc/self/fd/"+strconv.Itoa(fd), unix.AT_FDCWD, p, unix.AT_SYMLINK_FOLLOW)
	if err != nil {
		return ObjectInfo{}, false, nil // there already (replaced by a rename), or no /proc
	}
	if d.deferred {
		d.pending.mu.Lock()
		d.pending.next.files[p] = struct{}{}
		d.pending.mu.Unlock()
	}
	if err := d.named(dir); err != nil {
		return ObjectInfo{}, true, err
	}
	fi, err := f.Stat()
	if err != nil {
		return ObjectInfo{}, true, err
	}
	return ObjectInfo{Key: key, Size: fi.Size(), ETag: dirETag(fi), ModTime: fi.ModTime()}, true, nil
}

// checkCond takes the PutIf lock and checks cond against the object at
// p; the lock is held until unlock.
func (d *Dir) checkCond(key, p string, cond PutCond) (unlock func(), err error) {
	lk, err := os.OpenFile(filepath.Join(d.root, dirReserved, "putif.lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("put %s: %w", key, err)
	}
	if err := syscall.Flock(int(lk.Fd()), syscall.LOCK_EX); err != nil {
		lk.Close()
		return nil, fmt.Errorf("put %s: %w", key, err)
	}
	fi, err := os.Stat(p)
	if err != nil && !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ENOTDIR) {
		lk.Close()
		return nil, fmt.Errorf("put %s: %w", key, err)
	}
	etag := ""
	if err == nil {
		etag = dirETag(fi)
	}
	if !cond.holds(err == nil, etag) {
		lk.Close()
		return nil, fmt.Errorf("put %s: %w", key, ErrPrecondition)
	}
	return func() { lk.Close() }, nil
}

func (d *Dir) Delete(ctx context.Context, key string) error {
	p, err := d.path(key)
	if err != nil {
		return err
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ENOTDIR) {
		return fmt.Errorf("delete %s: %w", key, err)
	}
	// Drop directories the object leaves empty, as S3 has none.
	for dir := filepath.Dir(p); dir != d.root && strings.HasPrefix(dir, d.root); dir = filepath.Dir(dir) {
		if os.Remove(dir) != nil {
			break
		}
	}
	return nil
}

func (d *Dir) List(ctx context.Context, prefix string) ([]ObjectInfo, error) {
	if err := checkPrefix(prefix); err != nil {
		return nil, err
	}
	// Walk from the deepest directory the prefix names.
	start := d.root
	if i := strings.LastIndex(prefix, "/"); i >= 0 {
		start = filepath.Join(d.root, filepath.FromSlash(prefix[:i]))
	}
	var out []ObjectInfo
	err := filepath.WalkDir(start, func(p string, de fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
				return nil
			}
			return err
		}
		rel, _ := filepath.Rel(d.root, p)
		key := filepath.ToSlash(rel)
		if de.IsDir() {
			if key == dirReserved {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasPrefix(key, prefix) || !de.Type().IsRegular() {
			return nil
		}
		fi, err := de.Info()
		if err != nil {
			return nil // removed meanwhile
		}
		out = append(out, ObjectInfo{Key: key, Size: fi.Size(), ETag: dirETag(fi), ModTime: fi.ModTime()})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", prefix, err)
	}
	slices.SortFunc(out, func(a, b ObjectInfo) int { return strings.Compare(a.Key, b.Key) })
	return out, nil
}

func (d *Dir) uploadDir(id string) (string, error) {
	if len(id) != 32 || strings.Trim(id, "0123456789abcdef") != "" {
		return "", fmt.Errorf("upload %q: %w", id, ErrNotFound)
	}
	return filepath.Join(d.root, dirReserved, "uploads", id), nil
}

// uploadKey reads an upload's key; it must be key.
func (d *Dir) uploadKey(key, id string) (string, error) {
	dir, err := d.uploadDir(id)
	if err != nil {
		return "", err
	}
	b, err := os.ReadFile(filepath.Join(dir, "key"))
	if err != nil || string(b) != key {
		return "", fmt.Errorf("upload %s of %s: %w", id, key, ErrNotFound)
	}
	return dir, nil
}

func (d *Dir) CreateMultipart(ctx context.Context, key string) (string, error) {
	if _, err := d.path(key); err != nil {
		return "", err
	}
	var b [16]byte
	rand.Read(b[:])
	id := hex.EncodeToString(b[:])
	dir, _ := d.uploadDir(id)
	// Built aside and renamed into place, so an upload is never seen
	// without its key (a crash in between would leave one that no
	// listing by key can find, and so none could abort).
	tmp, err := os.MkdirTemp(filepath.Join(d.root, dirReserved), "tmp-upload-")
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(tmp, "key"), []byte(key), 0o644); err != nil {
		os.RemoveAll(tmp)
		return "", err
	}
	if err := syncPath(filepath.Join(tmp, "key")); err != nil {
		os.RemoveAll(tmp)
		return "", err
	}
	if err := os.Rename(tmp, dir); err != nil {
		os.RemoveAll(tmp)
		return "", err
	}
	if err := syncPath(filepath.Dir(dir)); err != nil {
		return "", err
	}
	return id, nil
}

func partName(num int32) string { return fmt.Sprintf("part-%05d", num) }

func (d *Dir) UploadPart(ctx context.Context, key, id string, num int32, body io.ReadSeeker, size int64) (Part, error) {
	if num < 1 || num > MaxParts {
		return Part{}, fmt.Errorf("part number %d outside 1..%d", num, MaxParts)
	}
	dir, err := d.uploadKey(key, id)
	if err != nil {
		return Part{}, err
	}
	if _, err := body.Seek(0, io.SeekStart); err != nil {
		return Part{}, err
	}
	tmp, err := d.writeTemp(body, size)
	if err != nil {
		return Part{}, fmt.Errorf("upload part %d of %s: %w", num, key, err)
	}
	p := filepath.Join(dir, partName(num))
	if err := os.Rename(tmp, p); err != nil {
		os.Remove(tmp)
		return Part{}, notFound("upload part", key, err)
	}
	if err := syncPath(dir); err != nil {
		return Part{}, err
	}
	fi, err := os.Stat(p)
	if err != nil {
		return Part{}, err
	}
	return Part{Number: num, ETag: dirETag(fi), Size: fi.Size()}, nil
}

func (d *Dir) ListParts(ctx context.Context, key, id string) ([]Part, error) {
	dir, err := d.uploadKey(key, id)
	if err != nil {
		return nil, err
	}
	des, err := os.ReadDir(dir)
	if err != nil {
		return nil, notFound("list parts", key, err)
	}
	var out []Part
	for _, de := range des {
		num, err := strconv.Atoi(strings.TrimPrefix(de.Name(), "part-"))
		if !strings.HasPrefix(de.Name(), "part-") || err != nil {
			continue
		}
		fi, err := de.Info()
		if err != nil {
			continue
		}
		out = append(out, Part{Number: int32(num), ETag: dirETag(fi), Size: fi.Size()})
	}
	return out, nil
}

func (d *Dir) CompleteMultipart(ctx context.Context, key, id string, parts []Part) (ObjectInfo, error) {
	p, err := d.path(key)
	if err != nil {
		return ObjectInfo{}, err
	}
	dir, err := d.uploadKey(key, id)
	if err != nil {
		return ObjectInfo{}, err
	}
	if len(parts) == 0 {
		return ObjectInfo{}, fmt.Errorf("complete %s: no parts", key)
	}
	files := make([]*os.File, 0, len(parts))
	sizes := make([]int64, 0, len(parts))
	for i, part := range parts {
		f, err := os.Open(filepath.Join(dir, partName(part.Number)))
		if err != nil {
			return ObjectInfo{}, fmt.Errorf("complete %s: part %d: %w", key, part.Number, err)
		}
		defer f.Close()
		fi, err := f.Stat()
		if err != nil || dirETag(fi) != part.ETag || (i > 0 && part.Number <= parts[i-1].Number) {
			return ObjectInfo{}, fmt.Errorf("complete %s: part %d out of order or with another etag", key, part.Number)
		}
		files = append(files, f)
		sizes = append(sizes, fi.Size())
	}
	// Part by part, file to file, so that the kernel copies the bytes
	// (through one reader of all parts they came up here 32 KiB at a
	// time: half of a dir-store upload's CPU).
	tmp, err := d.fillTemp(func(f *os.File) error {
		for i, pf := range files {
			if err := copyExactly(f, pf, sizes[i]); err != nil {
				return fmt.Errorf("part %d: %w", parts[i].Number, err)
			}
		}
		return f.Sync()
	})
	if err != nil {
		return ObjectInfo{}, fmt.Errorf("complete %s: %w", key, err)
	}
	info, err := d.install(tmp, key, p, false)
	if err != nil {
		return ObjectInfo{}, err
	}
	os.RemoveAll(dir)
	return info, nil
}

func (d *Dir) AbortMultipart(ctx context.Context, key, id string) error {
	dir, err := d.uploadKey(key, id)
	if err != nil {
		return err
	}
	return os.RemoveAll(dir)
}

func (d *Dir) ListMultipart(ctx context.Context, prefix string) ([]Upload, error) {
	if err := checkPrefix(prefix); err != nil {
		return nil, err
	}
	des, err := os.ReadDir(filepath.Join(d.root, dirReserved, "uploads"))
	if err != nil {
		return nil, err
	}
	var out []Upload
	for _, de := range des {
		b, err := os.ReadFile(filepath.Join(d.root, dirReserved, "uploads", de.Name(), "key"))
		if err != nil || !strings.HasPrefix(string(b), prefix) {
			continue
		}
		fi, _ := de.Info()
		var t time.Time
		if fi != nil {
			t = fi.ModTime()
		}
		out = append(out, Upload{Key: string(b), UploadID: de.Name(), Initiated: t})
	}
	slices.SortFunc(out, func(a, b Upload) int { return strings.Compare(a.Key+a.UploadID, b.Key+b.UploadID) })
	return out, nil
}

// syncAll makes the bytes of files durable, those removed since skipped.
// Writeback of every one is started first and each is synced after, so
// that the first sync's journal commit carries the others' blocks too and
// their syncs find little left to do: a sync of each in turn would write
// each file's blocks only when it comes, and commit once for each.
func syncAll(paths []string) error {
	const group = 256 // descriptors open at once
	for len(paths) > 0 {
		n := min(len(paths), group)
		fds, names := make([]int, 0, n), make([]string, 0, n)
		var err error
		for _, p := range paths[:n] {
			fd, oerr := unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if errors.Is(oerr, unix.ENOENT) {
				continue
			}
			if oerr != nil {
				err = fmt.Errorf("sync %s: %w", p, oerr)
				break
			}
			fds, names = append(fds, fd), append(names, p)
			// Only a start: the Fsync below is what makes it durable.
			unix.SyncFileRange(fd, 0, 0, unix.SYNC_FILE_RANGE_WRITE)
		}
		for i, fd := range fds {
			if ferr := unix.Fsync(fd); ferr != nil && err == nil {
				err = fmt.Errorf("sync %s: %w", names[i], ferr)
			}
			unix.Close(fd)
		}
		if err != nil {
			return err
		}
		paths = paths[n:]
	}
	return nil
}

func syncPath(p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", p, err)
	}
	return nil
}
