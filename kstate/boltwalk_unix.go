//go:build unix

package kstate

import (
	"io"
	"os"
	"syscall"
)

// mapFile maps f read-only for the page check: a page read is then a copy
// out of the page cache, not a system call (a pread each was two thirds of
// the check's time). The check reads below the size checkFile verified; a
// file cut shorter meanwhile faults, which readEveryPage turns into a panic
// it recovers.
func mapFile(f *os.File) (io.ReaderAt, func(), error) {
	fi, err := f.Stat()
	if err != nil {
		return nil, nil, err
	}
	if fi.Size() == 0 || int64(int(fi.Size())) != fi.Size() {
		return f, func() {}, nil
	}
	b, err := syscall.Mmap(int(f.Fd()), 0, int(fi.Size()), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return f, func() {}, nil // reads through the file instead
	}
	return mapped(b), func() { syscall.Munmap(b) }, nil
}

type mapped []byte

func (m mapped) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 || off >= int64(len(m)) {
		return 0, io.EOF
	}
	n := copy(p, m[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}
