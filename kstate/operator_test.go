package kstate_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/sluicehq/sluice/kstate"
	"github.com/sluicehq/sluice/kstate/kstatetest"
)

// taskScope is a kstatetest.Scope of a given task.
type taskScope struct {
	*kstatetest.Scope
	task int32
}

func (s taskScope) Task() int32 { return s.task }

func TestOperatorList(t *testing.T) {
	for _, kind := range []string{"memory", "bbolt"} {
		t.Run(kind, func(t *testing.T) {
			st := kstate.NewStore(kstatetest.MustOpen(t, kind))
			sc := kstatetest.NewScope(st)
			sc.SetKey("some record key") // operator state ignores it
			task := taskScope{sc, 3}
			split := kstate.OperatorList("offsets", kstate.Int64())
			union := kstate.UnionList("seen", kstate.String())
			for i := range int64(3) {
				if err := split.Add(task, i); err != nil {
					t.Fatal(err)
				}
			}
			if err := union.Update(task, []string{"a", "b"}); err != nil {
				t.Fatal(err)
			}
			st.CommitRecord()
			if got, err := split.Get(task); err != nil || fmt.Sprint(got) != "[0 1 2]" {
				t.Fatalf("split = %v, %v", got, err)
			}
			// Another record key reads the same list: it is the task's.
			sc.SetKey("other")
			if got, err := union.Get(task); err != nil || fmt.Sprint(got) != "[a b]" {
				t.Fatalf("union = %v, %v", got, err)
			}
			// Each list is one entry named after its mode and the task.
			n := 0
			err := st.Scan(kstate.EncodeKey(kstate.KindOperator, "", nil, nil)[:2], func(k, _ []byte) error {
				key, err := kstate.DecodeKey(k)
				if err != nil {
					return err
				}
				mode, writer, err := kstate.OperatorEntry(key)
				if err != nil || writer != 3 || (key.Name == "seen") != (mode == kstate.OperatorUnion) {
					return fmt.Errorf("entry %+v: mode %c task %d (%v)", key, mode, writer, err)
				}
				n++
				return nil
			})
			if err != nil || n != 2 {
				t.Fatalf("%d operator entries (%v), want 2", n, err)
			}
			if err := split.Clear(task); err != nil {
				t.Fatal(err)
			}
			if got, _ := split.Get(task); got != nil {
				t.Fatalf("after Clear: %v", got)
			}
		})
	}
}

// Broadcast state is written only by the broadcast handler: a write from any
// other scope is refused, and fails the record.
func TestBroadcastReadOnly(t *testing.T) {
	st := kstate.NewStore(kstatetest.MustOpen(t, "memory"))
	sc := kstatetest.NewScope(st)
	table := kstate.Broadcast("table", kstate.Int64())
	if err := table.Put(sc, "k", 1); !errors.Is(err, kstate.ErrBroadcastReadOnly) || !errors.Is(st.RecordErr(), kstate.ErrBroadcastReadOnly) {
		t.Fatalf("Put = %v, record error %v: want ErrBroadcastReadOnly", err, st.RecordErr())
	}
	if _, ok, err := table.Get(sc, "k"); ok || err != nil {
		t.Fatalf("Get after a refused Put: %v, %v", ok, err)
	}
}
