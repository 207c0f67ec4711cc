//go:build !noazure

package main

// azblob:// savepoint locations (SLUICE_SAVEPOINT_DIR, SLUICE_RESTORE_FROM),
// Azure Blob Storage. `go build -tags noazure` leaves its SDK out
// (docs/savepoints.md, "Storage").
import _ "github.com/sluicehq/sluice/savepoint/azure"
