//go:build !unix

package kstate

import (
	"io"
	"os"
	"time"

	bolt "go.etcd.io/bbolt"
)

// mapFile reads through the file itself where mmap is not at hand.
func mapFile(f *os.File) (io.ReaderAt, func(), error) { return f, func() {}, nil }

// fileIdentity is unknown here: every open after a crash reads the pages.
func fileIdentity(os.FileInfo) (dev, ino uint64, ok bool) { return 0, 0, false }

// lockShared takes bbolt's shared lock on the file at path by opening it
// read-only (bbolt reads only the meta pages then), where flock is not at
// hand.
func lockShared(path string, _ *os.File, timeout time.Duration) (unlock func(), err error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: timeout})
	if err != nil {
		return nil, err
	}
	return func() { _ = db.Close() }, nil
}
