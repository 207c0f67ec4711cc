// Package savepoint owns the savepoint format: a portable, backend-neutral
// copy of an application's state as of each task's last committed epoch,
// owned by the user rather than by Kafka.
//
// A savepoint is a directory (or an object store's key prefix) holding one data file
// per task (task-NNNN.data) and a manifest (manifest.json) that describes
// them. The manifest is written last, atomically, so a location without one
// is an incomplete savepoint and Open refuses it. docs/savepoints.md
// specifies the bytes, for tools that read savepoints without this package.
//
// A location is a path, a file://path (both through the os package, every
// file fsynced), s3://bucket/prefix with the query parameters of
// gocloud.dev/blob/s3blob (endpoint, region, use_path_style, ...;
// credentials from the AWS SDK's default chain), gs://bucket/prefix in
// Google Cloud Storage (gcsblob's parameters; Application Default
// Credentials), or azblob://container/prefix in Azure Blob Storage
// (azureblob's parameters; the account and credentials from AZURE_STORAGE_*
// or DefaultAzureCredential). Each object store needs its driver, imported
// for its side effect:
//
//	import _ "github.com/sluicehq/sluice/savepoint/s3"    // s3://
//	import _ "github.com/sluicehq/sluice/savepoint/gcs"   // gs://
//	import _ "github.com/sluicehq/sluice/savepoint/azure" // azblob://
//
// Without it they fail with ErrLocation and a message that names it; this
// package imports neither, so that a program with no use for them (the
// engine's, which imports this one) is not built with their SDKs.
//
// Writing, one task at a time so that memory stays bounded by the largest
// entry, not by the state; each data file is streamed to its file or upload
// with its SHA-256 taken on the way:
//
//	w, err := savepoint.Create(ctx, location, savepoint.Manifest{AppID: app, ...})
//	for each task {
//		_, err = w.WriteTask(ctx, savepoint.Cut{Partition: p, Epoch: e, ...}, backend)
//	}
//	_, err = w.Commit(ctx) // the manifest: only now is the savepoint complete
//	// on any error instead: w.Abort(ctx) removes what was written
//
// Reading:
//
//	sp, err := savepoint.Open(ctx, location)
//	defer sp.Close()
//	err = sp.Verify(ctx) // sizes and SHA-256 of every data file
//	for _, t := range sp.Manifest.Tasks {
//		err = sp.Scan(ctx, t, func(k, v []byte) error { ... })
//	}
package savepoint
