package kstate

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
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
	// cleanKey is present while the file is closed cleanly: Close writes
	// it, open removes it. A file opened without it was not closed (a
	// crash, a kill -9, a full disk), and gets bbolt's full consistency
	// check before it is trusted; a clean file skips that cost.
	cleanKey = []byte("clean")
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

	// Point reads share one read transaction, opened by the first Get
	// after a write and rolled back by the next write (update, Close),
	// so it never sees an older state than the file's: a bbolt
	// transaction per Get cost more than the lookup. rmu guards it, and
	// is held across every write, so that no Get can open it again while
	// the write is under way (it would see the old state, and hold up the
	// mmap's growth). Gets copy values out of it into reads, an arena that
	// dies with them.
	rmu   sync.Mutex
	rtx   *bolt.Tx
	rcur  *bolt.Cursor
	reads arena
	// writing is set while a write runs. A Get then reads in a
	// transaction of its own instead of waiting on rmu for the write,
	// fsyncs included: it sees the entry as of before the write, which
	// a Store asks for only when its write-sets do not hold the key
	// (Store.ApplyBehind), so the write does not change it.
	writing atomic.Bool

	checkErr error // the consistency check's first finding, at open
}

// OpenBolt opens or creates the bbolt file at path, creating its directory.
//
// The freelist is kept as a hash map and not synced by commits
// (NoFreelistSync): state files churn a lot of pages per epoch, and
// writing the freelist on every commit costs more than rebuilding it at an
// open after a crash. Close writes it once, so a clean restart reads it.
func OpenBolt(path string) (Backend, error) {
	return openBolt(path, DefaultLockTimeout)
}

func openBolt(path string, lockTimeout time.Duration) (b *boltBackend, err error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, fmt.Errorf("kstate: create state dir: %w", err)
	}
	m, err := checkFile(path)
	if err != nil {
		return nil, err
	}
	// bbolt's Open will rebuild the freelist: see checkFile.
	rebuild := m != nil && m.freelist == noFreelist
	if rebuild {
		if err := readEveryPage(path, *m, lockTimeout); err != nil {
			return nil, err
		}
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
	if err != nil {
		return nil, openErr(path, lockTimeout, err)
	}
	b = &boltBackend{db: db, path: path}
	err = db.Update(func(tx *bolt.Tx) error {
		// Not closed cleanly: check every page before the file is
		// trusted. If bbolt rebuilt the freelist at Open, readEveryPage
		// ran this check's page checks already (see checkFile), unless
		// the file took a commit between the two (another process that
		// had it open in the moment between them).
		walked := rebuild && uint64(tx.ID()) == m.txid+1
		if mb := tx.Bucket(metaBucket); mb != nil && mb.Get(cleanKey) == nil && !walked {
			for err := range tx.Check() {
				// Drain the channel: Check's goroutine ends only
				// after every error was received.
				if b.checkErr == nil {
					b.checkErr = fmt.Errorf("%w: %s failed bbolt's consistency check after an unclean close: %v", ErrCorrupt, path, err)
				}
			}
			if b.checkErr != nil {
				return b.checkErr
			}
		}
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
		if err := mb.Delete(cleanKey); err != nil {
			return err
		}
		if raw := mb.Get(statsKey); raw != nil {
			var timers bool
			if b.stats, timers, err = decodeStats(raw); err != nil || timers {
				return err
			}
			// Written before timers were counted: count them once.
			c := st.Cursor()
			for k, _ := c.Seek(timerKindPrefix); k != nil && bytes.HasPrefix(k, timerKindPrefix); k, _ = c.Next() {
				b.stats.count(k, 1)
			}
			return mb.Put(statsKey, encodeStats(b.stats))
		}
		// No stats yet: a fresh file, or one written before stats were kept.
		// Count once and persist so every later open is O(1).
		c := st.Cursor()
		for k, v := c.First(); k != nil; k, v = c.Next() {
			b.stats.Keys++
			b.stats.Bytes += int64(len(k) + len(v))
			b.stats.count(k, 1)
		}
		return mb.Put(statsKey, encodeStats(b.stats))
	})
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("kstate: open %s: %w", path, err)
	}
	return b, nil
}

