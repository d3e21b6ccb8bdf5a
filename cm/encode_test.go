package cm

import (
	"encoding/json"
	"reflect"
	"testing"
)

// The hand-written encoding of events must decode to what encoding/json's
// does, for any event, and be valid JSON.
func FuzzEventEncoding(f *testing.F) {
	f.Add(uint64(1), int64(1796332206709877178), "delete", "file", "orders-0/00000000000000000000.log", "", int64(65532), int64(0), int64(0), "", "", "tmp/move-1-2-orders-0%2F0.log", uint64(0), "", uint32(0), false, "", false, false, false)
	f.Add(uint64(7), int64(-1), "rename", "symlink", "a\"b\\c\nd\x01é\xff<>&\u2028", "to\ttab", int64(-5), int64(9), int64(1<<40), "ab", "files/x_ab", "", uint64(3), "../t", uint32(2), true, "file", true, true, true)
	f.Fuzz(func(t *testing.T, id uint64, ts int64, typ, kind, path, to string, size, newSize, oldSize int64, sum, name, pending string, ref uint64, target string, flags uint32, overwrote bool, over string, fromUntracked, zeroTail, recovered bool) {
		ev := Event{ID: id, TimeNs: ts, Type: typ, Kind: kind, Path: path, To: to, Size: size, NewSize: newSize, OldSize: oldSize,
			Sum: sum, Name: name, Pending: pending, Ref: ref, Target: target, Flags: flags, Overwrote: overwrote, Over: over,
			FromUntracked: fromUntracked, ZeroTail: zeroTail, Recovered: recovered}
		std, err := json.Marshal(&ev)
		if err != nil {
			t.Fatal(err)
		}
		var want, got Event
		if err := json.Unmarshal(std, &want); err != nil {
			t.Fatal(err)
		}
		ours := appendEvent(nil, &ev)
		if !json.Valid(ours) {
			t.Fatalf("not JSON: %q", ours)
		}
		if err := json.Unmarshal(ours, &got); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(want, got) {
			t.Fatalf("decodes to\n%+v\nencoding/json's to\n%+v\n(%s\n%s)", got, want, ours, std)
		}
		// The same keys: nothing omitted that encoding/json writes.
		var wk, gk map[string]any
		json.Unmarshal(std, &wk)
		json.Unmarshal(ours, &gk)
		if len(wk) != len(gk) {
			t.Fatalf("keys %v, encoding/json's %v", gk, wk)
		}
	})
}
