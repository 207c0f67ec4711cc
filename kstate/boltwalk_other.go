//go:build !unix

package kstate

import (
	"io"
	"os"
)

// mapFile reads through the file itself where mmap is not at hand.
func mapFile(f *os.File) (io.ReaderAt, func(), error) { return f, func() {}, nil }
