//go:build !unix

package kstate

import (
	"io"
	"os"
	"time"
)

// mapFile reads through the file itself where mmap is not at hand.
func mapFile(f *os.File) (io.ReaderAt, func(), error) { return f, func() {}, nil }

// fileIdentity is unknown here: every open after a crash reads the pages.
func fileIdentity(os.FileInfo) (dev, ino uint64, ok bool) { return 0, 0, false }

// lockShared does nothing where flock is not at hand.
func lockShared(*os.File, time.Duration) error { return nil }
