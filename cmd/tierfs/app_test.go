package main

import (
	"strings"
	"testing"
)

func TestMainRejectsBadArguments(t *testing.T) {
	cases := []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"tierfs", "mount"}, 2, "one argument"},
		{[]string{"tierfs", "mount", "a", "b"}, 2, "one argument"},
		{[]string{"tierfs", "umount"}, 2, "one argument"},
		{[]string{"tierfs", "--log-level", "loud", "mount", "/x"}, 2, "--log-level"},
		{[]string{"tierfs", "--log-format", "xml", "mount", "/x"}, 2, "--log-format"},
		{[]string{"tierfs", "umount", "/"}, 1, "not a tierfs mount"},
		{[]string{"tierfs", "mount", "--kafka-bootstrap", "127.0.0.1:9092", "/x"}, 2, "needs --remote"},
		{[]string{"tierfs", "mount", "--role", "boss", "/x"}, 2, "auto, leader, follower or reader"},
		{[]string{"tierfs", "mount", "--remote", "file:///nonexistent-store", "--kafka-bootstrap", "127.0.0.1:9092", "--kafka-client-properties", "/nonexistent.properties", "/x"}, 2, "--kafka-client-properties"},
	}
	for _, c := range cases {
		err := Main(c.args)
		if err == nil {
			t.Errorf("%v: no error", c.args)
			continue
		}
		if got := exitCode(err); got != c.code {
			t.Errorf("%v: exit code %d, want %d (%v)", c.args, got, c.code, err)
		}
		if !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%v: error %q does not mention %q", c.args, err, c.msg)
		}
	}
}

func TestMainHelp(t *testing.T) {
	if err := Main([]string{"tierfs", "--help"}); err != nil {
		t.Fatal(err)
	}
}
