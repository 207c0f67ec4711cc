// Command function-go serves the aggregate function (package aggregate) for
// a processor run with SLUICE_JOB=function; it listens on
// FUNCTION_LISTEN (host:port or unix:/path; default 127.0.0.1:8080).
package main

import (
	"fmt"
	"os"

	"github.com/sluicehq/sluice/examples/function-go/aggregate"
	"github.com/sluicehq/sluice/function/sdk"
)

func main() {
	addr := os.Getenv("FUNCTION_LISTEN")
	if addr == "" {
		addr = "127.0.0.1:8080"
	}
	fmt.Fprintln(os.Stderr, "aggregate function listening on", addr)
	if err := sdk.ListenAndServe(addr, sdk.Handler(aggregate.Declaration, aggregate.Func)); err != nil {
		fmt.Fprintln(os.Stderr, "function-go:", err)
		os.Exit(1)
	}
}
