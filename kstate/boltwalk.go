package kstate

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"time"

	bolt "go.etcd.io/bbolt"
)

// bbolt's on-disk page format (go.etcd.io/bbolt/internal/common), little
// endian as on every platform Sluice runs on:
//
//	page header, 16 bytes: id u64, flags u16, count u16, overflow u32
//	branch element, 16 bytes: pos u32, ksize u32, child page id u64
//	leaf element, 16 bytes: flags u32, pos u32, ksize u32, vsize u32
//
// An element's key starts pos bytes after the element itself; a leaf
// value follows its key. A leaf element with the bucket flag is a bucket:
// its value is the bucket's root page id and sequence (u64 each), and for
// an inline bucket (root 0) its one leaf page follows in the value.
const (
	pageHeaderSize  = 16
	pageElementSize = 16
	branchPageFlag  = 0x01
	leafPageFlag    = 0x02
	bucketLeafFlag  = 0x01
	bucketHeader    = 16
)

// pageWalker reads a bbolt file's tree page by page through ReadAt, so a
// damaged page is an error rather than a fault on the mapping or a panic
// in a goroutine of bbolt's (see checkFile). It checks what bbolt's
// freelist rebuild checks (tx_check.go's recursivelyCheckBucket), so that
// on a file it passes, that rebuild finds nothing: every reachable page is
// below the high-water mark, identifies as itself, is a branch or a leaf,
// and is referenced once; its elements and keys lie within it; keys are in
// order within a page and within their parent's bounds.
type pageWalker struct {
	f        io.ReaderAt
	path     string
	pageSize uint64
	hwm      uint64   // the meta's high-water page id: pages are below it
	seen     []uint64 // bitset of page ids referenced so far
	bufs     [][]byte // a read buffer per depth of the tree
}

// verifyPages walks every bucket reachable from the meta's root bucket.
func verifyPages(f io.ReaderAt, path string, m boltMetaPage) error {
	w := &pageWalker{f: f, path: path, pageSize: m.pageSize, hwm: m.pgid, seen: make([]uint64, (m.pgid+63)/64)}
	_, err := w.tree(m.root, nil, nil, 0)
	return err
}

func (w *pageWalker) corrupt(id uint64, format string, args ...any) error {
	return fmt.Errorf("%w: %s: page %d: %s", ErrCorrupt, w.path, id, fmt.Sprintf(format, args...))
}

// read returns page id with its overflow pages, in the buffer of depth.
func (w *pageWalker) read(id uint64, depth int) ([]byte, error) {
	if id < 2 || id >= w.hwm {
		return nil, w.corrupt(id, "out of bounds (high-water mark %d)", w.hwm)
	}
	for len(w.bufs) <= depth {
		w.bufs = append(w.bufs, make([]byte, w.pageSize))
	}
	buf := w.bufs[depth][:w.pageSize]
	if _, err := w.f.ReadAt(buf, int64(id*w.pageSize)); err != nil {
		return nil, w.corrupt(id, "read: %v", err)
	}
	if got := binary.LittleEndian.Uint64(buf); got != id {
		return nil, w.corrupt(id, "identifies as page %d", got)
	}
	overflow := uint64(binary.LittleEndian.Uint32(buf[12:]))
	if overflow >= w.hwm-id {
		return nil, w.corrupt(id, "%d overflow pages past the high-water mark %d", overflow, w.hwm)
	}
	for i := id; i <= id+overflow; i++ {
		if w.seen[i/64]&(1<<(i%64)) != 0 {
			return nil, w.corrupt(id, "page %d referenced twice", i)
		}
		w.seen[i/64] |= 1 << (i % 64)
	}
	if overflow > 0 {
		size := (overflow + 1) * w.pageSize
		if uint64(cap(w.bufs[depth])) < size {
			w.bufs[depth] = append(make([]byte, 0, size), buf...)
		}
		buf = w.bufs[depth][:size]
		if _, err := w.f.ReadAt(buf[w.pageSize:], int64((id+1)*w.pageSize)); err != nil {
			return nil, w.corrupt(id, "read overflow: %v", err)
		}
	}
	return buf, nil
}

