package main

// `processor healthz` is a health check in exec form for images without a
// shell or an HTTP client (the distroless image): docker and compose run
//
//	["CMD", "/processor", "healthz", "--ready"]
//
// inside the container, next to the processor it checks. It asks the local
// /healthz (or /readyz) endpoint on SLUICE_METRICS_ADDR's port and turns the
// answer into an exit status: 0 on 200, 1 on anything else. Docker reserves
// exit status 2, so unlike `run` a bad flag or variable is a 1 here too.
//
// It reads SLUICE_METRICS_ADDR alone, not the whole configuration: the
// check is about the process that runs, whose configuration was validated
// when it started.

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	neturl "net/url"
	"reflect"
	"strings"
	"time"
)

// healthzTimeout bounds the whole request by default. The endpoints answer
// from memory, so a process that takes longer is not healthy; it also stays
// well inside the timeouts docker and Kubernetes give a check (30s and 1s by
// default).
const healthzTimeout = 2 * time.Second

func runHealthz(args []string, envm map[string]string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("healthz", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // a bad flag is one line below, not the usage
	ready := fs.Bool("ready", false, "check /readyz (in the group, every assigned task restored) instead of /healthz (the process runs)")
	timeout := fs.Duration("timeout", healthzTimeout, "give up after this long")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stdout, "usage: processor healthz [--ready] [--timeout d]\n\nGETs /healthz (or /readyz) on 127.0.0.1 at SLUICE_METRICS_ADDR's port; exit 0 on 200, 1 otherwise.\n\n")
			fs.SetOutput(stdout)
			fs.PrintDefaults()
			return 0
		}
		fmt.Fprintln(stderr, "processor healthz:", err)
		return 1
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "processor healthz: unexpected argument %q\n", fs.Arg(0))
		return 1
	}
	if *timeout <= 0 {
		fmt.Fprintf(stderr, "processor healthz: --timeout=%v: expected a Go duration greater than 0 such as 2s\n", *timeout)
		return 1
	}
	path := "/healthz"
	if *ready {
		path = "/readyz"
	}
	url, err := healthzURL(envm["SLUICE_METRICS_ADDR"], path)
	if err != nil {
		fmt.Fprintln(stderr, "processor healthz:", err)
		return 1
	}
	code, line, err := probe(url, *timeout)
	switch {
	case err != nil:
		fmt.Fprintf(stderr, "processor healthz: %s: %v\n", url, err)
		return 1
	case code != http.StatusOK:
		fmt.Fprintf(stderr, "processor healthz: %s: %d %s\n", url, code, line)
		return 1
	}
	fmt.Fprintf(stdout, "%s: %d %s\n", url, code, line)
	return 0
}

// healthzURL is the URL of path on the processor that listens on addr (a
// SLUICE_METRICS_ADDR value, "" for its default). A listener on every
// interface (":9090", "0.0.0.0:9090", "[::]:9090") is asked on 127.0.0.1; one
// bound to a single address is asked there.
func healthzURL(addr, path string) (string, error) {
	if addr == "" {
		f, _ := fieldOf(reflect.TypeFor[Config](), "SLUICE_METRICS_ADDR")
		addr = f.Tag.Get("envDefault")
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil || !validListenAddr(addr) || port == "0" {
		return "", &ConfigError{Var: "SLUICE_METRICS_ADDR", Value: addr, Expected: "the listen address of the processor to check, with a fixed port, such as :9090"}
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, port) + path, nil
}

// probe GETs url once and returns the status code and the first line of the
// body. Redirects are not followed and no proxy is used: the answer must
// come from the processor itself.
func probe(url string, timeout time.Duration) (int, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	client := &http.Client{
		Transport:     &http.Transport{Proxy: nil, DisableKeepAlives: true},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	resp, err := client.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return 0, "", fmt.Errorf("no answer within %v", timeout)
		}
		if ue := (*neturl.Error)(nil); errors.As(err, &ue) {
			err = ue.Err // without the method and URL, which the caller prints
		}
		return 0, "", err
	}
	defer resp.Body.Close()
	line, _ := bufio.NewReader(io.LimitReader(resp.Body, 512)).ReadString('\n')
	line = strings.TrimSpace(line)
	if line == "" {
		line = http.StatusText(resp.StatusCode)
	}
	return resp.StatusCode, line, nil
}
