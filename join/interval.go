package join

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/late"
	"github.com/sluicehq/sluice/kstate"
)

// IntervalSpec declares an interval join of two co-partitioned topics,
// Flink's IntervalJoin (Kafka Streams' KStream-KStream join with its
// JoinWindows): a left record and a right record of the same key join when
// the right's event time lies within [left + Lower, left + Upper], both
// ends included. It is inner unless LeftUnmatched or RightUnmatched is
// set.
type IntervalSpec struct {
	// Name is the job's name, and the prefix of its state names: keep it
	// stable across releases, since it is the state's identity.
	Name string
	// Left and Right are the two input topics; the instance's
	// Options.InputTopics must be these two (co-partitioned), in any
	// order.
	Left, Right string
	// Lower and Upper bound the right record's event time relative to the
	// left's, in whole milliseconds; Lower <= Upper, and either may be
	// negative. Lower -5s, Upper 5s joins records at most five seconds
	// apart either way.
	Lower, Upper time.Duration
	// Join makes the value of the output record of one pair, emitted keyed
	// by their key and stamped with the later of the pair's two event
	// times, as Flink and Kafka Streams stamp it; a nil value emits
	// nothing for the pair (a filter). An
	// error fails the record being processed, which is dead-lettered with
	// none of its pairs emitted and not buffered (wrap it with
	// sluice.Fatal to stop the instance instead).
	Join func(key []byte, left, right Element) ([]byte, error)
	// Timestamp gives a record's event time (sluice.KafkaTime takes the
	// Kafka record time).
	Timestamp sluice.TimestampFunc
	// LateOutput, if set, is the side output that late records (event
	// time before the watermark) go to, unchanged but for one more
	// header, sluice.HeaderTopic, naming the topic (the side) each came
	// from. Unset, they are dropped and counted (state <name>.late-dropped
	// per key, and LateDropped).
	LateOutput sluice.OutputTag
	// LateDropped, if set, is incremented for each late record dropped
	// (committed or not: a replayed epoch counts again).
	LateDropped prometheus.Counter
	// LeftUnmatched, if set, makes the join a left outer join (with
	// RightUnmatched, a full outer one): each left record that joined no
	// right record is emitted once no right record can join it any more,
	// when the watermark passes its time + Upper, as Flink SQL's outer
	// interval join and Kafka Streams' leftJoin emit it. The function
	// makes the output's value, keyed by the record's key and stamped with
	// its event time; nil emits nothing. A record joined a right record
	// when one was within the bounds, whatever Join returned for the pair.
	// Late records go to LateOutput (or are counted), not here.
	LeftUnmatched func(key []byte, left Element) []byte
	// RightUnmatched is LeftUnmatched for right records (a right outer
	// join, or with LeftUnmatched a full outer one), emitted when the
	// watermark passes their time − Lower.
	RightUnmatched func(key []byte, right Element) []byte
}

// Element is a record being joined: its value and time, and where it was
// read. The record's headers are not kept.
type Element struct {
	Value []byte
	// Timestamp is the record's event time (IntervalSpec.Timestamp) in an
	// interval join, its Kafka record time in a table join; in a window
	// join its event time (WindowSpec.Timestamp), or in processing time
	// its Kafka record time.
	Timestamp time.Time
	// Partition and Offset are where the record was read in its topic.
	Partition int32
	Offset    int64
}

// Interval returns the sluice.Job that runs the spec, or an error saying
// what is wrong with it. Its state names are <name>.left, <name>.right
// and <name>.late-dropped, and for an outer join <name>.left-matched or
// <name>.right-matched or both (Job.States).
func Interval(s IntervalSpec) (sluice.Job, error) {
	if err := s.validate(); err != nil {
		return sluice.Job{}, fmt.Errorf("interval join %q: %w", s.Name, err)
	}
	o := &interval{
		spec:  s,
		lower: s.Lower.Milliseconds(),
		upper: s.Upper.Milliseconds(),
		// A left entry at t can join rights up to t+Upper, a right one at
		// s lefts down to s-Lower.
		left:    newSide(s.Name+".left", s.Upper.Milliseconds(), s.LeftUnmatched),
		right:   newSide(s.Name+".right", -s.Lower.Milliseconds(), s.RightUnmatched),
		dropped: kstate.Value[int64](s.Name+".late-dropped", kstate.Int64()),
	}
	job := sluice.Job{
		Name:      s.Name,
		Emits:     true,
		Process:   o.process,
		OnTimer:   o.onTimer,
		EventTime: true,
		Timestamp: s.Timestamp,
		States:    []string{o.left.entries.Name(), o.right.entries.Name(), o.dropped.Name()},
	}
	for _, sd := range []side{o.left, o.right} {
		if sd.matched != nil {
			job.States = append(job.States, sd.matched.Name())
		}
	}
	if s.LateOutput != "" {
		job.SideOutputs = []sluice.OutputTag{s.LateOutput}
	}
	return job, job.Validate()
}