// checkFile refuses a file cut short (a copy, a full disk, a bad restore
// from backup): not whole pages, or fewer pages than its meta page says it
// has. bbolt would read past the end of its mapping (SIGBUS) or panic in a
// goroutine of its own while rebuilding the freelist, killing the process
// instead of returning an error. It returns the meta page bbolt will use,
// nil for a file bbolt has yet to initialise.
//
// When that meta has no freelist synced (every commit leaves it so, with
// NoFreelistSync; only Close writes one), bbolt's Open rebuilds the
// freelist by walking every page reachable from the root (freepages),
// with the page checks of Tx.Check: each page referenced once, in bounds,
// a branch or leaf page, keys in order. That walk runs in a goroutine of
// its own, where a page that cannot be read panics past any recover, and a
// finding panics the opening goroutine while the walk goes on reading
// (after its transaction was closed under it). So openBolt first runs the
// same checks where a finding is an error (readEveryPage), and bbolt's
// walk then finds nothing. What Tx.Check adds, a freelist against the
// reachable pages, holds by construction for a freelist built as their
// complement, so it is not run again.
//
// When the freelist is synced (a clean close), bbolt reads it instead:
// checkFreelist makes sure that page is whole first.
func checkFile(path string) (*boltMetaPage, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("kstate: open %s: %w", path, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("kstate: stat %s: %w", path, err)
	}
	if fi.Size() == 0 {
		return nil, nil // created but never initialised: bbolt does that
	}
	truncated := func(why string) error {
		return fmt.Errorf("%w: %s is %d bytes, %s: truncated", ErrCorrupt, path, fi.Size(), why)
	}
	m, ok := boltMeta(f)
	switch {
	case !ok:
		return nil, fmt.Errorf("%w: %s has no valid bbolt meta page", ErrCorrupt, path)
	case uint64(fi.Size())%m.pageSize != 0:
		return nil, truncated(fmt.Sprintf("not whole %d-byte pages", m.pageSize))
	case m.pgid > uint64(fi.Size())/m.pageSize:
		return nil, truncated(fmt.Sprintf("its meta counts %d pages of %d bytes", m.pgid, m.pageSize))
	}
	if m.freelist != noFreelist {
		if err := checkFreelist(f, path, m); err != nil {
			return nil, err
		}
	}
	return &m, nil
}

// openErr says why bolt.Open refused path.
func openErr(path string, lockTimeout time.Duration, err error) error {
	switch {
	case errors.Is(err, berrors.ErrTimeout):
		return fmt.Errorf("%w: %s (still locked after %v; is an old instance still running?)", ErrLocked, path, lockTimeout)
	case errors.Is(err, berrors.ErrInvalid) || errors.Is(err, berrors.ErrChecksum) || errors.Is(err, berrors.ErrVersionMismatch):
		return fmt.Errorf("%w: open %s: %w", ErrCorrupt, path, err)
	}
	return fmt.Errorf("kstate: open %s: %w", path, err)
}

func (b *boltBackend) Get(key []byte) (value []byte, ok bool, err error) {
	if b.writing.Load() {
		return b.getBeside(key)
	}
	b.rmu.Lock()
	defer b.rmu.Unlock()
	if b.rtx == nil {
		tx, err := b.db.Begin(false)
		if err != nil {
			return nil, false, b.closedErr(err)
		}
		b.rtx, b.rcur = tx, tx.Bucket(stateBucket).Cursor()
	}
	value, ok = lookup(b.rcur, key)
	if ok {
		// bbolt's slices point into the mmap and die with the tx.
		value = b.reads.copy(value)
	}
	return value, ok, nil
}

