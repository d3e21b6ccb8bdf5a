package fs

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/tierfs/tierfs/internal/testenv"
)

// ACL entry tags and the id of the entries that name none, as in the
// system.posix_acl_access attribute (linux/posix_acl_xattr.h).
const (
	aclUserObj  = 0x01
	aclUser     = 0x02
	aclGroupObj = 0x04
	aclGroup    = 0x08
	aclMask     = 0x10
	aclOther    = 0x20
	aclNoID     = 0xffffffff
)

type aclEntry struct {
	tag, perm uint16
	id        uint32
}

// aclXattr is the value of system.posix_acl_access for entries (in
// the kernel's order: by tag, then by id).
func aclXattr(entries ...aclEntry) []byte {
	b := binary.LittleEndian.AppendUint32(nil, 2) // version
	for _, e := range entries {
		b = binary.LittleEndian.AppendUint16(b, e.tag)
		b = binary.LittleEndian.AppendUint16(b, e.perm)
		b = binary.LittleEndian.AppendUint32(b, e.id)
	}
	return b
}

// setACL sets ACL attribute name of p to value, or says the test cannot
// run where the file system has no POSIX ACLs.
func setACL(t *testing.T, p, name string, value []byte) {
	t.Helper()
	if err := unix.Setxattr(p, name, value, 0); err != nil {
		if errors.Is(err, unix.EOPNOTSUPP) {
			testenv.Missing(t, "the file system of %s has no POSIX ACLs", p)
		}
		t.Fatal(err)
	}
}

// aclOf is ACL attribute name of p in hex, or the error reading it.
func aclOf(p, name string) string {
	b := make([]byte, 256)
	n, err := unix.Getxattr(p, name, b)
	if err != nil {
		return err.Error()
	}
	return fmt.Sprintf("%x", b[:n])
}

