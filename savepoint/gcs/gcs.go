// Package gcs lets package savepoint (and so the engine's
// Options.RestoreFrom and `processor savepoint`) read and write
// savepoints at gs://bucket/prefix locations in Google Cloud Storage,
// through gocloud.dev/blob/gcsblob's JSON API client. The URL's query
// parameters are gcsblob's: anonymous=true (or access_id=-) for a public
// bucket, universe_domain; credentials otherwise come from Application
// Default Credentials (GOOGLE_APPLICATION_CREDENTIALS, gcloud's, or the
// metadata server on GCP, so GKE's Workload Identity). With
// STORAGE_EMULATOR_HOST=host:port set, it talks to that emulator,
// unauthenticated.
// Import it for its side effect:
//
//	import _ "github.com/sluicehq/sluice/savepoint/gcs"
//
// The processor binary does. A program that does not import it gets an
// error that says so for a gs:// location, and does not build the Google
// Cloud client.
package gcs

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"

	"gocloud.dev/blob/gcsblob"
	"gocloud.dev/gcp"
	"golang.org/x/oauth2/google"
	"google.golang.org/api/option"

	"github.com/sluicehq/sluice/savepoint/internal/blobstore"
	"github.com/sluicehq/sluice/savepoint/internal/objstore"
)

func init() { objstore.Register("gs", open) }

// params are the query parameters this driver takes: gcsblob's, less
// grpc and zonal.
var params = map[string]bool{"access_id": true, "private_key_path": true, "anonymous": true, "universe_domain": true}

func open(ctx context.Context, l objstore.Location) (objstore.Store, error) {
	q, err := url.ParseQuery(l.RawQuery)
	if err != nil {
		return nil, err
	}
	// The parameters first, so that a typo is not reported as missing
	// credentials. gcsblob's grpc and zonal build a gRPC client, which
	// this driver does not give credentials to.
	for k := range q {
		switch {
		case k == "grpc" || k == "zonal":
			return nil, fmt.Errorf("query parameter %q is not supported here (savepoints use the JSON API)", k)
		case !params[k]:
			return nil, fmt.Errorf("invalid query parameter %q (gs:// takes anonymous, access_id, private_key_path, universe_domain)", k)
		}
	}
	anonymous := q.Get("access_id") == "-"
	if a := q.Get("anonymous"); a != "" {
		v, err := strconv.ParseBool(a)
		if err != nil {
			return nil, fmt.Errorf("query parameter \"anonymous\": %w", err)
		}
		anonymous = anonymous || v
	}
	emulator := os.Getenv("STORAGE_EMULATOR_HOST")
	if strings.Contains(emulator, "://") {
		return nil, fmt.Errorf("STORAGE_EMULATOR_HOST=%q: want host:port, without a scheme", emulator)
	}
	// gcsblob's own default opener prints to stdout and goes on when it
	// finds no credentials; this one says so, once, where the location is
	// checked (SLUICE_SAVEPOINT_DIR at the processor's start).
	var client *gcp.HTTPClient
	ud := q.Get("universe_domain")
	switch {
	case anonymous:
		// gcsblob builds an unauthenticated client for these parameters.
	case emulator != "":
		client = gcp.NewAnonymousHTTPClient(gcp.DefaultTransport())
	default:
		// The credentials refresh their tokens with this context for as
		// long as the store is open: not the caller's, which may end
		// sooner.
		cctx := context.WithoutCancel(ctx)
		var creds *google.Credentials
		if ud != "" {
			creds, err = gcp.DefaultCredentialsWithParams(cctx, google.CredentialsParams{UniverseDomain: ud})
		} else {
			creds, err = gcp.DefaultCredentials(cctx)
		}
		if err != nil {
			return nil, fmt.Errorf("no Google Cloud credentials (Application Default Credentials; anonymous=true for a public bucket): %w", err)
		}
		if ud == "" {
			// A key file of another universe names it, as Google's own
			// clients read it.
			if cud, err := creds.GetUniverseDomain(); err == nil && cud != "googleapis.com" {
				ud = cud
			}
		}
		if client, err = gcp.NewHTTPClient(gcp.DefaultTransport(), gcp.CredentialsTokenSource(creds)); err != nil {
			return nil, err
		}
	}
	var opts gcsblob.Options
	if ud != "" {
		opts.ClientOptions = []option.ClientOption{option.WithUniverseDomain(ud)}
	}
	b, err := (&gcsblob.URLOpener{Client: client, Options: opts}).OpenBucketURL(ctx, &url.URL{Scheme: "gs", Host: l.Bucket, RawQuery: l.RawQuery})
	if err != nil {
		return nil, err
	}
	return blobstore.New(b, l), nil
}
