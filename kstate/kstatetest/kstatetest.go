// Package kstatetest helps test code that uses kstate: it opens backends in
// a test's temporary directory and checks them when the test ends, and it
// provides a Scope with a key and a clock the test sets by hand.
package kstatetest

import (
	"fmt"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/sluicehq/sluice/kstate"
)

// Task is the task name the helpers open backends under.
const Task = "task"

// MustOpen opens a backend of the given kind in tb.TempDir(). See MustOpenDir.
func MustOpen(tb testing.TB, kind string) kstate.Backend {
	tb.Helper()
	return MustOpenDir(tb, kind, tb.TempDir())
}

// MustOpenDir opens the backend of kind for Task in dir, failing the test on
// error. When the test ends it closes the backend and, for bbolt, runs
// bbolt's consistency check on the file, so every test that writes state
// also proves the file it leaves is sound. Open the same dir again to test a
// reopen; closing early is fine, Close is idempotent.
func MustOpenDir(tb testing.TB, kind, dir string) kstate.Backend {
	tb.Helper()
	b, err := kstate.Open(kind, dir, Task)
	if err != nil {
		tb.Fatalf("open %s backend: %v", kind, err)
	}
	tb.Cleanup(func() {
		if err := b.Close(); err != nil {
			tb.Errorf("close %s backend: %v", kind, err)
		}
		if kind == kstate.BoltBackend {
			if err := CheckBolt(kstate.BoltPath(dir, Task)); err != nil {
				tb.Error(err)
			}
		}
	})
	return b
}

// CheckBolt opens a closed bbolt state file and runs bbolt's consistency
// check over it (page references, freelist, key order).
func CheckBolt(path string) error {
	db, err := bolt.Open(path, 0o600, &bolt.Options{
		Timeout:        time.Second,
		NoFreelistSync: true,
		FreelistType:   bolt.FreelistMapType,
	})
	if err != nil {
		return fmt.Errorf("check %s: %w", path, err)
	}
	defer db.Close()
	return db.View(func(tx *bolt.Tx) error {
		var errs []error
		for err := range tx.Check() {
			errs = append(errs, err)
		}
		if len(errs) > 0 {
			return fmt.Errorf("check %s: %d inconsistencies, first: %w", path, len(errs), errs[0])
		}
		return nil
	})
}

// Epoch is the instant a Scope's clock starts at: fixed, so tests repeat.
var Epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// Scope is a kstate.Scope whose key and clock the test sets.
type Scope struct {
	store *kstate.Store
	key   []byte
	now   time.Time
}

// NewScope returns a Scope over st with an empty key and the clock at Epoch.
func NewScope(st *kstate.Store) *Scope { return &Scope{store: st, now: Epoch} }

// Store returns the scope's store.
func (s *Scope) Store() *kstate.Store { return s.store }

// Key returns the current record key.
func (s *Scope) Key() []byte { return s.key }

// Now returns the scope's clock.
func (s *Scope) Now() time.Time { return s.now }

// SetKey sets the current record key and returns s, for chaining.
func (s *Scope) SetKey(key string) *Scope {
	s.key = []byte(key)
	return s
}

// Advance moves the clock forward by d.
func (s *Scope) Advance(d time.Duration) { s.now = s.now.Add(d) }
