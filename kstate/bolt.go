package kstate

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
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
	// crash, a kill -9, a full disk), and has every page read and checked
	// before it is trusted (checkPages), unless it crashed on this boot
	// (bootKey, uncheckedKey); a clean file skips that cost.
	cleanKey = []byte("clean")
	// bootKey holds the boot (bootID) of the open that last wrote the
	// file, and the file's device and inode (fileID). A process that dies
	// on the machine's boot leaves its file as its last commit left it:
	// bbolt writes a commit's pages to pages no committed tree uses, then
	// its meta page (checksummed, one of two), and the page cache holds
	// what was written whatever became of the process. Torn or lost
	// writes take the machine going down (power, a kernel panic) or a
	// disk that drops them, and both come back on another boot; a copy of
	// the file in a new file is mostly another inode (not a copy written
	// over it, nor one whose file got the freed inode number back: a copy
	// of a live file is not a backup, docs/operations.md). So an open
	// after a crash of the same file on the same boot need not read the
	// pages, and a restart after a kill -9 does not grow with the state.
	bootKey = []byte("boot")
	// uncheckedKey is present while the file has been opened after a
	// crash without its pages being read, and not closed cleanly since.
	// The next open after another crash reads them whatever the boot:
	// damage done to the file at rest, which a crash cannot do but a read
	// of the damaged page stopping the process can look like, is then
	// found at the second start, not read again at every one.
	uncheckedKey = []byte("unchecked")
)

// bootID names the machine's current boot: Linux's random boot_id, which
// a container shares with its host. It is "" where there is none, and then
// every open after a crash reads the pages. Tests replace it.
var bootID = sync.OnceValue(func() string {
	raw, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return string(bytes.TrimSpace(raw))
})

// fileID is the boot and the identity of the file at path (see bootKey),
// "" where either is unknown.
func fileID(path string) string {
	boot := bootID()
	if boot == "" {
		return ""
	}
	fi, err := os.Stat(path)
	if err != nil {
		return ""
	}
	dev, ino, ok := fileIdentity(fi)
	if !ok {
		return ""
	}
	return fmt.Sprintf("%s %d:%d", boot, dev, ino)
}

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
}

// initialMmapSize is the address space a file is mapped with at its open.
// bbolt maps a file anew each time it outgrows the map (doubling it from
// 32 KiB), and a remap in a write transaction first copies every node the
// transaction has touched out of the map into the heap: in a restore of
// millions of keys, a seventh of its CPU. Mapped at 1 GiB, a file that
// stays under it is never remapped. The map reserves addresses, not memory
// (the pages a task reads are its resident set, as before, but stay mapped
// where a remap dropped them). bbolt then grows the file in steps of its
// AllocSize (16 MiB) beyond the pages in use, a sparse extension, where a
// small file grew to its map's size. On Windows bbolt grows the file to
// its map, and a 32-bit process has the addresses for a few such maps at
// most, so there bbolt's default stays.
var initialMmapSize = func() int {
	if runtime.GOOS == "windows" || strconv.IntSize < 64 {
		return 0
	}
	return 1 << 30
}()

// OpenBolt opens or creates the bbolt file at path, creating its directory.
//
// The freelist is kept as a hash map and written by every commit but a
// restore's batches (ApplyBulk), so an open reads it instead of walking
// every page to rebuild it: after a crash on the same boot (see bootKey),
// the open does not grow with the state.
func OpenBolt(path string) (Backend, error) {
	return openBolt(path, DefaultLockTimeout)
}

