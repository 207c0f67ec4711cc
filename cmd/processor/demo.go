package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/internal/check"
)

// runDemo runs the aggregate job for real: an embedded broker, two
// processor subprocesses, generated input, a kill -9 of one instance
// mid-run and its restart, then a read_committed check of the output.
func runDemo(args []string) int {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	keep := fs.Bool("keep", false, "keep the broker and instances running after the check, until Ctrl-C")
	inputs := fs.Int("inputs", 50000, "number of input records")
	partitions := fs.Int("partitions", 4, "input partitions (tasks)")
	rate := fs.Int("rate", 2500, "input records per second")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	d, err := newDemo(*partitions)
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		return 1
	}
	defer d.close()
	rep, crashes, dlq, err := d.run(ctx, *inputs, *rate)
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo: failed:", err)
		return 1
	}
	fmt.Printf("demo: %d inputs, %d outputs, %d duplicates, %d lost, %d wrong across %d crash (%d invalid inputs went to the DLQ; logs in %s)\n",
		rep.Inputs, rep.Outputs, rep.Duplicates, rep.Lost, rep.Wrong, crashes, dlq, d.dir)
	if *keep {
		fmt.Printf("demo: still running; broker %s, metrics at %s and %s; Ctrl-C to stop\n",
			d.brokers[0], "http://"+d.procs[0].metrics+"/metrics", "http://"+d.procs[1].metrics+"/metrics")
		<-ctx.Done()
	}
	if !rep.OK() {
		return 1
	}
	return 0
}

type demo struct {
	dir     string
	cluster *kfake.Cluster
	brokers []string
	procs   []*demoProc
}

type demoProc struct {
	id, stateDir, metrics, log string
	cmd                        *exec.Cmd
	exited                     chan struct{}
}

const (
	demoApp    = "sluice-demo"
	demoInput  = "demo-numbers"
	demoOutput = "demo-aggregates"
)

func newDemo(partitions int) (*demo, error) {
	dir, err := os.MkdirTemp("", "sluice-demo-")
	if err != nil {
		return nil, err
	}
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(int32(partitions), demoInput, demoOutput))
	if err != nil {
		return nil, err
	}
	d := &demo{dir: dir, cluster: c, brokers: c.ListenAddrs()}
	for i := range 2 {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		id := "demo-" + strconv.Itoa(i+1)
		d.procs = append(d.procs, &demoProc{
			id:       id,
			stateDir: filepath.Join(dir, id, "state"),
			metrics:  "127.0.0.1:" + strconv.Itoa(port),
			log:      filepath.Join(dir, id+".log"),
		})
	}
	return d, nil
}

func (d *demo) close() {
	for _, p := range d.procs {
		p.stop(syscall.SIGTERM)
	}
	d.cluster.Close()
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

func (p *demoProc) start(brokers []string) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	logf, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(self, "run")
	cmd.Env = append(os.Environ(),
		"SLUICE_BROKERS="+brokers[0],
		"SLUICE_APP_ID="+demoApp,
		"SLUICE_JOB=aggregate",
		"SLUICE_INPUT_TOPICS="+demoInput,
		"SLUICE_OUTPUT_TOPIC="+demoOutput,
		"SLUICE_STATE_DIR="+p.stateDir,
		"SLUICE_INSTANCE_ID="+p.id,
		"SLUICE_METRICS_ADDR="+p.metrics,
		"SLUICE_SESSION_TIMEOUT=6s",
	)
	cmd.Stdout, cmd.Stderr = logf, logf
	// The instances end with the demo, however it ends.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return err
	}
	p.cmd, p.exited = cmd, make(chan struct{})
	go func(exited chan struct{}) {
		cmd.Wait()
		logf.Close()
		close(exited)
	}(p.exited)
	return nil
}

// stop signals the process and waits for it to exit.
func (p *demoProc) stop(sig syscall.Signal) {
	if p.cmd == nil || p.cmd.Process == nil {
		return
	}
	p.cmd.Process.Signal(sig)
	<-p.exited
	p.cmd = nil
}

