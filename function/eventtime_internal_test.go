package function

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	functionv1 "github.com/sluicehq/sluice/function/functionv1"
)

func TestPointerLookup(t *testing.T) {
	doc := []byte(`{"a": {"b": [10, {"c": "x"}, 12]}, "a/b": 1, "m~n": 2, "": 3, "dup": 1, "dup": 2, "n": null}`)
	for _, tt := range []struct{ ptr, want string }{
		{"", string(doc)},
		{"/a/b/0", "10"},
		{"/a/b/1/c", `"x"`},
		{"/a/b/2", "12"},
		{"/a~1b", "1"},
		{"/m~0n", "2"},
		{"/", "3"},
		{"/dup", "2"}, // the last of a name, as encoding/json
		{"/n", "null"},
		{"/a/b/3", "!"},  // past the end
		{"/a/b/-", "!"},  // "-" is past the end
		{"/a/b/01", "!"}, // no leading zeros
		{"/a/b/0/x", "!"},
		{"/zz", "!"},
	} {
		tokens, err := pointerTokens(tt.ptr)
		if err != nil {
			t.Fatalf("%q: %v", tt.ptr, err)
		}
		got, err := lookup(doc, tokens)
		switch {
		case tt.want == "!" && err != errNotFound:
			t.Errorf("%q: %s, %v; want not found", tt.ptr, got, err)
		case tt.want != "!" && (err != nil || !bytes.Equal(bytes.TrimSpace(got), []byte(tt.want))):
			t.Errorf("%q: %s, %v; want %s", tt.ptr, got, err, tt.want)
		}
	}
	for _, bad := range []string{"a", "/a~", "/~2"} {
		if _, err := pointerTokens(bad); err == nil {
			t.Errorf("pointer %q accepted", bad)
		}
	}
	if _, err := lookup([]byte(`{"a": `), []string{"a"}); err == nil || !strings.Contains(err.Error(), "not JSON") {
		t.Errorf("a value cut short: %v", err)
	}
}

// lookup finds what decoding the whole value and walking it finds.
func FuzzLookupIsTheDecodedValue(f *testing.F) {
	f.Add([]byte(`{"a": [1, {"b": "x"}], "c": {"d": true}}`), "/a/1/b")
	f.Add([]byte(`[[0], [1, 2]]`), "/1/1")
	f.Add([]byte(`{"a~b": {"c/d": 5}}`), "/a~0b/c~1d")
	f.Fuzz(func(t *testing.T, doc []byte, ptr string) {
		tokens, err := pointerTokens(ptr)
		if err != nil {
			return
		}
		var whole any
		if json.Unmarshal(doc, &whole) != nil {
			return // lookup reads only as far as it must: no claim about invalid values
		}
		want, found := whole, true
		for _, tok := range tokens {
			switch v := want.(type) {
			case map[string]any:
				want, found = v[tok], hasKey(v, tok)
			case []any:
				n, err := strconv.Atoi(tok)
				found = err == nil && n >= 0 && tok == strconv.Itoa(n) && n < len(v)
				if found {
					want = v[n]
				}
			default:
				found = false
			}
			if !found {
				break
			}
		}
		got, err := lookup(doc, tokens)
		if !found {
			if err == nil {
				t.Fatalf("%s %q: found %s, want nothing", doc, ptr, got)
			}
			return
		}
		if err != nil {
			t.Fatalf("%s %q: %v, want %v", doc, ptr, err, want)
		}
		var g any
		if err := json.Unmarshal(got, &g); err != nil {
			t.Fatalf("%s %q: found %s, not JSON", doc, ptr, got)
		}
		gb, _ := json.Marshal(g)
		wb, _ := json.Marshal(want)
		if !bytes.Equal(gb, wb) {
			t.Fatalf("%s %q: found %s, want %s", doc, ptr, gb, wb)
		}
	})
}

func hasKey(m map[string]any, k string) bool { _, ok := m[k]; return ok }

