//go:build !nogcs

package main

// gs:// savepoint locations (SLUICE_SAVEPOINT_DIR, SLUICE_RESTORE_FROM).
// The Google Cloud Storage client makes the binary some 22 MB larger
// (stripped) and its start some 20 MB larger in resident memory (pages of
// the binary touched by its packages' init); `go build -tags nogcs` leaves it out
// (docs/savepoints.md, "Storage").
import _ "github.com/sluicehq/sluice/savepoint/gcs"
