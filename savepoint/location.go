package savepoint

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"path"
	"path/filepath"
	"strings"
)

// ErrLocation is returned (wrapped) for a location this package cannot
// write to or read from: an unknown URL scheme, an empty path, an s3://,
// gs:// or azblob:// URL without a bucket or with query parameters its
// driver does not know, or any such URL in a program that does not import
// its driver (savepoint/s3, savepoint/gcs, savepoint/azure).
var ErrLocation = errors.New("savepoint: bad location")

// A location is where a savepoint's files are: a local directory (a path
// or a file:// URL) or a key prefix in an object store's bucket: S3
// (s3://bucket/prefix, with the query parameters of
// gocloud.dev/blob/s3blob), Google Cloud Storage (gs://bucket/prefix,
// gcsblob's) or Azure Blob Storage (azblob://container/prefix,
// azureblob's).
type location struct {
	// local is the directory, absolute, for a path or file:// URL; ""
	// for object storage.
	local string
	// scheme, bucket, prefix and query are those of an object store's
	// URL (scheme "s3", "gs" or "azblob"); prefix has no leading or
	// trailing slash.
	scheme, bucket, prefix string
	// rawQuery is kept as given, so the location printed reads as the
	// one configured.
	rawQuery string
}

// parseLocation reads a path, file://path, s3://bucket/prefix?query or
// gs://bucket/prefix?query.
func parseLocation(s string) (location, error) {
	scheme, rest, ok := strings.Cut(s, "://")
	if !ok || strings.ContainsAny(scheme, "/\\") {
		scheme, rest = "", s
	}
	switch strings.ToLower(scheme) {
	case "", "file":
		if rest == "" {
			return location{}, fmt.Errorf("%w: %q has no path", ErrLocation, s)
		}
		abs, err := filepath.Abs(rest)
		if err != nil {
			return location{}, fmt.Errorf("%w: %q: %v", ErrLocation, s, err)
		}
		return location{local: abs}, nil
	case "s3", "gs", "azblob":
		u, err := url.Parse(s)
		if err != nil {
			return location{}, fmt.Errorf("%w: %v", ErrLocation, err)
		}
		if u.Host == "" {
			return location{}, fmt.Errorf("%w: %q names no bucket (want %s://bucket/prefix)", ErrLocation, s, u.Scheme)
		}
		return location{scheme: u.Scheme, bucket: u.Host, prefix: strings.Trim(path.Clean("/"+u.Path), "/"), rawQuery: u.RawQuery}, nil
	}
	return location{}, fmt.Errorf("%w: %q: scheme %s:// is not supported (a path, file://path, s3://bucket/prefix, gs://bucket/prefix or azblob://container/prefix)", ErrLocation, s, scheme)
}

// String is the location in the form parseLocation reads: an absolute path,
// or an object store's URL with its query.
func (l location) String() string {
	if l.local != "" {
		return l.local
	}
	u := url.URL{Scheme: l.scheme, Host: l.bucket, Path: "/" + l.prefix, RawQuery: l.rawQuery}
	if l.prefix == "" {
		u.Path = ""
	}
	return u.String()
}

func (l location) join(name string) location {
	if l.local != "" {
		l.local = filepath.Join(l.local, name)
		return l
	}
	l.prefix = strings.Trim(path.Join(l.prefix, name), "/")
	return l
}

// Join is location base with name appended as one more directory (or key
// prefix) level, in the form Open and Create read; query parameters of an
// object store's URL are kept. It is how `processor savepoint` names each new
// savepoint under SLUICE_SAVEPOINT_DIR.
func Join(base, name string) (string, error) {
	l, err := parseLocation(base)
	if err != nil {
		return "", err
	}
	return l.join(name).String(), nil
}

// CheckLocation reports whether location can be written to and read from,
// without writing or reading any file: it parses it and, for an object
// store, builds the bucket's client, which checks the query parameters and
// finds the credentials (the AWS configuration from the environment and
// shared files; Google's Application Default Credentials, which on GCP
// asks the metadata server), but reads and writes no object.
func CheckLocation(ctx context.Context, location string) error {
	l, err := parseLocation(location)
	if err != nil {
		return err
	}
	if l.local != "" {
		return nil
	}
	st, err := openStore(ctx, l)
	if err != nil {
		return err
	}
	return st.Close()
}
