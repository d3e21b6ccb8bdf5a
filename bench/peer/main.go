// Command peer measures `tierfs pull` of a partition on loopback against
// the ways one copies a tree between machines without it: tar piped
// through nc (the baseline: no checks, no resume) and an rsync daemon.
// Every run measures each of them in turn; the table gives MB/s and the
// CPU seconds of both sides, medians, with ratios to tar | nc.
//
// The source is on disk with its page cache warm; the destination is on
// tmpfs (/dev/shm), so the disk's write speed, and tierfs's fsync of each
// file, do not hide the transfer path being measured.
//
//	go run ./bench/peer -tierfs bin/tierfs -size 2GiB -runs 3
package main

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/tierfs/tierfs/bench/internal/benchutil"
	"github.com/tierfs/tierfs/internal/procmem"
	"github.com/tierfs/tierfs/peer/peertest"
)

func main() {
	bin := flag.String("tierfs", "bin/tierfs", "tierfs binary")
	sizeFlag := flag.String("size", "2GiB", "partition size")
	files := flag.Int("segments", 8, "segments the partition is made of")
	runs := flag.Int("runs", 3, "runs")
	flag.Parse()
	size, err := benchutil.ParseSize(*sizeFlag)
	check(err)
	tierfsBin, err := filepath.Abs(*bin)
	check(err)
	for _, tool := range []string{"nc", "tar", "rsync"} {
		if _, err := exec.LookPath(tool); err != nil {
			check(fmt.Errorf("%s is missing (scripts/install-deps installs it)", tool))
		}
	}
	work, err := os.MkdirTemp("/var/tmp", "tierfs-bench-peer-")
	check(err)
	defer os.RemoveAll(work)
	dst := filepath.Join("/dev/shm", filepath.Base(work)+"-dst")
	defer os.RemoveAll(dst)
	src := filepath.Join(work, "src")
	part := filepath.Join(src, "orders-0")
	check(os.MkdirAll(part, 0o755))
	writePartition(part, size, *files)
	warm(part)

	pki, err := peertest.WritePKI(work, "bench")
	check(err)
	plainAddr, secureAddr, rsyncPort := freeAddr(), freeAddr(), freePort()
	plain := startDaemon(filepath.Join(work, "serve.log"), tierfsBin, "serve", "--listen", plainAddr, src)
	defer plain.stop()
	secure := startDaemon(filepath.Join(work, "serve-tls.log"), tierfsBin, "serve", "--listen", secureAddr,
		"--tls-cert", pki.ServerCert, "--tls-key", pki.ServerKey, "--tls-ca", pki.CA, src)
	defer secure.stop()
	conf := filepath.Join(work, "rsyncd.conf")
	check(os.WriteFile(conf, []byte(fmt.Sprintf("[bench]\npath = %s\nread only = yes\nuse chroot = no\nuid = root\ngid = root\n", src)), 0o644))
	rsyncd := startDaemon(filepath.Join(work, "rsyncd.log"), "rsync", "--daemon", "--no-detach", "--config", conf, "--address", "127.0.0.1", "--port", strconv.Itoa(rsyncPort))
	defer rsyncd.stop()
	for _, a := range []string{plainAddr, secureAddr, fmt.Sprintf("127.0.0.1:%d", rsyncPort)} {
		check(benchutil.WaitFor(func() bool { return listening(a) }, 20*time.Second, a))
	}

	type config struct {
		name   string
		server *daemon // long-lived sender (nil: the command holds both)
		run    func() (clientCPU float64, err error)
	}
	pull := func(args ...string) func() (float64, error) {
		return func() (float64, error) {
			return runCmd(tierfsBin, append([]string{"pull", "--retries", "1"}, append(args, "orders-0", dst)...)...)
		}
	}
	configs := []config{
		{"tar | nc (baseline)", nil, func() (float64, error) { return tarNC(src, dst) }},
		{"rsync daemon (Debian)", rsyncd, func() (float64, error) {
			return runCmd("rsync", "-a", fmt.Sprintf("rsync://127.0.0.1:%d/bench/orders-0", rsyncPort), dst+"/")
		}},
		{"tierfs pull, plain TCP (sendfile)", plain, pull(plainAddr)},
		{"tierfs pull, mutual TLS", secure, pull("--tls-cert", pki.ClientCert, "--tls-key", pki.ClientKey, "--tls-ca", pki.CA, secureAddr)},
	}
	mbs := map[string][]float64{}
	cpu := map[string][]float64{}
	mb := float64(size) / 1e6
	for r := range *runs {
		for _, c := range configs {
			check(os.RemoveAll(dst))
			check(os.MkdirAll(dst, 0o755))
			var before float64
			if c.server != nil {
				before = c.server.cpu()
			}
			var clientCPU float64
			var rerr error
			d := benchutil.Time(func() { clientCPU, rerr = c.run() })
			if rerr != nil {
				check(fmt.Errorf("%s: %w", c.name, rerr))
			}
			check(verify(part, filepath.Join(dst, "orders-0")))
			total := clientCPU
			if c.server != nil {
				total += c.server.cpu() - before
			}
			mbs[c.name] = append(mbs[c.name], mb/d.Seconds())
			cpu[c.name] = append(cpu[c.name], total)
			fmt.Fprintf(os.Stderr, "run %d %s: %.0f MB/s, %.2f CPU s\n", r+1, c.name, mb/d.Seconds(), total)
		}
	}
	base := configs[0].name
	rep := benchutil.Report{
		Name:  "peer",
		Title: "Peer transfer: tierfs pull against tar | nc and rsync",
		Notes: []string{fmt.Sprintf("A %.0f MB partition of %d segments pulled on loopback, from /var/tmp (page cache warm) to tmpfs; medians of %d runs, every configuration in each run; ratios are medians of per-run ratios to tar | nc (which checks nothing and cannot resume). CPU seconds are both sides' user+system time. tierfs pull checks a CRC32C of every 8 MiB chunk against the version of its file, and fsyncs each file; %s.",
			mb, *files, *runs, benchutil.Machine())},
		Header:   []string{"configuration", "MB/s", "× tar | nc", "CPU s", "CPU s per GB"},
		Versions: map[string]string{"rsync": firstLine("rsync", "--version"), "nc": "netcat-openbsd " + dpkgVersion("netcat-openbsd")},
	}
	ch := benchutil.Chart{Title: "Pull of a partition over loopback", Unit: "MB/s"}
	for _, c := range configs {
		m := benchutil.Median(mbs[c.name])
		cs := benchutil.Median(cpu[c.name])
		rep.Rows = append(rep.Rows, []string{c.name, fmt.Sprintf("%.0f", m), fmt.Sprintf("%.2f", benchutil.Median(benchutil.Ratios(mbs[c.name], mbs[base]))),
			fmt.Sprintf("%.2f", cs), fmt.Sprintf("%.2f", cs/(mb/1000))})
		ch.Bars = append(ch.Bars, benchutil.Bar{Label: c.name, Value: m})
	}
	rep.Charts = []benchutil.Chart{ch}
	check(rep.Emit())
}

