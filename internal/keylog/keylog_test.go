package keylog

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func open(t *testing.T, p string) *Log {
	t.Helper()
	l, cut, err := Open(p)
	if err != nil {
		t.Fatal(err)
	}
	if cut != 0 {
		t.Fatalf("cut %d bytes", cut)
	}
	return l
}

func get(t *testing.T, l *Log, k string) string {
	t.Helper()
	v, ok, err := l.Get(k)
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		return "<none>"
	}
	return string(v)
}

func TestPutGetDeleteReopen(t *testing.T) {
	p := filepath.Join(t.TempDir(), "sub", "a.klog")
	l := open(t, p)
	if get(t, l, "x") != "<none>" || l.Len() != 0 {
		t.Fatal("empty log has a key")
	}
	for _, kv := range [][2]string{{"x", `{"n":1}`}, {"y", `"two"`}, {"x", `{"n":3}`}, {"z", `[1,2]`}} {
		if err := l.Put(kv[0], []byte(kv[1])); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Delete("y"); err != nil {
		t.Fatal(err)
	}
	if err := l.Delete("never"); err != nil {
		t.Fatal(err)
	}
	check := func(l *Log) {
		t.Helper()
		if get(t, l, "x") != `{"n":3}` || get(t, l, "y") != "<none>" || get(t, l, "z") != `[1,2]` {
			t.Fatalf("x=%s y=%s z=%s", get(t, l, "x"), get(t, l, "y"), get(t, l, "z"))
		}
		if fmt.Sprint(l.Keys()) != "[x z]" {
			t.Fatalf("keys %v", l.Keys())
		}
		var seen []string
		l.Each(func(k string, v []byte) error { seen = append(seen, k+"="+string(v)); return nil })
		if fmt.Sprint(seen) != `[x={"n":3} z=[1,2]]` {
			t.Fatalf("each %v", seen)
		}
	}
	check(l)
	check(open(t, p))
	for _, bad := range []string{"", "null", "{", "x"} {
		if err := l.Put("k", []byte(bad)); err == nil {
			t.Fatalf("put %q: no error", bad)
		}
	}
	// The last key deleted takes the file with it.
	l.Delete("x")
	l.Delete("z")
	if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("empty log left a file: %v", err)
	}
	if err := l.Put("again", []byte("1")); err != nil || get(t, open(t, p), "again") != "1" {
		t.Fatalf("put after empty: %v", err)
	}
}

// A torn last line (a crash during an append) is cut at open; a bad line
// before the last is an error that names the file and its offset.
func TestTornAndBadLines(t *testing.T) {
	p := filepath.Join(t.TempDir(), "a.klog")
	l := open(t, p)
	l.Put("a", []byte("1"))
	l.Put("b", []byte("2"))
	good, _ := os.ReadFile(p)
	next, _ := encode("c", []byte("3"))
	for name, tail := range map[string][]byte{
		"cut short":       next[:len(next)-4],
		"no newline":      next[:len(next)-1],
		"bad crc at end":  append([]byte("ffffffff"), next[8:]...),
		"junk at the end": []byte("junk\n"),
	} {
		t.Run(name, func(t *testing.T) {
			b := append(append([]byte{}, good...), tail...)
			os.WriteFile(p, b, 0o644)
			l, cut, err := Open(p)
			if err != nil || cut != int64(len(tail)) {
				t.Fatalf("cut %d of %d, %v", cut, len(tail), err)
			}
			if fi, _ := os.Stat(p); fi.Size() != int64(len(good)) {
				t.Fatalf("file is %d bytes after the cut, want %d", fi.Size(), len(good))
			}
			if get(t, l, "a") != "1" || get(t, l, "b") != "2" {
				t.Fatal("lost a whole line")
			}
			// Appends go on after the cut.
			l.Put("c", []byte("3"))
			if get(t, open(t, p), "c") != "3" {
				t.Fatal("append after a cut")
			}
		})
	}
	// A bad line in the middle.
	first := strings.Index(string(good), "\n") + 1
	b := append([]byte("00000000 {\"k\":\"x\"}\n"), good...)
	os.WriteFile(p, b, 0o644)
	_, _, err := Open(p)
	var fe *FormatError
	if !errors.As(err, &fe) || fe.Offset != 0 || !strings.Contains(err.Error(), p+": offset 0: CRC32C") {
		t.Fatalf("bad first line: %v", err)
	}
	b = append(append(append([]byte{}, good[:first]...), []byte("not a line\n")...), good[first:]...)
	os.WriteFile(p, b, 0o644)
	if _, _, err := Open(p); !errors.As(err, &fe) || fe.Offset != int64(first) {
		t.Fatalf("bad second line: %v", err)
	}
}

