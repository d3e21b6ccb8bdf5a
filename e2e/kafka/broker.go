// Package kafka runs a real Apache Kafka broker for the end-to-end tests:
// a single KRaft node (broker and controller) on 127.0.0.1, from the jars
// that pom.xml beside this file fetches from Maven Central into lib/
// (scripts/install-deps runs mvn for it).
package kafka

import (
	"bufio"
	"bytes"
	"cmp"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	mathrand "math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/tierfs/tierfs/internal/procmem"
)

// LibDir is where the broker's jars are: e2e/kafka/lib.
func LibDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "lib")
}

// KIP405LibDir is where the jars of Kafka 4.3.0 with the
// LocalTieredStorage remote storage manager (its kafka-storage test jar)
// are: e2e/kafka/kip405/lib, fetched by its pom.xml.
func KIP405LibDir() string { return filepath.Join(filepath.Dir(LibDir()), "kip405", "lib") }

// Version is the version of the Kafka jars in LibDir ("?" if none).
func Version() string { return VersionIn(LibDir()) }

// VersionIn is the version of the Kafka jars in lib ("?" if none).
func VersionIn(lib string) string {
	m, _ := filepath.Glob(filepath.Join(lib, "kafka_2.13-*.jar"))
	if len(m) == 0 {
		return "?"
	}
	return strings.TrimSuffix(strings.TrimPrefix(filepath.Base(m[0]), "kafka_2.13-"), ".jar")
}

// Available says why a broker cannot run here, or "" if it can.
func Available() string {
	if _, err := exec.LookPath("java"); err != nil {
		return "no java on PATH"
	}
	if m, _ := filepath.Glob(filepath.Join(LibDir(), "kafka_2.13-*.jar")); len(m) == 0 {
		return "no Kafka jars in " + LibDir() + " (run scripts/install-deps, or mvn -f e2e/kafka/pom.xml dependency:copy-dependencies -DoutputDirectory=lib)"
	}
	return ""
}

// Options configure a broker.
type Options struct {
	LogDir      string            // log.dirs (the tierfs mount)
	MetadataDir string            // metadata.log.dir, kept off the mount
	WorkDir     string            // config and the broker's own log
	Props       map[string]string // more server.properties, over the defaults
	// FileLimit, when set, is the broker's open-file limit (soft and
	// hard, set with prlimit), as a systemd LimitNOFILE would be.
	FileLimit int
	// Port, when set, is the broker's client port (StartQuorum), known
	// before it starts: a mount of its log dir can be told it.
	Port int
	// Lib, when set, is the directory of the jars to run (another Kafka
	// version: KIP405LibDir); LibDir by default.
	Lib string
	// Listener, when set, is one more client listener, e.g.
	// "SASL_PLAINTEXT://127.0.0.1:PORT" (its name is its protocol); its
	// settings (sasl.enabled.mechanisms, listener.name.…) go in Props.
	Listener string
	// Heap, when set, is the broker's largest Java heap (-Xmx, "2g");
	// 768m by default. Kafka's own tiered storage at a thousand
	// partitions ran out of 768m while a consumer read everything.
	Heap string
}

// Broker is a running (or stopped) broker process.
type Broker struct {
	Addr string // bootstrap address
	opts Options
	cfg  string
	mu   sync.Mutex
	log  *bytes.Buffer
	// started is where the log of the current process begins.
	started int
	cmd     *exec.Cmd
	done    chan struct{}
}

// FreePort is a port on 127.0.0.1 free now, below the kernel's range of
// ephemeral ports: a broker starts listening on it seconds later, and
// meanwhile no outgoing connection (of this test, of tests beside it, or
// a client dialling this very port, which the kernel could connect to
// itself) takes it as its local port.
//
// The port is also reserved until this process exits, by an flock on a
// file named after it (see reservePort), so that no other FreePort, in
// this process or in another test binary running beside it, hands it out
// again: a broker that stops and restarts on its port leaves it unbound
// for seconds, and two runs of go test share this range.
func FreePort() (int, error) {
	lo := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil && n > 12000 {
				lo = n
			}
		}
	}
	for range 200 {
		port := 10000 + mathrand.IntN(lo-10000)
		if !reservePort(port) {
			continue
		}
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			continue
		}
		l.Close()
		return port, nil
	}
	return 0, errors.New("no free port below the ephemeral range")
}

