//go:build unix

package kstate

import (
	"errors"
	"io"
	"os"
	"syscall"
	"time"

	berrors "go.etcd.io/bbolt/errors"
)

// mapFile maps f read-only for the page check: a page read is then a copy
// out of the page cache, not a system call (a pread each was two thirds of
// the check's time). The check reads below the size checkFile verified; a
// file cut shorter meanwhile faults, which checkPages turns into a panic
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

// fileIdentity is the device and inode of the file fi describes.
func fileIdentity(fi os.FileInfo) (dev, ino uint64, ok bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, 0, false
	}
	return uint64(st.Dev), st.Ino, true
}

// lockShared takes a shared lock on f, the file at path, as bbolt's
// read-only open does (flock, polled every 50 ms), or returns bbolt's
// ErrTimeout once timeout passed (0 waits for ever, as for bbolt). It
// lasts until unlock, or until f is closed.
func lockShared(_ string, f *os.File, timeout time.Duration) (unlock func(), err error) {
	deadline := time.Now().Add(timeout)
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_SH|syscall.LOCK_NB)
		switch {
		case err == nil:
			return func() { _ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN) }, nil
		case !errors.Is(err, syscall.EWOULDBLOCK):
			return nil, err
		case timeout > 0 && time.Now().After(deadline):
			return nil, berrors.ErrTimeout
		}
		time.Sleep(50 * time.Millisecond)
	}
}
