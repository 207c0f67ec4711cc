// Package systest holds Sluice's system tests: instances run against an
// in-process kfake broker over the real Kafka protocol, in this process or
// as subprocesses that are killed (kill -9, SIGSTOP) at chosen points, and
// a separate read_committed reader checks every input is reflected exactly
// once. It has no non-test code.
package systest
