// Package sdk is the Go SDK of the sidecar protocol: it turns a function
// value into an http.Handler that answers Describe and Invoke (gRPC,
// Connect with JSON or binary protobuf), so a Go service can run its
// computation beside a Sluice processor (docs/sidecar.md).
//
//	h := sdk.Handler(sdk.Declaration{States: []sdk.State{{Name: "count"}}},
//		func(ctx context.Context, c *sdk.Call) *sdk.Result {
//			r := &sdk.Result{}
//			n := len(c.States["count"]) + len(c.Events)
//			r.Set("count", make([]byte, n))
//			return r
//		})
//	sdk.ListenAndServe(":8080", h)
//
// Calls arrive concurrently (for disjoint keys); the keys of one call are
// handled one after the other, each key's events in order.
package sdk
