package join

import (
	"errors"
	"fmt"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/kstate"
)

// TableSpec declares a stream-table join of two co-partitioned topics,
// Kafka Streams' KStream-KTable join: the table topic's records are the
// table, each key's latest value (a record with a nil value deletes the
// key, as a tombstone on a compacted topic does), and each record of the
// stream topic is joined with its key's table value as of that record.
// Table records emit nothing.
type TableSpec struct {
	// Name is the job's name, and the prefix of its state name: keep it
	// stable across releases, since it is the state's identity.
	Name string
	// Stream and Table are the two input topics; the instance's
	// Options.InputTopics must be these two (co-partitioned).
	Stream, Table string
	// Join makes the value of the output record of a stream record,
	// emitted keyed by its key with its Kafka time (as Kafka Streams
	// stamps it), from the record and its key's table value
	// (found false when the table has none; the slice is valid during the
	// call only). A nil value emits nothing:
	// return nil when !found for an inner join, as Kafka Streams' join,
	// and something for a left join, as its leftJoin. An error fails the
	// stream record, which is dead-lettered (wrap it with sluice.Fatal to
	// stop the instance instead).
	Join func(key []byte, stream Element, table []byte, found bool) ([]byte, error)
}

// Table returns the sluice.Job that runs the spec, or an error saying what
// is wrong with it. Its state name is <name>.table (Job.States).
//
// "As of that record" is in the order the task takes its inputs: by Kafka
// record time, ties to the topic named first in Options.InputTopics,
// waiting at most Options.MaxTaskIdle for a topic whose records are on
// the broker but not yet fetched (docs/topology.md, "Order"). A table
// update with the same time as a stream record is seen by it when the
// table topic is named first.
func Table(s TableSpec) (sluice.Job, error) {
	if err := s.validate(); err != nil {
		return sluice.Job{}, fmt.Errorf("table join %q: %w", s.Name, err)
	}
	o := &table{spec: s, values: kstate.Value[[]byte](s.Name+".table", kstate.Bytes())}
	job := sluice.Job{
		Name:    s.Name,
		Emits:   true,
		Process: o.process,
		States:  []string{o.values.Name()},
	}
	return job, job.Validate()
}

func (s TableSpec) validate() error {
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

// topics is a join's two input topics as its spec names them, for the
// checks every join makes of its spec and of each record.
type topics struct {
	join, name string // the join's kind ("interval join") and the spec's Name
	aField, a  string // the first topic's field in the spec ("Left") and topic
	bField, b  string
	noKey      error // what a record without a key fails with
}

// check is that the spec names two topics.
func (t topics) check() error {
	switch {
	case t.a == "" || t.b == "":
		return fmt.Errorf("%s and %s must name the two input topics", t.aField, t.bField)
	case t.a == t.b:
		return fmt.Errorf("%s and %s are both %q: want two topics", t.aField, t.bField, t.a)
	}
	return nil
}

// first reports whether rec is of the first topic (a) rather than the
// second. A record of neither means the instance's InputTopics are not the
// two: it stops the instance. A record without a key fails with noKey,
// which dead-letters it.
func (t topics) first(rec *sluice.Record) (bool, error) {
	if rec.Topic != t.a && rec.Topic != t.b {
		return false, sluice.Fatal(fmt.Errorf("%s %q: a record from topic %q, which is neither %s (%q) nor %s (%q): Options.InputTopics must be the two",
			t.join, t.name, rec.Topic, t.aField, t.a, t.bField, t.b))
	}
	if rec.Key == nil {
		return false, t.noKey
	}
	return rec.Topic == t.a, nil
}

// table runs a TableSpec.
type table struct {
	spec   TableSpec
	values *kstate.ValueState[[]byte]
}

// errTableNoKey fails a record without a key.
var errTableNoKey = errors.New("join: a record without a key has no table value to join or to be")

func (s TableSpec) topics() topics {
	return topics{"table join", s.Name, "Stream", s.Stream, "Table", s.Table, errTableNoKey}
}

func (o *table) process(ctx sluice.Context, rec *sluice.Record) error {
	stream, err := o.spec.topics().first(rec)
	if err != nil {
		return err
	}
	if !stream {
		if rec.Value == nil {
			return o.values.Clear(ctx)
		}
		return o.values.Set(ctx, rec.Value)
	}
	v, found, err := o.values.Get(ctx)
	if err != nil {
		return err
	}
	out, err := o.spec.Join(rec.Key, Element{Value: rec.Value, Timestamp: rec.Timestamp, Partition: rec.Partition, Offset: rec.Offset}, v, found)
	if err != nil {
		return err
	}
	if out != nil {
		ctx.Emit(rec.Key, out)
	}
	return nil
}