// getBeside is Get while a write runs: a read transaction of its own, and
// a copy of the value (the shared arena is rmu's).
func (b *boltBackend) getBeside(key []byte) (value []byte, ok bool, err error) {
	err = b.view(func(tx *bolt.Tx) error {
		value, ok = lookup(tx.Bucket(stateBucket).Cursor(), key)
		if ok {
			value = bytes.Clone(value)
		}
		return nil
	})
	return value, ok, err
}

// endRead rolls back the shared read transaction, if one is open; the
// caller holds rmu. Every write calls it first: the transaction must not
// outlive the state it saw, and bbolt cannot grow its mmap while a read
// transaction is open.
func (b *boltBackend) endRead() {
	if b.rtx != nil {
		_ = b.rtx.Rollback() // read-only: nothing to lose
		b.rtx, b.rcur = nil, nil
	}
}

// appends reports whether every mutation of muts, sorted by key, comes
// after the last key the file holds: then none exists yet, and Apply need
// not look each one up. A restore of a changelog the job wrote in key order
// is made of such batches, and so are the epochs of keys that only grow (a
// time in the key, a sequence number).
func appends(c *bolt.Cursor, muts []Mutation) bool {
	if len(muts) == 0 {
		return false
	}
	last, _ := c.Last()
	return bytes.Compare(muts[0].Key, last) > 0
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
	return b.ScanFrom(prefix, prefix, fn)
}

func (b *boltBackend) ScanFrom(prefix, start []byte, fn func(k, v []byte) error) error {
	return b.view(func(tx *bolt.Tx) error {
		c := tx.Bucket(stateBucket).Cursor()
		for k, v := c.Seek(scanStart(prefix, start)); k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
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
		appending := appends(c, muts)
		if appending {
			// Fill the new pages (bbolt splits at half a page by
			// default, which suits random inserts): nothing goes
			// between these keys in this transaction, and half-full
			// pages would double the pages of a tree built in key
			// order. A later insert between them splits the full page
			// it lands in, as it would one that had filled up.
			st.FillPercent = 1.0
		}
		for _, m := range muts {
			var old []byte
			exists := false
			if !appending {
				// Re-seek for every key: a cursor is invalid after a write.
				old, exists = lookup(c, m.Key)
			}
			switch {
			case m.Value == nil && exists:
				if err := st.Delete(m.Key); err != nil {
					return err
				}
				stats.Keys--
				stats.Bytes -= int64(len(m.Key) + len(old))
				stats.count(m.Key, -1)
			case m.Value == nil:
			default:
				if exists {
					stats.Bytes += int64(len(m.Value) - len(old))
				} else {
					stats.Keys++
					stats.Bytes += int64(len(m.Key) + len(m.Value))
					stats.count(m.Key, 1)
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
	b.rmu.Lock()
	defer b.rmu.Unlock()
	b.endRead()
	// The last commit writes the freelist (only this one: see OpenBolt),
	// so the next open reads it instead of walking every page to rebuild
	// it: a restart after a clean close does not grow with the state.
	b.db.NoFreelistSync = false
	markErr := b.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(metaBucket).Put(cleanKey, []byte{1})
	})
	if err := b.db.Close(); err != nil {
		return fmt.Errorf("kstate: close %s: %w", b.path, err)
	}
	if markErr != nil {
		return fmt.Errorf("kstate: close %s: mark clean: %w", b.path, markErr)
	}
	return nil
}

func (b *boltBackend) view(fn func(*bolt.Tx) error) error {
	return b.closedErr(b.db.View(fn))
}

// update runs fn in a write transaction. fn must not call Get (rmu is held).
func (b *boltBackend) update(fn func(*bolt.Tx) error) error {
	b.writing.Store(true)
	defer b.writing.Store(false)
	b.rmu.Lock()
	defer b.rmu.Unlock()
	b.endRead()
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