func (s IntervalSpec) validate() error {
	if s.Name == "" {
		return errors.New("Name is empty")
	}
	if err := s.topics().check(); err != nil {
		return err
	}
	switch {
	case s.Lower > s.Upper:
		return fmt.Errorf("Lower %s is after Upper %s", s.Lower, s.Upper)
	case s.Lower%time.Millisecond != 0 || s.Upper%time.Millisecond != 0:
		return fmt.Errorf("Lower %s and Upper %s: want whole milliseconds (event time is in milliseconds)", s.Lower, s.Upper)
	case s.Join == nil:
		return errors.New("Join is nil")
	case s.Timestamp == nil:
		return errors.New("Timestamp is nil (sluice.KafkaTime takes the Kafka record time)")
	}
	return nil
}

// interval runs an IntervalSpec. Each key keeps its buffered records per
// side, in a map from (event time, offset) to value, so that entries come
// back in time order and a replay finds the same ones; and an event-time
// timer at each entry's cleanup time, once the watermark is past which no
// record the entry could join can come:
//
//	left at t:  right records of time s with t+Lower <= s <= t+Upper;
//	            cleaned once the watermark passes t+Upper
//	right at s: left records of time t with s-Upper <= t <= s-Lower;
//	            cleaned once the watermark passes s-Lower
//
// A record later than the watermark (a time before it) is late: it would
// find its partners cleaned, so it joins nothing and goes to LateOutput or
// is counted. Each pair is emitted once, by the later of its two records:
// the earlier is still buffered then, since the later one is not late. In
// an outer join, a side's entries that joined are marked (side.matched),
// and the others are emitted unmatched as they are cleaned.
type interval struct {
	spec         IntervalSpec
	lower, upper int64 // milliseconds
	left, right  side
	dropped      *kstate.ValueState[int64]
}

// side is one side's buffered entries, and how long past its time an entry
// can still join a record of the other side (milliseconds): its cleanup
// time is its time plus keep. In an outer join on the side, unmatched makes
// the output of an entry that joined nothing, and matched marks the
// entries that joined (by entry key; the value is one byte); both are nil
// otherwise.
type side struct {
	entries   *kstate.MapState[string, []byte]
	keep      int64
	unmatched func(key []byte, e Element) []byte
	matched   *kstate.MapState[string, []byte]
}

func newSide(name string, keep int64, unmatched func([]byte, Element) []byte) side {
	s := side{entries: kstate.Map[string, []byte](name, kstate.String(), kstate.Bytes()), keep: keep, unmatched: unmatched}
	if unmatched != nil {
		s.matched = kstate.Map[string, []byte](name+"-matched", kstate.String(), kstate.Bytes())
	}
	return s
}

// marked is the value of a matched mark.
var marked = []byte{1}

// markMatched marks the entry of key k matched, once.
func (s side) markMatched(ctx sluice.Context, k string) error {
	if s.matched == nil {
		return nil
	}
	_, ok, err := s.matched.Get(ctx, k)
	if err != nil || ok {
		return err
	}
	return s.matched.Put(ctx, k, marked)
}

func (s IntervalSpec) topics() topics {
	return topics{"interval join", s.Name, "Left", s.Left, "Right", s.Right, errNoKey}
}

