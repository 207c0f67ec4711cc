package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/sluicehq/sluice"
)

// TestTLSAndSASL runs instances against one kfake broker that speaks only
// TLS, wants a client certificate signed by the test's CA, and SASL (PLAIN
// and SCRAM-SHA-512; SCRAM-SHA-256 is TestLeastPrivilegeACLs'). Good
// settings get an instance ready; a certificate either side refuses stops
// it with an *AuthError instead of a retry loop; skipping verification
// works and says so loudly.
func TestTLSAndSASL(t *testing.T) {
	pki := newTestPKI(t)
	pw := filepath.Join(t.TempDir(), "password")
	if err := os.WriteFile(pw, []byte("scram-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.TLS(pki.Broker), kfake.EnableSASL(),
		kfake.Superuser("PLAIN", "plain-user", "plain-secret"), kfake.Superuser("SCRAM-SHA-512", "scram-user", "scram-secret"),
		kfake.SeedTopics(1, "in"))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	brokers := cluster.ListenAddrs()[0]

	mtls := []string{"SLUICE_TLS_ENABLED", "true", "SLUICE_TLS_CA_FILE", pki.CAFile, "SLUICE_TLS_CERT_FILE", pki.CertFile, "SLUICE_TLS_KEY_FILE", pki.KeyFile}
	plain := []string{"SLUICE_SASL_MECHANISM", "PLAIN", "SLUICE_SASL_USERNAME", "plain-user", "SLUICE_SASL_PASSWORD", "plain-secret"}
	scram := []string{"SLUICE_SASL_MECHANISM", "SCRAM-SHA-512", "SLUICE_SASL_USERNAME", "scram-user", "SLUICE_SASL_PASSWORD_FILE", pw}
	tests := []struct {
		name    string
		env     []string
		refused string // in the *AuthError; "" = the instance gets ready
		warning string // in the log
	}{
		{"mutual TLS and PLAIN", concat(mtls, plain), "", ""},
		{"mutual TLS and SCRAM-SHA-512 from a password file", concat(mtls, scram), "", ""},
		{"server name given", concat(mtls, plain, []string{"SLUICE_TLS_SERVER_NAME", "localhost"}), "", ""},
		{"broker certificate from another CA", concat(mtls, plain, []string{"SLUICE_TLS_CA_FILE", pki.OtherCAFile}), "certificate signed by unknown authority", ""},
		{"broker certificate for another name", concat(mtls, plain, []string{"SLUICE_TLS_SERVER_NAME", "kafka.example.com"}), "not kafka.example.com", ""},
		{"no client certificate", concat(mtls, plain, []string{"SLUICE_TLS_CERT_FILE", "<unset>", "SLUICE_TLS_KEY_FILE", "<unset>"}), "certificate", ""},
		{"verification skipped", concat(mtls, plain, []string{"SLUICE_TLS_CA_FILE", pki.OtherCAFile, "SLUICE_TLS_INSECURE_SKIP_VERIFY", "true"}), "", "broker certificates are NOT verified"},
	}
	t.Run("cases", func(t *testing.T) {
		for i, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				t.Parallel()
				app := "tls" + string(rune('a'+i))
				environ := envWith(map[string]string{
					"SLUICE_BROKERS": brokers, "SLUICE_APP_ID": app, "SLUICE_JOB": "aggregate", "SLUICE_INSTANCE_ID": "i1",
					"SLUICE_INPUT_TOPICS": "in", "SLUICE_OUTPUT_TOPIC": app + "-out", "SLUICE_STATE_DIR": t.TempDir(),
					"SLUICE_METRICS_ADDR": freeAddr(t), "SLUICE_SESSION_TIMEOUT": "6s",
				}, tt.env...)
				s := startServe(t, environ)
				if tt.refused != "" {
					err := s.wait(t)
					var ae *sluice.AuthError
					if !errors.As(err, &ae) || !strings.Contains(err.Error(), tt.refused) || strings.Contains(err.Error(), "\n") {
						t.Fatalf("stopped with %v, want one line of *AuthError saying %q", err, tt.refused)
					}
					t.Logf("stopped with: %v", err)
					return
				}
				s.awaitReady(t)
				s.stop(t)
				if log := s.log.String(); tt.warning != "" && !strings.Contains(log, `"level":"WARN","msg":"SLUICE_TLS_INSECURE_SKIP_VERIFY=true: `+tt.warning) {
					t.Errorf("no warning %q in the log:\n%s", tt.warning, log)
				}
			})
		}
	})
}

func concat(lists ...[]string) []string {
	var out []string
	for _, l := range lists {
		out = append(out, l...)
	}
	return out
}
