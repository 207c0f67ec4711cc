package function

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"syscall"

	"connectrpc.com/connect"

	"github.com/sluicehq/sluice/function/functionv1/functionv1connect"
)

// newClient builds the Connect client for o.URL: TCP for http:// and
// https://, the socket for unix:///path (the requests then name the host
// "unix"). idle closes the idle connections of the transport it built
// (nothing when o.HTTPClient is the caller's).
func newClient(o Options) (c functionv1connect.FunctionServiceClient, idle func(), err error) {
	u, err := url.Parse(o.URL)
	if err != nil {
		return nil, nil, fmt.Errorf("function: URL %q: %w", o.URL, err)
	}
	base := strings.TrimSuffix(o.URL, "/")
	var dial func(ctx context.Context, network, addr string) (net.Conn, error)
	switch u.Scheme {
	case "http", "https":
		if u.Host == "" {
			return nil, nil, fmt.Errorf("function: URL %q has no host", o.URL)
		}
	case "unix":
		if u.Path == "" {
			return nil, nil, fmt.Errorf("function: URL %q: want unix:///path/to/socket", o.URL)
		}
		path := u.Path
		dial = func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		}
		base = "http://unix"
	default:
		return nil, nil, fmt.Errorf("function: URL %q: want http://, https:// or unix://", o.URL)
	}
	hc, idle := o.HTTPClient, func() {}
	if hc == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.MaxIdleConnsPerHost = max(o.Concurrency*4, 16)
		if dial != nil {
			tr.DialContext = dial
		}
		if o.Protocol == GRPC {
			var p http.Protocols
			p.SetHTTP2(true)
			if u.Scheme != "https" {
				p.SetUnencryptedHTTP2(true)
			}
			tr.Protocols = &p
			tr.TLSClientConfig = &tls.Config{NextProtos: []string{"h2"}}
		}
		hc, idle = &http.Client{Transport: tr}, tr.CloseIdleConnections
	}
	// No gzip: beside the processor, compressing every reply costs more
	// CPU than the loopback saves (it was a sixth of the benchmark's).
	opts := []connect.ClientOption{connect.WithAcceptCompression("gzip", nil, nil)}
	switch o.Protocol {
	case JSON:
		opts = append(opts, connect.WithProtoJSON())
	case GRPC:
		opts = append(opts, connect.WithGRPC())
	}
	return functionv1connect.NewFunctionServiceClient(hc, base, opts...), idle, nil
}

// unreachable reports whether a call's error means the function cannot be
// reached at all (nothing listens, the connection broke, the name does not
// resolve), as opposed to a call that failed or timed out: the first makes
// the batch wait, the second is retried against the budget.
func unreachable(err error) bool {
	var dns *net.DNSError
	switch {
	case errors.As(err, &dns),
		errors.Is(err, syscall.ECONNREFUSED),
		errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.ECONNABORTED),
		errors.Is(err, syscall.EPIPE),
		errors.Is(err, syscall.ENOENT), // no socket file yet
		errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, io.EOF):
		return true
	}
	// A connection closed under a request in flight (the function was
	// killed) surfaces from net/http without a typed cause.
	var ce *connect.Error
	if errors.As(err, &ce) && ce.Code() == connect.CodeUnavailable {
		msg := ce.Message()
		return strings.Contains(msg, "connection") || strings.Contains(msg, "EOF") || strings.Contains(msg, "dial")
	}
	return false
}
