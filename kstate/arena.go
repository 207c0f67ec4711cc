package kstate

import (
	"bytes"
	"unsafe"
)

// arena hands out copies of small byte slices from shared chunks, so that
// copying a key or value costs no allocation of its own. The arena never
// writes a chunk again where it was handed out (the Store may: it writes
// an epoch value over in place, Store.overwrite), and a chunk lives as
// long as any slice of it: an arena is for bytes that die together (an
// epoch's writes, a batch's reads).
type arena struct {
	buf []byte
	// held counts the bytes the arena allocated (whole chunks, and the
	// copies too large for one): what it may keep alive, which can be far
	// more than the live values when most writes overwrite a few keys.
	held int
}

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
		a.held += len(b)
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
		a.held += arenaChunk
	}
}

// free returns the current chunk's free space as an empty slice to append
// to, for encoding in place; keep then claims what was appended.
func (a *arena) free() []byte {
	a.room(arenaMax)
	return a.buf[len(a.buf):len(a.buf)]
}

// keep claims b, the result of appending to the slice free returned: if
// it starts where the free space does and fits in it, it is taken from the
// chunk. Anything else is copied: an encoding that outgrew the free space,
// a part of what was appended, or a buffer the encoder keeps and may
// write again (an encoder that ignores dst) must not become state. The
// result is b with its capacity capped.
func (a *arena) keep(b []byte) []byte {
	n := len(a.buf)
	free := a.buf[n:cap(a.buf)]
	if len(b) > 0 {
		if unsafe.SliceData(b) == unsafe.SliceData(free) && len(b) <= len(free) {
			a.buf = a.buf[:n+len(b)]
		} else {
			a.held += len(b)
			b = bytes.Clone(b)
		}
	}
	if b == nil {
		b = []byte{}
	}
	return b[:len(b):len(b)]
}
