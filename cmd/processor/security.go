package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"reflect"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/oauth"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

// Security is how the processor reaches secured brokers: TLS and SASL.
// Config and GenerateConfig embed it; kafkaOpts turns it into the franz-go
// options every client gets (sluice Options.ClientOpts). Secret fields are
// never logged; files holding secrets are read when a connection
// authenticates, so a rotated password file takes effect without a restart.
type Security struct {
	TLSEnabled            bool   `env:"SLUICE_TLS_ENABLED" envDefault:"false" desc:"true: connect to the brokers over TLS (1.2 or later). The other SLUICE_TLS_ variables need it."`
	TLSCAFile             string `env:"SLUICE_TLS_CA_FILE" docDefault:"the system's CA certificates" expect:"a readable PEM file of CA certificates" desc:"PEM file of the CA certificates that sign the brokers' certificates."`
	TLSCertFile           string `env:"SLUICE_TLS_CERT_FILE" docDefault:"none" expect:"a readable PEM certificate file, together with SLUICE_TLS_KEY_FILE" desc:"Client certificate (PEM) for mutual TLS, with SLUICE_TLS_KEY_FILE."`
	TLSKeyFile            string `env:"SLUICE_TLS_KEY_FILE" docDefault:"none" expect:"a readable PEM private key file matching SLUICE_TLS_CERT_FILE" desc:"Private key (PEM) of SLUICE_TLS_CERT_FILE."`
	TLSServerName         string `env:"SLUICE_TLS_SERVER_NAME" docDefault:"the host of each broker address" expect:"a host name" desc:"Name the brokers' certificates must carry, when it is not the host the processor dials (e.g. brokers reached through a proxy)."`
	TLSInsecureSkipVerify bool   `env:"SLUICE_TLS_INSECURE_SKIP_VERIFY" envDefault:"false" desc:"true: accept any broker certificate without verification, which lets anyone on the path read and change the traffic. For tests only; logged as a warning at every start."`
	SASLMechanism         string `env:"SLUICE_SASL_MECHANISM" docDefault:"none (no SASL)" desc:"SASL mechanism: PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER. Use TLS with PLAIN: it sends the password as is."`
	SASLUsername          string `env:"SLUICE_SASL_USERNAME" docDefault:"required by PLAIN and SCRAM" expect:"the SASL user name" desc:"SASL user (PLAIN, SCRAM); the ACLs of docs/security.md are for its principal User:name."`
	SASLPassword          string `env:"SLUICE_SASL_PASSWORD" secret:"true" docDefault:"required by PLAIN and SCRAM, or SLUICE_SASL_PASSWORD_FILE" expect:"the SASL password" desc:"SASL password (PLAIN, SCRAM). Secret: never logged nor echoed in errors. Prefer SLUICE_SASL_PASSWORD_FILE."`
	SASLPasswordFile      string `env:"SLUICE_SASL_PASSWORD_FILE" docDefault:"none" expect:"a readable file holding the SASL password" desc:"File holding the SASL password (one trailing newline is dropped), instead of SLUICE_SASL_PASSWORD. Read at every authentication, so a rotated file needs no restart."`
	SASLTokenFile         string `env:"SLUICE_SASL_TOKEN_FILE" docDefault:"required by OAUTHBEARER" expect:"a readable file holding an OAuth bearer token" desc:"OAUTHBEARER: file holding the token, read at every authentication so a sidecar can refresh it."`
}

// SASL mechanisms SLUICE_SASL_MECHANISM accepts.
var saslMechanisms = []string{"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"}