func TestEventTimeFormats(t *testing.T) {
	at := time.Date(2026, 12, 7, 16, 55, 0, 123e6, time.UTC)
	ptr := func(f functionv1.TimeFormat) *eventTimeSource {
		src, err := newEventTimeSource(&functionv1.EventTimeSource{From: &functionv1.EventTimeSource_JsonPointer{JsonPointer: "/t"}, Format: f})
		if err != nil {
			t.Fatal(err)
		}
		return src
	}
	hdr, err := newEventTimeSource(&functionv1.EventTimeSource{From: &functionv1.EventTimeSource_Header{Header: "t"}, Format: functionv1.TimeFormat_UNIX_SECONDS})
	if err != nil {
		t.Fatal(err)
	}
	whole, err := newEventTimeSource(&functionv1.EventTimeSource{From: &functionv1.EventTimeSource_JsonPointer{JsonPointer: ""}, Format: functionv1.TimeFormat_UNIX_MILLIS})
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		src   *eventTimeSource
		rec   sluice.Record
		want  time.Time
		error string
	}{
		{ptr(functionv1.TimeFormat_UNIX_MILLIS), sluice.Record{Value: []byte(`{"t": 1796662500123}`)}, at, ""},
		{ptr(functionv1.TimeFormat_UNIX_MILLIS), sluice.Record{Value: []byte(`{"t": "1796662500123"}`)}, at, ""},
		{ptr(functionv1.TimeFormat_UNIX_MILLIS), sluice.Record{Value: []byte(`{"t": 1796662500.123}`)}, time.Time{}, "an integer"},
		{ptr(functionv1.TimeFormat_UNIX_MILLIS), sluice.Record{Value: []byte(`{"t": true}`)}, time.Time{}, "an integer"},
		{ptr(functionv1.TimeFormat_UNIX_SECONDS), sluice.Record{Value: []byte(`{"t": 1796662500.123}`)}, at, ""},
		{ptr(functionv1.TimeFormat_UNIX_SECONDS), sluice.Record{Value: []byte(`{"t": 1796662500}`)}, at.Truncate(time.Second), ""},
		{ptr(functionv1.TimeFormat_UNIX_SECONDS), sluice.Record{Value: []byte(`{"t": "NaN"}`)}, time.Time{}, "a number"},
		{ptr(functionv1.TimeFormat_UNIX_SECONDS), sluice.Record{Value: []byte(`{"t": 1e300}`)}, time.Time{}, "a number"},
		{ptr(functionv1.TimeFormat_RFC3339), sluice.Record{Value: []byte(`{"t": "2026-12-07T17:55:00.123+01:00"}`)}, at, ""},
		{ptr(functionv1.TimeFormat_RFC3339), sluice.Record{Value: []byte(`{"t": 1796662500123}`)}, time.Time{}, "a string"},
		{ptr(functionv1.TimeFormat_RFC3339), sluice.Record{Value: []byte(`{"t": "yesterday"}`)}, time.Time{}, "RFC 3339"},
		{ptr(functionv1.TimeFormat_RFC3339), sluice.Record{Value: []byte(`{"u": 1}`)}, time.Time{}, `"/t": not in the value`},
		{hdr, sluice.Record{Headers: []sluice.Header{{Key: "t", Value: []byte("1796662500.123")}}}, at, ""},
		{hdr, sluice.Record{Headers: []sluice.Header{{Key: "t", Value: []byte("1")}, {Key: "t", Value: []byte("1796662500.123")}}}, at, ""}, // the last
		{hdr, sluice.Record{Headers: []sluice.Header{{Key: "t", Value: []byte("1.0005")}}}, time.UnixMilli(1001).UTC(), ""},                 // rounded
		{hdr, sluice.Record{Headers: []sluice.Header{{Key: "t", Value: []byte("0x1p30")}}}, time.Time{}, "a number"},
		{hdr, sluice.Record{Headers: []sluice.Header{{Key: "t", Value: []byte("1_000")}}}, time.Time{}, "a number"},
		{hdr, sluice.Record{Headers: []sluice.Header{{Key: "t", Value: []byte("9223372036854775.807")}}}, time.Time{}, "a number"}, // past int64 ms
		{ptr(functionv1.TimeFormat_UNIX_MILLIS), sluice.Record{Value: []byte(`{"t": "+123"}`)}, time.Time{}, "an integer"},
		{ptr(functionv1.TimeFormat_UNIX_MILLIS), sluice.Record{Value: []byte(`{"t": " 123"}`)}, time.Time{}, "an integer"},
		{ptr(functionv1.TimeFormat_UNIX_MILLIS), sluice.Record{Value: []byte(`{"t": "-5"}`)}, time.UnixMilli(-5).UTC(), ""},
		{ptr(functionv1.TimeFormat_RFC3339), sluice.Record{Value: []byte(`{"t": "2026-12-07T16:55:00,123Z"}`)}, time.Time{}, "RFC 3339"},
		{ptr(functionv1.TimeFormat_RFC3339), sluice.Record{Value: []byte(`{"t": "2026-12-07T6:55:00Z"}`)}, time.Time{}, "RFC 3339"},
		{ptr(functionv1.TimeFormat_RFC3339), sluice.Record{Value: []byte(`{"t": "2026-12-07t16:55:00.123z"}`)}, at, ""},
		{whole, sluice.Record{Value: []byte(`1796662500123`)}, at, ""},
		{hdr, sluice.Record{Headers: []sluice.Header{{Key: "u", Value: []byte("1")}}}, time.Time{}, `no header "t"`},
	} {
		got, err := tt.src.timestamp(&tt.rec)
		switch {
		case tt.error == "" && (err != nil || !got.Equal(tt.want)):
			t.Errorf("%s %q: %v, %v; want %v", tt.rec.Value, tt.rec.Headers, got, err, tt.want)
		case tt.error != "" && (err == nil || !strings.Contains(err.Error(), tt.error)):
			t.Errorf("%s %q: %v, %v; want an error saying %q", tt.rec.Value, tt.rec.Headers, got, err, tt.error)
		}
	}
}
