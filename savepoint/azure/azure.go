// Package azure lets package savepoint (and so the engine's
// Options.RestoreFrom and `processor savepoint`) read and write
// savepoints at azblob://container/prefix locations in Azure Blob
// Storage, through gocloud.dev/blob/azureblob. The URL's query parameters
// are azureblob's: storage_account, domain, protocol, cdn and localemu
// (Azurite). The account and credentials come from the environment as
// azureblob reads it: AZURE_STORAGE_ACCOUNT with AZURE_STORAGE_KEY (a
// shared key), AZURE_STORAGE_SAS_TOKEN, AZURE_STORAGE_CONNECTION_STRING,
// or else azidentity's DefaultAzureCredential (environment variables, a
// workload or managed identity, the Azure CLI's login), so AKS's Workload
// Identity works. Import it for its side effect:
//
//	import _ "github.com/sluicehq/sluice/savepoint/azure"
//
// The processor binary does. A program that does not import it gets an
// error that says so for an azblob:// location, and does not build the
// Azure SDK.
package azure

import (
	"context"
	"fmt"
	"net/url"

	"gocloud.dev/blob/azureblob"

	"github.com/sluicehq/sluice/savepoint/internal/blobstore"
	"github.com/sluicehq/sluice/savepoint/internal/objstore"
)

func init() { objstore.Register("azblob", open) }

func open(ctx context.Context, l objstore.Location) (objstore.Store, error) {
	// azureblob's default opener, built here rather than through its
	// URL mux, so that the environment is read at each open.
	o := &azureblob.URLOpener{MakeClient: azureblob.NewDefaultClient, ServiceURLOptions: *azureblob.NewDefaultServiceURLOptions()}
	// The bucket is opened without the prefix, so the query parameters
	// are all azureblob's, and the prefix is applied by PrefixedBucket.
	b, err := o.OpenBucketURL(ctx, &url.URL{Scheme: "azblob", Host: l.Bucket, RawQuery: l.RawQuery})
	if err != nil {
		if o.ServiceURLOptions.AccountName == "" {
			return nil, fmt.Errorf("%w (set AZURE_STORAGE_ACCOUNT, or the storage_account query parameter)", err)
		}
		return nil, err
	}
	return blobstore.New(b, l), nil
}