func openBolt(path string, lockTimeout time.Duration) (b *boltBackend, err error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, fmt.Errorf("kstate: create state dir: %w", err)
	}
	m, rebuild, err := checkBeforeOpen(path, lockTimeout)
	if err != nil {
		return nil, err
	}
	// bbolt panics on some damaged pages rather than returning an error.
	var db *bolt.DB
	defer func() {
		if r := recover(); r != nil {
			if db != nil {
				_ = db.Close()
			}
			b, err = nil, fmt.Errorf("%w: open %s: %v", ErrCorrupt, path, r)
		}
	}()
	db, err = bolt.Open(path, 0o600, &bolt.Options{
		Timeout:         lockTimeout,
		FreelistType:    bolt.FreelistMapType,
		InitialMmapSize: initialMmapSize,
	})
	if err != nil {
		return nil, openErr(path, lockTimeout, err)
	}
	// bbolt holds the file's lock now, and has read only its meta and
	// freelist pages. The transaction below reads the root bucket's pages
	// and the meta bucket's before it can tell whether the file must be
	// checked whole; bbolt trusts them, and a damaged one faults past any
	// recover. So they are checked first, at every open (a few pages).
	// (bbolt has initialised a file that was new or empty: another
	// process may have between the checks above and the lock, so the
	// file is read again whatever they found.)
	cur, err := checkFile(path)
	if err == nil && cur == nil {
		err = fmt.Errorf("%w: %s has no bbolt meta page after bbolt's open", ErrCorrupt, path)
	}
	if err == nil {
		err = checkPages(path, *cur, stateBucket)
	}
	if err != nil {
		_ = db.Close()
		return nil, err
	}
	b = &boltBackend{db: db, path: path}
	id := fileID(path)
	err = db.Update(func(tx *bolt.Tx) error {
		unchecked := false // trusted after a crash without reading its pages
		if mb := tx.Bucket(metaBucket); mb != nil && mb.Get(cleanKey) == nil {
			// Not closed cleanly.
			switch {
			case rebuild && cur.root == m.root:
				// checkBeforeOpen checked this tree already (bbolt's
				// Open commits nothing but a freelist after a rebuild;
				// a commit of another process that had the file in
				// the moment between them would have a new root).
			case id != "" && string(mb.Get(bootKey)) == id && mb.Get(uncheckedKey) == nil:
				unchecked = true
			default:
				if err := checkPages(path, *cur, nil); err != nil {
					return err
				}
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
		if err := mb.Put(bootKey, []byte(id)); err != nil {
			return err
		}
		if unchecked {
			err = mb.Put(uncheckedKey, []byte{1})
		} else {
			err = mb.Delete(uncheckedKey)
		}
		if err != nil {
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
// When that meta has no freelist synced (a restore's batches leave it so,
// ApplyBulk, and so did every commit before the hot path synced it),
// bbolt's Open rebuilds the freelist by walking every page reachable
// from the root (freepages), with the page checks of Tx.Check: each page
// referenced once, in bounds, a branch or leaf page, keys in order. That
// walk runs in a goroutine of its own, where a page that cannot be read
// panics past any recover, and a finding panics the opening goroutine
// while the walk goes on reading (after its transaction was closed under
// it). So openBolt first runs the same checks where a finding is an error
// (checkBeforeOpen), and bbolt's walk then finds nothing. What Tx.Check
// adds, a freelist against the reachable pages, holds by construction for
// a freelist built as their complement, so it is not run again.
//
// When the freelist is synced, bbolt reads it instead: checkFreelist makes
// sure that page is whole first. After a crash, the open then checks the
// pages as bbolt would not (checkPages), unless the crash was on this boot
// (see bootKey).
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

// checkBeforeOpen is checkFile under a shared lock on the file, taken as
// bbolt's read-only open takes it: an instance that still has the file
// open (its commits write the freelist) makes the open ErrLocked, rather
// than a read between two of its commits passing for damage. When the
// meta has no freelist synced, bbolt's Open will rebuild it by walking
// every page (see checkFile), so every page is checked first, under the
// same lock (rebuild).
func checkBeforeOpen(path string, lockTimeout time.Duration) (m *boltMetaPage, rebuild bool, err error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("kstate: open %s: %w", path, err)
	}
	defer f.Close()
	unlock, err := lockShared(path, f, lockTimeout)
	if err != nil {
		return nil, false, openErr(path, lockTimeout, err)
	}
	defer unlock()
	if m, err = checkFile(path); err != nil || m == nil || m.freelist != noFreelist {
		return m, false, err
	}
	return m, true, checkPages(path, *m, nil)
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

// Apply is one bbolt Update: the entries, the meta, the stats and the
// freelist commit together or not at all.
func (b *boltBackend) Apply(muts []Mutation, meta Meta) error {
	return b.apply(muts, meta, true)
}

// ApplyBulk is Apply without the freelist: a restore's batches write a
// fresh tree, and writing the freelist at each of them cost a full
// restore some of its rate. The store's next Apply or Close writes it; a
// crash before that leaves a file whose open rebuilds the freelist by
// reading every page, as after a restore that crashed, which has its
// work to redo anyway.
func (b *boltBackend) ApplyBulk(muts []Mutation, meta Meta) error {
	return b.apply(muts, meta, false)
}

func (b *boltBackend) apply(muts []Mutation, meta Meta, syncFreelist bool) error {
	muts, err := prepareMutations(muts)
	if err != nil {
		return err
	}
	b.mu.Lock()
	stats := b.stats
	b.mu.Unlock()
	err = b.update(syncFreelist, func(tx *bolt.Tx) error {
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
	// The last commit writes the freelist (as every commit but
	// ApplyBulk's does: see OpenBolt).
	b.db.NoFreelistSync = false
	markErr := b.db.Update(func(tx *bolt.Tx) error {
		mb := tx.Bucket(metaBucket)
		if err := mb.Delete(uncheckedKey); err != nil {
			return err
		}
		return mb.Put(cleanKey, []byte{1})
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

// update runs fn in a write transaction, whose commit writes the freelist
// if syncFreelist is set. fn must not call Get (rmu is held).
func (b *boltBackend) update(syncFreelist bool, fn func(*bolt.Tx) error) error {
	b.writing.Store(true)
	defer b.writing.Store(false)
	b.rmu.Lock()
	defer b.rmu.Unlock()
	b.endRead()
	b.db.NoFreelistSync = !syncFreelist // read by the commit, which rmu orders
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