// PutAll appends its puts as one line: they read back, reopen, mix with
// single puts and deletes, and a torn batch is cut off whole.
func TestPutAll(t *testing.T) {
	p := filepath.Join(t.TempDir(), "a.klog")
	l := open(t, p)
	l.Put("a", []byte("0"))
	before, _ := os.ReadFile(p)
	if err := l.PutAll([]Entry{{"a", []byte("1")}, {"b", []byte(`{"x":2}`)}, {"c", []byte("3")}, {"b", []byte(`"two"`)}}); err != nil {
		t.Fatal(err)
	}
	after, _ := os.ReadFile(p)
	if lines := strings.Count(string(after[len(before):]), "\n"); lines != 1 {
		t.Fatalf("PutAll wrote %d lines, want 1", lines)
	}
	if err := l.Delete("c"); err != nil {
		t.Fatal(err)
	}
	check := func(l *Log) {
		t.Helper()
		if get(t, l, "a") != "1" || get(t, l, "b") != `"two"` || get(t, l, "c") != "<none>" || fmt.Sprint(l.Keys()) != "[a b]" {
			t.Fatalf("a=%s b=%s c=%s keys %v", get(t, l, "a"), get(t, l, "b"), get(t, l, "c"), l.Keys())
		}
		var seen []string
		if err := l.Each(func(k string, v []byte) error { seen = append(seen, k+"="+string(v)); return nil }); err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(seen) != `[a=1 b="two"]` {
			t.Fatalf("Each saw %v", seen)
		}
	}
	check(l)
	check(open(t, p))
	if err := l.PutAll([]Entry{{"d", []byte("null")}}); err == nil {
		t.Fatal("a null value was taken")
	}
	// A torn batch: none of its puts survive.
	good, _ := os.ReadFile(p)
	batch, err := encodeLine(line{B: []line{{K: "a", V: []byte("9")}, {K: "e", V: []byte("5")}}}, "a")
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(p, append(append([]byte{}, good...), batch[:len(batch)-3]...), 0o644)
	r, cut, err := Open(p)
	if err != nil || cut != int64(len(batch)-3) {
		t.Fatalf("cut %d, %v", cut, err)
	}
	check(r)
	// Values too big for one line go in several.
	big := []byte(`"` + strings.Repeat("v", MaxLine/3) + `"`)
	if err := r.PutAll([]Entry{{"x", big}, {"y", big}, {"z", big}}); err != nil {
		t.Fatal(err)
	}
	if r := open(t, p); get(t, r, "z") != string(big) || r.Len() != 5 {
		t.Fatalf("big batch: %d keys", r.Len())
	}
}

// Once most of the file is dead lines, it is rewritten with the live
// ones only, and reads and reopens see the same values.
func TestCompaction(t *testing.T) {
	p := filepath.Join(t.TempDir(), "a.klog")
	l := open(t, p)
	val := []byte(`"` + strings.Repeat("v", 200) + `"`)
	for i := range 2000 {
		if err := l.Put(fmt.Sprintf("k%d", i%10), val); err != nil {
			t.Fatal(err)
		}
	}
	fi, _ := os.Stat(p)
	if fi.Size() > 2*compactAt {
		t.Fatalf("2000 puts of 10 keys left %d bytes", fi.Size())
	}
	r := open(t, p)
	if r.Len() != 10 || get(t, r, "k7") != string(val) || get(t, l, "k3") != string(val) {
		t.Fatalf("after compaction: %d keys", r.Len())
	}
	if left, _ := filepath.Glob(p + ".tmp-*"); len(left) != 0 {
		t.Fatalf("compaction left its temporary file: %v", left)
	}
	// Keys of batch lines survive a compaction, each on a line of its own.
	for i := range 200 {
		if err := l.PutAll([]Entry{{fmt.Sprintf("k%d", i%10), val}, {fmt.Sprintf("b%d", i%3), []byte(fmt.Sprint(i))}}); err != nil {
			t.Fatal(err)
		}
	}
	r = open(t, p)
	if r.Len() != 13 || get(t, r, "b2") != "197" || get(t, r, "b0") != "198" || get(t, r, "k9") != string(val) || get(t, l, "b1") != "199" {
		t.Fatalf("after compacting batches: %d keys, b2=%s", r.Len(), get(t, r, "b2"))
	}
	if fi, _ := os.Stat(p); fi.Size() > 2*compactAt+4096 {
		t.Fatalf("200 batches of 13 keys left %d bytes", fi.Size())
	}
}

