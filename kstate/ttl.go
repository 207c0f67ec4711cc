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
// with OnReadAndWrite), at millisecond precision. The clock is the Scope's
// processing-time clock (Scope.Now), not the records' event time.
//
// Expired values are never returned (Flink's NeverReturnExpired). They are
// removed in two ways: lazily, when the state is next accessed for the key,
// and by the engine's bounded sweep once per epoch (SweepExpired), which
// reaches the keys that are never read again. Either way the removal is a
// delete in the write-sets, so it reaches the changelog as a tombstone and
// the backend when the epoch commits.
//
// A stored value with TTL is its 8-byte big-endian expiry (unix
// milliseconds) followed by the codec's bytes, under keys of KindKeyedTTL
// rather than KindKeyed, so that the key says the header is there. Adding
// WithTTL to a state that already holds entries therefore starts it empty,
// and the old KindKeyed entries are never read or swept again; removing it
// starts the state empty too, and the sweep removes the old entries as they
// expire. List state expires as a whole; map state per entry.
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
	return d.unwrap(s, key, raw, true)
}

// unwrap is unwrapTTL; with extend false a live value's expiry stays as it
// is even with OnReadAndWrite (a scan over every key, which would
// otherwise write the whole state again).
func (d *descriptor) unwrap(s Scope, key, raw []byte, extend bool) ([]byte, bool, error) {
	if !d.ttl.enabled() {
		return raw, true, nil
	}
	if len(raw) < ttlHeaderLen {
		return nil, false, d.wrap("read", errShortTTL(len(raw)))
	}
	now := s.Now()
	payload := raw[ttlHeaderLen:]
	st := s.Store()
	if ttlExpiry(raw) <= now.UnixMilli() {
		if !st.readOnly {
			st.Delete(key)
		}
		return nil, false, nil
	}
	if d.ttl.update == OnReadAndWrite && extend && !st.readOnly {
		st.putOwned(key, d.ttl.wrap(now, payload))
	}
	return payload, true, nil
}

// ttlExpiry returns the expiry, in unix milliseconds, of a stored value with
// TTL at least ttlHeaderLen long. A value is expired when its expiry is at
// or before now: reads and SweepExpired share this rule, so a value a read
// would still return is never swept.
func ttlExpiry(raw []byte) int64 { return int64(binary.BigEndian.Uint64(raw)) }

func errShortTTL(n int) error {
	return fmt.Errorf("%w: %d bytes, too short for a TTL header", ErrCorrupt, n)
}
