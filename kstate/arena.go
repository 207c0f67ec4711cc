package kstate

import (
	"bytes"
	"unsafe"
)

// arena hands out immutable copies of small byte slices from shared chunks,
// so that copying a key or value costs no allocation of its own. A chunk is
// never written again where it was handed out, and lives as long as any
// slice of it: an arena is for bytes that die together (an epoch's writes,
// a batch's reads).
type arena struct{ buf []byte }

const (
	// arenaChunk is the size of one chunk.
	arenaChunk = 32 << 10
	// arenaMax is the largest slice an arena copies into a chunk; larger
	// ones get an allocation of their own, so one large value cannot pin
	// a chunk of small ones (or waste most of one).
	arenaMax = 1 << 10
)

// copy returns a copy of b with its capacity capped at its length (an
// append to it reallocates). The copy of an empty b is empty, not nil.
func (a *arena) copy(b []byte) []byte {
	if len(b) > arenaMax {
		return append(make([]byte, 0, len(b)), b...)
	}
	a.room(len(b))
	n := len(a.buf)
	a.buf = append(a.buf, b...)
	return a.buf[n:len(a.buf):len(a.buf)]
}

// room makes sure the current chunk has n free bytes.
func (a *arena) room(n int) {
	if a.buf == nil || cap(a.buf)-len(a.buf) < n {
		a.buf = make([]byte, 0, arenaChunk)
	}
}

// free returns the current chunk's free space as an empty slice to append
// to, for encoding in place; keep then claims what was appended.
func (a *arena) free() []byte {
	a.room(arenaMax)
	return a.buf[len(a.buf):len(a.buf)]
}

// keep claims b, the result of appending to the slice free returned: if
// it still lies in the chunk it is taken from it, otherwise (it outgrew
// the free space) it is its own allocation already. Either way the result
// is b with its capacity capped.
//
// A b that points into the free space other than at its start (an encoder
// that returned a part of what it appended) is copied out, since the free
// space is handed out again.
func (a *arena) keep(b []byte) []byte {
	n := len(a.buf)
	free := a.buf[n:cap(a.buf)]
	if len(b) > 0 {
		start := uintptr(unsafe.Pointer(unsafe.SliceData(free)))
		p := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
		switch {
		case p == start && len(b) <= len(free):
			a.buf = a.buf[:n+len(b)]
		case p > start && p < start+uintptr(len(free)):
			b = bytes.Clone(b)
		}
	}
	if b == nil {
		b = []byte{}
	}
	return b[:len(b):len(b)]
}
