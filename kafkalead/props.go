package kafkalead

import (
	"bufio"
	"bytes"
	"cmp"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strconv"
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

// ParseProperties parses properties text; name is for errors. Escapes
// in keys and values are read as Java reads them (\n, \t, \r, \f,
// \uXXXX, and a backslash before any other character is that
// character), and a line ending in an odd number of backslashes goes on
// in the next, its leading blanks dropped.
func ParseProperties(name string, data []byte) (map[string]string, error) {
	out := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	line, first, cont := 0, 0, ""
	for sc.Scan() {
		line++
		s := strings.TrimLeft(sc.Text(), " \t\f")
		if cont == "" && (s == "" || s[0] == '#' || s[0] == '!') {
			continue
		}
		if cont == "" {
			first = line
		}
		if n := len(s) - len(strings.TrimRight(s, `\`)); n%2 == 1 {
			cont += s[:len(s)-1]
			continue
		}
		s, cont = cont+s, ""
		k, v, err := splitProperty(s)
		if err != nil {
			return nil, fmt.Errorf("%s: line %d: %w", name, first, err)
		}
		out[k] = v
	}
	if cont != "" {
		k, v, err := splitProperty(cont)
		if err != nil {
			return nil, fmt.Errorf("%s: line %d: %w", name, first, err)
		}
		out[k] = v
	}
	return out, sc.Err()
}

// splitProperty splits a logical line at its first unescaped =, : or
// blank (a key alone has an empty value), and unescapes both sides.
func splitProperty(s string) (string, string, error) {
	i := 0
	for ; i < len(s); i++ {
		if s[i] == '\\' {
			i++
			continue
		}
		if s[i] == '=' || s[i] == ':' || s[i] == ' ' || s[i] == '\t' {
			break
		}
	}
	k := unescape(s[:i])
	rest := strings.TrimLeft(s[i:], " \t\f")
	if rest != "" && (rest[0] == '=' || rest[0] == ':') {
		rest = strings.TrimLeft(rest[1:], " \t\f")
	}
	if k == "" {
		return "", "", errors.New("no key")
	}
	return k, unescape(strings.TrimRight(rest, " \t\f")), nil
}

func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '\\' || i+1 == len(s) {
			b.WriteByte(c)
			continue
		}
		i++
		switch c = s[i]; c {
		case 'n':
			b.WriteByte('\n')
		case 't':
			b.WriteByte('\t')
		case 'r':
			b.WriteByte('\r')
		case 'f':
			b.WriteByte('\f')
		case 'u':
			if i+4 < len(s) {
				if r, err := strconv.ParseUint(s[i+1:i+5], 16, 16); err == nil {
					b.WriteRune(rune(r))
					i += 4
					continue
				}
			}
			b.WriteByte(c)
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

// pemBlock matches one PEM block written on one line or several, as an
// inline ssl.*.certificates value joined by line continuations is.
var pemBlock = regexp.MustCompile(`-----BEGIN ([A-Z ]+)-----([A-Za-z0-9+/=\s]*)-----END ([A-Z ]+)-----`)

// normalizePEM rewrites PEM blocks whose lines were joined (an inline
// value) into PEM that encoding/pem reads.
func normalizePEM(b []byte) []byte {
	return pemBlock.ReplaceAllFunc(b, func(m []byte) []byte {
		sub := pemBlock.FindSubmatch(m)
		body := strings.Join(strings.Fields(string(sub[2])), "")
		var out strings.Builder
		fmt.Fprintf(&out, "-----BEGIN %s-----\n", sub[1])
		for len(body) > 64 {
			out.WriteString(body[:64] + "\n")
			body = body[64:]
		}
		fmt.Fprintf(&out, "%s\n-----END %s-----\n", body, sub[3])
		return []byte(out.String())
	})
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
	proto := strings.ToUpper(cmp.Or(props["security.protocol"], "PLAINTEXT"))
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
		switch mech := strings.ToUpper(cmp.Or(props["sasl.mechanism"], "GSSAPI")); mech {
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

// tlsConfig is the TLS of ssl.* properties, PEM only.
func tlsConfig(props map[string]string) (*tls.Config, error) {
	c := &tls.Config{MinVersion: tls.VersionTLS12}
	for _, k := range []string{"ssl.truststore.type", "ssl.keystore.type"} {
		if t := props[k]; t != "" && !strings.EqualFold(t, "PEM") {
			return nil, fmt.Errorf("%s %q: tierfs reads PEM stores only (convert with keytool and openssl)", k, t)
		}
	}
	pem := normalizePEM([]byte(props["ssl.truststore.certificates"]))
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
	chain, key := normalizePEM([]byte(props["ssl.keystore.certificate.chain"])), normalizePEM([]byte(props["ssl.keystore.key"]))
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
