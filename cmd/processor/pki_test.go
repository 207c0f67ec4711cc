package main

import (
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
	"testing"
	"time"
)

// testPKI is a certificate authority made for one test, with a broker
// certificate for 127.0.0.1 and a client certificate, written as PEM files
// to a temporary directory. No key material is checked in.
type testPKI struct {
	CAFile, CertFile, KeyFile string // what SLUICE_TLS_* point at
	OtherCAFile               string // a CA that signed nothing here
	Broker                    *tls.Config
}

func newTestPKI(t *testing.T) testPKI {
	t.Helper()
	dir := t.TempDir()
	ca, caKey := newCA(t, "sluice test CA")
	other, _ := newCA(t, "unrelated CA")
	brokerCert, brokerKey := issue(t, ca, caKey, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "kfake"},
		DNSNames:    []string{"localhost"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	clientCert, clientKey := issue(t, ca, caKey, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "processor"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	p := testPKI{
		CAFile:      writePEM(t, dir, "ca.pem", "CERTIFICATE", ca.Raw),
		OtherCAFile: writePEM(t, dir, "other-ca.pem", "CERTIFICATE", other.Raw),
		CertFile:    writePEM(t, dir, "client.pem", "CERTIFICATE", clientCert.Raw),
		KeyFile:     writePEM(t, dir, "client-key.pem", "PRIVATE KEY", pkcs8(t, clientKey)),
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	p.Broker = &tls.Config{
		Certificates: []tls.Certificate{{Certificate: [][]byte{brokerCert.Raw}, PrivateKey: brokerKey}},
		ClientCAs:    pool,
		ClientAuth:   tls.RequireAndVerifyClientCert,
		MinVersion:   tls.VersionTLS12,
	}
	return p
}

func newCA(t *testing.T, name string) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	return sign(t, tmpl, tmpl, key, key), key
}

func issue(t *testing.T, ca *x509.Certificate, caKey *ecdsa.PrivateKey, tmpl *x509.Certificate) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key := newKey(t)
	serial, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	if err != nil {
		t.Fatal(err)
	}
	tmpl.SerialNumber = serial
	tmpl.NotBefore = time.Now().Add(-time.Hour)
	tmpl.NotAfter = time.Now().Add(24 * time.Hour)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	return sign(t, tmpl, ca, key, caKey), key
}

// sign makes the certificate tmpl for key, signed by parent's signerKey
// (tmpl itself and key for a self-signed CA).
func sign(t *testing.T, tmpl, parent *x509.Certificate, key, signerKey *ecdsa.PrivateKey) *x509.Certificate {
	t.Helper()
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, signerKey)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}

func newKey(t *testing.T) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

func pkcs8(t *testing.T, key *ecdsa.PrivateKey) []byte {
	t.Helper()
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return der
}

func writePEM(t *testing.T, dir, name, kind string, der []byte) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