// validate checks the security variables with v, reading the files they
// name, so a bad file exits with status 2 at start rather than failing
// every connection.
func (s Security) validate(v *validation) {
	if !s.TLSEnabled {
		// Half a TLS configuration is a mistake, not a request for
		// plaintext.
		for _, o := range []struct {
			name  string
			given bool
		}{
			{"SLUICE_TLS_CA_FILE", s.TLSCAFile != ""},
			{"SLUICE_TLS_CERT_FILE", s.TLSCertFile != ""},
			{"SLUICE_TLS_KEY_FILE", s.TLSKeyFile != ""},
			{"SLUICE_TLS_SERVER_NAME", s.TLSServerName != ""},
			{"SLUICE_TLS_INSECURE_SKIP_VERIFY", s.TLSInsecureSkipVerify},
		} {
			v.check("SLUICE_TLS_ENABLED", !o.given, "true when "+o.name+" is set")
		}
	}
	if s.TLSCAFile != "" {
		_, err := readCAs(s.TLSCAFile)
		v.check("SLUICE_TLS_CA_FILE", err == nil, because("a readable PEM file of CA certificates", err))
	}
	v.check("SLUICE_TLS_CERT_FILE", s.TLSCertFile != "" || s.TLSKeyFile == "", "a PEM certificate file: SLUICE_TLS_KEY_FILE is set")
	v.check("SLUICE_TLS_KEY_FILE", s.TLSKeyFile != "" || s.TLSCertFile == "", "a PEM private key file: SLUICE_TLS_CERT_FILE is set")
	if s.TLSCertFile != "" && s.TLSKeyFile != "" {
		_, err := tls.LoadX509KeyPair(s.TLSCertFile, s.TLSKeyFile)
		v.check("SLUICE_TLS_KEY_FILE", err == nil, because("a PEM private key matching the certificate of SLUICE_TLS_CERT_FILE", err))
	}
	v.check("SLUICE_TLS_SERVER_NAME", s.TLSServerName == "" || validHost(s.TLSServerName), "a host name such as kafka.example.com")

	secretSet := s.SASLPassword != "" || s.SASLPasswordFile != ""
	switch s.SASLMechanism {
	case "":
		for _, name := range []string{"SLUICE_SASL_USERNAME", "SLUICE_SASL_PASSWORD", "SLUICE_SASL_PASSWORD_FILE", "SLUICE_SASL_TOKEN_FILE"} {
			v.check("SLUICE_SASL_MECHANISM", !set(v.environ, name), oneOf(saslMechanisms)+" when "+name+" is set")
		}
	case "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512":
		v.check("SLUICE_SASL_USERNAME", s.SASLUsername != "", "the SASL user name (SLUICE_SASL_MECHANISM="+s.SASLMechanism+")")
		v.check("SLUICE_SASL_PASSWORD", secretSet, "the SASL password, or SLUICE_SASL_PASSWORD_FILE (SLUICE_SASL_MECHANISM="+s.SASLMechanism+")")
		v.check("SLUICE_SASL_PASSWORD_FILE", s.SASLPassword == "" || s.SASLPasswordFile == "", "unset when SLUICE_SASL_PASSWORD is set (one of the two)")
		if s.SASLPasswordFile != "" {
			_, err := readSecret(s.SASLPasswordFile)
			v.check("SLUICE_SASL_PASSWORD_FILE", err == nil, because("a readable file holding the SASL password", err))
		}
		v.check("SLUICE_SASL_TOKEN_FILE", s.SASLTokenFile == "", "unset unless SLUICE_SASL_MECHANISM=OAUTHBEARER")
	case "OAUTHBEARER":
		v.check("SLUICE_SASL_TOKEN_FILE", s.SASLTokenFile != "", "a file holding the OAuth bearer token (SLUICE_SASL_MECHANISM=OAUTHBEARER)")
		if s.SASLTokenFile != "" {
			_, err := readSecret(s.SASLTokenFile)
			v.check("SLUICE_SASL_TOKEN_FILE", err == nil, because("a readable file holding an OAuth bearer token", err))
		}
		for _, name := range []string{"SLUICE_SASL_USERNAME", "SLUICE_SASL_PASSWORD", "SLUICE_SASL_PASSWORD_FILE"} {
			v.check(name, !set(v.environ, name), "unset with SLUICE_SASL_MECHANISM=OAUTHBEARER (the token carries the identity)")
		}
	default:
		v.check("SLUICE_SASL_MECHANISM", false, oneOf(saslMechanisms))
	}
}

func set(environ map[string]string, name string) bool { return environ[name] != "" }

// because appends why a file was refused to the expected form; the file's
// content is never part of it.
func because(expected string, err error) string {
	if err == nil {
		return expected
	}
	return expected + " (" + err.Error() + ")"
}

// validHost accepts DNS names and IPv4 literals, loosely: the certificate
// check is what matters.
func validHost(s string) bool {
	return !strings.ContainsAny(s, " /:@") && len(s) <= 253
}

