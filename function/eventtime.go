package function

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice"
	functionv1 "github.com/sluicehq/sluice/function/functionv1"
)

// A function in event time declares where each record's event time is
// (DescribeResponse.event_time_source): a field of the record's JSON value,
// named by a JSON Pointer, or a header, in one of three formats. The
// processor reads it before the call, as a Go job's Timestamp, since it
// moves the task's watermark, which the call carries; a function's own
// code is never asked for a record's time.

// eventTimeSource is a checked DescribeResponse.event_time_source.
type eventTimeSource struct {
	pointer []string // the JSON Pointer's reference tokens; nil with header
	header  string
	format  functionv1.TimeFormat
	what    string // for errors: the pointer, or "header <name>"
}

// newEventTimeSource checks a declared source.
func newEventTimeSource(s *functionv1.EventTimeSource) (*eventTimeSource, error) {
	if _, ok := functionv1.TimeFormat_name[int32(s.GetFormat())]; !ok || s.GetFormat() == functionv1.TimeFormat_TIME_FORMAT_UNSPECIFIED {
		// Over JSON a name this processor does not know reads as 0.
		return nil, fmt.Errorf("event_time_source has the format %s, which this processor does not know: want UNIX_MILLIS, UNIX_SECONDS or RFC3339", s.GetFormat())
	}
	src := &eventTimeSource{format: s.GetFormat()}
	switch from := s.GetFrom().(type) {
	case *functionv1.EventTimeSource_JsonPointer:
		tokens, err := pointerTokens(from.JsonPointer)
		if err != nil {
			return nil, fmt.Errorf("event_time_source: %w", err)
		}
		src.pointer, src.what = tokens, strconv.Quote(from.JsonPointer)
		if src.pointer == nil {
			src.pointer = []string{} // "": the whole value
		}
	case *functionv1.EventTimeSource_Header:
		if from.Header == "" {
			return nil, errors.New("event_time_source names an empty header")
		}
		src.header, src.what = from.Header, "header "+strconv.Quote(from.Header)
	default:
		return nil, errors.New("event_time_source names neither a jsonPointer nor a header")
	}
	return src, nil
}

// timestamp is the source as a Job's Timestamp: an error dead-letters the
// record (sluice.stage=timestamp), saying what was wrong with it.
func (src *eventTimeSource) timestamp(rec *sluice.Record) (time.Time, error) {
	if src.pointer == nil {
		// Of several headers of the name the last counts, as Kafka's
		// Headers.lastHeader reads them.
		for i := len(rec.Headers) - 1; i >= 0; i-- {
			if rec.Headers[i].Key == src.header {
				return src.parse(rec.Headers[i].Value, false)
			}
		}
		return time.Time{}, fmt.Errorf("event time: the record has no %s", src.what)
	}
	v, err := lookup(rec.Value, src.pointer)
	if err != nil {
		return time.Time{}, fmt.Errorf("event time: %s: %w", src.what, err)
	}
	return src.parse(v, true)
}

// parse reads a time in the source's format from b: a JSON value (a number
// or a string) when isJSON, else text.
func (src *eventTimeSource) parse(b []byte, isJSON bool) (time.Time, error) {
	text := string(b)
	quoted := false
	if isJSON && len(b) > 0 && b[0] == '"' {
		if err := json.Unmarshal(b, &text); err != nil {
			return time.Time{}, fmt.Errorf("event time: %s: %w", src.what, err)
		}
		quoted = true
	}
	bad := func(want string) (time.Time, error) {
		return time.Time{}, fmt.Errorf("event time: %s is %.64s: want %s", src.what, b, want)
	}
	switch src.format {
	case functionv1.TimeFormat_UNIX_SECONDS:
		// A JSON number, bare or as text: strconv alone would also take
		// "0x1p30", "1_000" or "+5".
		if !jsonNumber.MatchString(text) {
			return bad("seconds since the Unix epoch, a number")
		}
		s, err := strconv.ParseFloat(text, 64)
		if ms := s * 1e3; err != nil || math.Abs(ms) >= 1<<62 {
			return bad("seconds since the Unix epoch, a number")
		}
		return time.UnixMilli(int64(math.Round(s * 1e3))).UTC(), nil
	case functionv1.TimeFormat_RFC3339:
		if isJSON && !quoted {
			return bad("RFC 3339 text, a string")
		}
		// RFC 3339's grammar first: Go's parsers also take a comma for
		// the point and one-digit hours. Its t and z may be lower case.
		if !rfc3339.MatchString(text) {
			return bad("RFC 3339 text such as 2026-12-07T16:55:00.123Z")
		}
		t, err := time.Parse(time.RFC3339Nano, strings.ToUpper(text))
		if err != nil {
			return bad("RFC 3339 text such as 2026-12-07T16:55:00.123Z")
		}
		return t, nil
	default: // UNIX_MILLIS
		if !integer.MatchString(text) {
			return bad("milliseconds since the Unix epoch, an integer")
		}
		ms, err := strconv.ParseInt(text, 10, 64)
		if err != nil {
			return bad("milliseconds since the Unix epoch, an integer")
		}
		return time.UnixMilli(ms).UTC(), nil
	}
}

