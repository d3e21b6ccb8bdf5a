package peer

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
)

// ServerTLS is mutual TLS for a server: its certificate and key, and the
// CA that must have signed every client's certificate. A client without
// one, or with one of another CA, is refused in the handshake.
func ServerTLS(certFile, keyFile, caFile string) (*tls.Config, error) {
	cert, pool, err := load(certFile, keyFile, caFile)
	if err != nil {
		return nil, err
	}
	return &tls.Config{
		Certificates: []tls.Certificate{cert},
		ClientCAs:    pool,
		ClientAuth:   tls.RequireAndVerifyClientCert,
		MinVersion:   tls.VersionTLS13,
	}, nil
}

// ClientTLS is mutual TLS for a client: its certificate and key, and the
// CA that must have signed the server's certificate, which must name
// serverName (the host of the address, by default).
func ClientTLS(certFile, keyFile, caFile, serverName string) (*tls.Config, error) {
	cert, pool, err := load(certFile, keyFile, caFile)
	if err != nil {
		return nil, err
	}
	return &tls.Config{
		Certificates: []tls.Certificate{cert},
		RootCAs:      pool,
		ServerName:   serverName,
		MinVersion:   tls.VersionTLS13,
	}, nil
}

func load(certFile, keyFile, caFile string) (tls.Certificate, *x509.CertPool, error) {
	if certFile == "" || keyFile == "" || caFile == "" {
		return tls.Certificate{}, nil, fmt.Errorf("TLS needs --tls-cert, --tls-key and --tls-ca together")
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return tls.Certificate{}, nil, fmt.Errorf("TLS certificate %s, key %s: %w", certFile, keyFile, err)
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return tls.Certificate{}, nil, fmt.Errorf("TLS CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return tls.Certificate{}, nil, fmt.Errorf("TLS CA %s: no PEM certificate in it", caFile)
	}
	return cert, pool, nil
}
