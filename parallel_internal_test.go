package sluice

import (
	"errors"
	"sync"
	"testing"
)

// With Parallelism n, n tasks are processed at once: each task's work waits
// until all n are inside, which only parallel workers get past. What they
// report is merged: every rewind, worked if any worked.
func TestEachTaskRunsTasksAtOnce(t *testing.T) {
	const n = 4
	l := &loop{in: &Instance{cfg: Options{Parallelism: n}}}
	var inside sync.WaitGroup
	inside.Add(n)
	rewind := offsets{}
	worked, err := l.eachTask(n, rewind, func(i int, rewind offsets) (bool, error) {
		inside.Done()
		inside.Wait()
		rewind.set("in", int32(i), int64(10*i))
		return i == 2, nil
	})
	if err != nil || !worked {
		t.Fatalf("eachTask = %v, %v; want worked, no error", worked, err)
	}
	for i := range int32(n) {
		if got := rewind["in"][i].Offset; got != int64(10*i) {
			t.Fatalf("rewind of task %d = %d, want %d", i, got, 10*i)
		}
	}
}

// The first error in task order is the one reported, whichever worker met
// it first; serial processing stops at the failing task.
func TestEachTaskReportsTheFirstError(t *testing.T) {
	errs := []error{nil, errors.New("task 1"), errors.New("task 2")}
	for _, serial := range []bool{false, true} {
		workers := 3
		if serial {
			workers = 1
		}
		l := &loop{in: &Instance{cfg: Options{Parallelism: workers}}}
		var mu sync.Mutex
		ran := map[int]bool{}
		_, err := l.eachTask(len(errs), offsets{}, func(i int, _ offsets) (bool, error) {
			mu.Lock()
			ran[i] = true
			mu.Unlock()
			return true, errs[i]
		})
		if err != errs[1] {
			t.Fatalf("serial %v: error %v, want %v", serial, err, errs[1])
		}
		if serial && ran[2] {
			t.Fatal("serial: the task after the failing one ran")
		}
	}
}
