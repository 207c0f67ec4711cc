package savepoint

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"

	"gocloud.dev/blob"
	"gocloud.dev/blob/s3blob"
	"gocloud.dev/gcerrors"
)

// errNotFound is returned (wrapped) by store.open for a file that is not
// there.
var errNotFound = errors.New("not found")

// store holds the files of one savepoint. Local directories go through the
// os package rather than gocloud's fileblob, which does not fsync: a
// savepoint on local disk must survive a power cut once Commit returned.
type store interface {
	// prepare makes the location ready for a new savepoint, refusing one
	// that already holds files: a savepoint is never written over another.
	prepare(ctx context.Context) error
	// create starts writing file name; nothing is visible under that
	// name as a complete file until commit.
	create(ctx context.Context, name string) (file, error)
	open(ctx context.Context, name string) (io.ReadCloser, error)
	// putAtomic writes file name whole or not at all, even across a
	// crash: the manifest.
	putAtomic(ctx context.Context, name string, b []byte) error
	// removeAll deletes what the savepoint's files are, for a writer
	// that gives up.
	removeAll(ctx context.Context) error
	close() error
}

// file is a data file being written.
type file interface {
	io.Writer
	// commit makes the file durable (synced to disk, or the upload
	// completed).
	commit() error
	// abort drops the file.
	abort()
}

func openStore(ctx context.Context, l location) (store, error) {
	if l.local != "" {
		return dirStore(l.local), nil
	}
	// The bucket is opened without the prefix, so the query parameters
	// are all s3blob's, and the prefix is applied by PrefixedBucket.
	u := "s3://" + l.bucket
	if l.rawQuery != "" {
		u += "?" + l.rawQuery
	}
	bu, err := url.Parse(u)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrLocation, l, err)
	}
	b, err := (&s3blob.URLOpener{}).OpenBucketURL(ctx, bu)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrLocation, l, err)
	}
	if l.prefix != "" {
		b = blob.PrefixedBucket(b, l.prefix+"/")
	}
	return &blobStore{b: b, where: l.String()}, nil
}

// dirStore is a savepoint in a local directory.
type dirStore string

func (d dirStore) prepare(context.Context) error {
	if err := os.MkdirAll(filepath.Dir(string(d)), 0o755); err != nil {
		return fmt.Errorf("savepoint: %w", err)
	}
	// Mkdir, not MkdirAll: an existing directory is refused.
	if err := os.Mkdir(string(d), 0o755); err != nil {
		return fmt.Errorf("savepoint: %w", err)
	}
	return nil
}

func (d dirStore) create(_ context.Context, name string) (file, error) {
	f, err := os.Create(filepath.Join(string(d), name))
	if err != nil {
		return nil, fmt.Errorf("savepoint: %w", err)
	}
	return osFile{f}, nil
}

type osFile struct{ *os.File }

func (f osFile) commit() error {
	err := f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

func (f osFile) abort() {
	f.Close()
	os.Remove(f.Name())
}

func (d dirStore) open(_ context.Context, name string) (io.ReadCloser, error) {
	f, err := os.Open(filepath.Join(string(d), name))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w: %v", errNotFound, err)
	}
	return f, err
}

// putAtomic writes to a temporary file, syncs it, renames it and syncs the
// directory, so that after a crash the file either is whole or is not
// there.
func (d dirStore) putAtomic(_ context.Context, name string, b []byte) error {
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

func (d dirStore) removeAll(context.Context) error { return os.RemoveAll(string(d)) }

func (d dirStore) close() error { return nil }

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

const (
	uploadPartSize    = 8 << 20
	uploadConcurrency = 4
)

// blobStore is a savepoint under a key prefix of an object store bucket.
type blobStore struct {
	b     *blob.Bucket
	where string
}

func (s *blobStore) prepare(ctx context.Context) error {
	// An object store has no directories to create; refusing a prefix
	// that holds objects is the same rule as Mkdir's. Two writers racing
	// on one prefix are not excluded (S3 has no create-if-absent for a
	// prefix); `processor savepoint` names each savepoint by the time in
	// milliseconds.
	objs, _, err := s.b.ListPage(ctx, blob.FirstPageToken, 1, nil)
	if err != nil {
		return fmt.Errorf("savepoint: list %s: %w", s.where, err)
	}
	if len(objs) > 0 {
		return fmt.Errorf("savepoint: %s already holds objects (%s)", s.where, objs[0].Key)
	}
	return nil
}

func (s *blobStore) create(ctx context.Context, name string) (file, error) {
	// Cancelling the writer's context before Close aborts the upload, so
	// a failed data file leaves no object behind.
	ctx, cancel := context.WithCancel(ctx)
	w, err := s.b.NewWriter(ctx, name, &blob.WriterOptions{
		ContentType: "application/octet-stream",
		// Parts of 8 MiB, at most 4 uploading: the upload buffers stay
		// around 40 MiB whatever the file's size.
		BufferSize:     uploadPartSize,
		MaxConcurrency: uploadConcurrency,
	})
	if err != nil {
		cancel()
		return nil, fmt.Errorf("savepoint: %s/%s: %w", s.where, name, err)
	}
	return &blobFile{w: w, cancel: cancel}, nil
}

type blobFile struct {
	w      *blob.Writer
	cancel context.CancelFunc
}

func (f *blobFile) Write(p []byte) (int, error) { return f.w.Write(p) }

func (f *blobFile) commit() error {
	defer f.cancel()
	return f.w.Close()
}

func (f *blobFile) abort() {
	f.cancel()
	f.w.Close()
}

func (s *blobStore) open(ctx context.Context, name string) (io.ReadCloser, error) {
	r, err := s.b.NewReader(ctx, name, nil)
	if gcerrors.Code(err) == gcerrors.NotFound {
		return nil, fmt.Errorf("%w: %s/%s", errNotFound, s.where, name)
	}
	if err != nil {
		return nil, fmt.Errorf("%s/%s: %w", s.where, name, err)
	}
	return r, nil
}

// putAtomic is one PUT: an object store makes an object visible whole or
// not at all.
func (s *blobStore) putAtomic(ctx context.Context, name string, b []byte) error {
	return s.b.WriteAll(ctx, name, b, &blob.WriterOptions{ContentType: "application/json"})
}

func (s *blobStore) removeAll(ctx context.Context) error {
	it := s.b.List(nil)
	var first error
	for {
		obj, err := it.Next(ctx)
		if err == io.EOF {
			return first
		}
		if err != nil {
			return err
		}
		if err := s.b.Delete(ctx, obj.Key); err != nil && first == nil {
			first = err
		}
	}
}

func (s *blobStore) close() error { return s.b.Close() }
