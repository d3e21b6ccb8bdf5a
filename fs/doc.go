// Package fs is tierfs's FUSE layer: a loopback over a backing directory,
// built on go-fuse's node API.
//
// # What is cached where
//
//   - The kernel caches names (dentries) for Config.EntryTimeout, attributes
//     for Config.AttrTimeout, and failed lookups for EntryTimeout. Changes made
//     through the mount invalidate them at once; only changes made directly
//     in a separate backing directory can be seen that late.
//   - The kernel keeps each directory's listing (FOPEN_CACHE_DIR) until the
//     directory changes through the mount, or its mtime is seen to change
//     once its attributes are refreshed: a name made or removed in the
//     backing directory behind the mount's back shows in a listing within
//     AttrTimeout, as it does in a lookup.
//   - Without passthrough the kernel caches file pages; they are dropped at
//     each open (no FOPEN_KEEP_CACHE for local files). With passthrough the
//     kernel reads and writes the backing file and there is no FUSE page
//     cache for it at all.
//   - go-fuse keeps the tree of inodes the kernel knows. Each node here holds
//     an O_PATH descriptor of its backing inode until the kernel forgets it
//     (see node). Nothing else is cached in this package.
//
// # Identity
//
// A node's identity is its backing inode number and a generation taken from
// the backing file handle (see Root.stableAttr); two different files never
// share one, even when the backing filesystem reuses an inode number at
// once.
//
// # Locks
//
// This package takes no locks of its own: every operation is one or a few
// system calls on descriptors the node owns, and the backing filesystem
// orders them. go-fuse's own locks guard its inode tree; Root's fields are
// immutable after Mount, except an atomic flag.
//
// # Errors
//
// Every error becomes an errno in toErrno (errno.go), and nowhere else.
//
// # Deadlocks to avoid
//
// A process must not touch a mount that it serves itself through a memory
// mapping: a page fault blocks its thread outside a system call, and a
// garbage collection then waits for that thread while the server goroutines
// it would need are stopped. Tests therefore serve mounts from a child
// process.
package fs

//go:generate go run ./internal/observedgen/cmd -o ops_observed.go
