package kstate

import (
	"bytes"
	"slices"
	"sync"
)

// memory is the heap backend (Flink's HashMap backend): a hash map for point
// reads plus a key-sorted slice for ordered scans.
//
// The sorted slice costs O(n) to rebuild when an Apply adds or removes keys,
// but Apply runs once per epoch with a sorted batch, so the rebuild is one
// linear merge per epoch, and overwrites of existing keys (the common case
// for counters and aggregates) touch only the map. Scans then walk
// contiguous memory. For state too large for that, use bbolt.
type memory struct {
	mu     sync.RWMutex
	closed bool
	index  map[string]*memEntry
	sorted []*memEntry // ascending by key
	meta   Meta
	bytes  int64
	heap   int64 // sum of entryHeap over the entries
	timers Stats // the timer counts only
}

type memEntry struct {
	key, val []byte
	removed  bool // set during an Apply that deletes the entry
}

// NewMemory returns an empty in-memory backend. It keeps nothing across
// Close; a task using it restores from the changelog at every start.
func NewMemory() Backend {
	return &memory{index: map[string]*memEntry{}, meta: Meta{}.Clone()}
}

func (m *memory) Get(key []byte) ([]byte, bool, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.closed {
		return nil, false, ErrClosed
	}
	e, ok := m.index[string(key)]
	if !ok {
		return nil, false, nil
	}
	return bytes.Clone(e.val), true, nil
}

func (m *memory) Scan(prefix []byte, fn func(k, v []byte) error) error {
	return m.ScanFrom(prefix, prefix, fn)
}

func (m *memory) ScanFrom(prefix, start []byte, fn func(k, v []byte) error) error {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.closed {
		return ErrClosed
	}
	i, _ := slices.BinarySearchFunc(m.sorted, scanStart(prefix, start), func(e *memEntry, p []byte) int {
		return bytes.Compare(e.key, p)
	})
	for _, e := range m.sorted[i:] {
		if !bytes.HasPrefix(e.key, prefix) {
			break
		}
		if err := fn(e.key, e.val); err != nil {
			if err == ErrStopScan {
				return nil
			}
			return err
		}
	}
	return nil
}

func (m *memory) Apply(muts []Mutation, meta Meta) error {
	muts, err := prepareMutations(muts)
	if err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ErrClosed
	}
	// Nothing below can fail, which is what makes the apply atomic.
	var added []*memEntry // sorted, because muts are
	removed := 0
	for _, mut := range muts {
		e, exists := m.index[string(mut.Key)]
		switch {
		case mut.Value == nil && exists:
			e.removed = true
			delete(m.index, string(mut.Key))
			m.bytes -= int64(len(e.key) + len(e.val))
			m.heap -= entryHeap(len(e.key), cap(e.val))
			m.timers.count(e.key, -1)
			removed++
		case mut.Value == nil:
		case exists:
			m.bytes += int64(len(mut.Value) - len(e.val))
			m.heap -= entryHeap(len(e.key), cap(e.val))
			e.val = bytes.Clone(mut.Value)
			m.heap += entryHeap(len(e.key), cap(e.val))
		default:
			// Clone of an empty slice is non-nil, so an empty value stays a
			// value and never turns into a tombstone.
			e = &memEntry{key: bytes.Clone(mut.Key), val: append([]byte{}, mut.Value...)}
			m.index[string(e.key)] = e
			m.bytes += int64(len(e.key) + len(e.val))
			m.heap += entryHeap(len(e.key), cap(e.val))
			m.timers.count(e.key, 1)
			added = append(added, e)
		}
	}
	if len(added) > 0 || removed > 0 {
		m.sorted = mergeSorted(m.sorted, added, len(m.sorted)-removed+len(added))
	}
	m.meta = meta.Clone()
	return nil
}

// entryHeap estimates the heap one entry holds, for Stats.HeapBytes: the
// memEntry (64 bytes with its size class), the key twice (the entry's
// copy and the map's string) and the value's capacity, each rounded up as
// the allocator does, the map slot and the sorted slice's pointer.
//
// A slot of the map (a string and a pointer, 24 bytes, in groups of eight
// with a control word) takes 25 bytes; the table doubles when it is 7/8
// full, so a slot in use costs 29 to 57 bytes, 40 taken as the middle.
// The estimate leaves out the transient copy of the sorted slice during an
// Apply that adds or removes keys (8 bytes per entry) and the GC's
// headroom: a process's heap grows to about twice its live bytes before a
// collection (GOGC=100).
func entryHeap(key, valCap int) int64 {
	const entry, slot, sortedPtr = 64, 40, 8
	return int64(entry + 2*allocSize(key) + allocSize(valCap) + slot + sortedPtr)
}

// allocSize is the heap a byte slice or string of n bytes occupies: n
// rounded up to the allocator's size class (runtime/sizeclasses.go) up to
// 32 KiB, to 8 KiB pages beyond. Pointer-free allocations under 16 bytes
// share 16-byte blocks, so they count as what they use.
func allocSize(n int) int {
	switch {
	case n == 0:
		return 0
	case n < 16:
		return n
	case n > 32768:
		return (n + 8191) &^ 8191
	}
	i, _ := slices.BinarySearch(sizeClasses, n)
	return sizeClasses[i]
}

// sizeClasses are the Go allocator's small object sizes from 16 bytes.
var sizeClasses = []int{16, 24, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224, 240, 256,
	288, 320, 352, 384, 416, 448, 480, 512, 576, 640, 704, 768, 896, 1024, 1152, 1280, 1408,
	1536, 1792, 2048, 2304, 2688, 3072, 3200, 3456, 4096, 4864, 5376, 6144, 6528, 6784, 6912,
	8192, 9472, 9728, 10240, 10880, 12288, 13568, 14336, 16384, 18432, 19072, 20480, 21760,
	24576, 27264, 28672, 32768}

// mergeSorted merges the surviving entries of old with added, both sorted,
// into a new slice of capacity n.
func mergeSorted(old, added []*memEntry, n int) []*memEntry {
	out := make([]*memEntry, 0, n)
	i, j := 0, 0
	for i < len(old) || j < len(added) {
		if i < len(old) && old[i].removed {
			i++
			continue
		}
		if j == len(added) || (i < len(old) && bytes.Compare(old[i].key, added[j].key) < 0) {
			out = append(out, old[i])
			i++
		} else {
			out = append(out, added[j])
			j++
		}
	}
	return out
}

func (m *memory) Meta() (Meta, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.closed {
		return Meta{}, ErrClosed
	}
	return m.meta.Clone(), nil
}

func (m *memory) Stats() Stats {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return Stats{Keys: int64(len(m.index)), Bytes: m.bytes, HeapBytes: m.heap, EventTimers: m.timers.EventTimers, ProcessingTimers: m.timers.ProcessingTimers}
}

func (m *memory) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closed = true
	m.index, m.sorted, m.bytes, m.heap = nil, nil, 0, 0
	return nil
}
