package sluice

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Authentication. Credentials the brokers refuse, or a certificate a TLS
// handshake refuses, stay refused: Run stops with an *AuthError instead of
// retrying.

// AuthError is a failed authentication: the brokers refused the instance's
// SASL credentials, or a TLS handshake failed on a certificate. It is final:
// Run returns it rather than retrying.
type AuthError struct {
	Err error
}

func (e *AuthError) Error() string { return "authentication with the brokers failed: " + e.Err.Error() }
func (e *AuthError) Unwrap() error { return e.Err }

// authFailure reports whether err is a refused authentication, SASL or TLS.
func authFailure(err error) bool {
	for _, ke := range []*kerr.Error{kerr.SaslAuthenticationFailed, kerr.IllegalSaslState, kerr.UnsupportedSaslMechanism} {
		if errors.Is(err, ke) {
			return true
		}
	}
	var (
		verify   *tls.CertificateVerificationError
		unknown  x509.UnknownAuthorityError
		hostname x509.HostnameError
		invalid  x509.CertificateInvalidError
		record   tls.RecordHeaderError
		op       *net.OpError
	)
	if errors.As(err, &verify) || errors.As(err, &unknown) || errors.As(err, &hostname) || errors.As(err, &invalid) {
		return true // we refused the broker's certificate
	}
	if errors.As(err, &record) {
		return true // TLS to a listener that does not speak it
	}
	// crypto/tls reports an alert from the broker (a client certificate
	// refused or missing) as a *net.OpError with Op "remote error".
	return errors.As(err, &op) && op.Op == "remote error"
}

// saslRefusalsToStop is how many connections in a row must be closed by the
// brokers in the middle of SASL authentication, with none getting past it,
// before the credentials count as refused.
const saslRefusalsToStop = 3

// saslWatch notices brokers that refuse credentials by closing the
// connection during SASL authentication instead of answering
// SASL_AUTHENTICATION_FAILED (kfake does; so do brokers without
// SaslAuthenticate and some proxies). franz-go retries such a request
// until its context ends, which at start-up would look like a slow or
// unreachable cluster forever. It is a franz-go hook on every client.
type saslWatch struct {
	closedInSASL atomic.Int32 // connections closed during SASL since the last one that got past it
	refused      context.Context
	refuse       context.CancelCauseFunc
}

func newSASLWatch() *saslWatch {
	w := &saslWatch{}
	w.refused, w.refuse = context.WithCancelCause(context.Background())
	return w
}

var _ kgo.HookBrokerRead = (*saslWatch)(nil)

// OnBrokerRead counts failed reads of SaslAuthenticate responses, and
// resets the count when a response to anything but the authentication
// handshake arrives (that connection authenticated).
func (w *saslWatch) OnBrokerRead(_ kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, err error) {
	switch kmsg.Key(key) {
	case kmsg.SASLAuthenticate:
		if err == nil {
			return
		}
		if n := w.closedInSASL.Add(1); n >= saslRefusalsToStop {
			w.refuse(&AuthError{Err: fmt.Errorf("the brokers closed the connection during SASL authentication %d times in a row, which is how some brokers refuse credentials or a mechanism", n)})
		}
	case kmsg.ApiVersions, kmsg.SASLHandshake:
	default:
		if err == nil && w.closedInSASL.Load() != 0 {
			w.closedInSASL.Store(0)
		}
	}
}

// err is the refusal once one is seen, else nil.
func (w *saslWatch) err() error {
	if w.refused.Err() == nil {
		return nil
	}
	return context.Cause(w.refused)
}

// bind returns ctx, cancelled as well once a refusal is seen, so a request
// waiting on retries ends at once.
func (w *saslWatch) bind(ctx context.Context) (context.Context, context.CancelFunc) {
	bound, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(w.refused, func() { cancel(context.Cause(w.refused)) })
	return bound, func() {
		stop()
		cancel(nil)
	}
}
