// Package bench measures Sluice against raw franz-go loops on the same
// in-process broker in the same run, and measures restore times. It has no
// non-test code; run it with `make bench`. Speed is reported here, never
// asserted in tests.
package bench
