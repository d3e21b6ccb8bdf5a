package posixtest

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// raceBudget bounds every racing loop, so that the suite stays quick on a
// slow machine; the counts are high enough to hit the races it looks for.
const raceBudget = 2 * time.Second

func concurrencyCases() []Case {
	return []Case{
		{"two-writers", func(t *testing.T, dir string, tr *Transcript) {
			p := filepath.Join(dir, "shared")
			writeFile(t, p, nil)
			var wg sync.WaitGroup
			var failures atomic.Int32
			for w := range 2 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					f, err := os.OpenFile(p, os.O_WRONLY, 0)
					if err != nil {
						failures.Add(1)
						return
					}
					defer f.Close()
					block := bytes.Repeat([]byte{byte('a' + w)}, 4096)
					for i := w; i < 512; i += 2 {
						if _, err := f.WriteAt(block, int64(i)*4096); err != nil {
							failures.Add(1)
						}
					}
				}()
			}
			wg.Wait()
			tr.Say("write failures: %d", failures.Load())
			sayFile(tr, "shared", p)
		}},
		{"reader-vs-truncate", func(t *testing.T, dir string, tr *Transcript) {
			p := filepath.Join(dir, "churn")
			content := bytes.Repeat([]byte{'A'}, 65536)
			writeFile(t, p, content)
			stop := make(chan struct{})
			var bad, reads atomic.Int64
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				f, err := os.Open(p)
				if err != nil {
					bad.Add(1)
					return
				}
				defer f.Close()
				buf := make([]byte, 8192)
				for off := int64(0); ; off = (off + 12345) % 65536 {
					select {
					case <-stop:
						return
					default:
					}
					n, _ := f.ReadAt(buf, off)
					reads.Add(1)
					// Zeros are legitimate (a read can land between the
					// truncate and the rewrite, natively too); any other
					// byte was never in the file.
					if bytes.IndexFunc(buf[:n], func(r rune) bool { return r != 'A' && r != 0 }) >= 0 {
						bad.Add(1)
					}
				}
			}()
			w, err := os.OpenFile(p, os.O_RDWR, 0)
			must(t, err)
			deadline := time.Now().Add(raceBudget / 2)
			for i := 0; i < 3000 && time.Now().Before(deadline); i++ {
				w.Truncate(int64(i*97) % 65536)
				w.WriteAt(content, 0)
			}
			w.Close()
			close(stop)
			wg.Wait()
			tr.Say("reads returned bytes never written: %v", bad.Load() > 0)
			tr.Say("reader ran: %v", reads.Load() > 0)
		}},
		{"rename-over-open", func(t *testing.T, dir string, tr *Transcript) {
			// Kafka writes every checkpoint as file.tmp, then renames it
			// over file, while other threads open file to read it.
			target := filepath.Join(dir, "replication-offset-checkpoint")
			version := func(i int) []byte { return []byte("0\n1\ntopic 0 " + strconv.Itoa(i) + "\n") }
			writeFile(t, target, version(0))
			stop := make(chan struct{})
			var enoent, torn, opens atomic.Int64
			var wg sync.WaitGroup
			for range 2 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						select {
						case <-stop:
							return
						default:
						}
						data, err := os.ReadFile(target)
						opens.Add(1)
						if errors.Is(err, os.ErrNotExist) {
							enoent.Add(1)
							continue
						}
						if err != nil || !bytes.HasPrefix(data, []byte("0\n1\ntopic 0 ")) || !bytes.HasSuffix(data, []byte("\n")) {
							if torn.Add(1) == 1 {
								t.Logf("torn read: %q %v", data, err)
							}
						}
					}
				}()
			}
			tmp := target + ".tmp"
			// A fixed count, so both runs end on the same version; the
			// deadline only guards against a hang.
			deadline := time.Now().Add(10 * raceBudget)
			renames := 0
			for i := 1; i <= 300 && time.Now().Before(deadline); i++ {
				f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
				must(t, err)
				f.Write(version(i))
				f.Sync()
				f.Close()
				must(t, os.Rename(tmp, target))
				renames++
			}
			close(stop)
			wg.Wait()
			t.Logf("rename-over-open: %d renames, %d opens, %d ENOENT, %d torn", renames, opens.Load(), enoent.Load(), torn.Load())
			tr.Say("an open saw ENOENT: %v", enoent.Load() > 0)
			tr.Say("a read saw a torn file: %v", torn.Load() > 0)
			tr.Say("renames done: %d", renames)
			sayFile(tr, "final", target)
		}},
		{"stat-vs-write", func(t *testing.T, dir string, tr *Transcript) {
			// Sizes seen through stat only grow while a file is appended to.
			p := filepath.Join(dir, "grow")
			f, err := os.Create(p)
			must(t, err)
			stop := make(chan struct{})
			var shrank atomic.Bool
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				var last int64
				for {
					select {
					case <-stop:
						return
					default:
					}
					var st unix.Stat_t
					if unix.Stat(p, &st) == nil {
						if st.Size < last {
							shrank.Store(true)
						}
						last = st.Size
					}
				}
			}()
			chunk := bytes.Repeat([]byte("r"), 1000)
			for range 2000 {
				f.Write(chunk)
			}
			f.Close()
			close(stop)
			wg.Wait()
			tr.Say("size went backwards: %v", shrank.Load())
			sayFile(tr, "grow", p)
		}},
	}
}