func (o *interval) process(ctx sluice.Context, rec *sluice.Record) error {
	isLeft, err := o.spec.topics().first(rec)
	if err != nil {
		return err
	}
	ts := ctx.Timestamp().UnixMilli()
	wm := ctx.CurrentWatermark() // the zero time before the task has one
	if !wm.IsZero() && ts < wm.UnixMilli() {
		return o.late(ctx, rec)
	}
	me := Element{Value: rec.Value, Timestamp: time.UnixMilli(ts), Partition: rec.Partition, Offset: rec.Offset}
	// The other side's entries this record joins, in time order.
	mine, others, lo, hi := o.left, o.right, ts+o.lower, ts+o.upper
	if !isLeft {
		mine, others, lo, hi = o.right, o.left, ts-o.upper, ts-o.lower
	}
	// Entries come in the map's encoded key order, which is time, then
	// partition and offset (TestEntryKeyOrderAndRoundTrip): the early stop
	// rests on it, and the pairs come out in that order.
	var pairs []entry
	err = others.entries.Entries(ctx, func(k string, v []byte) error {
		e, err := decodeEntry(k, v)
		if err != nil {
			return err
		}
		if t := e.Timestamp.UnixMilli(); t > hi {
			return errStop
		} else if t >= lo {
			pairs = append(pairs, entry{k, e})
		}
		return nil
	})
	if err != nil && !errors.Is(err, errStop) {
		return err
	}
	key := rec.Key
	for _, pe := range pairs {
		// In an outer join on the other side, the entry joined.
		if err := others.markMatched(ctx, pe.k); err != nil {
			return err
		}
		p := pe.e
		l, r := me, p
		if !isLeft {
			l, r = p, me
		}
		v, err := o.spec.Join(key, l, r)
		if err != nil {
			return err
		}
		if v == nil {
			continue
		}
		// The pair's time is the later of its two, as in Flink and
		// Kafka Streams; ctx's is me's.
		if p.Timestamp.After(me.Timestamp) {
			sluice.WithTimestamp(ctx, p.Timestamp).Emit(key, v)
		} else {
			ctx.Emit(key, v)
		}
	}
	// The entry goes once the watermark passes its cleanup time, that is
	// reaches the next millisecond; one already past it (a negative bound
	// can make it so) could join no record to come, and is not kept.
	due := timerTime(ts + mine.keep)
	if !wm.IsZero() && due <= wm.UnixMilli() {
		// Nothing can join it later: in an outer join on its side, it
		// is unmatched now if it joined nothing now.
		if len(pairs) == 0 && mine.unmatched != nil {
			emitUnmatched(ctx, mine, key, me)
		}
		return nil
	}
	k := entryKey(ts, rec.Partition, rec.Offset)
	// Put copies the value into the store (the Bytes codec appends).
	if err := mine.entries.Put(ctx, k, rec.Value); err != nil {
		return err
	}
	if len(pairs) > 0 && mine.matched != nil {
		// It joined already (and was not buffered before).
		if err := mine.matched.Put(ctx, k, marked); err != nil {
			return err
		}
	}
	ctx.Timers().RegisterEventTime(time.UnixMilli(due))
	return nil
}

// emitUnmatched emits the output of side s's entry e that joined nothing,
// stamped with its time.
func emitUnmatched(ctx sluice.Context, s side, key []byte, e Element) {
	if v := s.unmatched(key, e); v != nil {
		sluice.WithTimestamp(ctx, e.Timestamp).Emit(key, v)
	}
}

// errNoKey fails a record without a key. Unkeyed records land on any
// partition: which would pair up is arbitrary. Kafka Streams drops them
// from inner joins (since 3.7 its outer joins emit them unmatched), Flink
// refuses them; here they are dead-lettered, saying why.
var errNoKey = errors.New("join: a record without a key joins nothing (its partition, so its partners, would be arbitrary)")

// errStop ends a scan of a side's entries early.
var errStop = errors.New("stop")

// timerTime is the time of the timer that cleans entries of cleanup time
// ms: the millisecond after it (timers fire when the watermark reaches
// them), and never before 0: the engine keeps no timer before 1970, so
// entries due before then stay until the watermark reaches 1970.
func timerTime(ms int64) int64 {
	if ms == math.MaxInt64 {
		return ms
	}
	return max(ms+1, 0)
}

