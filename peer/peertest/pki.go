// Package peertest makes what tests of peer transfers need: a CA, and
// certificates for 127.0.0.1 signed by it.
package peertest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// PKI names the files WritePKI wrote.
type PKI struct {
	CA, ServerCert, ServerKey, ClientCert, ClientKey string
}

// WritePKI writes a CA named name and a server and a client certificate
// it signed (the server's for 127.0.0.1 and localhost) into dir.
func WritePKI(dir, name string) (PKI, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return PKI{}, err
	}
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name + " CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return PKI{}, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return PKI{}, err
	}
	p := PKI{CA: filepath.Join(dir, name+"-ca.pem")}
	if err := writePEM(p.CA, "CERTIFICATE", caDER); err != nil {
		return PKI{}, err
	}
	leaf := func(cn string, serial int64, usage x509.ExtKeyUsage) (string, string, error) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return "", "", err
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
			IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			return "", "", err
		}
		kder, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			return "", "", err
		}
		cert, keyFile := filepath.Join(dir, name+"-"+cn+".pem"), filepath.Join(dir, name+"-"+cn+"-key.pem")
		if err := writePEM(cert, "CERTIFICATE", der); err != nil {
			return "", "", err
		}
		return cert, keyFile, writePEM(keyFile, "EC PRIVATE KEY", kder)
	}
	if p.ServerCert, p.ServerKey, err = leaf("server", 2, x509.ExtKeyUsageServerAuth); err != nil {
		return PKI{}, err
	}
	if p.ClientCert, p.ClientKey, err = leaf("client", 3, x509.ExtKeyUsageClientAuth); err != nil {
		return PKI{}, err
	}
	return p, nil
}

func writePEM(path, typ string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
}