// writePartition writes n segments of random bytes making size in all,
// each with a small .index and .timeindex.
func writePartition(dir string, size int64, n int) {
	r := rand.NewChaCha8([32]byte{7})
	buf := make([]byte, 1<<20)
	for i := range n {
		base := filepath.Join(dir, fmt.Sprintf("%020d", int64(i)*1_000_000))
		f, err := os.Create(base + ".log")
		check(err)
		for left := size / int64(n); left > 0; left -= int64(len(buf)) {
			r.Read(buf)
			_, err := f.Write(buf[:min(int64(len(buf)), left)])
			check(err)
		}
		check(f.Close())
		for _, ext := range []string{".index", ".timeindex"} {
			r.Read(buf[:4096])
			check(os.WriteFile(base+ext, buf[:4096], 0o644))
		}
	}
}

// warm reads every file once, so each run reads from the page cache.
func warm(dir string) {
	out, err := exec.Command("sh", "-c", "cat "+dir+"/* > /dev/null").CombinedOutput()
	if err != nil {
		check(fmt.Errorf("warm: %v %s", err, out))
	}
}

// tarNC pipes tar through nc into tar: the receiver listens, the sender
// connects. The CPU time is all four processes'.
func tarNC(src, dst string) (float64, error) {
	port := freePort()
	recv := exec.Command("sh", "-c", fmt.Sprintf("nc -l 127.0.0.1 %d | tar -C %s -xf -", port, dst))
	recv.Stderr = os.Stderr
	if err := recv.Start(); err != nil {
		return 0, err
	}
	if err := benchutil.WaitFor(func() bool { return listening(fmt.Sprintf("127.0.0.1:%d", port)) }, 10*time.Second, "nc -l"); err != nil {
		recv.Process.Kill()
		recv.Wait()
		return 0, err
	}
	send, err := runCmd("sh", "-c", fmt.Sprintf("tar -C %s -cf - orders-0 | nc -N 127.0.0.1 %d", src, port))
	if err != nil {
		recv.Process.Kill()
		recv.Wait()
		return 0, err
	}
	if err := recv.Wait(); err != nil {
		return 0, err
	}
	return send + cpuOf(recv.ProcessState), nil
}

