package kstate

import (
	"encoding/binary"
	"fmt"
	"time"
)

// TTLUpdate says which accesses push a value's expiry forward, as Flink's
// StateTtlConfig.UpdateType does.
type TTLUpdate byte

const (
	// OnCreateAndWrite sets the expiry when the value is written.
	OnCreateAndWrite TTLUpdate = 1
	// OnReadAndWrite also sets it when the value is read, so values in use
	// never expire. Every read then writes the entry again, which makes it
	// dirty and changelogged in that epoch.
	OnReadAndWrite TTLUpdate = 2
)

// ttlHeaderLen is the size of the expiry that prefixes a value with TTL.
const ttlHeaderLen = 8

// WithTTL makes values expire ttl after they were last written (or read,
// with OnReadAndWrite), at millisecond precision, by the processing-time
// clock of the Scope.
//
// This is the subset of Flink's StateTtlConfig that needs no background
// work: expired values are never returned (NeverReturnExpired) and are
// deleted lazily, when the state is next accessed for the key. A stored
// value with TTL is its 8-byte big-endian expiry (unix milliseconds)
// followed by the codec's bytes. List state expires as a whole; map state
// per entry.
//
// WithTTL panics if ttl is under a millisecond or update is not one of the
// TTLUpdate constants.
func WithTTL(ttl time.Duration, update TTLUpdate) Option {
	if ttl < time.Millisecond {
		panic(fmt.Sprintf("kstate: WithTTL(%v): ttl must be at least 1ms", ttl))
	}
	if update != OnCreateAndWrite && update != OnReadAndWrite {
		panic(fmt.Sprintf("kstate: WithTTL: unknown TTLUpdate %d", update))
	}
	return func(o *stateOptions) { o.ttl = ttlConfig{ttl: ttl.Milliseconds(), update: update} }
}

type ttlConfig struct {
	ttl    int64 // milliseconds; 0 disables TTL
	update TTLUpdate
}

func (c ttlConfig) enabled() bool { return c.ttl > 0 }

// wrap returns a new buffer holding the expiry for a write at now and the
// payload.
func (c ttlConfig) wrap(now time.Time, payload []byte) []byte {
	b := make([]byte, ttlHeaderLen, ttlHeaderLen+len(payload))
	binary.BigEndian.PutUint64(b, uint64(now.UnixMilli()+c.ttl))
	return append(b, payload...)
}

// unwrapTTL returns the payload of a stored value. An expired value reads as
// absent and is deleted; with OnReadAndWrite a live one is written back with
// a new expiry. key must be the value's key and stay valid for the call.
func (d *descriptor) unwrapTTL(s Scope, key, raw []byte) ([]byte, bool, error) {
	if !d.ttl.enabled() {
		return raw, true, nil
	}
	if len(raw) < ttlHeaderLen {
		return nil, false, d.wrap("read", fmt.Errorf("%w: %d bytes, too short for a TTL header", ErrCorrupt, len(raw)))
	}
	now := s.Now()
	expiry := int64(binary.BigEndian.Uint64(raw))
	payload := raw[ttlHeaderLen:]
	if expiry <= now.UnixMilli() {
		s.Store().Delete(key)
		return nil, false, nil
	}
	if d.ttl.update == OnReadAndWrite {
		s.Store().putOwned(key, d.ttl.wrap(now, payload))
	}
	return payload, true, nil
}