func FuzzParse(f *testing.F) {
	var seed []byte
	for _, kv := range [][2]string{{"a", "1"}, {"b", `{"x":[1]}`}} {
		b, _ := encode(kv[0], []byte(kv[1]))
		seed = append(seed, b...)
	}
	d, _ := encode("a", nil)
	seed = append(seed, d...)
	f.Add(seed)
	batch, _ := encodeLine(line{B: []line{{K: "c", V: []byte("1")}, {K: "a", V: []byte(`"x"`)}}}, "c")
	f.Add(append(append([]byte{}, seed...), batch...))
	f.Add([]byte("00000000 {}\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		keys := map[string]string{}
		valid, err := Parse("fuzz", b, func(k string, v []byte) {
			if v == nil {
				delete(keys, k)
			} else {
				keys[k] = string(v)
			}
		})
		if err != nil {
			var fe *FormatError
			if !errors.As(err, &fe) || fe.Path != "fuzz" || fe.Offset < 0 || fe.Offset >= int64(len(b)) {
				t.Fatalf("error without file and offset: %v", err)
			}
			return
		}
		if valid < 0 || valid > int64(len(b)) {
			t.Fatalf("valid %d of %d", valid, len(b))
		}
		// What parsed encodes again to lines that parse to the same.
		var again []byte
		for k, v := range keys {
			e, err := encode(k, []byte(v))
			if err != nil {
				return // too long to write back: fine
			}
			again = append(again, e...)
		}
		got := map[string]string{}
		if _, err := Parse("again", again, func(k string, v []byte) { got[k] = string(v) }); err != nil || len(got) != len(keys) {
			t.Fatalf("round trip: %v, %d of %d keys", err, len(got), len(keys))
		}
	})
}

// A batch line is the line json.Marshal makes of it, and the places of
// its puts are those decodePuts finds when it is read back.
func TestEncodeBatch(t *testing.T) {
	ps := []line{
		{K: "a", V: json.RawMessage(`{"x":1}`)},
		{K: "b\"<q>", V: json.RawMessage(`"s,]}"`)},
		{K: "c", V: json.RawMessage(`[1, 2]`)},
	}
	b, puts, err := encodeBatch(ps, "a")
	if err != nil {
		t.Fatal(err)
	}
	want, err := encodeLine(line{B: ps}, "a")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b, want) {
		t.Fatalf("encodeBatch:\n%s\njson.Marshal:\n%s", b, want)
	}
	_, got, err := decodePuts(b[:len(b)-1])
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(puts, got) {
		t.Fatalf("puts at %v, decodePuts finds them at %v", puts, got)
	}
}

// OpenEach gives what Open then Each give: the same live keys and
// values in the same order, the same torn tail cut, and a Log that
// holds the same keys; an error from fn ends it.
func TestOpenEachIsOpenThenEach(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "a.klog")
	l := open(t, p)
	for i := range 30 {
		if err := l.Put(fmt.Sprintf("k%02d", i%11), []byte(fmt.Sprintf(`{"n":%d}`, i))); err != nil {
			t.Fatal(err)
		}
		if i%7 == 3 {
			if err := l.Delete(fmt.Sprintf("k%02d", (i+4)%11)); err != nil {
				t.Fatal(err)
			}
		}
		if i%9 == 0 {
			es := []Entry{{"b1", []byte(fmt.Sprintf(`[%d]`, i))}, {"k03", []byte(`"in a batch"`)}, {fmt.Sprintf("b%d", i), []byte(`{}`)}}
			if err := l.PutAll(es); err != nil {
				t.Fatal(err)
			}
		}
	}
	good, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	torn, _ := encode("late", []byte("1"))
	for name, b := range map[string][]byte{"whole": good, "torn tail": append(append([]byte{}, good...), torn[:len(torn)-3]...)} {
		t.Run(name, func(t *testing.T) {
			read := func(openEach bool) (kvs []string, keys []string, cut int64) {
				q := filepath.Join(t.TempDir(), "a.klog")
				if err := os.WriteFile(q, b, 0o644); err != nil {
					t.Fatal(err)
				}
				note := func(k string, v []byte) error { kvs = append(kvs, k+"="+string(v)); return nil }
				var l *Log
				var err error
				if openEach {
					l, cut, err = OpenEach(q, note)
				} else if l, cut, err = Open(q); err == nil {
					err = l.Each(note)
				}
				if err != nil {
					t.Fatal(err)
				}
				return kvs, l.Keys(), cut
			}
			kvs, keys, cut := read(false)
			kvs2, keys2, cut2 := read(true)
			if len(kvs) < 10 || !reflect.DeepEqual(kvs, kvs2) || !reflect.DeepEqual(keys, keys2) || cut != cut2 {
				t.Fatalf("Open then Each: %v, keys %v, cut %d\nOpenEach: %v, keys %v, cut %d", kvs, keys, cut, kvs2, keys2, cut2)
			}
		})
	}
	stop := errors.New("stop")
	if _, _, err := OpenEach(p, func(string, []byte) error { return stop }); !errors.Is(err, stop) {
		t.Fatalf("fn's error: %v", err)
	}
	if l, cut, err := OpenEach(filepath.Join(dir, "none.klog"), func(string, []byte) error { return stop }); err != nil || cut != 0 || l.Len() != 0 {
		t.Fatalf("no file: %v, %d, %v", l, cut, err)
	}
}
