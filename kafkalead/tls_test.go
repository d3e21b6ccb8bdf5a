package kafkalead

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
)

// testCert is a certificate and key, signed by parent (self-signed when
// nil), as PEM.
type testCert struct {
	cert    *x509.Certificate
	key     *ecdsa.PrivateKey
	certPEM []byte
	keyPEM  []byte
}

func newCert(t *testing.T, name string, parent *testCert, ca bool) *testCert {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(time.Now().UnixNano()),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  ca,
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		BasicConstraintsValid: true,
	}
	signer, signKey := tmpl, key
	if parent != nil {
		signer, signKey = parent.cert, parent.key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, signer, &key.PublicKey, signKey)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	kb, _ := x509.MarshalECPrivateKey(key)
	return &testCert{cert: c, key: key, certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		keyPEM: pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb})}
}

// TestWatcherWithTLS: a cluster that takes mutual TLS only is asked
// with the PEM trust store and key store of a client properties file;
// without the client's key, or trusting another CA, it does not answer.
func TestWatcherWithTLS(t *testing.T) {
	ca := newCert(t, "test CA", nil, true)
	srv := newCert(t, "broker", ca, false)
	cli := newCert(t, "tierfs", ca, false)
	other := newCert(t, "another CA", nil, true)
	pool := x509.NewCertPool()
	pool.AddCert(ca.cert)
	srvPair, err := tls.X509KeyPair(srv.certPEM, srv.keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "orders"),
		kfake.TLS(&tls.Config{Certificates: []tls.Certificate{srvPair}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert}))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	dir := t.TempDir()
	write := func(name string, b ...[]byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, bytes.Join(b, nil), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	caFile, otherFile := write("ca.pem", ca.certPEM), write("other.pem", other.certPEM)
	keystore := write("client.pem", cli.certPEM, cli.keyPEM)
	for _, tc := range []struct {
		name, props string
		ok          bool
	}{
		{"mutual TLS", "security.protocol=SSL\nssl.truststore.type=PEM\nssl.truststore.location=" + caFile + "\nssl.keystore.type=PEM\nssl.keystore.location=" + keystore, true},
		{"no host name check", "security.protocol=SSL\nssl.endpoint.identification.algorithm=\nssl.truststore.location=" + caFile + "\nssl.keystore.location=" + keystore, true},
		{"inline PEM, escaped newlines", "security.protocol=SSL\nssl.truststore.certificates=" + strings.ReplaceAll(string(ca.certPEM), "\n", "\\n\\\n") +
			"\nssl.keystore.location=" + keystore, true},
		{"inline PEM, joined lines", "security.protocol=SSL\nssl.truststore.certificates=" + strings.ReplaceAll(strings.TrimSpace(string(ca.certPEM)), "\n", " \\\n  ") +
			"\nssl.keystore.certificate.chain=" + strings.ReplaceAll(strings.TrimSpace(string(cli.certPEM)), "\n", " \\\n  ") +
			"\nssl.keystore.key=" + strings.ReplaceAll(strings.TrimSpace(string(cli.keyPEM)), "\n", " \\\n  "), true},
		{"no client key", "security.protocol=SSL\nssl.truststore.location=" + caFile, false},
		{"another CA", "security.protocol=SSL\nssl.truststore.location=" + otherFile + "\nssl.keystore.location=" + keystore, false},
		{"another CA, no host name check", "security.protocol=SSL\nssl.endpoint.identification.algorithm=\nssl.truststore.location=" + otherFile + "\nssl.keystore.location=" + keystore, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			props, err := ParseProperties("client.properties", []byte(tc.props))
			if err != nil {
				t.Fatal(err)
			}
			opts, err := ClientOptions(props)
			if err != nil {
				if tc.ok {
					t.Fatal(err)
				}
				return
			}
			w := newWatcher(t, c, 0, nil, opts...)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := w.Poll(ctx); (err == nil) != tc.ok {
				t.Fatalf("answered: %v, want %v", err, tc.ok)
			}
		})
	}
}
