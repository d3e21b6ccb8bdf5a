package kafkalead

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

// ReadProperties reads a Java properties file (key=value or key: value
// lines, # and ! comments, backslash line continuations), as the
// broker's own client.properties is written.
func ReadProperties(path string) (map[string]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return ParseProperties(path, data)
}

// ParseProperties parses properties text; name is for errors.
func ParseProperties(name string, data []byte) (map[string]string, error) {
	out := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	line, cont := 0, ""
	for sc.Scan() {
		line++
		s := strings.TrimLeft(sc.Text(), " \t\f")
		if cont == "" && (s == "" || s[0] == '#' || s[0] == '!') {
			continue
		}
		if strings.HasSuffix(s, `\`) && !strings.HasSuffix(s, `\\`) {
			cont += strings.TrimSuffix(s, `\`)
			continue
		}
		s, cont = cont+s, ""
		i := strings.IndexAny(s, "=:")
		if i < 0 {
			return nil, fmt.Errorf("%s: line %d: %q is not key=value", name, line, s)
		}
		k, v := strings.TrimSpace(s[:i]), strings.TrimSpace(s[i+1:])
		if k == "" {
			return nil, fmt.Errorf("%s: line %d: no key", name, line)
		}
		out[k] = v
	}
	return out, sc.Err()
}

// jaasOption is one key="value" of a sasl.jaas.config.
var jaasOption = regexp.MustCompile(`(\w+)\s*=\s*"((?:[^"\\]|\\.)*)"`)

// ClientOptions are the client options of a Kafka client's properties:
// security.protocol (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL),
// sasl.mechanism (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512) with the user and
// password of sasl.jaas.config, and for TLS PEM trust and key stores
// (ssl.truststore.location or ssl.truststore.certificates,
// ssl.keystore.location or ssl.keystore.certificate.chain and
// ssl.keystore.key) and ssl.endpoint.identification.algorithm. Other
// keys are a Java client's own and are left alone; a value tierfs cannot
// honour (a JKS store, GSSAPI) is an error that names it.
func ClientOptions(props map[string]string) ([]kgo.Opt, error) {
	var opts []kgo.Opt
	proto := strings.ToUpper(cmpOr(props["security.protocol"], "PLAINTEXT"))
	var useTLS, useSASL bool
	switch proto {
	case "PLAINTEXT":
	case "SSL":
		useTLS = true
	case "SASL_PLAINTEXT":
		useSASL = true
	case "SASL_SSL":
		useTLS, useSASL = true, true
	default:
		return nil, fmt.Errorf("security.protocol %q: PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL", props["security.protocol"])
	}
	if useTLS {
		c, err := tlsConfig(props)
		if err != nil {
			return nil, err
		}
		opts = append(opts, kgo.DialTLSConfig(c))
	}
	if useSASL {
		jaas := props["sasl.jaas.config"]
		kv := map[string]string{}
		for _, m := range jaasOption.FindAllStringSubmatch(jaas, -1) {
			kv[m[1]] = strings.ReplaceAll(strings.ReplaceAll(m[2], `\"`, `"`), `\\`, `\`)
		}
		user, pass := kv["username"], kv["password"]
		if user == "" {
			return nil, errors.New(`sasl.jaas.config: no username="..." (and password="...")`)
		}
		switch mech := strings.ToUpper(cmpOr(props["sasl.mechanism"], "GSSAPI")); mech {
		case "PLAIN":
			opts = append(opts, kgo.SASL(plain.Auth{User: user, Pass: pass}.AsMechanism()))
		case "SCRAM-SHA-256":
			opts = append(opts, kgo.SASL(scram.Auth{User: user, Pass: pass}.AsSha256Mechanism()))
		case "SCRAM-SHA-512":
			opts = append(opts, kgo.SASL(scram.Auth{User: user, Pass: pass}.AsSha512Mechanism()))
		default:
			return nil, fmt.Errorf("sasl.mechanism %q: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512", mech)
		}
	}
	return opts, nil
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// tlsConfig is the TLS of ssl.* properties, PEM only.
func tlsConfig(props map[string]string) (*tls.Config, error) {
	c := &tls.Config{MinVersion: tls.VersionTLS12}
	for _, k := range []string{"ssl.truststore.type", "ssl.keystore.type"} {
		if t := props[k]; t != "" && !strings.EqualFold(t, "PEM") {
			return nil, fmt.Errorf("%s %q: tierfs reads PEM stores only (convert with keytool and openssl)", k, t)
		}
	}
	pem := []byte(props["ssl.truststore.certificates"])
	if p := props["ssl.truststore.location"]; p != "" {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("ssl.truststore.location: %w", err)
		}
		pem = b
	}
	if len(pem) > 0 {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, errors.New("ssl.truststore: no PEM certificate in it")
		}
		c.RootCAs = pool
	}
	chain, key := []byte(props["ssl.keystore.certificate.chain"]), []byte(props["ssl.keystore.key"])
	if p := props["ssl.keystore.location"]; p != "" {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("ssl.keystore.location: %w", err)
		}
		chain, key = b, b
	}
	if len(chain) > 0 || len(key) > 0 {
		cert, err := tls.X509KeyPair(chain, key)
		if err != nil {
			return nil, fmt.Errorf("ssl.keystore: %w", err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	if alg, ok := props["ssl.endpoint.identification.algorithm"]; ok && alg == "" {
		// The chain is checked, the host name is not (as the Java
		// client does with an empty algorithm).
		c.InsecureSkipVerify = true
		c.VerifyConnection = func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("the broker sent no certificate")
			}
			inter := x509.NewCertPool()
			for _, ic := range cs.PeerCertificates[1:] {
				inter.AddCert(ic)
			}
			_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: c.RootCAs, Intermediates: inter})
			return err
		}
	}
	return c, nil
}
