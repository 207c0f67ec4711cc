package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// securityErrorTests are bad TLS and SASL settings that need no files.
var securityErrorTests = []configErrorTest{
	{"tls enabled not a bool", envWith(baseEnv(), "SLUICE_TLS_ENABLED", "yes"), "SLUICE_TLS_ENABLED",
		`SLUICE_TLS_ENABLED="yes": expected true or false`},
	{"tls file without tls", envWith(baseEnv(), "SLUICE_TLS_CA_FILE", "/etc/ca.pem"), "SLUICE_TLS_ENABLED",
		`SLUICE_TLS_ENABLED="false": expected true when SLUICE_TLS_CA_FILE is set`},
	{"ca file missing", envWith(baseEnv(), "SLUICE_TLS_ENABLED", "true", "SLUICE_TLS_CA_FILE", "/nonexistent/ca.pem"), "SLUICE_TLS_CA_FILE",
		`SLUICE_TLS_CA_FILE="/nonexistent/ca.pem": expected a readable PEM file of CA certificates (open /nonexistent/ca.pem: no such file or directory)`},
	{"key without cert", envWith(baseEnv(), "SLUICE_TLS_ENABLED", "true", "SLUICE_TLS_KEY_FILE", "/k.pem"), "SLUICE_TLS_CERT_FILE",
		"SLUICE_TLS_CERT_FILE is required: expected a PEM certificate file: SLUICE_TLS_KEY_FILE is set"},
	{"cert without key", envWith(baseEnv(), "SLUICE_TLS_ENABLED", "true", "SLUICE_TLS_CERT_FILE", "/c.pem"), "SLUICE_TLS_KEY_FILE",
		"SLUICE_TLS_KEY_FILE is required: expected a PEM private key file: SLUICE_TLS_CERT_FILE is set"},
	{"server name with a port", envWith(baseEnv(), "SLUICE_TLS_ENABLED", "true", "SLUICE_TLS_SERVER_NAME", "kafka:9093"), "SLUICE_TLS_SERVER_NAME",
		`SLUICE_TLS_SERVER_NAME="kafka:9093": expected a host name such as kafka.example.com`},
	{"skip verify not a bool", envWith(baseEnv(), "SLUICE_TLS_INSECURE_SKIP_VERIFY", "please"), "SLUICE_TLS_INSECURE_SKIP_VERIFY", ""},
	{"skip verify without tls", envWith(baseEnv(), "SLUICE_TLS_INSECURE_SKIP_VERIFY", "true"), "SLUICE_TLS_ENABLED", ""},
	{"unknown mechanism", envWith(baseEnv(), "SLUICE_SASL_MECHANISM", "GSSAPI"), "SLUICE_SASL_MECHANISM",
		`SLUICE_SASL_MECHANISM="GSSAPI": expected one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER`},
	{"mechanism is case sensitive", envWith(baseEnv(), "SLUICE_SASL_MECHANISM", "scram-sha-256"), "SLUICE_SASL_MECHANISM", ""},
	{"credentials without mechanism", envWith(baseEnv(), "SLUICE_SASL_USERNAME", "app"), "SLUICE_SASL_MECHANISM",
		"SLUICE_SASL_MECHANISM is required: expected one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER when SLUICE_SASL_USERNAME is set"},
	{"scram without user", envWith(baseEnv(), "SLUICE_SASL_MECHANISM", "SCRAM-SHA-512", "SLUICE_SASL_PASSWORD", "hunter2"), "SLUICE_SASL_USERNAME",
		"SLUICE_SASL_USERNAME is required: expected the SASL user name (SLUICE_SASL_MECHANISM=SCRAM-SHA-512)"},
	{"plain without password", envWith(baseEnv(), "SLUICE_SASL_MECHANISM", "PLAIN", "SLUICE_SASL_USERNAME", "app"), "SLUICE_SASL_PASSWORD",
		"SLUICE_SASL_PASSWORD is required: expected the SASL password, or SLUICE_SASL_PASSWORD_FILE (SLUICE_SASL_MECHANISM=PLAIN)"},
	{"password and password file", envWith(baseEnv(), "SLUICE_SASL_MECHANISM", "PLAIN", "SLUICE_SASL_USERNAME", "app",
		"SLUICE_SASL_PASSWORD", "hunter2", "SLUICE_SASL_PASSWORD_FILE", "/run/secrets/pw"), "SLUICE_SASL_PASSWORD_FILE",
		`SLUICE_SASL_PASSWORD_FILE="/run/secrets/pw": expected unset when SLUICE_SASL_PASSWORD is set (one of the two)`},
	{"password file missing", envWith(baseEnv(), "SLUICE_SASL_MECHANISM", "SCRAM-SHA-256", "SLUICE_SASL_USERNAME", "app",
		"SLUICE_SASL_PASSWORD_FILE", "/nonexistent/pw"), "SLUICE_SASL_PASSWORD_FILE",
		`SLUICE_SASL_PASSWORD_FILE="/nonexistent/pw": expected a readable file holding the SASL password (open /nonexistent/pw: no such file or directory)`},
	{"oauthbearer without token file", envWith(baseEnv(), "SLUICE_SASL_MECHANISM", "OAUTHBEARER"), "SLUICE_SASL_TOKEN_FILE",
		"SLUICE_SASL_TOKEN_FILE is required: expected a file holding the OAuth bearer token (SLUICE_SASL_MECHANISM=OAUTHBEARER)"},
	{"token file with scram", envWith(baseEnv(), "SLUICE_SASL_MECHANISM", "SCRAM-SHA-256", "SLUICE_SASL_USERNAME", "app",
		"SLUICE_SASL_PASSWORD", "hunter2", "SLUICE_SASL_TOKEN_FILE", "/t"), "SLUICE_SASL_TOKEN_FILE", ""},
}

