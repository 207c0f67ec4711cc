package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strconv"
	"syscall"

	"github.com/twmb/franz-go/pkg/kfake"
)

// runBroker runs an embedded single-node kfake broker until SIGTERM, for
// trying instances out by hand without a Kafka installation.
func runBroker(args []string) int {
	fs := flag.NewFlagSet("broker", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:9092", "listen address")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	host, portStr, err := net.SplitHostPort(*addr)
	port, perr := strconv.Atoi(portStr)
	if err != nil || perr != nil || host == "" {
		fmt.Fprintf(os.Stderr, "processor broker: -addr=%q: expected host:port\n", *addr)
		return 2
	}
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(port), kfake.ListenFn(func(network, _ string) (net.Listener, error) {
		return net.Listen(network, *addr)
	}))
	if err != nil {
		fmt.Fprintln(os.Stderr, "processor broker:", err)
		return 1
	}
	defer c.Close()
	fmt.Println("broker listening on", c.ListenAddrs()[0])
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	<-ctx.Done()
	return 0
}
