package sluicetest

import (
	"errors"
	"fmt"
	"sync"
)

// TB is what a Harness needs from its test: the subset of testing.TB that
// *testing.T, *testing.B and *testing.F satisfy. Run provides one outside a
// test function, for runnable examples.
type TB interface {
	Helper()
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
	Cleanup(func())
}

// Run calls f with a TB for code that is not a test function, such as a
// runnable Example (which gets no *testing.T). Errorf records a failure and
// lets f go on; Fatalf records one and stops f, so it must be called on f's
// goroutine, as testing.T's must. When f returns or stops, the functions
// registered with Cleanup run, last registered first. Run returns the
// failures reported, joined, or nil if there were none.
func Run(f func(t TB)) error {
	s := &standalone{}
	func() {
		defer s.recoverFatal()
		f(s)
	}()
	for i := len(s.cleanups) - 1; i >= 0; i-- {
		func() {
			defer s.recoverFatal()
			s.cleanups[i]()
		}()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return errors.Join(s.errs...)
}

// standalone is Run's TB.
type standalone struct {
	mu       sync.Mutex
	errs     []error
	cleanups []func()
}

// fatal is the panic value with which Fatalf stops f.
type fatal struct{}

func (s *standalone) recoverFatal() {
	if r := recover(); r != nil {
		if _, ok := r.(fatal); !ok {
			panic(r)
		}
	}
}

func (s *standalone) Helper() {}

func (s *standalone) Errorf(format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.errs = append(s.errs, fmt.Errorf(format, args...))
}

func (s *standalone) Fatalf(format string, args ...any) {
	s.Errorf(format, args...)
	panic(fatal{})
}

func (s *standalone) Cleanup(f func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cleanups = append(s.cleanups, f)
}
