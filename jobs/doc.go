// Package jobs holds Sluice's built-in jobs, declared with the public API
// the way a user's job would be. Their semantics are contracts (DESIGN §7):
// outside tools check their output.
package jobs
