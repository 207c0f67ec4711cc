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
			m.timers.count(e.key, -1)
			removed++
		case mut.Value == nil:
		case exists:
			m.bytes += int64(len(mut.Value) - len(e.val))
			e.val = bytes.Clone(mut.Value)
		default:
			// Clone of an empty slice is non-nil, so an empty value stays a
			// value and never turns into a tombstone.
			e = &memEntry{key: bytes.Clone(mut.Key), val: append([]byte{}, mut.Value...)}
			m.index[string(e.key)] = e
			m.bytes += int64(len(e.key) + len(e.val))
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
	return Stats{Keys: int64(len(m.index)), Bytes: m.bytes, EventTimers: m.timers.EventTimers, ProcessingTimers: m.timers.ProcessingTimers}
}

func (m *memory) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closed = true
	m.index, m.sorted, m.bytes = nil, nil, 0
	return nil
}
