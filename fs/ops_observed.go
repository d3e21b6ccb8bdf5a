// Generated from go-fuse's RawFileSystem interface (v2.12.1). If go-fuse
// adds a method, the embedded RawFileSystem serves it unobserved.

package fs

import (
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// observed hands every FUSE request's op, duration and status to an
// OpObserver (see Config.Ops). Requests the kernel expects no reply to
// (FORGET, RELEASE) and the bridge's own calls pass through unobserved.
type observed struct {
	fuse.RawFileSystem
	obs OpObserver
}

func (o *observed) Lookup(cancel <-chan struct{}, header *fuse.InHeader, name string, out *fuse.EntryOut) fuse.Status {
	t0 := time.Now()
	st := o.RawFileSystem.Lookup(cancel, header, name, out)
	o.obs.ObserveOp("lookup", time.Since(t0), st)
	return st
}

func (o *observed) GetAttr(cancel <-chan struct{}, input *fuse.GetAttrIn, out *fuse.AttrOut) fuse.Status {
	t0 := time.Now()
	st := o.RawFileSystem.GetAttr(cancel, input, out)
	o.obs.ObserveOp("getattr", time.Since(t0), st)
	return st
}

func (o *observed) SetAttr(cancel <-chan struct{}, input *fuse.SetAttrIn, out *fuse.AttrOut) fuse.Status {
	t0 := time.Now()
	st := o.RawFileSystem.SetAttr(cancel, input, out)
	o.obs.ObserveOp("setattr", time.Since(t0), st)
	return st
}

func (o *observed) Mknod(cancel <-chan struct{}, input *fuse.MknodIn, name string, out *fuse.EntryOut) fuse.Status {
	t0 := time.Now()
	st := o.RawFileSystem.Mknod(cancel, input, name, out)
	o.obs.ObserveOp("mknod", time.Since(t0), st)
	return st
}

func (o *observed) Mkdir(cancel <-chan struct{}, input *fuse.MkdirIn, name string, out *fuse.EntryOut) fuse.Status {
	t0 := time.Now()
	st := o.RawFileSystem.Mkdir(cancel, input, name, out)
	o.obs.ObserveOp("mkdir", time.Since(t0), st)
	return st
}

func (o *observed) Unlink(cancel <-chan struct{}, header *fuse.InHeader, name string) fuse.Status {
	t0 := time.Now()
	st := o.RawFileSystem.Unlink(cancel, header, name)
	o.obs.ObserveOp("unlink", time.Since(t0), st)
	return st
}

func (o *observed) Rmdir(cancel <-chan struct{}, header *fuse.InHeader, name string) fuse.Status {
	t0 := time.Now()
	st := o.RawFileSystem.Rmdir(cancel, header, name)
	o.obs.ObserveOp("rmdir", time.Since(t0), st)
	return st
}

func (o *observed) Rename(cancel <-chan struct{}, input *fuse.RenameIn, oldName string, newName string) fuse.Status {
	t0 := time.Now()
	st := o.RawFileSystem.Rename(cancel, input, oldName, newName)
	o.obs.ObserveOp("rename", time.Since(t0), st)
	return st
}

func (o *observed) Link(cancel <-chan struct{}, input *fuse.LinkIn, filename string, out *fuse.EntryOut) fuse.Status {
	t0 := time.Now()
	st := o.RawFileSystem.Link(cancel, input, filename, out)
	o.obs.ObserveOp("link", time.Since(t0), st)
	return st
}

func (o *observed) Symlink(cancel <-chan struct{}, header *fuse.InHeader, pointedTo string, linkName string, out *fuse.EntryOut) fuse.Status {
	t0 := time.Now()
	st := o.RawFileSystem.Symlink(cancel, header, pointedTo, linkName, out)
	o.obs.ObserveOp("symlink", time.Since(t0), st)
	return st
}

func (o *observed) Readlink(cancel <-chan struct{}, header *fuse.InHeader) ([]byte, fuse.Status) {
	t0 := time.Now()
	r, st := o.RawFileSystem.Readlink(cancel, header)
	o.obs.ObserveOp("readlink", time.Since(t0), st)
	return r, st
}

func (o *observed) Access(cancel <-chan struct{}, input *fuse.AccessIn) fuse.Status {
	t0 := time.Now()
	st := o.RawFileSystem.Access(cancel, input)
	o.obs.ObserveOp("access", time.Since(t0), st)
	return st
}

func (o *observed) GetXAttr(cancel <-chan struct{}, header *fuse.InHeader, attr string, dest []byte) (uint32, fuse.Status) {
	t0 := time.Now()
	r, st := o.RawFileSystem.GetXAttr(cancel, header, attr, dest)
	o.obs.ObserveOp("getxattr", time.Since(t0), st)
	return r, st
}

func (o *observed) ListXAttr(cancel <-chan struct{}, header *fuse.InHeader, dest []byte) (uint32, fuse.Status) {
	t0 := time.Now()
	r, st := o.RawFileSystem.ListXAttr(cancel, header, dest)
	o.obs.ObserveOp("listxattr", time.Since(t0), st)
	return r, st
}

func (o *observed) SetXAttr(cancel <-chan struct{}, input *fuse.SetXAttrIn, attr string, data []byte) fuse.Status {
	t0 := time.Now()
	st := o.RawFileSystem.SetXAttr(cancel, input, attr, data)
	o.obs.ObserveOp("setxattr", time.Since(t0), st)
	return st
}

func (o *observed) RemoveXAttr(cancel <-chan struct{}, header *fuse.InHeader, attr string) fuse.Status {
	t0 := time.Now()
	st := o.RawFileSystem.RemoveXAttr(cancel, header, attr)
	o.obs.ObserveOp("removexattr", time.Since(t0), st)
	return st
}

func (o *observed) Create(cancel <-chan struct{}, input *fuse.CreateIn, name string, out *fuse.CreateOut) fuse.Status {
	t0 := time.Now()
	st := o.RawFileSystem.Create(cancel, input, name, out)
	o.obs.ObserveOp("create", time.Since(t0), st)
	return st
}

func (o *observed) Tmpfile(cancel <-chan struct{}, input *fuse.CreateIn, out *fuse.CreateOut) fuse.Status {
	t0 := time.Now()
	st := o.RawFileSystem.Tmpfile(cancel, input, out)
	o.obs.ObserveOp("tmpfile", time.Since(t0), st)
	return st
}

func (o *observed) Open(cancel <-chan struct{}, input *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	t0 := time.Now()
	st := o.RawFileSystem.Open(cancel, input, out)
	o.obs.ObserveOp("open", time.Since(t0), st)
	return st
}

func (o *observed) Read(cancel <-chan struct{}, input *fuse.ReadIn, buf []byte) (fuse.ReadResult, fuse.Status) {
	t0 := time.Now()
	r, st := o.RawFileSystem.Read(cancel, input, buf)
	o.obs.ObserveOp("read", time.Since(t0), st)
	return r, st
}

func (o *observed) Lseek(cancel <-chan struct{}, in *fuse.LseekIn, out *fuse.LseekOut) fuse.Status {
	t0 := time.Now()
	st := o.RawFileSystem.Lseek(cancel, in, out)
	o.obs.ObserveOp("lseek", time.Since(t0), st)
	return st
}

func (o *observed) GetLk(cancel <-chan struct{}, input *fuse.LkIn, out *fuse.LkOut) fuse.Status {
	t0 := time.Now()
	st := o.RawFileSystem.GetLk(cancel, input, out)
	o.obs.ObserveOp("getlk", time.Since(t0), st)
	return st
}

func (o *observed) SetLk(cancel <-chan struct{}, input *fuse.LkIn) fuse.Status {
	t0 := time.Now()
	st := o.RawFileSystem.SetLk(cancel, input)
	o.obs.ObserveOp("setlk", time.Since(t0), st)
	return st
}

func (o *observed) SetLkw(cancel <-chan struct{}, input *fuse.LkIn) fuse.Status {
	t0 := time.Now()
	st := o.RawFileSystem.SetLkw(cancel, input)
	o.obs.ObserveOp("setlkw", time.Since(t0), st)
	return st
}

func (o *observed) Write(cancel <-chan struct{}, input *fuse.WriteIn, data []byte) (uint32, fuse.Status) {
	t0 := time.Now()
	r, st := o.RawFileSystem.Write(cancel, input, data)
	o.obs.ObserveOp("write", time.Since(t0), st)
	return r, st
}

func (o *observed) Writev(cancel <-chan struct{}, input *fuse.WriteIn, data [][]byte) (uint32, fuse.Status) {
	t0 := time.Now()
	r, st := o.RawFileSystem.Writev(cancel, input, data)
	o.obs.ObserveOp("writev", time.Since(t0), st)
	return r, st
}

func (o *observed) CopyFileRange(cancel <-chan struct{}, input *fuse.CopyFileRangeIn) (uint32, fuse.Status) {
	t0 := time.Now()
	r, st := o.RawFileSystem.CopyFileRange(cancel, input)
	o.obs.ObserveOp("copy_file_range", time.Since(t0), st)
	return r, st
}

func (o *observed) Ioctl(cancel <-chan struct{}, input *fuse.IoctlIn, inbuf []byte, output *fuse.IoctlOut, outbuf []byte) fuse.Status {
	t0 := time.Now()
	st := o.RawFileSystem.Ioctl(cancel, input, inbuf, output, outbuf)
	o.obs.ObserveOp("ioctl", time.Since(t0), st)
	return st
}

func (o *observed) Flush(cancel <-chan struct{}, input *fuse.FlushIn) fuse.Status {
	t0 := time.Now()
	st := o.RawFileSystem.Flush(cancel, input)
	o.obs.ObserveOp("flush", time.Since(t0), st)
	return st
}

func (o *observed) Fsync(cancel <-chan struct{}, input *fuse.FsyncIn) fuse.Status {
	t0 := time.Now()
	st := o.RawFileSystem.Fsync(cancel, input)
	o.obs.ObserveOp("fsync", time.Since(t0), st)
	return st
}

func (o *observed) Fallocate(cancel <-chan struct{}, input *fuse.FallocateIn) fuse.Status {
	t0 := time.Now()
	st := o.RawFileSystem.Fallocate(cancel, input)
	o.obs.ObserveOp("fallocate", time.Since(t0), st)
	return st
}

func (o *observed) OpenDir(cancel <-chan struct{}, input *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	t0 := time.Now()
	st := o.RawFileSystem.OpenDir(cancel, input, out)
	o.obs.ObserveOp("opendir", time.Since(t0), st)
	return st
}

func (o *observed) ReadDir(cancel <-chan struct{}, input *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	t0 := time.Now()
	st := o.RawFileSystem.ReadDir(cancel, input, out)
	o.obs.ObserveOp("readdir", time.Since(t0), st)
	return st
}

func (o *observed) ReadDirPlus(cancel <-chan struct{}, input *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	t0 := time.Now()
	st := o.RawFileSystem.ReadDirPlus(cancel, input, out)
	o.obs.ObserveOp("readdirplus", time.Since(t0), st)
	return st
}

func (o *observed) FsyncDir(cancel <-chan struct{}, input *fuse.FsyncIn) fuse.Status {
	t0 := time.Now()
	st := o.RawFileSystem.FsyncDir(cancel, input)
	o.obs.ObserveOp("fsyncdir", time.Since(t0), st)
	return st
}

func (o *observed) StatFs(cancel <-chan struct{}, input *fuse.InHeader, out *fuse.StatfsOut) fuse.Status {
	t0 := time.Now()
	st := o.RawFileSystem.StatFs(cancel, input, out)
	o.obs.ObserveOp("statfs", time.Since(t0), st)
	return st
}

func (o *observed) Statx(cancel <-chan struct{}, input *fuse.StatxIn, out *fuse.StatxOut) fuse.Status {
	t0 := time.Now()
	st := o.RawFileSystem.Statx(cancel, input, out)
	o.obs.ObserveOp("statx", time.Since(t0), st)
	return st
}
