package kafkalead

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/tierfs/tierfs/peer/peertest"
)

// TestWatcherWithTLS: a cluster that takes mutual TLS only is asked
// with the PEM trust store and key store of a client properties file
// (files, or inline PEM in either of the ways Java properties write it);
// without the client's key, or trusting another CA, it does not answer.
func TestWatcherWithTLS(t *testing.T) {
	dir := t.TempDir()
	pki, err := peertest.WritePKI(dir, "kafka")
	if err != nil {
		t.Fatal(err)
	}
	other, err := peertest.WritePKI(dir, "other")
	if err != nil {
		t.Fatal(err)
	}
	read := func(paths ...string) []byte {
		var out []byte
		for _, p := range paths {
			b, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, b...)
		}
		return out
	}
	srv, err := tls.X509KeyPair(read(pki.ServerCert), read(pki.ServerKey))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(read(pki.CA))
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "orders"),
		kfake.TLS(&tls.Config{Certificates: []tls.Certificate{srv}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert}))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	keystore := filepath.Join(dir, "client.pem")
	if err := os.WriteFile(keystore, read(pki.ClientCert, pki.ClientKey), 0o600); err != nil {
		t.Fatal(err)
	}
	// escaped: one logical line, newlines as \n; joined: the PEM's own
	// lines joined by continuations (Kafka's documentation's way).
	escaped := func(p string) string {
		return strings.ReplaceAll(string(read(p)), "\n", "\\n\\\n")
	}
	joined := func(p string) string {
		return strings.ReplaceAll(string(bytes.TrimSpace(read(p))), "\n", " \\\n  ")
	}
	for _, tc := range []struct {
		name, props string
		ok          bool
	}{
		{"mutual TLS", "security.protocol=SSL\nssl.truststore.type=PEM\nssl.truststore.location=" + pki.CA + "\nssl.keystore.type=PEM\nssl.keystore.location=" + keystore, true},
		{"no host name check", "security.protocol=SSL\nssl.endpoint.identification.algorithm=\nssl.truststore.location=" + pki.CA + "\nssl.keystore.location=" + keystore, true},
		{"inline PEM, escaped newlines", "security.protocol=SSL\nssl.truststore.certificates=" + escaped(pki.CA) + "\nssl.keystore.location=" + keystore, true},
		{"inline PEM, joined lines", "security.protocol=SSL\nssl.truststore.certificates=" + joined(pki.CA) +
			"\nssl.keystore.certificate.chain=" + joined(pki.ClientCert) + "\nssl.keystore.key=" + joined(pki.ClientKey), true},
		{"no client key", "security.protocol=SSL\nssl.truststore.location=" + pki.CA, false},
		{"another CA", "security.protocol=SSL\nssl.truststore.location=" + other.CA + "\nssl.keystore.location=" + keystore, false},
		{"another CA, no host name check", "security.protocol=SSL\nssl.endpoint.identification.algorithm=\nssl.truststore.location=" + other.CA + "\nssl.keystore.location=" + keystore, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := watcherWithProps(t, c, tc.props)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := w.Poll(ctx); (err == nil) != tc.ok {
				t.Fatalf("answered: %v, want %v", err, tc.ok)
			}
		})
	}
}
