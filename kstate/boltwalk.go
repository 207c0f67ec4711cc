package kstate

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"io"
	"os"
	"runtime/debug"
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
	pageHeaderSize   = 16
	pageElementSize  = 16
	branchPageFlag   = 0x01
	leafPageFlag     = 0x02
	freelistPageFlag = 0x10
	bucketLeafFlag   = 0x01
	bucketHeader     = 16
)

// noFreelist is bbolt's freelist page id for "not synced".
const noFreelist = ^uint64(0)

type boltMetaPage struct{ pageSize, root, freelist, pgid, txid uint64 }

// boltMeta reads the meta page bbolt uses (DB.meta): of pages 0 and 1, the
// valid one with the higher transaction id. Each is a 16-byte page header,
// then magic, version, page size and flags (4 bytes each), the root bucket
// (root page, sequence), the freelist page, the high-water page id, the
// transaction id and an FNV-64a checksum of the fields before it (8 bytes
// each), little endian. Page 1 is where bbolt looks for it (getPageSize):
// at page 0's page size if page 0 is valid, else at each page size it
// supports.
func boltMeta(f *os.File) (boltMetaPage, bool) {
	const magic, version = 0xED0CDAED, 2
	read := func(off int64) (boltMetaPage, bool) {
		buf := make([]byte, 80)
		if _, err := f.ReadAt(buf, off); err != nil {
			return boltMetaPage{}, false
		}
		le := binary.LittleEndian
		h := fnv.New64a()
		h.Write(buf[16:72])
		if le.Uint32(buf[16:]) != magic || le.Uint32(buf[20:]) != version || le.Uint64(buf[72:]) != h.Sum64() {
			return boltMetaPage{}, false
		}
		m := boltMetaPage{pageSize: uint64(le.Uint32(buf[24:])), root: le.Uint64(buf[32:]), freelist: le.Uint64(buf[48:]), pgid: le.Uint64(buf[56:]), txid: le.Uint64(buf[64:])}
		return m, m.pageSize >= 1024 && m.pageSize&(m.pageSize-1) == 0
	}
	m0, ok0 := read(0)
	var m1 boltMetaPage
	ok1 := false
	if ok0 {
		m1, ok1 = read(int64(m0.pageSize))
	} else if fi, err := f.Stat(); err == nil {
		// bbolt's getPageSizeFromSecondMeta: page 1 at each page size
		// from 1 KiB to 16 MiB.
		for pos := int64(1024); pos <= 16<<20 && pos < fi.Size()-1024 && !ok1; pos <<= 1 {
			m1, ok1 = read(pos)
			ok1 = ok1 && int64(m1.pageSize) == pos
		}
	}
	switch {
	case ok0 && ok1:
		if m1.txid > m0.txid {
			return m1, true
		}
		return m0, true
	case ok1:
		return m1, true
	}
	return m0, ok0
}

// Bounds a legitimate bbolt file keeps, beyond which the walk refuses a
// page instead of reading or recursing on: bbolt's MaxKeySize; a bucket's
// value is its 16-byte header, or that and an inline page of at most a
// quarter page; trees are a few levels deep. A page's first 2 MiB (its
// header and up to 65,535 elements) is read at once, the rest of a large
// value's overflow pages only where a key or a bucket lies in it.
const (
	maxKeySize  = 32768
	maxDepth    = 128
	maxBuffered = 2 << 20
)

// pageWalker reads a bbolt file's tree page by page through ReadAt, so a
// damaged page is an error rather than a fault on the mapping or a panic
// in a goroutine of bbolt's (see checkFile). It checks what bbolt's
// freelist rebuild checks (tx_check.go's recursivelyCheckBucket) and what
// the cursors of bbolt's walk read, so that on a file it passes, that
// rebuild finds nothing: every reachable page is below the high-water
// mark, identifies as itself, is a branch (with elements) or a leaf, and
// is referenced once; its elements and keys lie within it; keys are in
// order within a page and within their parent's bounds; a bucket's header
// and inline page are whole.
type pageWalker struct {
	f        io.ReaderAt
	path     string
	pageSize uint64
	hwm      uint64   // the meta's high-water page id: pages are below it
	seen     []uint64 // bitset of page ids referenced so far
	bufs     [][]byte // a read buffer per depth of the tree
	// skip names a bucket of the root bucket whose tree is not walked
	// (nil: none); nested counts the buckets the walk is inside of.
	skip   []byte
	nested int
}

