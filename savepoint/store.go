package savepoint

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/sluicehq/sluice/savepoint/internal/objstore"
)

// errNotFound is returned (wrapped) by store.Open for a file that is not
// there.
var errNotFound = objstore.ErrNotFound

// store holds the files of one savepoint: a local directory (dirStore), or
// an object store's, from the package that registered its URL scheme
// (savepoint/s3, savepoint/gcs, savepoint/azure). Local directories go through the os package rather than
// gocloud's fileblob, which does not fsync: a savepoint on local disk must
// survive a power cut once Commit returned.
type store = objstore.Store

// file is a data file being written.
type file = objstore.File

// drivers are the packages whose import lets each object store's
// locations open, and what they are called in messages.
var drivers = map[string]struct{ name, pkg, binary string }{
	"s3":     {"S3", "github.com/sluicehq/sluice/savepoint/s3", "the processor binary has it"},
	"gs":     {"Google Cloud Storage", "github.com/sluicehq/sluice/savepoint/gcs", "the processor binary has it unless built with -tags nogcs"},
	"azblob": {"Azure Blob Storage", "github.com/sluicehq/sluice/savepoint/azure", "the processor binary has it unless built with -tags noazure"},
}

func openStore(ctx context.Context, l location) (store, error) {
	if l.local != "" {
		return dirStore(l.local), nil
	}
	open := objstore.Lookup(l.scheme)
	if open == nil {
		d := drivers[l.scheme]
		return nil, fmt.Errorf("%w: %s: %s:// locations need the %s driver, which this program does not import (import _ %q; %s)", ErrLocation, l, l.scheme, d.name, d.pkg, d.binary)
	}
	st, err := open(ctx, objstore.Location{Bucket: l.bucket, Prefix: l.prefix, RawQuery: l.rawQuery, String: l.String()})
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrLocation, l, err)
	}
	return st, nil
}

// dirStore is a savepoint in a local directory.
type dirStore string

func (d dirStore) Prepare(context.Context) error {
	if err := os.MkdirAll(filepath.Dir(string(d)), 0o755); err != nil {
		return fmt.Errorf("savepoint: %w", err)
	}
	// Mkdir, not MkdirAll: an existing directory is refused.
	if err := os.Mkdir(string(d), 0o755); err != nil {
		return fmt.Errorf("savepoint: %w", err)
	}
	return nil
}

func (d dirStore) Create(_ context.Context, name string) (file, error) {
	f, err := os.Create(filepath.Join(string(d), name))
	if err != nil {
		return nil, fmt.Errorf("savepoint: %w", err)
	}
	return osFile{f}, nil
}

type osFile struct{ *os.File }

func (f osFile) Commit() error {
	err := f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

func (f osFile) Abort() {
	f.Close()
	os.Remove(f.Name())
}

func (d dirStore) Open(_ context.Context, name string) (io.ReadCloser, error) {
	f, err := os.Open(filepath.Join(string(d), name))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w: %v", errNotFound, err)
	}
	return f, err
}

// PutAtomic writes to a temporary file, syncs it, renames it and syncs the
// directory, so that after a crash the file either is whole or is not
// there.
func (d dirStore) PutAtomic(_ context.Context, name string, b []byte) error {
	dir := string(d)
	tmp := filepath.Join(dir, name+".tmp")
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(dir, name))
	}
	if err == nil {
		err = syncDir(dir)
	}
	if err != nil {
		os.Remove(tmp)
	}
	return err
}

func (d dirStore) RemoveAll(context.Context) error { return os.RemoveAll(string(d)) }

func (d dirStore) Close() error { return nil }

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