func (d *demo) run(ctx context.Context, n, rate int) (check.Report, int, int, error) {
	for _, p := range d.procs {
		if err := p.start(d.brokers); err != nil {
			return check.Report{}, 0, 0, err
		}
	}
	fmt.Printf("demo: broker %s, 2 instances of the aggregate job (logs in %s)\n", d.brokers[0], d.dir)

	out := newLiveReader(ctx, d.brokers, demoOutput)
	defer out.stop()

	prod, err := kgo.NewClient(kgo.SeedBrokers(d.brokers...), kgo.ProducerLinger(5*time.Millisecond))
	if err != nil {
		return check.Report{}, 0, 0, err
	}
	defer prod.Close()
	inputs := map[string][]int64{}
	rng := rand.New(rand.NewPCG(1, 2))
	start := time.Now()
	crashed, restarted := false, false
	invalid := 0
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	for i := 0; i < n; i++ {
		key := fmt.Sprintf("key-%03d", rng.IntN(200))
		value := strconv.Itoa(rng.IntN(2001) - 1000)
		if i%50 == 49 {
			value, invalid = "not-a-number", invalid+1
		} else {
			v, _ := strconv.ParseInt(value, 10, 64)
			inputs[key] = append(inputs[key], v)
		}
		prod.Produce(ctx, &kgo.Record{Topic: demoInput, Key: []byte(key), Value: []byte(value)}, nil)
		if want := start.Add(time.Duration(i) * time.Second / time.Duration(rate)); time.Until(want) > 0 {
			time.Sleep(time.Until(want)) // pacing the generator, not synchronising
		}
		switch {
		case !crashed && i >= n*2/5:
			fmt.Printf("demo: kill -9 %s at input %d\n", d.procs[0].id, i)
			d.procs[0].stop(syscall.SIGKILL)
			crashed = true
		case crashed && !restarted && i >= n*2/5+2*rate:
			fmt.Printf("demo: restarting %s with its state dir\n", d.procs[0].id)
			if err := d.procs[0].start(d.brokers); err != nil {
				return check.Report{}, 1, invalid, err
			}
			restarted = true
		}
		select {
		case <-tick.C:
			fmt.Printf("demo: %5.1fs produced %d, committed outputs %d\n", time.Since(start).Seconds(), i+1, out.count())
		case <-ctx.Done():
			return check.Report{}, 1, invalid, ctx.Err()
		default:
		}
	}
	if err := prod.Flush(ctx); err != nil {
		return check.Report{}, 1, invalid, err
	}
	valid := n - invalid
	deadline := time.Now().Add(2 * time.Minute)
	for out.count() < valid && time.Now().Before(deadline) && ctx.Err() == nil {
		select {
		case <-tick.C:
			fmt.Printf("demo: %5.1fs waiting for outputs: %d of %d\n", time.Since(start).Seconds(), out.count(), valid)
		case <-out.changed():
		case <-ctx.Done():
		}
	}
	// Anything still in flight (a duplicate, say) lands within an epoch
	// or two; read a little longer so the check would see it.
	settle := time.After(2 * time.Second)
	for done := false; !done; {
		select {
		case <-settle:
			done = true
		case <-out.changed():
		}
	}
	dlq, err := check.ReadCommitted(ctx, d.brokers, demoApp+"-dlq", 30*time.Second, check.Settled(invalid))
	if err != nil {
		return check.Report{}, 1, 0, err
	}
	return check.Aggregate(inputs, out.records()), 1, len(dlq), nil
}

// liveReader reads a topic read_committed in the background.
type liveReader struct {
	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	recs   []*kgo.Record
	notify chan struct{}
}

func newLiveReader(ctx context.Context, brokers []string, topic string) *liveReader {
	ctx, cancel := context.WithCancel(ctx)
	r := &liveReader{cancel: cancel, done: make(chan struct{}), notify: make(chan struct{}, 1)}
	go func() {
		defer close(r.done)
		check.ReadCommitted(ctx, brokers, topic, time.Hour, func(recs []*kgo.Record) bool {
			r.mu.Lock()
			grew := len(recs) > len(r.recs)
			r.recs = recs
			r.mu.Unlock()
			if grew {
				select {
				case r.notify <- struct{}{}:
				default:
				}
			}
			return ctx.Err() != nil
		})
	}()
	return r
}

func (r *liveReader) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.recs)
}

func (r *liveReader) records() []*kgo.Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.recs
}

func (r *liveReader) changed() <-chan struct{} { return r.notify }

func (r *liveReader) stop() {
	r.cancel()
	<-r.done
}
