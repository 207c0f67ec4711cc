// Package bench measures Sluice against raw franz-go loops on the same
// broker in the same run, and measures restore times. BenchmarkContenders
// (`make bench`, BENCHMARKS.md) runs the broker and each contender as
// processes of their own, the test binary started again (child_test.go);
// the other benchmarks keep an in-process broker. It has no non-test code.
// Speed is reported here, never asserted in tests.
package bench