// reservePort takes an exclusive flock on $TMPDIR/tierfs-test-ports/PORT
// and keeps it, its descriptor left open, until the process exits; it
// says false when another FreePort holds it. flock locks belong to the
// open file, so a second reservation in the same process fails too. A
// directory it cannot use reserves nothing and says true.
func reservePort(port int) bool {
	dir := filepath.Join(os.TempDir(), "tierfs-test-ports")
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return true
	}
	// A raw descriptor: an *os.File would be closed, and the lock
	// dropped, when the collector finds it unreachable.
	fd, err := syscall.Open(filepath.Join(dir, strconv.Itoa(port)), syscall.O_CREAT|syscall.O_RDONLY|syscall.O_CLOEXEC, 0o666)
	if err != nil {
		return true
	}
	if err := syscall.Flock(fd, syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		syscall.Close(fd)
		return !errors.Is(err, syscall.EWOULDBLOCK)
	}
	return true // fd stays open: the lock lasts as long as the process
}

// NoTimedFlush is log.flush.interval.ms as Kafka leaves it by default
// (Long.MAX_VALUE: no fsync forced by time), as a production broker
// runs; Defaults fsync every partition each second, a cost of the test
// settings that benchmarks override with it.
const NoTimedFlush = "9223372036854775807"

// Defaults are the server.properties every test broker gets: small
// segments that roll, recovery points and high watermarks checkpointed
// every second, single-replica internal topics.
func Defaults() map[string]string {
	return map[string]string{
		"process.roles":                                    "broker,controller",
		"node.id":                                          "1",
		"controller.listener.names":                        "CONTROLLER",
		"listener.security.protocol.map":                   "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
		"inter.broker.listener.name":                       "PLAINTEXT",
		"num.partitions":                                   "1",
		"offsets.topic.replication.factor":                 "1",
		"offsets.topic.num.partitions":                     "1",
		"transaction.state.log.replication.factor":         "1",
		"transaction.state.log.min.isr":                    "1",
		"share.coordinator.state.topic.replication.factor": "1",
		"share.coordinator.state.topic.min.isr":            "1",
		"group.initial.rebalance.delay.ms":                 "0",
		"auto.create.topics.enable":                        "false",
		"log.segment.bytes":                                "1048576",
		"log.flush.interval.ms":                            "1000",
		"log.flush.scheduler.interval.ms":                  "1000",
		"log.flush.offset.checkpoint.interval.ms":          "1000",
		"log.flush.start.offset.checkpoint.interval.ms":    "1000",
		"replica.high.watermark.checkpoint.interval.ms":    "1000",
		"log.retention.check.interval.ms":                  "1000",
		"file.delete.delay.ms":                             "1000",
		"log.cleaner.backoff.ms":                           "1000",
	}
}

// Start formats the metadata and log dirs and starts a broker.
func Start(opts Options) (*Broker, error) {
	brs, err := StartCluster([]Options{opts})
	if err != nil {
		return nil, err
	}
	return brs[0], nil
}

// StartCluster starts a cluster of len(opts) brokers, node ids 1.. in
// order; node 1 is also the (only) controller.
func StartCluster(opts []Options) ([]*Broker, error) {
	if why := Available(); why != "" {
		return nil, errors.New(why)
	}
	clusterID := newClusterID()
	cport, err := FreePort()
	if err != nil {
		return nil, err
	}
	var out []*Broker
	for i, o := range opts {
		br, err := start(o, i+1, cport, clusterID)
		if err != nil {
			for _, b := range out {
				b.Kill()
			}
			return nil, err
		}
		out = append(out, br)
	}
	return out, nil
}

func start(opts Options, node, cport int, clusterID string) (*Broker, error) {
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	props := Defaults()
	props["node.id"] = fmt.Sprint(node)
	if node == 1 {
		props["listeners"] = fmt.Sprintf("PLAINTEXT://127.0.0.1:%d,CONTROLLER://127.0.0.1:%d", port, cport)
	} else {
		props["process.roles"] = "broker"
		props["listeners"] = fmt.Sprintf("PLAINTEXT://127.0.0.1:%d", port)
	}
	props["controller.quorum.voters"] = fmt.Sprintf("1@127.0.0.1:%d", cport)
	br, err := configure(opts, port, props, clusterID)
	if err != nil {
		return nil, err
	}
	return br, br.Restart()
}