// tree checks the subtree rooted at page id, whose keys lie in [lo, hi)
// (nil: unbounded), and returns the largest key in it (a copy), as bbolt's
// recursivelyCheckPageKeyOrderInternal does.
func (w *pageWalker) tree(id uint64, lo, hi []byte, depth int) ([]byte, error) {
	buf, err := w.read(id, depth)
	if err != nil {
		return nil, err
	}
	flags := binary.LittleEndian.Uint16(buf[8:])
	count := int(binary.LittleEndian.Uint16(buf[10:]))
	switch flags {
	case branchPageFlag:
		if pageHeaderSize+count*pageElementSize > len(buf) {
			return nil, w.corrupt(id, "%d elements do not fit", count)
		}
		keys := make([][]byte, count)
		children := make([]uint64, count)
		for i := range count {
			at := pageHeaderSize + i*pageElementSize
			pos, ksize := binary.LittleEndian.Uint32(buf[at:]), binary.LittleEndian.Uint32(buf[at+4:])
			start, end := uint64(at)+uint64(pos), uint64(at)+uint64(pos)+uint64(ksize)
			if end > uint64(len(buf)) {
				return nil, w.corrupt(id, "key %d past the page", i)
			}
			keys[i] = bytes.Clone(buf[start:end])
			children[i] = binary.LittleEndian.Uint64(buf[at+8:])
		}
		// The buffer of this depth is reused below: only the copies
		// are read from here on.
		var maxKey []byte
		running := lo
		for i := range count {
			if err := w.keyOrder(id, i, keys[i], running, hi); err != nil {
				return nil, err
			}
			next := hi
			if i < count-1 {
				next = keys[i+1]
			}
			if maxKey, err = w.tree(children[i], keys[i], next, depth+1); err != nil {
				return nil, err
			}
			running = maxKey
		}
		return maxKey, nil
	case leafPageFlag:
		return w.leaf(id, buf, count, lo, hi, depth)
	default:
		return nil, w.corrupt(id, "flags %#x: not a branch or a leaf page", flags)
	}
}

// leaf checks a leaf page's elements, and the buckets it holds.
func (w *pageWalker) leaf(id uint64, buf []byte, count int, lo, hi []byte, depth int) ([]byte, error) {
	if pageHeaderSize+count*pageElementSize > len(buf) {
		return nil, w.corrupt(id, "%d elements do not fit", count)
	}
	running := lo
	for i := range count {
		at := pageHeaderSize + i*pageElementSize
		le := binary.LittleEndian
		eflags, pos, ksize, vsize := le.Uint32(buf[at:]), le.Uint32(buf[at+4:]), le.Uint32(buf[at+8:]), le.Uint32(buf[at+12:])
		start := uint64(at) + uint64(pos)
		kend, vend := start+uint64(ksize), start+uint64(ksize)+uint64(vsize)
		if vend > uint64(len(buf)) {
			return nil, w.corrupt(id, "element %d past the page", i)
		}
		key := buf[start:kend]
		if err := w.keyOrder(id, i, key, running, hi); err != nil {
			return nil, err
		}
		running = key
		if eflags&bucketLeafFlag == 0 {
			continue
		}
		value := buf[kend:vend]
		if len(value) < bucketHeader {
			return nil, w.corrupt(id, "bucket %q: %d-byte header", key, len(value))
		}
		if root := binary.LittleEndian.Uint64(value); root != 0 {
			// Deeper buffers only: this page's stays intact.
			if _, err := w.tree(root, nil, nil, depth+1); err != nil {
				return nil, err
			}
			continue
		}
		inline := value[bucketHeader:]
		if len(inline) < pageHeaderSize || binary.LittleEndian.Uint16(inline[8:]) != leafPageFlag {
			return nil, w.corrupt(id, "inline bucket %q: not a leaf page", key)
		}
		if _, err := w.leaf(id, inline, int(binary.LittleEndian.Uint16(inline[10:])), nil, nil, depth+1); err != nil {
			return nil, err
		}
	}
	if count == 0 {
		return nil, nil
	}
	return bytes.Clone(running), nil
}

// keyOrder is bbolt's verifyKeyOrder: element i's key is >= the ancestor's
// bound (the first) or > the previous key (the others), and < hi.
func (w *pageWalker) keyOrder(id uint64, i int, key, prev, hi []byte) error {
	switch c := bytes.Compare(prev, key); {
	case i == 0 && prev != nil && c > 0:
		return w.corrupt(id, "first key below its parent's")
	case i > 0 && c >= 0:
		return w.corrupt(id, "key %d not above the one before it", i)
	}
	if hi != nil && bytes.Compare(key, hi) >= 0 {
		return w.corrupt(id, "key %d not below the next key of its parent", i)
	}
	return nil
}

// readEveryPage is verifyPages on the file at path under bbolt's shared
// lock (an instance that still has the file open makes it ErrLocked).
func readEveryPage(path string, m boltMetaPage, lockTimeout time.Duration) error {
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: lockTimeout})
	if err != nil {
		return openErr(path, lockTimeout, err)
	}
	defer db.Close()
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("kstate: open %s: %w", path, err)
	}
	defer f.Close()
	return verifyPages(f, path, m)
}