// verifyPages walks every bucket reachable from the meta's root bucket
// but skip's (nil: every bucket), then checks a synced freelist against
// the pages it reached: with skip, only the root bucket's and the other
// buckets' pages are read, which is what bbolt reads before a bucket's
// own tree.
func verifyPages(f io.ReaderAt, path string, m boltMetaPage, skip []byte) error {
	w := &pageWalker{f: f, path: path, pageSize: m.pageSize, hwm: m.pgid, seen: make([]uint64, (m.pgid+63)/64), skip: skip}
	if _, err := w.tree(m.root, nil, nil, 0); err != nil {
		return err
	}
	if m.freelist == noFreelist || skip != nil {
		return nil // bbolt's Open builds it as the pages not reached
	}
	// bbolt's Open reads a synced freelist as it is, and its next commits
	// would write over a page in use that it lists.
	overflow, err := freePages(f, path, m, func(id uint64) error {
		if w.reached(id) {
			return w.corrupt(id, "listed free by the freelist, but in the tree")
		}
		return nil
	})
	if err != nil {
		return err
	}
	for id := m.freelist; id <= m.freelist+overflow; id++ {
		if w.reached(id) {
			return w.corrupt(id, "a page of the freelist is in the tree too")
		}
	}
	return nil
}

// reached reports whether the walk read page id.
func (w *pageWalker) reached(id uint64) bool {
	return w.seen[id/64]&(1<<(id%64)) != 0
}

func (w *pageWalker) corrupt(id uint64, format string, args ...any) error {
	return fmt.Errorf("%w: %s: page %d: %s", ErrCorrupt, w.path, id, fmt.Sprintf(format, args...))
}

// span is a page and its overflow pages: size bytes, of which buf holds
// the first len(buf).
type span struct {
	w    *pageWalker
	id   uint64
	size uint64
	buf  []byte
}

// bytes returns the span's bytes [off, off+n): a slice of buf, or read.
func (s span) bytes(off, n uint64) ([]byte, error) {
	if off+n > s.size {
		return nil, s.w.corrupt(s.id, "%d bytes at %d past the page's %d", n, off, s.size)
	}
	if off+n <= uint64(len(s.buf)) {
		return s.buf[off : off+n], nil
	}
	b := make([]byte, n)
	if _, err := s.w.f.ReadAt(b, int64(s.id*s.w.pageSize+off)); err != nil {
		return nil, s.w.corrupt(s.id, "read: %v", err)
	}
	return b, nil
}

// key is element i's key: pos bytes after the element, ksize long.
func (s span) key(i, pos, ksize uint64) ([]byte, error) {
	if ksize > maxKeySize {
		return nil, s.w.corrupt(s.id, "key %d of %d bytes", i, ksize)
	}
	return s.bytes(pageHeaderSize+i*pageElementSize+pos, ksize)
}

// read reads page id, with as much of its overflow as maxBuffered, into
// the buffer of depth.
func (w *pageWalker) read(id uint64, depth int) (span, error) {
	if id < 2 || id >= w.hwm {
		return span{}, w.corrupt(id, "out of bounds (high-water mark %d)", w.hwm)
	}
	if depth >= maxDepth {
		return span{}, w.corrupt(id, "%d levels deep", depth)
	}
	for len(w.bufs) <= depth {
		w.bufs = append(w.bufs, make([]byte, w.pageSize))
	}
	buf := w.bufs[depth][:w.pageSize]
	if _, err := w.f.ReadAt(buf, int64(id*w.pageSize)); err != nil {
		return span{}, w.corrupt(id, "read: %v", err)
	}
	if got := binary.LittleEndian.Uint64(buf); got != id {
		return span{}, w.corrupt(id, "identifies as page %d", got)
	}
	overflow := uint64(binary.LittleEndian.Uint32(buf[12:]))
	if overflow >= w.hwm-id {
		return span{}, w.corrupt(id, "%d overflow pages past the high-water mark %d", overflow, w.hwm)
	}
	for i := id; i <= id+overflow; i++ {
		if w.seen[i/64]&(1<<(i%64)) != 0 {
			return span{}, w.corrupt(id, "page %d referenced twice", i)
		}
		w.seen[i/64] |= 1 << (i % 64)
	}
	s := span{w: w, id: id, size: (overflow + 1) * w.pageSize, buf: buf}
	if n := min(s.size, maxBuffered); n > w.pageSize {
		if uint64(cap(w.bufs[depth])) < n {
			w.bufs[depth] = append(make([]byte, 0, n), buf...)
		}
		s.buf = w.bufs[depth][:n]
		if _, err := w.f.ReadAt(s.buf[w.pageSize:], int64((id+1)*w.pageSize)); err != nil {
			return span{}, w.corrupt(id, "read overflow: %v", err)
		}
	}
	return s, nil
}