// StartQuorum starts a cluster of len(opts) nodes that are each a broker
// and a controller (a KRaft quorum of len(opts) voters), node ids 1.. in
// order. They start at once: none serves before a majority is up.
func StartQuorum(opts []Options) ([]*Broker, error) {
	if why := Available(); why != "" {
		return nil, errors.New(why)
	}
	clusterID := newClusterID()
	ports, cports := make([]int, len(opts)), make([]int, len(opts))
	var voters []string
	for i := range opts {
		var err error
		if ports[i] = opts[i].Port; ports[i] == 0 {
			if ports[i], err = FreePort(); err != nil {
				return nil, err
			}
		}
		if cports[i], err = FreePort(); err != nil {
			return nil, err
		}
		voters = append(voters, fmt.Sprintf("%d@127.0.0.1:%d", i+1, cports[i]))
	}
	// Formatted and started at once (each format is a JVM start).
	brs := make([]*Broker, len(opts))
	errs := make([]error, len(opts))
	var wg sync.WaitGroup
	for i, o := range opts {
		props := Defaults()
		props["node.id"] = fmt.Sprint(i + 1)
		props["listeners"] = fmt.Sprintf("PLAINTEXT://127.0.0.1:%d,CONTROLLER://127.0.0.1:%d", ports[i], cports[i])
		props["controller.quorum.voters"] = strings.Join(voters, ",")
		wg.Add(1)
		go func() {
			defer wg.Done()
			if brs[i], errs[i] = configure(o, ports[i], props, clusterID); errs[i] == nil {
				errs[i] = brs[i].Restart()
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, br := range brs {
			if br != nil {
				br.Kill()
			}
		}
		return nil, err
	}
	return brs, nil
}

func newClusterID() string {
	// A cluster id that starts with "-" would read as an option.
	clusterID := "-"
	for strings.HasPrefix(clusterID, "-") {
		var id [16]byte
		rand.Read(id[:])
		clusterID = base64.RawURLEncoding.EncodeToString(id[:])
	}
	return clusterID
}

// configure writes a node's server.properties (props, then opts.Props
// over them) and formats its storage; the broker is not started.
func configure(opts Options, port int, props map[string]string, clusterID string) (*Broker, error) {
	props["advertised.listeners"] = fmt.Sprintf("PLAINTEXT://127.0.0.1:%d", port)
	if l := opts.Listener; l != "" {
		name, _, _ := strings.Cut(l, "://")
		props["listeners"] += "," + l
		props["advertised.listeners"] += "," + l
		props["listener.security.protocol.map"] += "," + name + ":" + name
	}
	props["log.dirs"] = opts.LogDir
	props["metadata.log.dir"] = opts.MetadataDir
	for k, v := range opts.Props {
		props[k] = v
	}
	var keys []string
	for k := range props {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%s=%s\n", k, props[k])
	}
	if err := os.MkdirAll(opts.WorkDir, 0o755); err != nil {
		return nil, err
	}
	br := &Broker{Addr: fmt.Sprintf("127.0.0.1:%d", port), opts: opts, cfg: filepath.Join(opts.WorkDir, "server.properties"), log: &bytes.Buffer{}}
	if err := os.WriteFile(br.cfg, []byte(b.String()), 0o644); err != nil {
		return nil, err
	}
	l4j := filepath.Join(opts.WorkDir, "log4j2.properties")
	if err := os.WriteFile(l4j, []byte(log4j), 0o644); err != nil {
		return nil, err
	}
	out, err := exec.Command("java", br.jvmArgs("kafka.tools.StorageTool", "format", "-t", clusterID, "-c", br.cfg)...).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("format: %v\n%s", err, out)
	}
	return br, nil
}

const log4j = `status = warn
appender.out.type = Console
appender.out.name = OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = OUT
logger.kafka.name = kafka
logger.kafka.level = INFO
logger.state.name = state.change.logger
logger.state.level = WARN
`

func (br *Broker) jvmArgs(main string, args ...string) []string {
	return append([]string{"-Xmx" + cmp.Or(br.opts.Heap, "768m"), "-XX:+UseG1GC", "-Djava.awt.headless=true",
		"-Dlog4j2.configurationFile=" + filepath.Join(br.opts.WorkDir, "log4j2.properties"),
		"-cp", filepath.Join(cmp.Or(br.opts.Lib, LibDir()), "*"), main}, args...)
}

// Restart starts the broker process again (after Stop or Kill) and waits
// until it serves.
func (br *Broker) Restart() error {
	br.mu.Lock()
	cmd := exec.Command("java", br.jvmArgs("kafka.Kafka", br.cfg)...)
	if n := br.opts.FileLimit; n > 0 {
		cmd = exec.Command("prlimit", append([]string{fmt.Sprintf("--nofile=%d:%d", n, n), "java"}, br.jvmArgs("kafka.Kafka", br.cfg)...)...)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	pr, pw, err := os.Pipe()
	if err != nil {
		br.mu.Unlock()
		return err
	}
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		br.mu.Unlock()
		return err
	}
	pw.Close()
	br.cmd, br.done = cmd, make(chan struct{})
	br.started = br.log.Len()
	done := br.done
	br.mu.Unlock()
	started := make(chan struct{})
	var once sync.Once
	go func() {
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			br.mu.Lock()
			br.log.WriteString(line + "\n")
			br.mu.Unlock()
			if strings.Contains(line, "Kafka Server started") {
				once.Do(func() { close(started) })
			}
		}
	}()
	go func() { cmd.Wait(); close(done) }()
	select {
	case <-started:
		return nil
	case <-done:
		return fmt.Errorf("broker exited during start (%v)%s", cmd.ProcessState, br.startFailure())
	case <-time.After(90 * time.Second):
		return fmt.Errorf("broker not started after 90s%s", br.startFailure())
	}
}

