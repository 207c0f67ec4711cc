//go:build !nogcs

package main

// gcsBuilt says whether this build has the gs:// driver (gcs.go).
const gcsBuilt = true
