package main

import (
	"strings"
	"testing"
)

func TestMountHelperArgs(t *testing.T) {
	for _, c := range []struct {
		args     []string
		want     string
		log      string
		fake     bool
		errorHas string
	}{
		// In place (source = dir), generic options dropped, flags passed.
		{[]string{"/data/kafka", "/data/kafka", "-o", "rw,nofail,remote=s3://b/p?endpoint=http://127.0.0.1:9000,cm,x-systemd.requires=network.target"},
			"mount --remote=s3://b/p?endpoint=http://127.0.0.1:9000 --cm /data/kafka", "/var/log/tierfs-data-kafka.log", false, ""},
		// A separate backing dir; global flags before the command; -f.
		{[]string{"/hot", "/mnt/kafka", "-f", "-oconfig=/etc/tierfs.yaml,ship-after=10m,log-file=/tmp/t.log", "-t", "tierfs"},
			"--config=/etc/tierfs.yaml mount --backing /hot --ship-after=10m /mnt/kafka", "/tmp/t.log", true, ""},
		{[]string{"/only-one"}, "", "", false, "usage"},
		{[]string{"/a", "/b", "-o", "backing=/c"}, "", "", false, "source"},
	} {
		got, log, fake, err := helperArgs(c.args)
		if c.errorHas != "" {
			if err == nil || !strings.Contains(err.Error(), c.errorHas) {
				t.Errorf("%v: error %v, want one with %q", c.args, err, c.errorHas)
			}
			continue
		}
		if err != nil || strings.Join(got, " ") != c.want || log != c.log || fake != c.fake {
			t.Errorf("%v:\n got %q log %s fake %v err %v\nwant %q log %s fake %v", c.args, strings.Join(got, " "), log, fake, err, c.want, c.log, c.fake)
		}
	}
}