// TestACLsAsTheBackingFile: POSIX ACLs of the backing files are
// enforced through the mount exactly as on the backing directory: an
// entry that refuses a user refuses it through the mount too (before,
// the mount checked the mode alone and let nobody read what its ACL
// refused it), and one that grants a user, or a group, grants it. An
// ACL set through the mount is the backing file's, and enforced at once.
func TestACLsAsTheBackingFile(t *testing.T) {
	requireMount(t)
	if os.Geteuid() != 0 {
		testenv.Missing(t, "needs root to act as another user")
	}
	const nobody = 65534
	acls := map[string][]byte{
		// 0644, but user nobody may do nothing.
		"f-deny-user": aclXattr(aclEntry{aclUserObj, 6, aclNoID}, aclEntry{aclUser, 0, nobody}, aclEntry{aclGroupObj, 4, aclNoID}, aclEntry{aclMask, 4, aclNoID}, aclEntry{aclOther, 4, aclNoID}),
		// 0600, but user nobody may read.
		"f-grant-user": aclXattr(aclEntry{aclUserObj, 6, aclNoID}, aclEntry{aclUser, 4, nobody}, aclEntry{aclGroupObj, 0, aclNoID}, aclEntry{aclMask, 4, aclNoID}, aclEntry{aclOther, 0, aclNoID}),
		// 0600, but user nobody may read and write.
		"f-grant-write": aclXattr(aclEntry{aclUserObj, 6, aclNoID}, aclEntry{aclUser, 6, nobody}, aclEntry{aclGroupObj, 0, aclNoID}, aclEntry{aclMask, 6, aclNoID}, aclEntry{aclOther, 0, aclNoID}),
		// 0600, but group nobody (65534) may read.
		"f-grant-group": aclXattr(aclEntry{aclUserObj, 6, aclNoID}, aclEntry{aclGroupObj, 0, aclNoID}, aclEntry{aclGroup, 4, nobody}, aclEntry{aclMask, 4, aclNoID}, aclEntry{aclOther, 0, aclNoID}),
		// The user entry grants, the mask takes it back.
		"f-masked": aclXattr(aclEntry{aclUserObj, 6, aclNoID}, aclEntry{aclUser, 6, nobody}, aclEntry{aclGroupObj, 0, aclNoID}, aclEntry{aclMask, 0, aclNoID}, aclEntry{aclOther, 0, aclNoID}),
		// A directory of 0755 that user nobody may not enter or list.
		"d-deny-user": aclXattr(aclEntry{aclUserObj, 7, aclNoID}, aclEntry{aclUser, 0, nobody}, aclEntry{aclGroupObj, 5, aclNoID}, aclEntry{aclMask, 5, aclNoID}, aclEntry{aclOther, 5, aclNoID}),
	}
	for _, passthrough := range []bool{false, true} {
		t.Run(fmt.Sprintf("passthrough=%v", passthrough), func(t *testing.T) {
			top := t.TempDir()
			reachable(t, top)
			backing := filepath.Join(top, "backing")
			if err := os.Mkdir(backing, 0o755); err != nil {
				t.Fatal(err)
			}
			for name, acl := range acls {
				p := filepath.Join(backing, name)
				if name[0] == 'd' {
					if err := os.Mkdir(p, 0o755); err != nil {
						t.Fatal(err)
					}
					if err := os.WriteFile(filepath.Join(p, "inside"), []byte("x\n"), 0o644); err != nil {
						t.Fatal(err)
					}
				} else if err := os.WriteFile(p, []byte("secret\n"), 0o644); err != nil {
					t.Fatal(err)
				}
				setACL(t, p, "system.posix_acl_access", acl)
			}
			mnt := filepath.Join(top, "mnt")
			if err := os.Mkdir(mnt, 0o755); err != nil {
				t.Fatal(err)
			}
			srv := startServer(t, backing, mnt, passthrough)
			cases := [][]string{
				{"cat", "f-deny-user"}, {"cat", "f-grant-user"}, {"cat", "f-grant-group"}, {"cat", "f-masked"},
				{"sh", "-c", "echo x >> ROOT/f-grant-write"}, {"sh", "-c", "echo x >> ROOT/f-grant-user"},
				{"ls", "d-deny-user"}, {"cat", "d-deny-user/inside"},
			}
			run := func(root string, c []string) string {
				args := append([]string(nil), c[1:]...)
				for i, a := range args {
					if c[0] == "sh" {
						args[i] = strings.Replace(a, "ROOT", root, 1)
					} else {
						args[i] = filepath.Join(root, a)
					}
				}
				return asNobody(t, c[0], args...)
			}
			allowed, refused := 0, 0
			for _, c := range cases {
				native, mounted := run(backing, c), run(srv.Mountpoint, c)
				if native != mounted {
					t.Errorf("%v as nobody: %q through the mount, %q in the backing directory", c, mounted, native)
				}
				if native == "ok" {
					allowed++
				} else {
					refused++
				}
			}
			// Not a test that passes because nobody is always refused,
			// or always let in.
			if allowed < 3 || refused < 3 {
				t.Fatalf("nobody was allowed %d and refused %d of %d cases in the backing directory: the ACLs did not apply", allowed, refused, len(cases))
			}
			for name := range acls {
				b, m := stat(t, filepath.Join(backing, name)), stat(t, filepath.Join(srv.Mountpoint, name))
				if b.Mode != m.Mode {
					t.Errorf("%s: mode %o through the mount, %o in the backing directory", name, m.Mode, b.Mode)
				}
			}

			// An ACL set through the mount lands on the backing file and
			// refuses at once.
			p := filepath.Join(srv.Mountpoint, "f-set-through")
			if err := os.WriteFile(p, []byte("secret\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			if got := asNobody(t, "cat", p); got != "ok" {
				t.Fatalf("nobody cannot read a new 0644 file: %s", got)
			}
			deny := acls["f-deny-user"]
			setACL(t, p, "system.posix_acl_access", deny)
			if got, want := aclOf(filepath.Join(backing, "f-set-through"), "system.posix_acl_access"), fmt.Sprintf("%x", deny); got != want {
				t.Fatalf("the backing file's ACL after a set through the mount: %s; want %s", got, want)
			}
			if got, native := asNobody(t, "cat", p), asNobody(t, "cat", filepath.Join(backing, "f-set-through")); got == "ok" || got != native {
				t.Errorf("cat as nobody after an ACL refused it: %q through the mount, %q in the backing directory", got, native)
			}

			// A chmod through the mount of a file with an ACL changes its
			// mask as a chmod of the backing file does, and takes the
			// user entry's grant back alike.
			for _, root := range []string{backing, srv.Mountpoint} {
				twin := filepath.Join(backing, "f-chmod-"+filepath.Base(root))
				if err := os.WriteFile(twin, []byte("secret\n"), 0o600); err != nil {
					t.Fatal(err)
				}
				setACL(t, twin, "system.posix_acl_access", acls["f-grant-user"])
				if got := asNobody(t, "cat", twin); got != "ok" {
					t.Fatalf("nobody cannot read %s, which its ACL grants: %s", twin, got)
				}
				if err := os.Chmod(filepath.Join(root, filepath.Base(twin)), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			np, mp := filepath.Join(backing, "f-chmod-backing"), filepath.Join(backing, "f-chmod-mnt")
			if a, b := stat(t, np).Mode, stat(t, mp).Mode; a != b {
				t.Errorf("chmod 0600 of a file with an ACL: mode %o through the mount, %o natively", b, a)
			}
			if a, b := aclOf(np, "system.posix_acl_access"), aclOf(mp, "system.posix_acl_access"); a != b {
				t.Errorf("chmod 0600 of a file with an ACL: ACL %s through the mount, %s natively", b, a)
			}
			if native, mounted := asNobody(t, "cat", np), asNobody(t, "cat", filepath.Join(srv.Mountpoint, "f-chmod-mnt")); native == "ok" || native != mounted {
				t.Errorf("cat as nobody after chmod 0600: %q through the mount, %q natively", mounted, native)
			}
		})
	}
}

// TestCreationModesAsTheBackingFile: files and directories made through
// the mount get the mode and access ACL they get on the backing
// directory: the creator's umask applies in a directory without a
// default ACL, and in one with a default ACL the ACL takes its place
// (before, the kernel applied the umask there too, and a named user's
// rw- came out r--).
func TestCreationModesAsTheBackingFile(t *testing.T) {
	requireMount(t)
	top := t.TempDir()
	backing := filepath.Join(top, "backing")
	for _, d := range []string{backing, filepath.Join(backing, "plain"), filepath.Join(backing, "inherits")} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	const nobody = 65534
	def := aclXattr(aclEntry{aclUserObj, 7, aclNoID}, aclEntry{aclUser, 7, nobody}, aclEntry{aclGroupObj, 5, aclNoID}, aclEntry{aclMask, 7, aclNoID}, aclEntry{aclOther, 5, aclNoID})
	setACL(t, filepath.Join(backing, "inherits"), "system.posix_acl_default", def)
	mnt := filepath.Join(top, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	srv := startServer(t, backing, mnt, true)
	for _, dir := range []string{"plain", "inherits"} {
		for _, umask := range []string{"022", "077", "000"} {
			// Made natively as "n-...", through the mount as "m-...",
			// side by side in the same backing directory.
			for _, who := range []struct{ prefix, root string }{{"n-", backing}, {"m-", srv.Mountpoint}} {
				d := filepath.Join(who.root, dir)
				script := fmt.Sprintf("umask %s && cd %s && touch %sf%s && mkdir %sd%s && mkfifo %sp%s", umask, d, who.prefix, umask, who.prefix, umask, who.prefix, umask)
				if out, err := exec.Command("sh", "-c", script).CombinedOutput(); err != nil {
					t.Fatalf("%s: %v: %s", script, err, out)
				}
			}
			for _, kind := range []string{"f", "d", "p"} {
				name := kind + umask
				native := filepath.Join(backing, dir, "n-"+name)
				mounted := filepath.Join(backing, dir, "m-"+name)
				if n, m := stat(t, native), stat(t, mounted); n.Mode != m.Mode {
					t.Errorf("%s/%s, umask %s: mode %o made through the mount, %o natively", dir, name, umask, m.Mode, n.Mode)
				}
				for _, attr := range []string{"system.posix_acl_access", "system.posix_acl_default"} {
					if n, m := aclOf(native, attr), aclOf(mounted, attr); n != m {
						t.Errorf("%s/%s, umask %s: %s %s made through the mount, %s natively", dir, name, umask, attr, m, n)
					}
				}
			}
		}
	}
}
