package kstate

import (
	"errors"
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
		{"data page zeroed, not closed cleanly", func(t *testing.T, path string) {
			db, err := bolt.Open(path, 0o600, nil)
			if err != nil {
				t.Fatal(err)
			}
			var leaf int64
			err = db.Update(func(tx *bolt.Tx) error {
				leaf = int64(tx.Bucket(stateBucket).Root())
				return tx.Bucket(metaBucket).Delete(cleanKey) // as after a crash
			})
			db.Close()
			if err != nil {
				t.Fatal(err)
			}
			f, err := os.OpenFile(path, os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			junk := make([]byte, page)
			for i := range junk {
				junk[i] = 0xA5
			}
			if _, err := f.WriteAt(junk, leaf*page); err != nil {
				t.Fatal(err)
			}
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
