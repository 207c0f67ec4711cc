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
			fi, _ := os.Stat(path)
			if err := os.Truncate(path, fi.Size()/2/page*page); err != nil {
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

// patchAfterCrash makes the file look as after a crash (no clean mark),
// committing that with opts, then lets patch damage its pages.
func patchAfterCrash(t *testing.T, path string, opts *bolt.Options, patch func(*testing.T, *rawPage)) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, opts)
	if err != nil {
		t.Fatal(err)
	}
	var root uint64
	err = db.Update(func(tx *bolt.Tx) error {
		root = uint64(tx.Bucket(stateBucket).Root())
		return tx.Bucket(metaBucket).Delete(cleanKey)
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

// Close writes the freelist, so the next open reads it instead of walking
// every page; the first commit after that open unsyncs it again, so a
// crash then leaves a file whose open rebuilds it (and checks every page
// doing so). Through the whole cycle the data stays and bbolt's own check
// finds nothing.
func TestBoltFreelistSyncedOnlyByClose(t *testing.T) {
	path := writeFile(t)
	if synced, err := freelistSynced(path); err != nil || !synced {
		t.Fatalf("after a clean close: freelist synced %v, %v", synced, err)
	}
	b, err := openBolt(path, DefaultLockTimeout)
	if err != nil {
		t.Fatal(err)
	}
	if synced, err := freelistSynced(path); err != nil || synced {
		t.Fatalf("once opened: freelist synced %v, %v", synced, err)
	}
	more := []Mutation{{Key: EncodeKey(KindKeyed, "s", []byte("new"), nil), Value: []byte("v")}}
	if err := b.Apply(more, Meta{Epoch: 4, ChangelogOffset: 11, Offsets: map[string]int64{"in": 8}}); err != nil {
		t.Fatal(err)
	}
	// A crash: the file is released without Close's last commit.
	b.endRead()
	if err := b.db.Close(); err != nil {
		t.Fatal(err)
	}
	if synced, err := freelistSynced(path); err != nil || synced {
		t.Fatalf("after a crash: freelist synced %v, %v", synced, err)
	}
	re, err := OpenBolt(path)
	if err != nil {
		t.Fatal(err)
	}
	m, err := re.Meta()
	if err != nil || m.Epoch != 4 || re.Stats().Keys != 2001 {
		t.Fatalf("after the crash: meta %+v, %d keys, %v", m, re.Stats().Keys, err)
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
	if err := b.Apply(muts, Meta{Epoch: 1, ChangelogOffset: 1, Offsets: map[string]int64{"in": 1}}); err != nil {
		t.Fatal(err)
	}
	b.endRead()
	if err := b.db.Close(); err != nil { // a crash: no clean mark
		t.Fatal(err)
	}
	m, err := checkFile(path)
	if err != nil || m.freelist != noFreelist {
		t.Fatalf("meta %+v, %v: want the freelist unsynced", m, err)
	}
	if err := readEveryPage(path, *m, DefaultLockTimeout); err != nil {
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
