// Package testhook lets sluicetest reach into a running instance without
// making that reach part of package sluice's API: sluice sets these
// functions when it is initialised.
package testhook

import "context"

var (
	// Kill stops an instance (a *sluice.Instance) as a crash would.
	Kill func(instance any)
	// Quiet reports whether an instance has nothing in flight.
	Quiet func(ctx context.Context, instance any) (bool, error)
)
