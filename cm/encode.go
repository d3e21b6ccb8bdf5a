package cm

import (
	"strconv"
	"unicode/utf8"
)

// appendEvent appends ev as JSON, the same object json.Marshal makes of
// it (the same fields, omitted when empty, and the same text after
// decoding), without reflection: an event is written for every change
// through the mount, and encoding/json cost as much as the write.
// FuzzEventEncoding checks it against encoding/json.
func appendEvent(b []byte, ev *Event) []byte {
	b = append(b, `{"id":`...)
	b = strconv.AppendUint(b, ev.ID, 10)
	b = append(b, `,"t":`...)
	b = strconv.AppendInt(b, ev.TimeNs, 10)
	b = appendStr(b, "type", ev.Type, false)
	b = appendStr(b, "kind", ev.Kind, true)
	b = appendStr(b, "path", ev.Path, false)
	b = appendStr(b, "to", ev.To, true)
	b = appendInt(b, "size", ev.Size)
	b = appendInt(b, "new_size", ev.NewSize)
	b = appendInt(b, "old_size", ev.OldSize)
	b = appendStr(b, "sum", ev.Sum, true)
	b = appendStr(b, "name", ev.Name, true)
	b = appendStr(b, "pending", ev.Pending, true)
	if ev.Ref != 0 {
		b = append(b, `,"ref":`...)
		b = strconv.AppendUint(b, ev.Ref, 10)
	}
	b = appendStr(b, "target", ev.Target, true)
	b = appendInt(b, "flags", int64(ev.Flags))
	b = appendBool(b, "overwrote", ev.Overwrote)
	b = appendStr(b, "over", ev.Over, true)
	b = appendBool(b, "from_untracked", ev.FromUntracked)
	b = appendBool(b, "zero_tail", ev.ZeroTail)
	b = appendBool(b, "recovered", ev.Recovered)
	return append(b, '}')
}

func appendInt(b []byte, key string, v int64) []byte {
	if v == 0 {
		return b
	}
	b = append(b, ',', '"')
	b = append(b, key...)
	b = append(b, '"', ':')
	return strconv.AppendInt(b, v, 10)
}

func appendBool(b []byte, key string, v bool) []byte {
	if !v {
		return b
	}
	b = append(b, ',', '"')
	b = append(b, key...)
	return append(b, `":true`...)
}

func appendStr(b []byte, key, v string, omitEmpty bool) []byte {
	if v == "" && omitEmpty {
		return b
	}
	b = append(b, ',', '"')
	b = append(b, key...)
	b = append(b, '"', ':')
	return appendJSONString(b, v)
}

const hexDigits = "0123456789abcdef"

// appendJSONString appends s as a JSON string. As encoding/json does,
// bytes that are not UTF-8 become U+FFFD (an event's text is what
// json.Marshal would have written).
func appendJSONString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
