package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tierfs/tierfs/e2e/kafka"
)

// TestKafkaLeadershipOverSASL (issue 26): a real broker whose client
// listener takes SASL PLAIN only; the mount asks it who leads through
// that listener, with the user and password of a client properties
// file, and ships what its broker leads. After a clean stop and start
// of both with a wrong password in the file, the cluster does not
// answer, and the mount uploads nothing more.
func TestKafkaLeadershipOverSASL(t *testing.T) {
	requireKafka(t)
	r := remotes(t)[0] // dir
	// Below the ephemeral range: the mount dials it before the broker
	// listens (see kafka.FreePort).
	saslPort, err := kafka.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	saslAddr := fmt.Sprintf("127.0.0.1:%d", saslPort)
	props := filepath.Join(t.TempDir(), "client.properties")
	writeProps := func(pass string) {
		t.Helper()
		body := "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\n" +
			"sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required \\\n" +
			"    username=\"tierfs\" \\\n    password=\"" + pass + "\";\n"
		if err := os.WriteFile(props, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	writeProps("s3cret")
	_, backing, mnt := mountDirs(t)
	args := []string{"--backing", backing, "--remote", r.url, "--ship-after", "2s", "--local-retention-bytes", "1",
		"--tier-interval", "500ms", "--kafka-bootstrap", saslAddr, "--kafka-client-properties", props, "--kafka-poll-interval", "1s", mnt}
	m := startMount(t, r.env, args...)
	br := startBrokerWith(t, kafka.Options{LogDir: mnt, Listener: "SASL_PLAINTEXT://" + saslAddr, Props: map[string]string{
		"sasl.enabled.mechanisms":                             "PLAIN",
		"listener.name.sasl_plaintext.plain.sasl.jaas.config": `org.apache.kafka.common.security.plain.PlainLoginModule required user_tierfs="s3cret";`,
	}})
	s := kafka.Stream{Topic: "secured", Size: 1000}
	name := s.Topic + "-0"
	createTopic(t, br, s.Topic, nil)
	produce(t, br, s, 0, 8000)
	part := filepath.Join(mnt, name)
	waitEvicted(t, part, 4, m)
	st := statusOf(t, mnt)[name]
	if st.Role.Role != "leader" || st.Role.Lead == nil || !st.Role.Lead.Self || st.Uploaded == 0 {
		t.Fatalf("with the right password: %+v", st)
	}
	uploaded, lead := st.Uploaded, *st.Role.Lead

	// A clean stop of the broker and the mount, and a start again with
	// a wrong password: 8,000 more records roll and are old enough to
	// ship, but with no answer from the cluster the mount leads nothing.
	if err := br.Stop(); err != nil {
		t.Fatal(err)
	}
	m.stop(t)
	writeProps("wrong")
	m = startMount(t, r.env, args...)
	if err := br.Restart(); err != nil {
		t.Fatal(err)
	}
	produce(t, br, s, 8000, 16000)
	time.Sleep(5 * time.Second)
	st = statusOf(t, mnt)[name]
	if st.Role.Role != "follower" || !strings.Contains(st.Role.Why, "not known") || st.Uploaded != uploaded {
		t.Fatalf("with a wrong password: %+v (%d uploaded before)", st, uploaded)
	}
	if !strings.Contains(m.Log(), "cannot ask the Kafka cluster") {
		t.Fatalf("the mount does not say it cannot ask:\n%s", m.Log())
	}
	if got := consumeAll(t, br, s, 16000); got.Records != 16000 {
		t.Errorf("consumed %d records", got.Records)
	}
	noProblems(t, br)
	t.Logf("over SASL PLAIN: broker %d leads in leader epoch %d; %d segments uploaded, none more with a wrong password", lead.Leader, lead.Epoch, uploaded)
}