// onTimer drops the key's entries whose cleanup time the watermark passed.
func (o *interval) onTimer(ctx sluice.Context, t sluice.Timer) error {
	if t.Domain != sluice.EventTime {
		return fmt.Errorf("interval join %q: a %s timer, which it never registers", o.spec.Name, t.Domain)
	}
	at := t.At.UnixMilli()
	if err := o.left.clean(ctx, at); err != nil {
		return err
	}
	return o.right.clean(ctx, at)
}

// clean drops the entries whose timer is at or before at: those of time t
// with timerTime(t + keep) <= at. In an outer join on the side, those that
// joined nothing are emitted first, in time order.
func (s side) clean(ctx sluice.Context, at int64) error {
	var gone []entry
	err := s.entries.Entries(ctx, func(k string, v []byte) error {
		e, err := decodeEntry(k, v)
		if err != nil {
			return err
		}
		if due := timerTime(e.Timestamp.UnixMilli() + s.keep); due > at {
			// Entries come in time order, and so do their cleanup
			// times. The first not due has a timer of its own, unless
			// the bounds changed since it was buffered (a restart with
			// another Lower or Upper): then it gets one, so that it is
			// cleaned (and, unmatched, emitted) all the same.
			tm := sluice.Timer{Domain: sluice.EventTime, At: time.UnixMilli(due), Key: ctx.Key()}
			has, err := kstate.HasTimer(ctx.Store(), tm)
			if err == nil && !has {
				ctx.Timers().RegisterEventTime(tm.At)
			}
			if err != nil {
				return err
			}
			return errStop
		}
		gone = append(gone, entry{k, e}) // the codec decoded a copy of v
		return nil
	})
	if err != nil && !errors.Is(err, errStop) {
		return err
	}
	for _, g := range gone {
		if s.matched != nil {
			_, joined, err := s.matched.Get(ctx, g.k)
			if err != nil {
				return err
			}
			if joined {
				if err := s.matched.Remove(ctx, g.k); err != nil {
					return err
				}
			} else {
				emitUnmatched(ctx, s, ctx.Key(), g.e)
			}
		}
		if err := s.entries.Remove(ctx, g.k); err != nil {
			return err
		}
	}
	return nil
}

// entry is a buffered record: its map key and what it holds.
type entry struct {
	k string
	e Element
}

// decodeEntry is the Element of the entry of map key k and value v.
func decodeEntry(k string, v []byte) (Element, error) {
	t, p, off, err := decodeEntryKey(k)
	if err != nil {
		return Element{}, err
	}
	return Element{Value: v, Timestamp: time.UnixMilli(t), Partition: p, Offset: off}, nil
}

// late handles a record whose time is before the watermark.
func (o *interval) late(ctx sluice.Context, rec *sluice.Record) error {
	return late.Handle(ctx, rec, o.spec.LateOutput, o.dropped, o.spec.LateDropped)
}

// entryKey is a buffered record's map key: its event time (unix ms, the
// sign bit flipped so that the bytes sort as the numbers do), its
// partition and its offset, big-endian, 20 bytes. The partition keeps
// entries apart after a rescale, when a key's buffer moves to a partition
// whose offsets overlap its old one's. It is durable state: savepoints
// carry it.
func entryKey(ts int64, partition int32, offset int64) string {
	var b [entryKeyLen]byte
	binary.BigEndian.PutUint64(b[:8], uint64(ts)^(1<<63))
	binary.BigEndian.PutUint32(b[8:12], uint32(partition))
	binary.BigEndian.PutUint64(b[12:], uint64(offset))
	return string(b[:])
}

const entryKeyLen = 20

func decodeEntryKey(k string) (ts int64, partition int32, offset int64, err error) {
	if len(k) != entryKeyLen {
		return 0, 0, 0, fmt.Errorf("join: a buffered entry's key of %d bytes, want %d (event time, partition, offset): the state is not an interval join's", len(k), entryKeyLen)
	}
	b := []byte(k)
	return int64(binary.BigEndian.Uint64(b[:8]) ^ (1 << 63)), int32(binary.BigEndian.Uint32(b[8:12])), int64(binary.BigEndian.Uint64(b[12:])), nil
}