// tree checks the subtree rooted at page id, whose keys lie in [lo, hi)
// (nil: unbounded), and returns the largest key in it (a copy), as bbolt's
// recursivelyCheckPageKeyOrderInternal does.
func (w *pageWalker) tree(id uint64, lo, hi []byte, depth int) ([]byte, error) {
	s, err := w.read(id, depth)
	if err != nil {
		return nil, err
	}
	flags := binary.LittleEndian.Uint16(s.buf[8:])
	count := uint64(binary.LittleEndian.Uint16(s.buf[10:]))
	switch flags {
	case branchPageFlag:
		// bbolt never writes an empty branch, and its cursors read
		// element 0 of one whatever the count says.
		if count == 0 {
			return nil, w.corrupt(id, "a branch page without elements")
		}
		elems, err := s.bytes(pageHeaderSize, count*pageElementSize)
		if err != nil {
			return nil, err
		}
		// The keys are copied into one buffer no larger than the page:
		// a page's keys do not overlap.
		var sum uint64
		for i := range count {
			sum += uint64(binary.LittleEndian.Uint32(elems[i*pageElementSize+4:]))
		}
		if sum > s.size {
			return nil, w.corrupt(id, "keys of %d bytes in all on a %d-byte page", sum, s.size)
		}
		all := make([]byte, 0, sum)
		keys := make([][]byte, count)
		children := make([]uint64, count)
		for i := range count {
			e := elems[i*pageElementSize:]
			key, err := s.key(i, uint64(binary.LittleEndian.Uint32(e)), uint64(binary.LittleEndian.Uint32(e[4:])))
			if err != nil {
				return nil, err
			}
			all = append(all, key...)
			keys[i] = all[len(all)-len(key) : len(all) : len(all)]
			children[i] = binary.LittleEndian.Uint64(e[8:])
		}
		// The buffer of this depth is reused below: only the copies
		// are read from here on.
		var maxKey []byte
		running := lo
		for i := range count {
			if err := w.keyOrder(id, int(i), keys[i], running, hi); err != nil {
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
		return w.leaf(s, count, lo, hi, depth)
	default:
		return nil, w.corrupt(id, "flags %#x: not a branch or a leaf page", flags)
	}
}

// leaf checks a leaf page's elements, and the buckets it holds.
func (w *pageWalker) leaf(s span, count uint64, lo, hi []byte, depth int) ([]byte, error) {
	elems, err := s.bytes(pageHeaderSize, count*pageElementSize)
	if err != nil {
		return nil, err
	}
	running := lo
	for i := range count {
		e := elems[i*pageElementSize:]
		le := binary.LittleEndian
		eflags, pos, ksize, vsize := le.Uint32(e), uint64(le.Uint32(e[4:])), uint64(le.Uint32(e[8:])), uint64(le.Uint32(e[12:]))
		key, err := s.key(i, pos, ksize)
		if err != nil {
			return nil, err
		}
		at := pageHeaderSize + i*pageElementSize + pos
		if at+ksize+vsize > s.size {
			return nil, w.corrupt(s.id, "element %d past the page", i)
		}
		if err := w.keyOrder(s.id, int(i), key, running, hi); err != nil {
			return nil, err
		}
		running = key
		if eflags&bucketLeafFlag == 0 {
			if w.nested == 0 {
				// bbolt's root bucket holds buckets only; bbolt would
				// refuse this one as a value, an error the engine
				// cannot tell from any other.
				return nil, w.corrupt(s.id, "%q in the root bucket is not a bucket", key)
			}
			continue
		}
		if vsize < bucketHeader || vsize > w.pageSize {
			return nil, w.corrupt(s.id, "bucket %q: a %d-byte value", key, vsize)
		}
		value, err := s.bytes(at+ksize, vsize)
		if err != nil {
			return nil, err
		}
		if w.nested == 0 && w.skip != nil && bytes.Equal(key, w.skip) {
			continue
		}
		if root := binary.LittleEndian.Uint64(value); root != 0 {
			// Deeper buffers only: this page's stays intact.
			w.nested++
			_, err := w.tree(root, nil, nil, depth+1)
			w.nested--
			if err != nil {
				return nil, err
			}
			continue
		}
		inline := span{w: w, id: s.id, size: vsize - bucketHeader, buf: value[bucketHeader:]}
		if len(inline.buf) < pageHeaderSize || binary.LittleEndian.Uint16(inline.buf[8:]) != leafPageFlag {
			return nil, w.corrupt(s.id, "inline bucket %q: not a leaf page", key)
		}
		if depth+1 >= maxDepth {
			return nil, w.corrupt(s.id, "%d levels deep", depth+1)
		}
		w.nested++
		_, err = w.leaf(inline, uint64(binary.LittleEndian.Uint16(inline.buf[10:])), nil, nil, depth+1)
		w.nested--
		if err != nil {
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

// checkPages is verifyPages on the file at path, through a read-only map
// of its own. The caller keeps writers out (a lock on the file). A panic
// of the walk's own, which no damage should cause, refuses the file too:
// it is restored from the changelog, not trusted.
func checkPages(path string, m boltMetaPage, skip []byte) (err error) {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("kstate: open %s: %w", path, err)
	}
	defer f.Close()
	r, unmap, err := mapFile(f)
	if err != nil {
		return fmt.Errorf("kstate: open %s: %w", path, err)
	}
	defer unmap()
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %s: checking its pages: %v", ErrCorrupt, path, r)
		}
	}()
	return verifyPages(r, path, m, skip)
}

// checkFreelist checks the synced freelist page bbolt's Open will read
// (freelist.Read) where bbolt does not: its header, a count that fits its
// pages, and page ids in ascending order, each a page of the file other
// than the meta pages and the freelist's own, so that bbolt neither reads
// past the page nor allocates by a damaged count. Whether a listed page is
// really free is not checked: that takes the walk over every page that a
// synced freelist saves.
func checkFreelist(f io.ReaderAt, path string, m boltMetaPage) error {
	_, err := freePages(f, path, m, nil)
	return err
}

// freePages is checkFreelist that calls each (if not nil) with every page
// id the freelist lists, in order, and returns the count of its own
// overflow pages. The ids are read a chunk at a time.
func freePages(f io.ReaderAt, path string, m boltMetaPage, each func(uint64) error) (overflow uint64, err error) {
	w := &pageWalker{f: f, path: path, pageSize: m.pageSize, hwm: m.pgid}
	id := m.freelist
	if id < 2 || id >= m.pgid {
		return 0, w.corrupt(id, "the freelist is out of bounds (high-water mark %d)", m.pgid)
	}
	head := make([]byte, pageHeaderSize+8)
	if _, err := f.ReadAt(head, int64(id*m.pageSize)); err != nil {
		return 0, w.corrupt(id, "read the freelist: %v", err)
	}
	le := binary.LittleEndian
	overflow = uint64(le.Uint32(head[12:]))
	switch {
	case le.Uint64(head) != id:
		return 0, w.corrupt(id, "the freelist identifies as page %d", le.Uint64(head))
	case le.Uint16(head[8:]) != freelistPageFlag:
		return 0, w.corrupt(id, "flags %#x: not the freelist page", le.Uint16(head[8:]))
	case overflow >= m.pgid-id:
		return 0, w.corrupt(id, "the freelist's %d overflow pages pass the high-water mark %d", overflow, m.pgid)
	}
	// A count of 0xFFFF means the count is the first id's slot.
	first, count := uint64(0), uint64(le.Uint16(head[10:]))
	if count == 0xFFFF {
		first, count = 1, le.Uint64(head[pageHeaderSize:])
	}
	if count > (overflow+1)*m.pageSize/8 || pageHeaderSize+(first+count)*8 > (overflow+1)*m.pageSize {
		return 0, w.corrupt(id, "%d free page ids do not fit the freelist's %d pages", count, overflow+1)
	}
	// bbolt's commit frees the freelist's pages by this count: one too
	// large would free live pages. bbolt allocates the page by the count
	// of free pages before the allocation took its own from them
	// (EstimatedWritePageSize), so at most that many.
	if most := (pageHeaderSize+8*(count+(overflow+1)+1))/m.pageSize + 1; overflow+1 > most {
		return 0, w.corrupt(id, "the freelist's %d pages are more than %d ids need", overflow+1, count)
	}
	const chunk = 8192 // ids a read
	buf := make([]byte, min(count, chunk)*8)
	prev := uint64(1)
	for i := uint64(0); i < count; i += chunk {
		ids := buf[:min(count-i, chunk)*8]
		if _, err := f.ReadAt(ids, int64(id*m.pageSize+pageHeaderSize+(first+i)*8)); err != nil {
			return 0, w.corrupt(id, "read the freelist: %v", err)
		}
		for j := 0; j < len(ids); j += 8 {
			p := le.Uint64(ids[j:])
			switch {
			case p <= prev || p >= m.pgid:
				return 0, w.corrupt(id, "free page %d (after %d) out of order or bounds", p, prev)
			case p >= id && p <= id+overflow:
				return 0, w.corrupt(id, "the freelist lists its own page %d", p)
			}
			if each != nil {
				if err := each(p); err != nil {
					return 0, err
				}
			}
			prev = p
		}
	}
	return overflow, nil
}
