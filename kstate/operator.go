package kstate

import (
	"encoding/binary"
	"fmt"
)

// TaskScope is a Scope that knows its task (sluice.Context is one): what
// operator state needs, since it belongs to a task, not to a record key.
type TaskScope interface {
	Scope
	Task() int32
}

// Operator list modes: the first byte of an operator entry's tail, then the
// task that wrote it (4 bytes, big endian).
const (
	// OperatorSplit entries are Flink's ListState of an operator: on a
	// rescale each goes to one task.
	OperatorSplit byte = 's'
	// OperatorUnion entries are Flink's UnionListState: on a restore from
	// a savepoint every task gets every task's.
	OperatorUnion byte = 'u'
)

// OperatorEntry decodes an operator entry's tail: its mode (OperatorSplit,
// OperatorUnion, OperatorBroadcast, OperatorPosition) and, for a list, the
// task that wrote it (-1 otherwise).
func OperatorEntry(k Key) (mode byte, task int32, err error) {
	if k.Kind != KindOperator || len(k.Sub) == 0 {
		return 0, 0, fmt.Errorf("%w: not an operator entry", ErrBadKey)
	}
	switch mode := k.Sub[0]; {
	case mode == OperatorBroadcast:
		return mode, -1, nil
	case mode == OperatorPosition && len(k.Sub) == 5:
		return mode, -1, nil
	case (mode == OperatorSplit || mode == OperatorUnion) && len(k.Sub) == 5:
		return mode, int32(binary.BigEndian.Uint32(k.Sub[1:])), nil
	}
	return 0, 0, fmt.Errorf("%w: operator entry of an unknown form", ErrBadKey)
}

// OperatorListState is a list per task, not per record key: Flink's
// operator ListState (OperatorList) and UnionListState (UnionList). It is
// changelogged, restored and saved like keyed state. A task's own list is
// one entry; what a restore from a savepoint gave the task (another task's
// list after a rescale, every task's for a union list) are entries of their
// own, which Get reads with the task's and the next write folds into the
// task's one entry.
//
// A task's failover restores it from its own changelog, so it gets its own
// list back, not the union: Sluice's failovers are per task, where Flink
// restarts the whole job.
type OperatorListState[T any] struct {
	d     descriptor
	mode  byte
	codec Codec[T]
}

// OperatorList declares a task's list that a rescale through a savepoint
// deals out: each task's list goes to one task of the new count.
func OperatorList[T any](name string, c Codec[T]) *OperatorListState[T] {
	return newOperatorList(name, OperatorSplit, c)
}

// UnionList declares a task's list of which, on a restore from a savepoint,
// every task gets the union of all the tasks' lists.
func UnionList[T any](name string, c Codec[T]) *OperatorListState[T] {
	return newOperatorList(name, OperatorUnion, c)
}

func newOperatorList[T any](name string, mode byte, c Codec[T]) *OperatorListState[T] {
	d := newDescriptor("operator list", name, nil)
	d.kind = KindOperator
	mustCodec("operator list", name, "codec", c)
	return &OperatorListState[T]{d: d, mode: mode, codec: c}
}

// Name returns the state's name.
func (l *OperatorListState[T]) Name() string { return l.d.name }

func (l *OperatorListState[T]) prefix() []byte { return EncodeKey(KindOperator, l.d.name, nil, nil) }

func (l *OperatorListState[T]) own(s TaskScope) []byte {
	return operatorKey(l.d.name, l.mode, s.Task())
}

func operatorKey(name string, mode byte, task int32) []byte {
	return EncodeKey(KindOperator, name, nil, binary.BigEndian.AppendUint32([]byte{mode}, uint32(task)))
}

// UnionEntryKey is the key of the union list name's entry of task.
func UnionEntryKey(name string, task int32) []byte { return operatorKey(name, OperatorUnion, task) }

// Get returns the task's list: its own elements and those a restore gave
// it, nil if there are none.
func (l *OperatorListState[T]) Get(s TaskScope) ([]T, error) {
	var out []T
	err := s.Store().Scan(l.prefix(), func(_, raw []byte) error {
		for len(raw) > 0 {
			elem, rest, err := nextElement(raw)
			if err != nil {
				return err
			}
			v, err := decode(&l.d, l.codec, elem)
			if err != nil {
				return err
			}
			out = append(out, v)
			raw = rest
		}
		return nil
	})
	return out, l.d.wrap("read", err)
}

// Update replaces the task's list with vs; an empty vs clears it.
func (l *OperatorListState[T]) Update(s TaskScope, vs []T) error {
	if err := l.Clear(s); err != nil {
		return err
	}
	if len(vs) == 0 {
		return nil
	}
	buf, err := encodeElements(&l.d, l.codec, vs)
	if err != nil {
		return err
	}
	return l.d.save(s, l.own(s), buf)
}

// Add appends v to the task's list.
func (l *OperatorListState[T]) Add(s TaskScope, v T) error {
	vs, err := l.Get(s)
	if err != nil {
		return err
	}
	return l.Update(s, append(vs, v))
}

// Clear deletes the task's list, and what a restore gave it.
func (l *OperatorListState[T]) Clear(s TaskScope) error {
	st := s.Store()
	var keys [][]byte
	err := st.Scan(l.prefix(), func(k, _ []byte) error {
		keys = append(keys, append([]byte(nil), k...))
		return nil
	})
	for _, k := range keys {
		st.Delete(k)
	}
	return l.d.wrap("clear", err)
}
