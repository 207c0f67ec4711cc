package kstate

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// DefaultLockTimeout is how long OpenBolt waits for the file lock. A zombie
// instance that still holds its task's file then makes the open fail with
// ErrLocked instead of hanging the new owner forever.
const DefaultLockTimeout = 5 * time.Second

var (
	stateBucket = []byte("state")
	metaBucket  = []byte("meta")
	metaKey     = []byte("meta")
	statsKey    = []byte("stats")
)

// boltBackend is the on-disk backend: one bbolt file per task, entries in the
// "state" bucket, and in the "meta" bucket the Meta plus the entry count and
// byte size, kept in the same transaction as the entries so Stats is exact
// after a reopen without walking the tree.
type boltBackend struct {
	db   *bolt.DB
	path string

	mu     sync.Mutex // guards stats against concurrent Stats calls
	stats  Stats
	closed bool
}

// OpenBolt opens or creates the bbolt file at path, creating its directory.
//
// The freelist is not synced (NoFreelistSync) and kept as a hash map: state
// files churn a lot of pages per epoch, and rebuilding the freelist on open
// is cheaper than writing it on every commit.
func OpenBolt(path string) (Backend, error) {
	return openBolt(path, DefaultLockTimeout)
}

func openBolt(path string, lockTimeout time.Duration) (b *boltBackend, err error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, fmt.Errorf("kstate: create state dir: %w", err)
	}
	if err := checkFileSize(path); err != nil {
		return nil, err
	}
	// bbolt panics on some damaged pages rather than returning an error.
	defer func() {
		if r := recover(); r != nil {
			b, err = nil, fmt.Errorf("%w: open %s: %v", ErrCorrupt, path, r)
		}
	}()
	db, err := bolt.Open(path, 0o600, &bolt.Options{
		Timeout:        lockTimeout,
		NoFreelistSync: true,
		FreelistType:   bolt.FreelistMapType,
	})
	if errors.Is(err, berrors.ErrTimeout) {
		return nil, fmt.Errorf("%w: %s (still locked after %v; is an old instance still running?)", ErrLocked, path, lockTimeout)
	}
	if errors.Is(err, berrors.ErrInvalid) || errors.Is(err, berrors.ErrChecksum) || errors.Is(err, berrors.ErrVersionMismatch) {
		return nil, fmt.Errorf("%w: open %s: %w", ErrCorrupt, path, err)
	}
	if err != nil {
		return nil, fmt.Errorf("kstate: open %s: %w", path, err)
	}
	b = &boltBackend{db: db, path: path}
	err = db.Update(func(tx *bolt.Tx) error {
		st, err := tx.CreateBucketIfNotExists(stateBucket)
		if err != nil {
			return err
		}
		mb, err := tx.CreateBucketIfNotExists(metaBucket)
		if err != nil {
			return err
		}
		if raw := mb.Get(metaKey); raw != nil {
			if _, err := decodeMeta(raw); err != nil {
				return err
			}
		}
		if raw := mb.Get(statsKey); raw != nil {
			b.stats, err = decodeStats(raw)
			return err
		}
		// No stats yet: a fresh file, or one written before stats were kept.
		// Count once and persist so every later open is O(1).
		c := st.Cursor()
		for k, v := c.First(); k != nil; k, v = c.Next() {
			b.stats.Keys++
			b.stats.Bytes += int64(len(k) + len(v))
		}
		return mb.Put(statsKey, encodeStats(b.stats))
	})
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("kstate: open %s: %w", path, err)
	}
	return b, nil
}

// checkFileSize refuses a file that is not a whole number of pages: bbolt
// grows files by whole pages, so anything else was cut short (a copy, a
// full disk), and reading a page past the end of the mapping would kill the
// process (SIGBUS) instead of returning an error. A file bbolt's meta says
// is larger than it is fails bbolt's own checks at open.
func checkFileSize(path string) error {
	fi, err := os.Stat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("kstate: stat %s: %w", path, err)
	}
	page := int64(os.Getpagesize())
	if fi.Size() == 0 {
		return nil // created but never initialised: bbolt does that
	}
	if fi.Size() < 2*page || fi.Size()%page != 0 {
		return fmt.Errorf("%w: %s is %d bytes, not whole %d-byte pages: truncated", ErrCorrupt, path, fi.Size(), page)
	}
	return nil
}

