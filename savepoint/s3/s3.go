// Package s3 lets package savepoint (and so the engine's
// Options.RestoreFrom and `processor savepoint`) read and write
// savepoints at s3://bucket/prefix locations, through
// gocloud.dev/blob/s3blob: the URL's query parameters are s3blob's
// (endpoint, region, use_path_style, ...), and credentials come from the
// AWS SDK's default chain. Import it for its side effect:
//
//	import _ "github.com/sluicehq/sluice/savepoint/s3"
//
// The processor binary does. A program that does not import it gets an
// error that says so for an s3:// location, and does not build the AWS
// SDK.
package s3

import (
	"context"
	"net/url"

	"gocloud.dev/blob/s3blob"

	"github.com/sluicehq/sluice/savepoint/internal/blobstore"
	"github.com/sluicehq/sluice/savepoint/internal/objstore"
)

func init() { objstore.Register("s3", open) }

func open(ctx context.Context, l objstore.Location) (objstore.Store, error) {
	// The bucket is opened without the prefix, so the query parameters
	// are all s3blob's, and the prefix is applied by PrefixedBucket.
	u := "s3://" + l.Bucket
	if l.RawQuery != "" {
		u += "?" + l.RawQuery
	}
	bu, err := url.Parse(u)
	if err != nil {
		return nil, err
	}
	b, err := (&s3blob.URLOpener{}).OpenBucketURL(ctx, bu)
	if err != nil {
		return nil, err
	}
	return blobstore.New(b, l), nil
}