// startFailure says why a start failed, cause first: the error lines of
// this start, then the last lines it logged, then the whole log (a CI log
// that keeps only its head and tail still shows the cause).
func (br *Broker) startFailure() string {
	br.mu.Lock()
	log := br.log.String()[br.started:]
	br.mu.Unlock()
	lines := strings.Split(strings.TrimRight(log, "\n"), "\n")
	var b strings.Builder
	b.WriteString("; errors logged:\n")
	for _, p := range br.Problems() {
		b.WriteString(p + "\n")
	}
	b.WriteString("the last lines logged:\n")
	for _, l := range lines[max(0, len(lines)-15):] {
		b.WriteString(l + "\n")
	}
	b.WriteString("the whole log:\n" + log)
	return b.String()
}

// CPUSeconds is the CPU time the running broker process has used.
func (br *Broker) CPUSeconds() (float64, error) {
	br.mu.Lock()
	cmd := br.cmd
	br.mu.Unlock()
	if cmd == nil {
		return 0, errors.New("the broker never started")
	}
	return procmem.CPUSeconds(cmd.Process.Pid)
}

// Running says whether the broker process is alive.
func (br *Broker) Running() bool {
	br.mu.Lock()
	done := br.done
	br.mu.Unlock()
	select {
	case <-done:
		return false
	default:
		return true
	}
}

// Pause stops the broker's process (SIGSTOP) where it is, so that it
// takes no CPU while another process is measured; Resume lets it go on.
// A paused broker answers nothing: pause only brokers no client of the
// measurement talks to. A broker is its own controller here, so one
// paused for longer than broker.session.timeout.ms (9 s by default) is
// fenced by it when it goes on: start a broker to be paused with that
// property longer than any pause (bench/kafkacatchup sets a day).
func (br *Broker) Pause() error { return br.send(syscall.SIGSTOP) }

// Resume continues a paused broker (SIGCONT).
func (br *Broker) Resume() error { return br.send(syscall.SIGCONT) }

func (br *Broker) send(sig syscall.Signal) error {
	br.mu.Lock()
	cmd := br.cmd
	br.mu.Unlock()
	if cmd == nil {
		return errors.New("the broker never started")
	}
	return cmd.Process.Signal(sig)
}

// Stop shuts the broker down cleanly (SIGTERM) and waits.
func (br *Broker) Stop() error { return br.signal(syscall.SIGTERM, 60*time.Second) }

// Kill kills the broker (kill -9) and waits.
func (br *Broker) Kill() error { return br.signal(syscall.SIGKILL, 30*time.Second) }

func (br *Broker) signal(sig syscall.Signal, wait time.Duration) error {
	br.mu.Lock()
	cmd, done := br.cmd, br.done
	br.mu.Unlock()
	if cmd == nil {
		return nil
	}
	select {
	case <-done:
		return nil
	default:
	}
	cmd.Process.Signal(sig)
	// A paused broker would not act on the signal before it runs again.
	cmd.Process.Signal(syscall.SIGCONT)
	select {
	case <-done:
		return nil
	case <-time.After(wait):
		cmd.Process.Kill()
		<-done
		return fmt.Errorf("broker did not stop on %v within %v", sig, wait)
	}
}

// Log is everything the broker printed so far.
func (br *Broker) Log() string {
	br.mu.Lock()
	defer br.mu.Unlock()
	return br.log.String()
}

// Problems are the lines the running broker process logged that say
// something is wrong with its log: errors, and warnings about corrupt
// segments or invalid indexes.
func (br *Broker) Problems() []string {
	br.mu.Lock()
	log := br.log.String()[br.started:]
	br.mu.Unlock()
	var out []string
	for _, l := range strings.Split(log, "\n") {
		low := strings.ToLower(l)
		if strings.Contains(l, "] ERROR ") || strings.Contains(l, "] FATAL ") ||
			strings.Contains(low, "corrupt") || strings.Contains(low, "invalid") && strings.Contains(low, "index") {
			out = append(out, l)
		}
	}
	return out
}

// SetLogDir points the stopped broker at another log dir (log.dirs) for
// its next Restart: a copy of its own, made after a clean stop.
func (br *Broker) SetLogDir(dir string) error {
	br.mu.Lock()
	defer br.mu.Unlock()
	b, err := os.ReadFile(br.cfg)
	if err != nil {
		return err
	}
	lines := strings.Split(string(b), "\n")
	for i, l := range lines {
		if strings.HasPrefix(l, "log.dirs=") {
			lines[i] = "log.dirs=" + dir
		}
	}
	br.opts.LogDir = dir
	return os.WriteFile(br.cfg, []byte(strings.Join(lines, "\n")), 0o644)
}
