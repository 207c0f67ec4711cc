// Package blobstore is a savepoint's files under a key prefix of a
// gocloud.dev/blob bucket: the object stores' drivers (savepoint/s3,
// savepoint/gcs) open their bucket and hand it here.
package blobstore

import (
	"context"
	"fmt"
	"io"

	"gocloud.dev/blob"
	"gocloud.dev/gcerrors"

	"github.com/sluicehq/sluice/savepoint/internal/objstore"
)

// New is the savepoint at l in bucket b, opened at the bucket's root: the
// prefix is applied here. The Store closes b.
func New(b *blob.Bucket, l objstore.Location) objstore.Store {
	if l.Prefix != "" {
		b = blob.PrefixedBucket(b, l.Prefix+"/")
	}
	return &blobStore{b: b, where: l.String}
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

func (s *blobStore) Prepare(ctx context.Context) error {
	// An object store has no directories to create; refusing a prefix
	// that holds objects is the same rule as Mkdir's. Two writers racing
	// on one prefix are not excluded (S3 has no create-if-absent for a
	// prefix; GCS's preconditions are per object); `processor savepoint`
	// names each savepoint by the time in
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

func (s *blobStore) Create(ctx context.Context, name string) (objstore.File, error) {
	// Cancelling the writer's context before Close aborts the upload, so
	// a failed data file leaves no object behind.
	ctx, cancel := context.WithCancel(ctx)
	w, err := s.b.NewWriter(ctx, name, &blob.WriterOptions{
		ContentType: "application/octet-stream",
		// Parts of 8 MiB, at most 4 uploading: the upload buffers stay
		// around 40 MiB whatever the file's size (S3; GCS uploads one
		// 8 MiB chunk at a time).
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

func (f *blobFile) Commit() error {
	defer f.cancel()
	return f.w.Close()
}

func (f *blobFile) Abort() {
	f.cancel()
	f.w.Close()
}

func (s *blobStore) Open(ctx context.Context, name string) (io.ReadCloser, error) {
	r, err := s.b.NewReader(ctx, name, nil)
	if gcerrors.Code(err) == gcerrors.NotFound {
		return nil, fmt.Errorf("%w: %s/%s", objstore.ErrNotFound, s.where, name)
	}
	if err != nil {
		return nil, fmt.Errorf("%s/%s: %w", s.where, name, err)
	}
	return r, nil
}

// PutAtomic is one PUT: an object store makes an object visible whole or
// not at all.
func (s *blobStore) PutAtomic(ctx context.Context, name string, b []byte) error {
	return s.b.WriteAll(ctx, name, b, &blob.WriterOptions{ContentType: "application/json"})
}

func (s *blobStore) RemoveAll(ctx context.Context) error {
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

func (s *blobStore) Close() error { return s.b.Close() }
