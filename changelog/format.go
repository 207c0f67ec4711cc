package changelog

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/sluicehq/sluice/kstate"
)

// EpochHeader is the record header carrying the epoch (8 bytes, big endian)
// on every changelog record, for debugging and tooling.
const EpochHeader = "sluice.epoch"

// Marker value formats: 3 adds the job's name and the sink transaction; 2
// the watermark; 1 and 2 are still read.
const (
	markerFormatV1 byte = 1
	markerFormatV2 byte = 2
	markerFormat   byte = 3
)

// MarkerKey is the key of every epoch marker.
var MarkerKey = kstate.EncodeKey(kstate.KindMarker, "", nil, nil)

// ErrBadMarker is returned (wrapped) for a marker value that does not decode.
var ErrBadMarker = errors.New("changelog: bad epoch marker")

// Marker ends a task's epoch in its changelog partition: the epoch number
// and, per input topic, the next offset of the task's partition to read.
// Offsets are operator state: they commit in the same transaction as the
// state changes they reflect.
type Marker struct {
	Epoch   uint64
	Offsets map[string]int64
	// Watermark is the task's event-time watermark as of the epoch (zero
	// when it has none): a restore from the changelog alone resumes event
	// time where the committed outputs left it.
	Watermark time.Time
	// Job is the name of the job that wrote the epoch ("" in markers of
	// format 2 and older), so that a savepoint taken from Kafka alone
	// knows whose state it holds.
	Job string
	// SinkTxn identifies the epoch's transaction in an outside sink
	// (txsink), "" when the epoch wrote nothing there: committing the
	// marker is what decides that transaction's fate.
	SinkTxn string
}

// IsMarker reports whether a changelog key is an epoch marker's.
func IsMarker(key []byte) bool {
	return len(key) >= 2 && key[0] == kstate.FormatV1 && kstate.Kind(key[1]) == kstate.KindMarker
}

// EncodeMarker encodes m: [format][uvarint epoch][uvarint n] then n times
// [uvarint len][topic][varint offset], topics sorted so equal markers encode
// equally, then [flags: bit 0 watermark][varint watermark, unix ms, if set],
// then [uvarint len][job][uvarint len][sink transaction].
func EncodeMarker(m Marker) []byte {
	topics := make([]string, 0, len(m.Offsets))
	for t := range m.Offsets {
		topics = append(topics, t)
	}
	sort.Strings(topics)
	b := make([]byte, 0, 16+len(topics)*24)
	b = append(b, markerFormat)
	b = binary.AppendUvarint(b, m.Epoch)
	b = binary.AppendUvarint(b, uint64(len(topics)))
	for _, t := range topics {
		b = binary.AppendUvarint(b, uint64(len(t)))
		b = append(b, t...)
		b = binary.AppendVarint(b, m.Offsets[t])
	}
	if m.Watermark.IsZero() {
		b = append(b, 0)
	} else {
		b = append(b, 1)
		b = binary.AppendVarint(b, m.Watermark.UnixMilli())
	}
	b = appendString(b, m.Job)
	return appendString(b, m.SinkTxn)
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// readString decodes appendString's form from b, returning the rest.
func readString(b []byte, what string) (string, []byte, error) {
	l, n := binary.Uvarint(b)
	if n <= 0 || l > uint64(len(b)-n) {
		return "", nil, fmt.Errorf("%w: %s", ErrBadMarker, what)
	}
	return string(b[n : n+int(l)]), b[n+int(l):], nil
}

// DecodeMarker decodes a marker value, strictly.
func DecodeMarker(b []byte) (Marker, error) {
	if len(b) == 0 || b[0] < markerFormatV1 || b[0] > markerFormat {
		return Marker{}, fmt.Errorf("%w: unknown format", ErrBadMarker)
	}
	format := b[0]
	b = b[1:]
	epoch, n := binary.Uvarint(b)
	if n <= 0 {
		return Marker{}, fmt.Errorf("%w: epoch", ErrBadMarker)
	}
	b = b[n:]
	count, n := binary.Uvarint(b)
	if n <= 0 || count > uint64(len(b)) {
		return Marker{}, fmt.Errorf("%w: topic count", ErrBadMarker)
	}
	b = b[n:]
	m := Marker{Epoch: epoch, Offsets: make(map[string]int64, count)}
	for i := uint64(0); i < count; i++ {
		l, n := binary.Uvarint(b)
		if n <= 0 || l > uint64(len(b)-n) {
			return Marker{}, fmt.Errorf("%w: topic length", ErrBadMarker)
		}
		topic := string(b[n : n+int(l)])
		b = b[n+int(l):]
		off, n := binary.Varint(b)
		if n <= 0 {
			return Marker{}, fmt.Errorf("%w: offset of %q", ErrBadMarker, topic)
		}
		b = b[n:]
		if _, dup := m.Offsets[topic]; dup {
			return Marker{}, fmt.Errorf("%w: topic %q twice", ErrBadMarker, topic)
		}
		m.Offsets[topic] = off
	}
	if format >= markerFormatV2 {
		if len(b) == 0 || b[0] > 1 {
			return Marker{}, fmt.Errorf("%w: flags", ErrBadMarker)
		}
		has := b[0] == 1
		b = b[1:]
		if has {
			wm, n := binary.Varint(b)
			if n <= 0 {
				return Marker{}, fmt.Errorf("%w: watermark", ErrBadMarker)
			}
			m.Watermark = time.UnixMilli(wm)
			b = b[n:]
		}
	}
	if format >= markerFormat {
		var err error
		if m.Job, b, err = readString(b, "job"); err != nil {
			return Marker{}, err
		}
		if m.SinkTxn, b, err = readString(b, "sink transaction"); err != nil {
			return Marker{}, err
		}
	}
	if len(b) != 0 {
		return Marker{}, fmt.Errorf("%w: %d trailing bytes", ErrBadMarker, len(b))
	}
	return m, nil
}

// EncodeEpoch is the EpochHeader value for epoch.
func EncodeEpoch(epoch uint64) []byte {
	return binary.BigEndian.AppendUint64(nil, epoch)
}
