// Command trace-loop reads an execution trace of a `make bench` contender
// (BENCH_TRACE=dir) and says where its processing goroutine spent the
// traced window: running, runnable (waiting for a CPU), waiting (with the
// first frame of its stack that names what for) or in a system call. For
// each wait it also gives how many there were and the 50th, 90th and 99th
// percentiles and the longest, so a share made of a few long waits shows.
//
//	cd scripts/trace-loop && go run . /tmp/trace/aggregate-eos-bbolt-100ms.trace
//
// The processing goroutine is the one with the most running time among
// those whose stacks hold a frame matching -loop (Sluice's loop or the raw
// loop). It is a module of its own so that the trace parser
// (golang.org/x/exp/trace) is not a dependency of Sluice.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"golang.org/x/exp/trace"
)

func main() {
	loopRE := flag.String("loop", `sluice\.\(\*Instance\)\.runSession|bench\.rawLoopWith`, "frames that mark the processing goroutine")
	waitRE := flag.String("wait", `PollRecords|Flush|\.End$|bufferRecord|Mutex|Fdatasync|Produce$`, "frames that name a wait")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: trace-loop [-loop re] [-wait re] file.trace")
		os.Exit(2)
	}
	if err := run(flag.Arg(0), regexp.MustCompile(*loopRE), regexp.MustCompile(*waitRE)); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

type goroutine struct {
	state  trace.GoState
	since  trace.Time
	label  string // what the current state waits on
	isLoop bool
	sums   map[string]time.Duration
	spans  map[string][]time.Duration // each wait's length, by key (the processing goroutine's)
}

func (g *goroutine) key() string {
	if g.state == trace.GoWaiting || g.state == trace.GoSyscall {
		return g.state.String() + " " + g.label
	}
	return g.state.String()
}

func run(path string, loop, wait *regexp.Regexp) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	r, err := trace.NewReader(f)
	if err != nil {
		return err
	}
	gs := map[trace.GoID]*goroutine{}
	var first, last trace.Time
	for {
		ev, err := r.ReadEvent()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		if first == 0 {
			first = ev.Time()
		}
		last = ev.Time()
		if ev.Kind() != trace.EventStateTransition {
			continue
		}
		st := ev.StateTransition()
		if st.Resource.Kind != trace.ResourceGoroutine {
			continue
		}
		id := st.Resource.Goroutine()
		g := gs[id]
		if g == nil {
			g = &goroutine{sums: map[string]time.Duration{}, spans: map[string][]time.Duration{}}
			gs[id] = g
		} else {
			d := ev.Time().Sub(g.since)
			g.sums[g.key()] += d
			if g.isLoop && g.state == trace.GoWaiting {
				g.spans[g.key()] = append(g.spans[g.key()], d)
			}
		}
		stack := st.Stack
		if stack == trace.NoStack {
			stack = ev.Stack()
		}
		label := ""
		for fr := range stack.Frames() {
			if loop.MatchString(fr.Func) {
				g.isLoop = true
			}
			if label == "" && wait.MatchString(fr.Func) {
				label = fr.Func[strings.LastIndex(fr.Func, "/")+1:]
			}
		}
		_, g.state = st.Goroutine()
		g.since, g.label = ev.Time(), st.Reason
		if label != "" {
			g.label += " in " + label
		}
	}
	var best *goroutine
	for _, g := range gs {
		g.sums[g.key()] += last.Sub(g.since)
		if g.isLoop && (best == nil || g.sums["Running"] > best.sums["Running"]) {
			best = g
		}
	}
	if best == nil {
		return fmt.Errorf("%s: no goroutine with a frame matching %s", path, loop)
	}
	window := last.Sub(first)
	fmt.Printf("window %.3f s\n", window.Seconds())
	var keys []string
	for k := range best.sums {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return best.sums[keys[i]] > best.sums[keys[j]] })
	for _, k := range keys {
		if v := best.sums[k]; v*200 >= window { // 0.5 % and more
			fmt.Printf("%6.1f %%  %8.1f ms  %s\n", 100*float64(v)/float64(window), float64(v)/1e6, k)
			if ds := best.spans[k]; len(ds) > 0 {
				slices.Sort(ds)
				q := func(p float64) float64 { return float64(ds[int(p*float64(len(ds)-1))]) / 1e6 }
				fmt.Printf("%21s%d waits, p50 %.2f ms, p90 %.2f ms, p99 %.2f ms, longest %.2f ms\n", "", len(ds), q(0.5), q(0.9), q(0.99), float64(ds[len(ds)-1])/1e6)
			}
		}
	}
	return nil
}
