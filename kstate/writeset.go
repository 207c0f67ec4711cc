package kstate

import (
	"bytes"
	"strings"
	"unsafe"
)

// writeSet is the epoch write-set: every key changed in the epoch with its
// last value, nil for a deleted key.
//
// Point reads go through a hash map (lookups with string(key) do not
// allocate); ordered reads go through a skip list over the same nodes, so a
// prefix scan costs O(log n + matches) however large the epoch grows. Nodes
// are only ever added or overwritten until reset: a delete is a tombstone
// value, which is also what the changelog needs to see.
//
// A node may also be unset: in the list, but not changed in the epoch (a
// record that created it was rolled back, or reset kept it from an epoch
// before). get, len and bytes leave unset nodes out, and so must every
// walk over the list (see live).
//
// Keys and nodes are carved from slabs (the key bytes from an arena, the
// nodes from a node slab), so a key new to the epoch costs no allocation
// of its own; reset keeps the slabs with the nodes, or drops them (see
// reset).
type writeSet struct {
	index map[string]*wsNode
	head  wsNode // sentinel; head.next has maxLevel entries
	level int    // levels in use, at least 1
	live  int    // nodes that are set
	bytes int    // key and value bytes of the set nodes, for the epoch budget
	rng   uint64 // xorshift state for node heights; fixed seed, so runs repeat
	keys  arena
	nodes []wsNode // the node slab's unused part
	// nodesHeld counts the bytes of the node slabs allocated since the
	// write-set was last emptied; heldBefore is what the keys' arena and
	// the node slabs held when reset last kept the nodes (see held).
	nodesHeld  int
	heldBefore int
	// last remembers the last key looked up and its node (nil: none), so
	// that the write following a read of the same key, which is what
	// keyed state does, does not search the index again. insert keeps it
	// true and reset clears it.
	lastKey []byte
	last    *wsNode
	lastOK  bool
	// shared: the values were handed out (Store.Dirty), so none may be
	// overwritten in place (Store.overwrite) until reset.
	shared bool
}

type wsNode struct {
	key   string // shares kb's bytes
	kb    []byte
	val   []byte // nil is a tombstone
	unset bool
	// own: val is a buffer of this node's alone, which the Store may
	// overwrite in place (Store.overwrite). Store.write sets it, and a
	// rollback of an in-place write sets it again; any other assignment
	// clears it.
	own bool
	// gen is the Store's record generation that last saved an undo
	// entry for this node (see Store.write).
	gen   uint64
	next  []*wsNode
	tower [2]*wsNode // next's storage for the common heights 1 and 2
}

// nodeSlab is how many nodes one slab allocation holds.
const nodeSlab = 64

// maxLevel with a branching factor of 4 keeps searches logarithmic up to
// 4^20 (about 10^12) keys, far beyond any epoch.
const maxLevel = 20

// resetShrinkLen is the size above which reset drops the map instead of
// clearing it: Go maps never shrink, and one huge epoch should not pin its
// memory for the life of the task.
const resetShrinkLen = 1 << 16

// keepMaxNodes and keepMaxBytes bound the write-sets reset keeps for the
// next epoch (their nodes and keys' memory): a task's hot keys, not a bulk
// load's, nor large keys.
const (
	keepMaxNodes = 1 << 14
	keepMaxBytes = 4 << 20
)

func newWriteSet() *writeSet {
	ws := &writeSet{index: map[string]*wsNode{}}
	ws.head.next = make([]*wsNode, maxLevel)
	ws.level = 1
	ws.rng = 0x9E3779B97F4A7C15
	return ws
}

// newReadWriteSet is a read store's write-set (NewReadStore): always
// empty, since the store refuses every write, so it allocates neither the
// index nor the head's tower of maxLevel links (half a query's time when
// it did). It must never take an insert.
func newReadWriteSet() *writeSet {
	ws := &writeSet{level: 1}
	ws.head.next = ws.head.tower[:1]
	return ws
}

func (ws *writeSet) len() int { return ws.live }

// get returns the node for key, or nil if the key was not changed.
func (ws *writeSet) get(key []byte) *wsNode {
	if n := ws.node(key); n != nil && !n.unset {
		return n
	}
	return nil
}

// node returns the node for key, set or not, or nil if there is none.
func (ws *writeSet) node(key []byte) *wsNode {
	if ws.lastOK && bytes.Equal(ws.lastKey, key) {
		return ws.last
	}
	n := ws.index[string(key)]
	ws.remember(key, n)
	return n
}

func (ws *writeSet) remember(key []byte, n *wsNode) {
	ws.lastKey = append(ws.lastKey[:0], key...)
	ws.last, ws.lastOK = n, true
}

// set records val (nil for a delete) as key's latest value. It takes
// ownership of val.
func (ws *writeSet) set(key string, val []byte) {
	n := ws.index[key]
	if n == nil {
		n = ws.insert(unsafe.Slice(unsafe.StringData(key), len(key)))
	}
	ws.assign(n, val)
}

// assign sets n to val (nil for a delete), taking ownership of val.
func (ws *writeSet) assign(n *wsNode, val []byte) {
	if n.unset {
		n.unset = false
		ws.live++
		ws.bytes += len(n.key) + len(val)
	} else {
		ws.bytes += len(val) - len(n.val)
	}
	n.val, n.own = val, false
}

// size is what n counts in the write-set's bytes.
func (n *wsNode) size() int {
	if n.unset {
		return 0
	}
	return len(n.key) + len(n.val)
}

