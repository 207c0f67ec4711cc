// Package objstore is what package savepoint needs of the place a
// savepoint's files live, and the registry of the object stores it can
// use. The object stores are packages of their own (savepoint/s3,
// savepoint/gcs), so
// that a program that imports the engine, and so savepoint, does not
// build an object store's SDK it does not use.
package objstore

import (
	"context"
	"errors"
	"io"
	"sync"
)

// ErrNotFound is returned (wrapped) by Store.Open for a file that is not
// there.
var ErrNotFound = errors.New("not found")

// Store holds the files of one savepoint.
type Store interface {
	// Prepare makes the location ready for a new savepoint, refusing one
	// that already holds files: a savepoint is never written over another.
	Prepare(ctx context.Context) error
	// Create starts writing file name; nothing is visible under that
	// name as a complete file until File.Commit.
	Create(ctx context.Context, name string) (File, error)
	Open(ctx context.Context, name string) (io.ReadCloser, error)
	// PutAtomic writes file name whole or not at all, even across a
	// crash: the manifest.
	PutAtomic(ctx context.Context, name string, b []byte) error
	// RemoveAll deletes what the savepoint's files are, for a writer
	// that gives up.
	RemoveAll(ctx context.Context) error
	Close() error
}

// File is a data file being written.
type File interface {
	io.Writer
	// Commit makes the file durable (synced to disk, or the upload
	// completed).
	Commit() error
	// Abort drops the file.
	Abort()
}

// Location is where an object store's savepoint is: the bucket, the key
// prefix (no leading or trailing slash, "" for the bucket's root), the URL's
// query as given, and the whole location for messages.
type Location struct {
	Bucket, Prefix, RawQuery, String string
}

// Opener opens the savepoint at l. It may read the store's configuration
// (credentials, region) but should send nothing.
type Opener func(ctx context.Context, l Location) (Store, error)

var (
	mu      sync.Mutex
	openers = map[string]Opener{}
)

// Register makes the URL scheme's locations (without "://") open with o.
func Register(scheme string, o Opener) {
	mu.Lock()
	defer mu.Unlock()
	openers[scheme] = o
}

// Lookup returns the scheme's Opener, or nil if no package registered one.
func Lookup(scheme string) Opener {
	mu.Lock()
	defer mu.Unlock()
	return openers[scheme]
}
