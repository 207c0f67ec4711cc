package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/twmb/franz-go/pkg/kfake"
)

// runBroker runs an embedded single-node kfake broker until SIGTERM, for
// trying instances out by hand without a Kafka installation.
func runBroker(args []string) int {
	fs := flag.NewFlagSet("broker", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:9092", "listen address")
	topics := fs.String("topics", "", "topics to create, as name:partitions[,name:partitions...]")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	var seeds []kfake.Opt
	for _, spec := range strings.Split(*topics, ",") {
		if spec == "" {
			continue
		}
		name, n, ok := strings.Cut(spec, ":")
		parts, err := strconv.Atoi(n)
		if !ok || err != nil || parts < 1 || name == "" {
			fmt.Fprintf(os.Stderr, "processor broker: -topics=%q: expected name:partitions[,name:partitions...]\n", *topics)
			return 2
		}
		seeds = append(seeds, kfake.SeedTopics(int32(parts), name))
	}
	host, portStr, err := net.SplitHostPort(*addr)
	port, perr := strconv.Atoi(portStr)
	if err != nil || perr != nil || host == "" {
		fmt.Fprintf(os.Stderr, "processor broker: -addr=%q: expected host:port\n", *addr)
		return 2
	}
	opts := append([]kfake.Opt{kfake.NumBrokers(1), kfake.Ports(port), kfake.ListenFn(func(network, _ string) (net.Listener, error) {
		return net.Listen(network, *addr)
	})}, seeds...)
	c, err := kfake.NewCluster(opts...)
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
