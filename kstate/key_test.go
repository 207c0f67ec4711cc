package kstate

import (
	"bytes"
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestEncodeKeyLayout(t *testing.T) {
	tests := []struct {
		name    string
		kind    Kind
		state   string
		userKey []byte
		sub     []byte
		want    []byte
	}{
		{"empty", KindKeyed, "", nil, nil, []byte{1, 1, 0, 0}},
		{"value", KindKeyed, "count", []byte("k1"), nil, []byte("\x01\x01\x05count\x02k1")},
		{"map entry", KindKeyed, "m", []byte("k"), []byte("sub"), []byte("\x01\x01\x01m\x01ksub")},
		{"timer", KindTimer, "", nil, []byte{1, 2}, []byte{1, 2, 0, 0, 1, 2}},
		{"marker", KindMarker, "", nil, nil, []byte{1, 4, 0, 0}},
		{"value with TTL", KindKeyedTTL, "count", []byte("k1"), nil, []byte("\x01\x05\x05count\x02k1")},
		{"two-byte varint", KindOperator, strings.Repeat("n", 200), nil, nil,
			append(append([]byte{1, 3, 0xc8, 0x01}, strings.Repeat("n", 200)...), 0)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := EncodeKey(tt.kind, tt.state, tt.userKey, tt.sub)
			if !bytes.Equal(got, tt.want) {
				t.Fatalf("EncodeKey = %x, want %x", got, tt.want)
			}
			if cap(got) != len(got) {
				t.Errorf("EncodeKey capacity %d, want exactly %d", cap(got), len(got))
			}
		})
	}
}

func TestDecodeKeyRejects(t *testing.T) {
	tests := []struct {
		name string
		in   []byte
	}{
		{"nil", nil},
		{"one byte", []byte{1}},
		{"unknown format", []byte{2, 1, 0, 0}},
		{"kind zero", []byte{1, 0, 0, 0}},
		{"kind past keyed-ttl", []byte{1, 6, 0, 0}},
		{"missing name length", []byte{1, 1}},
		{"missing user key length", []byte{1, 1, 0}},
		{"name past end", []byte{1, 1, 3, 'a', 'b'}},
		{"user key past end", []byte{1, 1, 0, 2, 'a'}},
		{"truncated varint", []byte{1, 1, 0x80}},
		{"non-minimal varint", []byte{1, 1, 0x80, 0x00, 0}},
		{"overflowing varint", []byte{1, 1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}},
		{"huge length", []byte{1, 1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if k, err := DecodeKey(tt.in); !errors.Is(err, ErrBadKey) {
				t.Fatalf("DecodeKey(%x) = %+v, %v; want ErrBadKey", tt.in, k, err)
			}
		})
	}
}

// TestKeyPrefixIsolation is why names and user keys are length-prefixed:
// one (name, user key) prefix must never cover another's entries.
func TestKeyPrefixIsolation(t *testing.T) {
	p := EncodeKey(KindKeyed, "ab", []byte("c"), nil)
	others := [][]byte{
		EncodeKey(KindKeyed, "a", []byte("bc"), nil),
		EncodeKey(KindKeyed, "abc", nil, nil),
		EncodeKey(KindKeyed, "ab", []byte("cd"), nil),
		EncodeKey(KindKeyed, "ab", nil, []byte("c")),
		EncodeKey(KindTimer, "ab", []byte("c"), nil),
	}
	for _, o := range others {
		if bytes.HasPrefix(o, p) {
			t.Errorf("%x has prefix %x", o, p)
		}
	}
	if !bytes.HasPrefix(EncodeKey(KindKeyed, "ab", []byte("c"), []byte("x")), p) {
		t.Error("map entry not under its prefix")
	}
}

func FuzzDecodeKey(f *testing.F) {
	f.Add([]byte{1, 1, 0, 0}, byte(1), "count", []byte("key"), []byte(nil))
	f.Add([]byte{1, 2, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 'k'}, byte(2), "", []byte(nil), []byte{1, 2, 3})
	f.Add([]byte{1, 1, 0x80, 0x00, 0}, byte(3), strings.Repeat("x", 300), []byte{0xff}, []byte{0})
	f.Add([]byte("\x01\x01\x05count\x02k1tail"), byte(4), "m", []byte{}, []byte("sub"))
	f.Add([]byte("\x01\x05\x01m\x01ksub"), byte(5), "m", []byte("k"), []byte("sub"))
	f.Fuzz(func(t *testing.T, in []byte, kind byte, name string, userKey, sub []byte) {
		// Arbitrary bytes: never panic, and anything accepted is canonical.
		if k, err := DecodeKey(in); err == nil {
			if re := EncodeKey(k.Kind, k.Name, k.UserKey, k.Sub); !bytes.Equal(re, in) {
				t.Fatalf("re-encode of %x gave %x", in, re)
			}
		} else if !errors.Is(err, ErrBadKey) {
			t.Fatalf("DecodeKey error %v does not wrap ErrBadKey", err)
		}

		// Arbitrary fields: encode then decode returns them.
		if !Kind(kind).valid() {
			return
		}
		enc := EncodeKey(Kind(kind), name, userKey, sub)
		k, err := DecodeKey(enc)
		if err != nil {
			t.Fatalf("DecodeKey(EncodeKey(...)) = %v", err)
		}
		if k.Kind != Kind(kind) || k.Name != name || !bytes.Equal(k.UserKey, userKey) || !bytes.Equal(k.Sub, sub) {
			t.Fatalf("round trip: got %+v from kind=%d name=%q userKey=%x sub=%x", k, kind, name, userKey, sub)
		}
		if (k.UserKey == nil) != (len(userKey) == 0) || (k.Sub == nil) != (len(sub) == 0) {
			t.Fatalf("empty fields must decode as nil: %+v", k)
		}
		if got := AppendKey(slices.Clone([]byte("pre")), Kind(kind), name, userKey, sub); !bytes.Equal(got[3:], enc) {
			t.Fatalf("AppendKey differs from EncodeKey")
		}
	})
}
