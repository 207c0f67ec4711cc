package join

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/kstate"
)

// TableTableSpec declares a table-table join of two co-partitioned topics,
// Kafka Streams' KTable-KTable join: each topic's records are a table, each
// key's latest value (a record with a nil value deletes the key, as a
// tombstone on a compacted topic does), and the output is the joined table,
// updated at every change of either side: a record for each key whose
// joined row is or was there, a tombstone (nil value) when it goes.
type TableTableSpec struct {
	// Name is the job's name, and the prefix of its state names: keep it
	// stable across releases, since it is the state's identity.
	Name string
	// Left and Right are the two input topics; the instance's
	// Options.InputTopics must be these two (co-partitioned).
	Left, Right string
	// LeftOuter makes a key with a left value and no right one a row too
	// (Kafka Streams' leftJoin); with RightOuter, a key with either (its
	// outerJoin). Neither: an inner join, a row for keys with both.
	LeftOuter, RightOuter bool
	// Join makes the joined row's value from the key's current values,
	// nil for a side that has none (only in an outer join). It is called
	// after each update of either side that leaves the key a row, and the
	// output is keyed by the key and stamped with the later of the two
	// values' record times. A nil value is a tombstone, as Kafka Streams'
	// joiner returning null. An error fails the update's record, which is
	// dead-lettered and changes nothing (wrap it with sluice.Fatal to
	// stop the instance instead).
	Join func(key []byte, left, right *Element) ([]byte, error)
}

// TableTable returns the sluice.Job that runs the spec, or an error saying
// what is wrong with it. Its state names are <name>.left and <name>.right
// (Job.States): each side's current value with its record's time,
// partition and offset.
//
// An update that leaves no row where there was one (a delete, or in an
// inner join a value whose other side is gone) emits a tombstone for the
// key; one that leaves no row where there was none emits nothing. Updates
// are taken in the order the task takes its inputs: by Kafka record time,
// ties to the topic named first in Options.InputTopics, waiting at most
// Options.MaxTaskIdle for a topic whose records are on the broker but not
// yet fetched (docs/topology.md, "Order").
func TableTable(s TableTableSpec) (sluice.Job, error) {
	if err := s.validate(); err != nil {
		return sluice.Job{}, fmt.Errorf("table-table join %q: %w", s.Name, err)
	}
	o := &tableTable{
		spec:  s,
		left:  kstate.Value[Element](s.Name+".left", elementCodec{}),
		right: kstate.Value[Element](s.Name+".right", elementCodec{}),
	}
	job := sluice.Job{
		Name:    s.Name,
		Emits:   true,
		Process: o.process,
		States:  []string{o.left.Name(), o.right.Name()},
	}
	return job, job.Validate()
}

func (s TableTableSpec) validate() error {
	if s.Name == "" {
		return errors.New("Name is empty")
	}
	if err := s.topics().check(); err != nil {
		return err
	}
	if s.Join == nil {
		return errors.New("Join is nil")
	}
	return nil
}

// tableTable runs a TableTableSpec.
type tableTable struct {
	spec        TableTableSpec
	left, right *kstate.ValueState[Element]
}

// row reports whether a key with these sides is a row of the joined table.
func (o *tableTable) row(left, right bool) bool {
	return left && right || left && o.spec.LeftOuter || right && o.spec.RightOuter
}

func (s TableTableSpec) topics() topics {
	return topics{"table-table join", s.Name, "Left", s.Left, "Right", s.Right, errTableNoKey}
}

func (o *tableTable) process(ctx sluice.Context, rec *sluice.Record) error {
	isLeft, err := o.spec.topics().first(rec)
	if err != nil {
		return err
	}
	mine, other := o.left, o.right
	if !isLeft {
		mine, other = o.right, o.left
	}
	_, had, err := mine.Get(ctx)
	if err != nil {
		return err
	}
	theirs, has, err := other.Get(ctx)
	if err != nil {
		return err
	}
	me := Element{Value: rec.Value, Timestamp: rec.Timestamp, Partition: rec.Partition, Offset: rec.Offset}
	present := rec.Value != nil
	if present {
		err = mine.Set(ctx, me)
	} else {
		err = mine.Clear(ctx)
	}
	if err != nil {
		return err
	}
	// The sides as left and right, before the update and after.
	l0, r0, l1, r1 := had, has, present, has
	if !isLeft {
		l0, r0, l1, r1 = has, had, has, present
	}
	wasRow, isRow := o.row(l0, r0), o.row(l1, r1)
	at := rec.Timestamp
	if has && theirs.Timestamp.After(at) {
		at = theirs.Timestamp
	}
	switch {
	case isRow:
		var l, r *Element
		if present {
			l = &me
		}
		if has {
			r = &theirs
		}
		if !isLeft {
			l, r = r, l
		}
		v, err := o.spec.Join(rec.Key, l, r)
		if err != nil {
			return err
		}
		sluice.WithTimestamp(ctx, at).Emit(rec.Key, v)
	case wasRow:
		sluice.WithTimestamp(ctx, at).Emit(rec.Key, nil) // the row is gone
	}
	return nil
}

// elementCodec stores an Element: a version byte (1), its time (unix ms),
// partition and offset, big-endian, then its value. It is durable state:
// savepoints carry it.
type elementCodec struct{}

const (
	elementVersion = 1
	elementHeader  = 1 + 8 + 4 + 8
)

func (elementCodec) Encode(e Element) ([]byte, error) {
	return elementCodec{}.AppendEncode(nil, e)
}

func (elementCodec) AppendEncode(dst []byte, e Element) ([]byte, error) {
	dst = append(dst, elementVersion)
	dst = binary.BigEndian.AppendUint64(dst, uint64(e.Timestamp.UnixMilli()))
	dst = binary.BigEndian.AppendUint32(dst, uint32(e.Partition))
	dst = binary.BigEndian.AppendUint64(dst, uint64(e.Offset))
	return append(dst, e.Value...), nil
}

func (elementCodec) Decode(b []byte) (Element, error) {
	switch {
	case len(b) < elementHeader:
		return Element{}, fmt.Errorf("join: a stored element of %d bytes, want at least %d", len(b), elementHeader)
	case b[0] != elementVersion:
		return Element{}, fmt.Errorf("join: a stored element of version %d, want %d", b[0], elementVersion)
	}
	b = b[1:]
	return Element{
		Timestamp: time.UnixMilli(int64(binary.BigEndian.Uint64(b))),
		Partition: int32(binary.BigEndian.Uint32(b[8:])),
		Offset:    int64(binary.BigEndian.Uint64(b[12:])),
		Value:     append([]byte{}, b[elementHeader-1:]...),
	}, nil
}
