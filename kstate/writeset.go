package kstate

import "strings"

// writeSet is the epoch write-set: every key changed in the epoch with its
// last value, nil for a deleted key.
//
// Point reads go through a hash map (lookups with string(key) do not
// allocate); ordered reads go through a skip list over the same nodes, so a
// prefix scan costs O(log n + matches) however large the epoch grows. Nodes
// are only ever added or overwritten until reset: a delete is a tombstone
// value, which is also what the changelog needs to see.
type writeSet struct {
	index map[string]*wsNode
	head  wsNode // sentinel; head.next has maxLevel entries
	level int    // levels in use, at least 1
	bytes int    // key and value bytes of the nodes, for the epoch budget
	rng   uint64 // xorshift state for node heights; fixed seed, so runs repeat
}

type wsNode struct {
	key  string
	val  []byte // nil is a tombstone
	next []*wsNode
}

// maxLevel with a branching factor of 4 keeps searches logarithmic up to
// 4^20 (about 10^12) keys, far beyond any epoch.
const maxLevel = 20

// resetShrinkLen is the size above which reset drops the map instead of
// clearing it: Go maps never shrink, and one huge epoch should not pin its
// memory for the life of the task.
const resetShrinkLen = 1 << 16

func newWriteSet() *writeSet {
	ws := &writeSet{index: map[string]*wsNode{}}
	ws.head.next = make([]*wsNode, maxLevel)
	ws.level = 1
	ws.rng = 0x9E3779B97F4A7C15
	return ws
}

func (ws *writeSet) len() int { return len(ws.index) }

// get returns the node for key, or nil if the key was not changed.
func (ws *writeSet) get(key []byte) *wsNode { return ws.index[string(key)] }

// set records val (nil for a delete) as key's latest value. It takes
// ownership of val.
func (ws *writeSet) set(key string, val []byte) {
	if n := ws.index[key]; n != nil {
		ws.bytes += len(val) - len(n.val)
		n.val = val
		return
	}
	ws.bytes += len(key) + len(val)
	var update [maxLevel]*wsNode
	x := &ws.head
	for i := ws.level - 1; i >= 0; i-- {
		for x.next[i] != nil && x.next[i].key < key {
			x = x.next[i]
		}
		update[i] = x
	}
	h := ws.randomHeight()
	if h > ws.level {
		for i := ws.level; i < h; i++ {
			update[i] = &ws.head
		}
		ws.level = h
	}
	n := &wsNode{key: key, val: val, next: make([]*wsNode, h)}
	for i := range h {
		n.next[i] = update[i].next[i]
		update[i].next[i] = n
	}
	ws.index[key] = n
}

func (ws *writeSet) randomHeight() int {
	ws.rng ^= ws.rng << 13
	ws.rng ^= ws.rng >> 7
	ws.rng ^= ws.rng << 17
	r := ws.rng
	h := 1
	for h < maxLevel && r&3 == 0 {
		h++
		r >>= 2
	}
	return h
}

// seek returns the first node whose key is >= prefix, or nil.
func (ws *writeSet) seek(prefix []byte) *wsNode {
	x := &ws.head
	for i := ws.level - 1; i >= 0; i-- {
		for x.next[i] != nil && x.next[i].key < string(prefix) {
			x = x.next[i]
		}
	}
	return x.next[0]
}

// first returns the node with the smallest key, or nil.
func (ws *writeSet) first() *wsNode { return ws.head.next[0] }

// within reports whether n is non-nil and its key has the prefix.
func (n *wsNode) within(prefix string) bool {
	return n != nil && strings.HasPrefix(n.key, prefix)
}

func (ws *writeSet) reset() {
	if len(ws.index) > resetShrinkLen {
		ws.index = map[string]*wsNode{}
	} else {
		clear(ws.index)
	}
	clear(ws.head.next)
	ws.level = 1
	ws.bytes = 0
}