// unassign makes n unset again: the key is no longer changed in the epoch.
func (ws *writeSet) unassign(n *wsNode) {
	if n.unset {
		return
	}
	ws.live--
	ws.bytes -= len(n.key) + len(n.val)
	n.unset, n.val, n.own = true, nil, false
}

// insert adds an unset node for key, which must not be in the set yet; the
// key is copied.
func (ws *writeSet) insert(key []byte) *wsNode {
	kb := ws.keys.copy(key)
	k := unsafe.String(unsafe.SliceData(kb), len(kb))
	var update [maxLevel]*wsNode
	x := &ws.head
	for i := ws.level - 1; i >= 0; i-- {
		for x.next[i] != nil && x.next[i].key < k {
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
	if len(ws.nodes) == 0 {
		ws.nodes = make([]wsNode, nodeSlab)
		ws.nodesHeld += nodeSlab * int(unsafe.Sizeof(wsNode{}))
	}
	n := &ws.nodes[0]
	ws.nodes = ws.nodes[1:]
	n.kb, n.key, n.unset = kb, k, true
	if h <= len(n.tower) {
		n.next = n.tower[:h]
	} else {
		n.next = make([]*wsNode, h)
	}
	for i := range h {
		n.next[i] = update[i].next[i]
		update[i].next[i] = n
	}
	ws.index[n.key] = n
	ws.remember(key, n)
	return n
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

// seek returns the first set node whose key is >= from and has the prefix
// (from is at or after the prefix: see scanStart), or nil. The
// unset nodes it steps over are the prefix's only: at an epoch's start
// every node a reset kept is unset, and a scan of a range the epoch has
// not written must not walk the list to its end.
func (ws *writeSet) seek(from []byte, prefix string) *wsNode {
	x := &ws.head
	for i := ws.level - 1; i >= 0; i-- {
		for x.next[i] != nil && x.next[i].key < string(from) {
			x = x.next[i]
		}
	}
	return liveWithin(x.next[0], prefix)
}

// first returns the set node with the smallest key, or nil.
func (ws *writeSet) first() *wsNode { return live(ws.head.next[0]) }

// live returns n, or the first set node after it, or nil.
func live(n *wsNode) *wsNode { return liveWithin(n, "") }

// liveWithin is live for the nodes with the prefix: nil at the first node
// without it.
func liveWithin(n *wsNode, prefix string) *wsNode {
	for ; n.within(prefix); n = n.next[0] {
		if !n.unset {
			return n
		}
	}
	return nil
}

// after returns the set node following n, or nil.
func (n *wsNode) after() *wsNode { return live(n.next[0]) }

// afterWithin returns the set node with the prefix that follows n, or nil.
func (n *wsNode) afterWithin(prefix string) *wsNode { return liveWithin(n.next[0], prefix) }

// within reports whether n is non-nil and its key has the prefix.
func (n *wsNode) within(prefix string) bool {
	return n != nil && strings.HasPrefix(n.key, prefix)
}

// reset empties the write-set for the next epoch. When at least three
// quarters of its nodes were set this epoch, and there are at most
// keepMaxNodes of them holding at most keepMaxBytes, it keeps them,
// unset, with their keys: a task whose hot keys are written epoch after
// epoch then finds each key's node already in the index and the skip
// list at its first write of the next epoch that uses this write-set,
// instead of copying the key, searching the list and linking a node into
// it again on memory new each epoch (BENCHMARKS.md, "What an epoch
// costs"). Any other write-set (keys that come and go, or many, or
// large) is emptied. So a kept one holds at most a third more nodes than
// the epoch that used it last set, the nodes of keys no longer written go
// at the first reset that finds a quarter of them unset, and what is kept
// beyond the epoch budget (Store.EpochMemory counts only what an epoch
// adds) is bounded by keepMaxBytes a write-set. Walks step over unset
// nodes: a scan only over those in its range (seek, afterWithin); Dirty
// and fold over all of them, once an epoch. One that grew past
// resetShrinkLen lets its map's memory go too.
//
// Nothing outside the write-set holds a node (the epoch's mutations hold
// key and value bytes, and a kept node's key bytes never change), so
// keeping them is safe once the epoch was applied or discarded.
func (ws *writeSet) reset() {
	n := len(ws.index)
	keep := n <= keepMaxNodes && ws.keys.held+ws.nodesHeld <= keepMaxBytes && ws.live*4 >= n*3
	ws.last, ws.lastOK = nil, false
	ws.shared = false
	ws.live, ws.bytes = 0, 0
	if keep {
		for x := ws.head.next[0]; x != nil; x = x.next[0] {
			x.unset, x.val, x.own = true, nil, false
		}
		ws.heldBefore = ws.keys.held + ws.nodesHeld
		return
	}
	if n > resetShrinkLen {
		ws.index = map[string]*wsNode{}
	} else {
		clear(ws.index)
	}
	clear(ws.head.next)
	ws.level = 1
	// The nodes and keys go with their slabs (the epoch's mutations, the
	// changelog records in flight, may still hold key bytes: the new
	// arena never writes over them).
	ws.keys, ws.nodes, ws.nodesHeld, ws.heldBefore = arena{}, nil, 0, 0
}

// held is the memory the write-set took for keys and nodes since its last
// reset: what this epoch added to what it kept.
func (ws *writeSet) held() int { return ws.keys.held + ws.nodesHeld - ws.heldBefore }
