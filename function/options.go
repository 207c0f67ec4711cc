package function

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// OnFailure says what happens to a key's records when its call failed for
// good.
type OnFailure string

const (
	// DeadLetter sends each of the key's records to the dead-letter topic
	// (sluice.stage=function) and goes on.
	DeadLetter OnFailure = "dead_letter"
	// Fail stops the instance (nothing of the epoch commits).
	Fail OnFailure = "fail"
)

// Protocol is how the processor talks to the function.
type Protocol string

const (
	// JSON is Connect's unary protocol with JSON bodies: a plain HTTP/1.1
	// POST any language's standard library can answer.
	JSON Protocol = "json"
	// Proto is Connect's unary protocol with binary protobuf bodies.
	Proto Protocol = "proto"
	// GRPC is gRPC (HTTP/2; cleartext HTTP/2 for http:// and unix://).
	GRPC Protocol = "grpc"
)

// ProtocolVersion is the version of the sidecar protocol this package
// speaks; a function declaring another is refused.
const ProtocolVersion = 1

// Options configure the function job. Zero values take the defaults named.
type Options struct {
	// URL is where the function listens: http://host:port, https://...,
	// or unix:///path/to/socket. Required.
	URL string
	// Protocol defaults to JSON.
	Protocol Protocol
	// AppID is passed to Describe for the function's logs.
	AppID string
	// Timeout bounds one call (default 1s). A batch's calls, retries
	// included, take at most Budget, which must stay below the
	// transaction timeout: they run while the epoch's transaction is open.
	Timeout time.Duration
	// Batch is the most records one call carries (default 500).
	Batch int
	// Concurrency is the most calls in flight for one task (default 4).
	Concurrency int
	// Retries is how many times a failed call or a RETRY answer is tried
	// again for a key (default 3; negative: none).
	Retries int
	// Backoff is the wait before the first retry, doubled at each
	// (default 100ms, at most 5s).
	Backoff time.Duration
	// OnFailure defaults to DeadLetter.
	OnFailure OnFailure
	// MaxStateBytes bounds one state value the function sets (default
	// 1 MiB): a larger one fails the key, naming key and state.
	MaxStateBytes int
	// Registry receives the function metrics; nil keeps them unregistered.
	// A registry takes one function job's: New refuses a second with an
	// error until the first is closed (the Job's Close, which
	// sluice.Instance.Close calls).
	Registry prometheus.Registerer
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// HTTPClient overrides the client built for URL (its transport must
	// speak HTTP/2 for GRPC).
	HTTPClient *http.Client
}

// Defaults of Options.
const (
	DefaultTimeout       = time.Second
	DefaultBatch         = 500
	DefaultConcurrency   = 4
	DefaultRetries       = 3
	DefaultBackoff       = 100 * time.Millisecond
	DefaultMaxStateBytes = 1 << 20
	maxBackoff           = 5 * time.Second
)

func (o Options) withDefaults() Options {
	if o.Protocol == "" {
		o.Protocol = JSON
	}
	if o.Timeout == 0 {
		o.Timeout = DefaultTimeout
	}
	if o.Batch == 0 {
		o.Batch = DefaultBatch
	}
	if o.Concurrency == 0 {
		o.Concurrency = DefaultConcurrency
	}
	switch {
	case o.Retries == 0:
		o.Retries = DefaultRetries
	case o.Retries < 0:
		o.Retries = 0
	}
	if o.Backoff == 0 {
		o.Backoff = DefaultBackoff
	}
	if o.OnFailure == "" {
		o.OnFailure = DeadLetter
	}
	if o.MaxStateBytes == 0 {
		o.MaxStateBytes = DefaultMaxStateBytes
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

func (o Options) validate() error {
	switch {
	case o.URL == "":
		return errors.New("function: URL is empty")
	case o.Protocol != JSON && o.Protocol != Proto && o.Protocol != GRPC:
		return fmt.Errorf("function: protocol %q: want json, proto or grpc", o.Protocol)
	case o.Timeout < 0, o.Batch < 0, o.Concurrency < 0, o.Backoff < 0, o.MaxStateBytes < 0:
		return errors.New("function: Timeout, Batch, Concurrency, Backoff and MaxStateBytes must not be negative")
	case o.OnFailure != DeadLetter && o.OnFailure != Fail:
		return fmt.Errorf("function: OnFailure %q: want dead_letter or fail", o.OnFailure)
	}
	return nil
}

// backoff is the wait before retry n (1-based).
func (o Options) backoff(n int) time.Duration {
	d := o.Backoff
	for i := 1; i < n && d < maxBackoff; i++ {
		d *= 2
	}
	return min(d, maxBackoff)
}