func (b *boltBackend) Get(key []byte) (value []byte, ok bool, err error) {
	err = b.view(func(tx *bolt.Tx) error {
		value, ok = lookup(tx.Bucket(stateBucket).Cursor(), key)
		if ok {
			// bbolt's slices point into the mmap and die with the tx.
			value = append([]byte{}, value...)
		}
		return nil
	})
	return value, ok, err
}

// lookup finds key with a cursor rather than Bucket.Get so that an empty
// value is told apart from a missing key by the key, not by a nil check.
func lookup(c *bolt.Cursor, key []byte) ([]byte, bool) {
	k, v := c.Seek(key)
	if k == nil || !bytes.Equal(k, key) {
		return nil, false
	}
	return v, true
}

func (b *boltBackend) Scan(prefix []byte, fn func(k, v []byte) error) error {
	return b.view(func(tx *bolt.Tx) error {
		c := tx.Bucket(stateBucket).Cursor()
		for k, v := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
			if err := fn(k, v); err != nil {
				if err == ErrStopScan {
					return nil
				}
				return err
			}
		}
		return nil
	})
}

// Apply is one bbolt Update: the entries, the meta and the stats commit
// together or not at all.
func (b *boltBackend) Apply(muts []Mutation, meta Meta) error {
	muts, err := prepareMutations(muts)
	if err != nil {
		return err
	}
	b.mu.Lock()
	stats := b.stats
	b.mu.Unlock()
	err = b.update(func(tx *bolt.Tx) error {
		st := tx.Bucket(stateBucket)
		c := st.Cursor()
		for _, m := range muts {
			// Re-seek for every key: a cursor is invalid after a write.
			old, exists := lookup(c, m.Key)
			switch {
			case m.Value == nil && exists:
				if err := st.Delete(m.Key); err != nil {
					return err
				}
				stats.Keys--
				stats.Bytes -= int64(len(m.Key) + len(old))
			case m.Value == nil:
			default:
				if exists {
					stats.Bytes += int64(len(m.Value) - len(old))
				} else {
					stats.Keys++
					stats.Bytes += int64(len(m.Key) + len(m.Value))
				}
				if err := st.Put(m.Key, m.Value); err != nil {
					return err
				}
			}
		}
		mb := tx.Bucket(metaBucket)
		if err := mb.Put(metaKey, encodeMeta(meta)); err != nil {
			return err
		}
		return mb.Put(statsKey, encodeStats(stats))
	})
	if err != nil {
		return fmt.Errorf("kstate: apply %d mutations to %s: %w", len(muts), b.path, err)
	}
	b.mu.Lock()
	b.stats = stats
	b.mu.Unlock()
	return nil
}

func (b *boltBackend) Meta() (m Meta, err error) {
	err = b.view(func(tx *bolt.Tx) error {
		raw := tx.Bucket(metaBucket).Get(metaKey)
		if raw == nil {
			m = Meta{}.Clone()
			return nil
		}
		m, err = decodeMeta(raw)
		return err
	})
	return m, err
}

func (b *boltBackend) Stats() Stats {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.stats
}

func (b *boltBackend) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	b.mu.Unlock()
	if err := b.db.Close(); err != nil {
		return fmt.Errorf("kstate: close %s: %w", b.path, err)
	}
	return nil
}

func (b *boltBackend) view(fn func(*bolt.Tx) error) error {
	return b.closedErr(b.db.View(fn))
}

func (b *boltBackend) update(fn func(*bolt.Tx) error) error {
	return b.closedErr(b.db.Update(fn))
}

// closedErr turns bbolt's not-open error into the package's ErrClosed, so
// callers see the same error from every backend.
func (b *boltBackend) closedErr(err error) error {
	if errors.Is(err, berrors.ErrDatabaseNotOpen) {
		return ErrClosed
	}
	return err
}