func TestSecurityConfigErrors(t *testing.T) {
	for _, tt := range securityErrorTests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := loadConfig(tt.env, testJobs)
			assertConfigError(t, err, tt.wantVar, tt.wantMsg)
			if err != nil && strings.Contains(err.Error(), "hunter2") {
				t.Errorf("error shows the password: %v", err)
			}
		})
	}
}

// Errors that need files: PEM that is not PEM, a key of another
// certificate, an empty secret, and a secret never echoed.
func TestSecurityConfigFileErrors(t *testing.T) {
	pki := newTestPKI(t)
	dir := t.TempDir()
	garbage := filepath.Join(dir, "garbage.pem")
	empty := filepath.Join(dir, "empty")
	token := filepath.Join(dir, "token")
	for path, content := range map[string]string{garbage: "not PEM\n", empty: "\n", token: "eyJ0b2tlbiI\n"} {
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	tls := func(kv ...string) map[string]string {
		return envWith(baseEnv(), append([]string{"SLUICE_TLS_ENABLED", "true"}, kv...)...)
	}
	tests := []configErrorTest{
		{"ca file not PEM", tls("SLUICE_TLS_CA_FILE", garbage), "SLUICE_TLS_CA_FILE",
			fmt.Sprintf(`SLUICE_TLS_CA_FILE=%q: expected a readable PEM file of CA certificates (no PEM certificate in it)`, garbage)},
		{"key of another certificate", tls("SLUICE_TLS_CERT_FILE", pki.CAFile, "SLUICE_TLS_KEY_FILE", pki.KeyFile), "SLUICE_TLS_KEY_FILE",
			fmt.Sprintf(`SLUICE_TLS_KEY_FILE=%q: expected a PEM private key matching the certificate of SLUICE_TLS_CERT_FILE (tls: private key does not match public key)`, pki.KeyFile)},
		{"key file not PEM", tls("SLUICE_TLS_CERT_FILE", pki.CertFile, "SLUICE_TLS_KEY_FILE", garbage), "SLUICE_TLS_KEY_FILE", ""},
		{"empty password file", envWith(baseEnv(), "SLUICE_SASL_MECHANISM", "PLAIN", "SLUICE_SASL_USERNAME", "app", "SLUICE_SASL_PASSWORD_FILE", empty),
			"SLUICE_SASL_PASSWORD_FILE", fmt.Sprintf(`SLUICE_SASL_PASSWORD_FILE=%q: expected a readable file holding the SASL password (the file is empty)`, empty)},
		{"password with oauthbearer is redacted", envWith(baseEnv(), "SLUICE_SASL_MECHANISM", "OAUTHBEARER", "SLUICE_SASL_TOKEN_FILE", token, "SLUICE_SASL_PASSWORD", "hunter2"),
			"SLUICE_SASL_PASSWORD", `SLUICE_SASL_PASSWORD="<redacted>": expected unset with SLUICE_SASL_MECHANISM=OAUTHBEARER (the token carries the identity)`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := loadConfig(tt.env, testJobs)
			assertConfigError(t, err, tt.wantVar, tt.wantMsg)
		})
	}
	// The same rules hold for `processor generate`.
	_, err := loadGenerateConfig(envWith(generateBase(), "SLUICE_TLS_ENABLED", "true", "SLUICE_TLS_CA_FILE", garbage))
	assertConfigError(t, err, "SLUICE_TLS_CA_FILE", "")
}