// runCmd runs a command to its end; its CPU time includes its children's.
func runCmd(name string, args ...string) (float64, error) {
	cmd := exec.Command(name, args...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return cpuOf(cmd.ProcessState), nil
}

func cpuOf(ps *os.ProcessState) float64 { return (ps.UserTime() + ps.SystemTime()).Seconds() }

// daemon is a long-lived process whose CPU time (with its reaped
// children's) is read from /proc.
type daemon struct {
	cmd *exec.Cmd
	log *os.File
}

func startDaemon(logPath, name string, args ...string) *daemon {
	logf, err := os.Create(logPath)
	check(err)
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	check(cmd.Start())
	return &daemon{cmd, logf}
}

func (d *daemon) stop() {
	d.cmd.Process.Signal(syscall.SIGTERM)
	d.cmd.Wait()
	d.log.Close()
}

// cpu is utime+stime+cutime+cstime of the daemon, in seconds.
func (d *daemon) cpu() float64 {
	s, err := procmem.CPUSeconds(d.cmd.Process.Pid)
	check(err)
	return s
}

func freePort() int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	check(err)
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func freeAddr() string { return fmt.Sprintf("127.0.0.1:%d", freePort()) }

// listening says whether a socket listens on addr (from /proc/net/tcp:
// a probe connection would use up nc's one accept).
func listening(addr string) bool {
	_, port, _ := net.SplitHostPort(addr)
	p, _ := strconv.Atoi(port)
	b, _ := os.ReadFile("/proc/net/tcp")
	return strings.Contains(string(b), fmt.Sprintf(":%04X 00000000:0000 0A", p))
}

// verify compares the pulled partition with the source, byte by byte.
func verify(a, b string) error {
	ents, err := os.ReadDir(a)
	if err != nil {
		return err
	}
	for _, e := range ents {
		x, err := os.Stat(filepath.Join(a, e.Name()))
		if err != nil {
			return err
		}
		y, err := os.Stat(filepath.Join(b, e.Name()))
		if err != nil {
			return err
		}
		if x.Size() != y.Size() {
			return fmt.Errorf("%s: %d bytes, want %d", e.Name(), y.Size(), x.Size())
		}
		if out, err := exec.Command("cmp", filepath.Join(a, e.Name()), filepath.Join(b, e.Name())).CombinedOutput(); err != nil {
			return fmt.Errorf("%s: %v %s", e.Name(), err, out)
		}
	}
	return nil
}

func firstLine(name string, args ...string) string {
	out, _ := exec.Command(name, args...).Output()
	l, _, _ := strings.Cut(string(out), "\n")
	return strings.TrimSpace(l)
}

func dpkgVersion(pkg string) string {
	out, _ := exec.Command("dpkg-query", "-W", "-f", "${Version}", pkg).Output()
	return string(out)
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench/peer:", err)
		os.Exit(1)
	}
}