// kafkaOpts are the franz-go options for TLS and SASL, for every client.
// Call it on a validated configuration.
func (s Security) kafkaOpts() ([]kgo.Opt, error) {
	var opts []kgo.Opt
	if s.TLSEnabled {
		cfg := &tls.Config{
			MinVersion:         tls.VersionTLS12,
			ServerName:         s.TLSServerName, // franz-go sets each broker's host when empty
			InsecureSkipVerify: s.TLSInsecureSkipVerify,
		}
		if s.TLSCAFile != "" {
			pool, err := readCAs(s.TLSCAFile)
			if err != nil {
				return nil, fmt.Errorf("SLUICE_TLS_CA_FILE: %w", err)
			}
			cfg.RootCAs = pool
		}
		if s.TLSCertFile != "" {
			cert, err := tls.LoadX509KeyPair(s.TLSCertFile, s.TLSKeyFile)
			if err != nil {
				return nil, fmt.Errorf("SLUICE_TLS_CERT_FILE, SLUICE_TLS_KEY_FILE: %w", err)
			}
			cfg.Certificates = []tls.Certificate{cert}
		}
		opts = append(opts, kgo.DialTLSConfig(cfg))
	}
	if m := s.mechanism(); m != nil {
		opts = append(opts, kgo.SASL(m))
	}
	return opts, nil
}

// mechanism is the SASL mechanism, nil without SASL. Passwords and tokens
// from files are read at each authentication.
func (s Security) mechanism() sasl.Mechanism {
	password := func() (string, error) {
		if s.SASLPasswordFile == "" {
			return s.SASLPassword, nil
		}
		p, err := readSecret(s.SASLPasswordFile)
		if err != nil {
			return "", fmt.Errorf("SLUICE_SASL_PASSWORD_FILE: %w", err)
		}
		return p, nil
	}
	scramAuth := func(context.Context) (scram.Auth, error) {
		p, err := password()
		return scram.Auth{User: s.SASLUsername, Pass: p}, err
	}
	switch s.SASLMechanism {
	case "PLAIN":
		return plain.Plain(func(context.Context) (plain.Auth, error) {
			p, err := password()
			return plain.Auth{User: s.SASLUsername, Pass: p}, err
		})
	case "SCRAM-SHA-256":
		return scram.Sha256(scramAuth)
	case "SCRAM-SHA-512":
		return scram.Sha512(scramAuth)
	case "OAUTHBEARER":
		return oauth.Oauth(func(context.Context) (oauth.Auth, error) {
			t, err := readSecret(s.SASLTokenFile)
			if err != nil {
				return oauth.Auth{}, fmt.Errorf("SLUICE_SASL_TOKEN_FILE: %w", err)
			}
			return oauth.Auth{Token: t}, nil
		})
	}
	return nil
}

// warnings are what an operator must hear at every start: settings that
// give away the protection TLS or SASL are there for.
func (s Security) warnings() []string {
	var w []string
	if s.TLSEnabled && s.TLSInsecureSkipVerify {
		w = append(w, "SLUICE_TLS_INSECURE_SKIP_VERIFY=true: broker certificates are NOT verified; anyone on the network path can impersonate the brokers and read or change the traffic, including the SASL credentials")
	}
	if s.SASLMechanism == "PLAIN" && !s.TLSEnabled {
		w = append(w, "SLUICE_SASL_MECHANISM=PLAIN without SLUICE_TLS_ENABLED=true: the password crosses the network in clear text")
	}
	return w
}

// identity is the security settings in effect, for errors about a refused
// authentication: the variables that are set, never a secret.
func (s Security) identity() string {
	rv := reflect.ValueOf(s)
	var set []string
	for _, f := range reflect.VisibleFields(rv.Type()) {
		name := envName(f)
		v := rv.FieldByIndex(f.Index)
		if name == "" || f.Tag.Get("secret") == "true" || v.IsZero() {
			continue
		}
		set = append(set, fmt.Sprintf("%s=%v", name, v.Interface()))
	}
	if len(set) == 0 {
		return "neither TLS nor SASL"
	}
	return strings.Join(set, " ")
}

func readCAs(path string) (*x509.CertPool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, errors.New("no PEM certificate in it")
	}
	return pool, nil
}

// readSecret reads a password or token file; one trailing newline (as
// editors and `echo` leave) is not part of the secret.
func readSecret(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	s := strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
	if s == "" {
		return "", errors.New("the file is empty")
	}
	return s, nil
}