func TestSecurityConfigValid(t *testing.T) {
	pki := newTestPKI(t)
	pw := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pw, []byte("hunter2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		env   map[string]string
		opts  int // franz-go options: one for TLS, one for SASL
		warns int
	}{
		{"nothing", baseEnv(), 0, 0},
		{"tls with system roots", envWith(baseEnv(), "SLUICE_TLS_ENABLED", "true"), 1, 0},
		{"mutual tls", envWith(baseEnv(), "SLUICE_TLS_ENABLED", "true", "SLUICE_TLS_CA_FILE", pki.CAFile,
			"SLUICE_TLS_CERT_FILE", pki.CertFile, "SLUICE_TLS_KEY_FILE", pki.KeyFile, "SLUICE_TLS_SERVER_NAME", "kafka.internal"), 1, 0},
		{"skip verify warns", envWith(baseEnv(), "SLUICE_TLS_ENABLED", "true", "SLUICE_TLS_INSECURE_SKIP_VERIFY", "true"), 1, 1},
		{"explicit false without tls", envWith(baseEnv(), "SLUICE_TLS_INSECURE_SKIP_VERIFY", "false"), 0, 0},
		{"plain without tls warns", envWith(baseEnv(), "SLUICE_SASL_MECHANISM", "PLAIN", "SLUICE_SASL_USERNAME", "app", "SLUICE_SASL_PASSWORD", "hunter2"), 1, 1},
		{"scram over tls from a file", envWith(baseEnv(), "SLUICE_TLS_ENABLED", "true", "SLUICE_SASL_MECHANISM", "SCRAM-SHA-512",
			"SLUICE_SASL_USERNAME", "app", "SLUICE_SASL_PASSWORD_FILE", pw), 2, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := loadConfig(tt.env, testJobs)
			if err != nil {
				t.Fatal(err)
			}
			opts, err := c.kafkaOpts()
			if err != nil {
				t.Fatal(err)
			}
			if len(opts) != tt.opts {
				t.Errorf("kafkaOpts: %d options, want %d", len(opts), tt.opts)
			}
			if w := c.warnings(); len(w) != tt.warns {
				t.Errorf("warnings: %q, want %d", w, tt.warns)
			}
		})
	}
}

// The password never reaches the startup log line, and neither does the
// content of a password file.
func TestSecuritySummaryHidesSecrets(t *testing.T) {
	c, err := loadConfig(envWith(baseEnv(), "SLUICE_SASL_MECHANISM", "SCRAM-SHA-256", "SLUICE_SASL_USERNAME", "app", "SLUICE_SASL_PASSWORD", "hunter2"), testJobs)
	if err != nil {
		t.Fatal(err)
	}
	line := fmt.Sprint(c.Summary()...)
	if strings.Contains(line, "hunter2") || strings.Contains(line, "sasl_password=") {
		t.Errorf("Summary shows the password: %s", line)
	}
	if !strings.Contains(line, "sasl_username=app") || !strings.Contains(line, "sasl_mechanism=SCRAM-SHA-256") {
		t.Errorf("Summary lacks the SASL identity: %s", line)
	}
	if id := c.identity(); strings.Contains(id, "hunter2") || id != "SLUICE_SASL_MECHANISM=SCRAM-SHA-256 SLUICE_SASL_USERNAME=app" {
		t.Errorf("identity() = %q", id)
	}
}

// Password and token files are read at every authentication: a rotated
// secret takes effect on the next connection. PLAIN and OAUTHBEARER carry
// the secret in their first message, which shows what was read.
func TestSecuritySecretFilesReadAtEachAuthentication(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "secret")
	write := func(s string) {
		if err := os.WriteFile(file, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, tt := range []struct {
		mechanism string
		env       []string
		want      func(secret string) string
	}{
		{"PLAIN", []string{"SLUICE_SASL_USERNAME", "app", "SLUICE_SASL_PASSWORD_FILE", file}, func(s string) string { return "\x00app\x00" + s }},
		{"OAUTHBEARER", []string{"SLUICE_SASL_TOKEN_FILE", file}, func(s string) string { return "auth=Bearer " + s + "\x01" }},
	} {
		t.Run(tt.mechanism, func(t *testing.T) {
			write("first\n")
			c, err := loadConfig(envWith(baseEnv(), append([]string{"SLUICE_SASL_MECHANISM", tt.mechanism}, tt.env...)...), testJobs)
			if err != nil {
				t.Fatal(err)
			}
			m := c.mechanism()
			for _, secret := range []string{"first", "rotated"} {
				write(secret + "\n")
				_, msg, err := m.Authenticate(context.Background(), "127.0.0.1:9092")
				if err != nil {
					t.Fatal(err)
				}
				if !strings.Contains(string(msg), tt.want(secret)) {
					t.Errorf("first message %q does not carry %q", msg, secret)
				}
			}
		})
	}
}