var (
	// jsonNumber is RFC 8259's number.
	jsonNumber = regexp.MustCompile(`^-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?$`)
	integer    = regexp.MustCompile(`^-?[0-9]+$`)
	rfc3339    = regexp.MustCompile(`^[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?([Zz]|[-+][0-9]{2}:[0-9]{2})$`)
)

// pointerTokens parses an RFC 6901 JSON Pointer into its reference tokens:
// "" is the whole value (no token), "/a~1b/0" is ["a/b", "0"].
func pointerTokens(p string) ([]string, error) {
	if p == "" {
		return nil, nil
	}
	if p[0] != '/' {
		return nil, fmt.Errorf("JSON Pointer %q: want \"\" or one starting with /", p)
	}
	tokens := strings.Split(p[1:], "/")
	for i, t := range tokens {
		for j := 0; j < len(t); j++ {
			if t[j] == '~' && (j+1 == len(t) || t[j+1] != '0' && t[j+1] != '1') {
				return nil, fmt.Errorf("JSON Pointer %q: ~ must be followed by 0 or 1", p)
			}
		}
		tokens[i] = strings.ReplaceAll(strings.ReplaceAll(t, "~1", "/"), "~0", "~")
	}
	return tokens, nil
}

var errNotFound = errors.New("not in the value")

// lookup returns the JSON value that tokens point to in doc, as it is
// written there. Of members of the same name the last counts, as for
// encoding/json, JavaScript's JSON.parse and Python's json. It reads doc
// only as far as it must: what follows the value is not checked.
func lookup(doc []byte, tokens []string) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	if len(tokens) == 0 {
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, errNotJSON(err)
		}
		return v, nil
	}
	tok, err := dec.Token()
	if err != nil {
		return nil, errNotJSON(err)
	}
	var member json.RawMessage
	switch tok {
	case json.Delim('{'):
		member, err = memberOf(dec, tokens[0])
	case json.Delim('['):
		member, err = elementOf(dec, tokens[0])
	default:
		return nil, errNotFound // a scalar has no members
	}
	if err != nil {
		return nil, err
	}
	return lookup(member, tokens[1:])
}

func errNotJSON(err error) error { return fmt.Errorf("the value is not JSON: %w", err) }

// memberOf reads an object, after its '{', and returns the value of its
// last member named want.
func memberOf(dec *json.Decoder, want string) (json.RawMessage, error) {
	var found json.RawMessage
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			return nil, errNotJSON(err)
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, errNotJSON(err)
		}
		if k == want {
			found = v
		}
	}
	if found == nil {
		return nil, errNotFound
	}
	return found, nil
}

// elementOf reads an array, after its '[', up to its element want: a
// decimal index without leading zeros ("-", past the last element, is
// never there).
func elementOf(dec *json.Decoder, want string) (json.RawMessage, error) {
	n, err := strconv.Atoi(want)
	if err != nil || n < 0 || want != strconv.Itoa(n) {
		return nil, errNotFound
	}
	for i := 0; dec.More(); i++ {
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, errNotJSON(err)
		}
		if i == n {
			return v, nil
		}
	}
	return nil, errNotFound
}
