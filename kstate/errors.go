package kstate

import "errors"

// Errors from the key format.
var (
	// ErrBadKey is wrapped by DecodeKey when bytes are not a valid physical
	// key, and recorded by a Store (see Store.RecordErr) when a write names
	// an empty key or one longer than MaxKeySize.
	ErrBadKey = errors.New("kstate: bad key")

	// ErrValueTooLarge is recorded by a Store (see Store.RecordErr) when a
	// write is larger than its SetMaxEntryBytes bound.
	ErrValueTooLarge = errors.New("kstate: entry too large")

	// ErrReadOnly is recorded by a Store from NewReadStore (see
	// Store.RecordErr) when state is written through it: a query reads
	// committed state and cannot change it.
	ErrReadOnly = errors.New("kstate: read-only store: a query cannot write state")
)

// Errors from backends.
var (
	// ErrClosed is returned by every Backend method called after Close.
	ErrClosed = errors.New("kstate: backend closed")

	// ErrLocked is returned by OpenBolt when another handle, usually a zombie
	// process of the same instance, still holds the file lock after the lock
	// timeout. It is the clear failure that replaces waiting forever.
	ErrLocked = errors.New("kstate: state file locked by another process")

	// ErrUnknownBackend is returned by Open and Remove for a kind other than
	// BoltBackend or MemoryBackend.
	ErrUnknownBackend = errors.New("kstate: unknown backend kind")

	// ErrCorrupt is wrapped when stored bytes cannot be decoded: a backend's
	// meta record, a list's framing, or a TTL header. Codec errors are not
	// ErrCorrupt; they are wrapped with the state name instead.
	ErrCorrupt = errors.New("kstate: corrupt stored value")
)

// ErrStopScan may be returned by a Scan callback to end the scan early.
// Scan then returns nil; it is never returned to the caller of Scan.
var ErrStopScan = errors.New("kstate: stop scan")
