package kstate

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// writeFile makes a closed bbolt store with some entries and returns its
// path.
func writeFile(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "task-0000.db")
	b, err := OpenBolt(path)
	if err != nil {
		t.Fatal(err)
	}
	var muts []Mutation
	for i := range 2000 {
		muts = append(muts, Mutation{Key: EncodeKey(KindKeyed, "s", []byte{byte(i >> 8), byte(i)}, nil), Value: make([]byte, 100)})
	}
	if err := b.Apply(muts, Meta{Epoch: 3, ChangelogOffset: 10, Offsets: map[string]int64{"in": 7}}); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

// Damaged files are refused at open with ErrCorrupt, so the engine can move
// them aside and restore from the changelog instead of using them (or
// crashing on them).
func TestBoltDetectsDamage(t *testing.T) {
	page := int64(os.Getpagesize())
	tests := []struct {
		name   string
		damage func(t *testing.T, path string)
	}{
		{"truncated mid-page", func(t *testing.T, path string) {
			fi, _ := os.Stat(path)
			if err := os.Truncate(path, fi.Size()-page/2); err != nil {
				t.Fatal(err)
			}
		}},
		{"truncated to whole pages", func(t *testing.T, path string) {
			// Half the pages in use: the file grows in steps of
			// AllocSize beyond them (initialMmapSize), so half the
			// file may be all of them.
			m, err := checkFile(path)
			if err != nil || m == nil {
				t.Fatalf("the file before the damage: %v, %v", m, err)
			}
			if err := os.Truncate(path, int64(m.pgid/2*m.pageSize)); err != nil {
				t.Fatal(err)
			}
		}},
		{"meta pages overwritten", func(t *testing.T, path string) {
			f, err := os.OpenFile(path, os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if _, err := f.WriteAt(make([]byte, 2*page), 0); err != nil {
				t.Fatal(err)
			}
		}},
		{"meta value changed", func(t *testing.T, path string) {
			db, err := bolt.Open(path, 0o600, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			err = db.Update(func(tx *bolt.Tx) error {
				mb := tx.Bucket(metaBucket)
				raw := append([]byte{}, mb.Get(metaKey)...)
				raw[3] ^= 0x40
				return mb.Put(metaKey, raw)
			})
			if err != nil {
				t.Fatal(err)
			}
		}},
		// bbolt's default options sync the freelist: the open does
		// not walk the pages, Tx.Check does.
		{"root page junk, not closed cleanly, freelist synced", func(t *testing.T, path string) {
			patchAfterCrash(t, path, nil, junkPage)
		}},
		// The rest as Sluice's own commits leave a file: bbolt's open
		// would rebuild the freelist, in a goroutine where each of these
		// took the process down (a fault, a nil pointer, a panic).
		{"root page junk, not closed cleanly, freelist not synced", func(t *testing.T, path string) {
			patchAfterCrash(t, path, unsynced, junkPage)
		}},
		{"two equal keys in a leaf, freelist not synced", func(t *testing.T, path string) {
			patchAfterCrash(t, path, unsynced, func(t *testing.T, pg *rawPage) {
				leaf := pg.read(t, pg.child(t, pg.read(t, pg.root), 0))
				copy(leaf.key(t, 1), leaf.key(t, 0))
				leaf.write(t)
			})
		}},
		{"a leaf key's offset far past the page, freelist not synced", func(t *testing.T, path string) {
			patchAfterCrash(t, path, unsynced, func(t *testing.T, pg *rawPage) {
				leaf := pg.read(t, pg.child(t, pg.read(t, pg.root), 0))
				binary.LittleEndian.PutUint32(leaf.b[pageHeaderSize+4:], 0x7FFFFF00)
				leaf.write(t)
			})
		}},
		{"a branch child past the high-water mark, freelist not synced", func(t *testing.T, path string) {
			patchAfterCrash(t, path, unsynced, func(t *testing.T, pg *rawPage) {
				root := pg.read(t, pg.root)
				binary.LittleEndian.PutUint64(root.b[pageHeaderSize+8:], 1<<40)
				root.write(t)
			})
		}},
		{"a branch page without elements, freelist not synced", func(t *testing.T, path string) {
			patchAfterCrash(t, path, unsynced, func(t *testing.T, pg *rawPage) {
				root := pg.read(t, pg.root)
				binary.LittleEndian.PutUint64(root.b[pageHeaderSize+8:], 1<<40) // what bbolt's cursor would read
				binary.LittleEndian.PutUint16(root.b[10:], 0)
				root.write(t)
			})
		}},
		// A clean close synced the freelist, which bbolt's open reads:
		// a damaged one made it allocate by a junk count.
		{"the freelist page junk after a clean close", func(t *testing.T, path string) {
			m, err := checkFile(path)
			if err != nil || m.freelist == noFreelist {
				t.Fatalf("meta %+v, %v: want a synced freelist", m, err)
			}
			f, err := os.OpenFile(path, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			pg := (&rawPage{f: f}).read(t, m.freelist)
			binary.LittleEndian.PutUint16(pg.b[10:], 0xFFFF)
			binary.LittleEndian.PutUint64(pg.b[pageHeaderSize:], 1<<36)
			pg.write(t)
		}},
		// bbolt's next commit frees the freelist's pages by its
		// overflow count: live pages, had it passed.
		{"the freelist page's overflow too large after a clean close", func(t *testing.T, path string) {
			// A second open and clean close puts the freelist among
			// the file's first pages, with live pages after it.
			b, err := OpenBolt(path)
			if err != nil {
				t.Fatal(err)
			}
			muts := []Mutation{{Key: EncodeKey(KindKeyed, "s", []byte{0, 1}, nil), Value: make([]byte, 50)}}
			if err := b.Apply(muts, Meta{Epoch: 4, ChangelogOffset: 11, Offsets: map[string]int64{"in": 8}}); err != nil {
				t.Fatal(err)
			}
			if err := b.Close(); err != nil {
				t.Fatal(err)
			}
			m, err := checkFile(path)
			if err != nil || m.freelist == noFreelist || m.freelist+2 >= m.pgid {
				t.Fatalf("meta %+v, %v: want a synced freelist with pages after it", m, err)
			}
			f, err := os.OpenFile(path, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			pg := (&rawPage{f: f}).read(t, m.freelist)
			binary.LittleEndian.PutUint32(pg.b[12:], uint32(m.pgid-m.freelist-2))
			pg.write(t)
		}},
		// The root bucket's page is read by the open's transaction
		// before it can tell whether to check the file: an element's
		// offset past the page faulted there, past any recover, at
		// every start.
		{"the root bucket page's element past the page, after a crash on this boot", func(t *testing.T, path string) {
			b, err := openBolt(path, DefaultLockTimeout)
			if err != nil {
				t.Fatal(err)
			}
			crash(t, b)
			patchRootElement(t, path, 4, 0x7FFFFF00) // its pos, far past the page
		}},
		{"the root bucket page's element past the page, after a clean close", func(t *testing.T, path string) {
			patchRootElement(t, path, 4, 0x7FFFFF00) // its pos, far past the page
		}},
		// bbolt would refuse the bucket with an error of its own
		// (incompatible value), not ErrCorrupt: the task would fail at
		// every start instead of being restored.
		{"a root bucket element without its bucket flag, after a clean close", func(t *testing.T, path string) {
			patchRootElement(t, path, 0, 0) // its flags
		}},
		{"a page referenced twice, freelist not synced", func(t *testing.T, path string) {
			patchAfterCrash(t, path, unsynced, func(t *testing.T, pg *rawPage) {
				root := pg.read(t, pg.root)
				binary.LittleEndian.PutUint64(root.b[pageHeaderSize+pageElementSize+8:], pg.child(t, root, 0))
				root.write(t)
			})
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := writeFile(t)
			tt.damage(t, path)
			b, err := OpenBolt(path)
			if err == nil {
				b.Close()
			}
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("open of a damaged file: %v, want ErrCorrupt", err)
			}
		})
	}
}

var unsynced = &bolt.Options{NoFreelistSync: true}

// patchRootElement sets the 32-bit field at offset at (0 flags, 4 pos)
// of the root bucket page's first element to v.
func patchRootElement(t *testing.T, path string, at int, v uint32) {
	t.Helper()
	patchFile(t, path, nil, nil, func(t *testing.T, pg *rawPage) {
		m, err := checkFile(path)
		if err != nil {
			t.Fatal(err)
		}
		root := pg.read(t, m.root)
		binary.LittleEndian.PutUint32(root.b[pageHeaderSize+at:], v)
		root.write(t)
	})
}

// rawPage is a page of a bbolt file read and written as bytes.
type rawPage struct {
	f    *os.File
	id   uint64
	b    []byte
	root uint64 // the state bucket's root page
}

func (pg *rawPage) read(t *testing.T, id uint64) *rawPage {
	t.Helper()
	b := make([]byte, os.Getpagesize())
	if _, err := pg.f.ReadAt(b, int64(id)*int64(len(b))); err != nil {
		t.Fatal(err)
	}
	return &rawPage{f: pg.f, id: id, b: b, root: pg.root}
}

func (pg *rawPage) write(t *testing.T) {
	t.Helper()
	if _, err := pg.f.WriteAt(pg.b, int64(pg.id)*int64(len(pg.b))); err != nil {
		t.Fatal(err)
	}
}

// child is branch page p's element i's page id.
func (pg *rawPage) child(t *testing.T, p *rawPage, i int) uint64 {
	t.Helper()
	if binary.LittleEndian.Uint16(p.b[8:]) != branchPageFlag {
		t.Fatalf("page %d is not a branch page: make the test's state bigger", p.id)
	}
	return binary.LittleEndian.Uint64(p.b[pageHeaderSize+i*pageElementSize+8:])
}

// key is leaf page pg's element i's key, in place.
func (pg *rawPage) key(t *testing.T, i int) []byte {
	t.Helper()
	if binary.LittleEndian.Uint16(pg.b[8:]) != leafPageFlag {
		t.Fatalf("page %d is not a leaf page", pg.id)
	}
	at := pageHeaderSize + i*pageElementSize
	pos, ksize := int(binary.LittleEndian.Uint32(pg.b[at+4:])), int(binary.LittleEndian.Uint32(pg.b[at+8:]))
	return pg.b[at+pos : at+pos+ksize]
}

func junkPage(t *testing.T, pg *rawPage) {
	p := pg.read(t, pg.root)
	for i := range p.b {
		p.b[i] = 0xA5
	}
	p.write(t)
}

// patchAfterCrash makes the file look as after the machine went down (no
// clean mark, written on another boot), committing that with opts, then
// lets patch damage its pages.
func patchAfterCrash(t *testing.T, path string, opts *bolt.Options, patch func(*testing.T, *rawPage)) {
	t.Helper()
	patchFile(t, path, opts, func(mb *bolt.Bucket) error {
		if err := mb.Put(bootKey, []byte("a boot before")); err != nil {
			return err
		}
		return mb.Delete(cleanKey)
	}, patch)
}

// patchFile edits the meta bucket with edit, committing that with opts
// (with no edit, it only reads), then lets patch damage the file's pages.
func patchFile(t *testing.T, path string, opts *bolt.Options, edit func(mb *bolt.Bucket) error, patch func(*testing.T, *rawPage)) {
	t.Helper()
	run := (*bolt.DB).Update
	if edit == nil {
		opts, run = &bolt.Options{ReadOnly: true}, (*bolt.DB).View
	}
	db, err := bolt.Open(path, 0o600, opts)
	if err != nil {
		t.Fatal(err)
	}
	var root uint64
	err = run(db, func(tx *bolt.Tx) error {
		root = uint64(tx.Bucket(stateBucket).Root())
		if edit == nil {
			return nil
		}
		return edit(tx.Bucket(metaBucket))
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	patch(t, &rawPage{f: f, root: root})
}

// A file closed cleanly opens without the full check and keeps its data.
func TestBoltCleanReopen(t *testing.T) {
	path := writeFile(t)
	b, err := OpenBolt(path)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	m, err := b.Meta()
	if err != nil || m.Epoch != 3 || b.Stats().Keys != 2000 {
		t.Fatalf("meta %+v, %d keys, %v", m, b.Stats().Keys, err)
	}
}

// Every commit writes the freelist, so an open reads it instead of
// walking every page, except ApplyBulk's: a crash after one leaves a file
// whose open rebuilds it (and checks every page doing so), and the next
// Apply writes it again. Through the whole cycle the data stays and
// bbolt's own check finds nothing.
func TestBoltFreelistSyncedButByApplyBulk(t *testing.T) {
	path := writeFile(t)
	if synced, err := freelistSynced(path); err != nil || !synced {
		t.Fatalf("after a clean close: freelist synced %v, %v", synced, err)
	}
	b, err := openBolt(path, DefaultLockTimeout)
	if err != nil {
		t.Fatal(err)
	}
	if synced, err := freelistSynced(path); err != nil || !synced {
		t.Fatalf("once opened: freelist synced %v, %v", synced, err)
	}
	key := func(s string) []byte { return EncodeKey(KindKeyed, "s", []byte(s), nil) }
	if err := b.Apply([]Mutation{{Key: key("a"), Value: []byte("v")}}, Meta{Epoch: 4, ChangelogOffset: 11, Offsets: map[string]int64{"in": 8}}); err != nil {
		t.Fatal(err)
	}
	if synced, err := freelistSynced(path); err != nil || !synced {
		t.Fatalf("after an Apply: freelist synced %v, %v", synced, err)
	}
	if err := b.ApplyBulk([]Mutation{{Key: key("b"), Value: []byte("v")}}, Meta{Epoch: 5, ChangelogOffset: 12, Offsets: map[string]int64{"in": 9}}); err != nil {
		t.Fatal(err)
	}
	// A crash: the file is released without Close's last commit.
	crash(t, b)
	if synced, err := freelistSynced(path); err != nil || synced {
		t.Fatalf("after an ApplyBulk and a crash: freelist synced %v, %v", synced, err)
	}
	re, err := openBolt(path, DefaultLockTimeout)
	if err != nil {
		t.Fatal(err)
	}
	m, err := re.Meta()
	if err != nil || m.Epoch != 5 || re.Stats().Keys != 2002 {
		t.Fatalf("after the crash: meta %+v, %d keys, %v", m, re.Stats().Keys, err)
	}
	if synced, err := freelistSynced(path); err != nil || !synced {
		t.Fatalf("reopened: freelist synced %v, %v", synced, err)
	}
	if err := re.Close(); err != nil {
		t.Fatal(err)
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	err = db.View(func(tx *bolt.Tx) error {
		var first error
		for err := range tx.Check() { // drained: Check's goroutine waits for each send
			first = cmp.Or(first, err)
		}
		return first
	})
	if err != nil {
		t.Fatalf("bbolt's check of the file: %v", err)
	}
}

// crash releases b's file as a process that died would: no Close.
func crash(t *testing.T, b *boltBackend) {
	t.Helper()
	b.endRead()
	if err := b.db.Close(); err != nil {
		t.Fatal(err)
	}
}

// After a crash on the same boot the open trusts the file without reading
// its pages, once: the open after a second crash without a clean close
// between reads them, and so does an open on another boot. Damage at rest
// stands in for what only that read would find.
func TestBoltCrashOnTheSameBoot(t *testing.T) {
	boot := "boot-1"
	defer func(f func() string) { bootID = f }(bootID)
	bootID = func() string { return boot }
	key := func(i int) []byte { return EncodeKey(KindKeyed, "s", []byte{byte(i >> 8), byte(i)}, nil) }

	// openCrashed opens path, reads a key, and crashes.
	openCrashed := func(t *testing.T, path string) {
		t.Helper()
		b, err := openBolt(path, DefaultLockTimeout)
		if err != nil {
			t.Fatal(err)
		}
		if v, ok, err := b.Get(key(1)); err != nil || !ok || len(v) != 100 {
			t.Fatalf("get: %d bytes, %v, %v", len(v), ok, err)
		}
		crash(t, b)
	}
	// damage makes the first leaf junk, a page no open reads but the check.
	damage := func(t *testing.T, path string) {
		t.Helper()
		patchFile(t, path, nil, nil, func(t *testing.T, pg *rawPage) {
			leaf := pg.read(t, pg.child(t, pg.read(t, pg.root), 0))
			for i := range leaf.b {
				leaf.b[i] = 0xA5
			}
			leaf.write(t)
		})
	}

	// Each case crashes a clean file its own way, and returns the file
	// to damage and open (a copy, say).
	tests := []struct {
		name    string
		prepare func(t *testing.T, path string) string
		trusted bool // the open reads no page: the damage goes unseen
	}{
		{"one crash is trusted", func(t *testing.T, path string) string {
			openCrashed(t, path)
			return path
		}, true},
		{"a crash after an open that trusted a crash is checked", func(t *testing.T, path string) string {
			openCrashed(t, path)
			openCrashed(t, path) // trusts the file, and crashes again
			return path
		}, false},
		{"a clean close trusts the next crash again", func(t *testing.T, path string) string {
			openCrashed(t, path)
			b, err := openBolt(path, DefaultLockTimeout)
			if err != nil {
				t.Fatal(err)
			}
			if err := b.Close(); err != nil {
				t.Fatal(err)
			}
			openCrashed(t, path)
			return path
		}, true},
		{"a checked open trusts the next crash again", func(t *testing.T, path string) string {
			for range 3 { // trusted, then checked
				openCrashed(t, path)
			}
			return path
		}, true},
		{"a copy of the file", func(t *testing.T, path string) string {
			openCrashed(t, path)
			raw, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			copied := filepath.Join(t.TempDir(), "task-0000.db")
			if err := os.WriteFile(copied, raw, 0o600); err != nil {
				t.Fatal(err)
			}
			return copied
		}, false},
		{"another boot", func(t *testing.T, path string) string {
			openCrashed(t, path)
			boot = "boot-2"
			t.Cleanup(func() { boot = "boot-1" })
			return path
		}, false},
		{"no boot id", func(t *testing.T, path string) string {
			openCrashed(t, path)
			boot = ""
			t.Cleanup(func() { boot = "boot-1" })
			return path
		}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := tt.prepare(t, writeFile(t))
			damage(t, path)
			b, err := openBolt(path, DefaultLockTimeout)
			switch {
			case tt.trusted && err != nil:
				t.Fatalf("open: %v, want the file trusted without a page read", err)
			case tt.trusted:
				crash(t, b)
			case !errors.Is(err, ErrCorrupt):
				if err == nil {
					b.Close()
				}
				t.Fatalf("open: %v, want the pages read and ErrCorrupt", err)
			}
		})
	}
}

// A synced freelist that lists a page of the tree is refused by the check
// after a crash: bbolt would write over that page.
func TestBoltCheckFindsAFreelistListingALivePage(t *testing.T) {
	path := writeFile(t)
	patchAfterCrash(t, path, nil, func(t *testing.T, pg *rawPage) {
		m, err := checkFile(path)
		if err != nil || m.freelist == noFreelist {
			t.Fatalf("meta %+v, %v: want a synced freelist", m, err)
		}
		fl := pg.read(t, m.freelist)
		count := binary.LittleEndian.Uint16(fl.b[10:])
		if count == 0 || count == 0xFFFF {
			t.Fatalf("freelist count %d: want a short list", count)
		}
		// The last free id becomes the root's (ids stay in order if it is
		// larger; else the first takes it).
		at := pageHeaderSize + int(count-1)*8
		if last := binary.LittleEndian.Uint64(fl.b[at:]); last > pg.root {
			at = pageHeaderSize
			if binary.LittleEndian.Uint64(fl.b[at:]) >= pg.root {
				t.Skip("no free id below the root to replace")
			}
		}
		binary.LittleEndian.PutUint64(fl.b[at:], pg.root)
		fl.write(t)
	})
	if _, err := openBolt(path, DefaultLockTimeout); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("open: %v, want ErrCorrupt", err)
	}
}

func freelistSynced(path string) (bool, error) {
	m, err := checkFile(path)
	if err != nil {
		return false, err
	}
	return m.freelist != noFreelist, nil
}

// The check after a crash passes what bbolt legitimately writes: values
// on overflow pages beyond what the walk buffers, many small entries, an
// inline bucket (meta), a tree several levels deep.
func TestBoltCheckPassesLargeValuesAfterACrash(t *testing.T) {
	path := filepath.Join(t.TempDir(), "task-0000.db")
	b, err := openBolt(path, DefaultLockTimeout)
	if err != nil {
		t.Fatal(err)
	}
	big := bytes.Repeat([]byte{7}, 3*maxBuffered/2)
	bigKey := EncodeKey(KindKeyed, "big", []byte("k"), nil)
	muts := []Mutation{{Key: bigKey, Value: big}} // Apply sorts muts
	for i := range 20000 {
		muts = append(muts, Mutation{Key: EncodeKey(KindKeyed, "s", fmt.Appendf(nil, "%06d", i), nil), Value: []byte("v")})
	}
	if err := b.Apply(muts[:len(muts)/2], Meta{Epoch: 1, ChangelogOffset: 1, Offsets: map[string]int64{"in": 1}}); err != nil {
		t.Fatal(err)
	}
	m, err := checkFile(path)
	if err != nil || m.freelist == noFreelist {
		t.Fatalf("meta %+v, %v: want the freelist synced", m, err)
	}
	if err := checkPages(path, *m, nil); err != nil {
		t.Fatalf("the check refused a sound file, with its freelist: %v", err)
	}
	if err := b.ApplyBulk(muts[len(muts)/2:], Meta{Epoch: 2, ChangelogOffset: 2, Offsets: map[string]int64{"in": 2}}); err != nil {
		t.Fatal(err)
	}
	crash(t, b)
	m, err = checkFile(path)
	if err != nil || m.freelist != noFreelist {
		t.Fatalf("meta %+v, %v: want the freelist unsynced", m, err)
	}
	if err := checkPages(path, *m, nil); err != nil {
		t.Fatalf("the check refused a sound file: %v", err)
	}
	re, err := OpenBolt(path)
	if err != nil {
		t.Fatal(err)
	}
	defer re.Close()
	v, ok, err := re.Get(bigKey)
	if err != nil || !ok || !bytes.Equal(v, big) || re.Stats().Keys != 20001 {
		t.Fatalf("after the crash: big value %v %v (%d bytes), %d keys", ok, err, len(v), re.Stats().Keys)
	}
}
