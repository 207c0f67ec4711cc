package sluice

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/internal/control"
	"github.com/sluicehq/sluice/savepoint"
)

// A Pipeline is a short chain of stages, Flink's keyBy between operators and
// Kafka Streams' repartition between sub-topologies: a stage re-keys its
// records with Forward, the runtime writes them to the next stage's
// repartition topic <app>-<stage>-repartition inside the stage's epoch
// transaction, and the next stage consumes that topic read_committed, in
// the same process, with tasks, state, changelog and markers of its own.
//
// Each stage runs as an Instance of its own: the first under the app id,
// each later one under <app>-<stage> (its consumer group, transactional id
// prefix and internal topics). Exactly-once across a hop follows from each
// stage's own: the forwarded records and the upstream offsets commit in the
// upstream stage's transaction; the downstream stage's offsets and state
// commit in its own, later one. A stage purges the repartition records it
// has committed (DeleteRecords, as Kafka Streams does), so the topic does
// not grow forever.
//
// Every process runs every stage; instances of the app share each stage's
// partitions as they do a single job's. Metrics carry a stage label.
type Pipeline struct {
	stages []*Instance
	names  []string
	parts  []int32 // partitions of each repartition topic, 0 = the input's
	opts   Options
}

// Stage is one step of a Pipeline.
type Stage struct {
	// Name names the stage's consumer group, changelog and repartition
	// topic. Letters, digits, '.', '_', '-'.
	Name string
	// Job runs the stage. Every stage but the last sends on with Forward;
	// any stage may Emit to Options.OutputTopic.
	Job Job
	// Partitions is the partition count of the stage's repartition topic
	// (its input), 0 = that of the pipeline's input. Ignored for the first
	// stage, which reads Options.InputTopics.
	Partitions int32
}

// Stage returns the instance that runs the stage named name, nil if there
// is none: its Query reads the stage's state. Run and Close are the
// Pipeline's, not the stage's.
func (p *Pipeline) Stage(name string) *Instance {
	if i := slices.Index(p.names, name); i >= 0 {
		return p.stages[i]
	}
	return nil
}

// purgeEvery bounds how often a stage deletes the repartition records it
// committed: often enough that the topic stays small, rarely enough that
// the brokers do not notice.
const purgeEvery = 5 * time.Second

var stageName = regexp.MustCompile(`^[a-zA-Z0-9._-]{1,100}$`)

// NewPipeline validates the stages and builds one Instance per stage from
// opts, which names the pipeline's input, output and app id as for New.
// Nothing touches the network until Run.
func NewPipeline(opts Options, stages ...Stage) (*Pipeline, error) {
	if len(stages) < 2 {
		return nil, errors.New("sluice: a pipeline needs two stages or more (one stage is sluice.New)")
	}
	if opts.BroadcastTopic != "" {
		return nil, errors.New("sluice: Options.BroadcastTopic: broadcast state in a pipeline is not supported yet")
	}
	if opts.Sink != nil {
		return nil, errors.New("sluice: Options.Sink: a pipeline writing to an outside sink is not supported yet")
	}
	reg := opts.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	if opts.DLQTopic == "" {
		opts.DLQTopic = opts.AppID + "-dlq"
	}
	p := &Pipeline{opts: opts}
	if err := p.build(opts, reg, stages); err != nil {
		// The stages built before the one refused let go of their
		// metrics, so that the caller can try again on the same registry;
		// their jobs stay open, as a refused New leaves its job, for the
		// caller to give to the next try or to close.
		for _, in := range p.stages {
			_ = in.close(false)
		}
		return nil, err
	}
	return p, nil
}

// build makes an Instance of each stage in p.
func (p *Pipeline) build(opts Options, reg prometheus.Registerer, stages []Stage) error {
	seen := map[string]bool{}
	for i, s := range stages {
		if !stageName.MatchString(s.Name) || seen[s.Name] {
			return fmt.Errorf("sluice: stage %d: name %q: want 1 to 100 of a-z A-Z 0-9 . _ -, unique in the pipeline", i, s.Name)
		}
		seen[s.Name] = true
		o := opts
		o.Job = s.Job
		o.Registry = prometheus.WrapRegistererWith(prometheus.Labels{"stage": s.Name}, reg)
		o.controlApp = opts.AppID
		if o.Logger != nil {
			o.Logger = o.Logger.With("stage", s.Name)
		}
		if i > 0 {
			o.AppID = opts.AppID + "-" + s.Name
			o.InputTopics = []string{RepartitionTopic(opts.AppID, s.Name)}
			o.purgeInput = true
		}
		if opts.RestoreFrom != "" {
			// A pipeline's savepoint: the first stage's at its root,
			// each later one's in a directory of its own under it.
			if i == 0 {
				for _, later := range stages[1:] {
					o.pipelineStages = append(o.pipelineStages, later.Name)
				}
			} else {
				var err error
				if o.RestoreFrom, err = savepoint.Join(opts.RestoreFrom, savepoint.StageDir(s.Name)); err != nil {
					return fmt.Errorf("sluice: Options.RestoreFrom: %w", err)
				}
			}
		}
		if i+1 < len(stages) {
			o.forwardTopic = RepartitionTopic(opts.AppID, stages[i+1].Name)
		}
		in, err := New(o)
		if err != nil {
			return fmt.Errorf("sluice: stage %s: %w", s.Name, err)
		}
		p.stages = append(p.stages, in)
		p.names = append(p.names, s.Name)
		p.parts = append(p.parts, s.Partitions)
	}
	return nil
}

// Close unregisters every stage's metrics and closes every stage's job
// (Instance.Close), so that another Pipeline or Instance can take the
// registry. While Run runs it
// returns an error, and the stages keep their metrics.
func (p *Pipeline) Close() error {
	var errs []error
	for i, in := range p.stages {
		if err := in.Close(); err != nil {
			errs = append(errs, fmt.Errorf("stage %s: %w", p.names[i], err))
		}
	}
	return errors.Join(errs...)
}

// RepartitionTopic is the repartition topic that feeds stage of app.
func RepartitionTopic(app, stage string) string { return app + "-" + stage + "-repartition" }

// Ready reports whether every stage is ready.
func (p *Pipeline) Ready() bool {
	for _, in := range p.stages {
		if !in.Ready() {
			return false
		}
	}
	return true
}

// Run creates the repartition topics that are missing, then runs every
// stage until ctx is cancelled (each ends with a final checkpoint, as
// Instance.Run) or one of them fails, which stops the others.
func (p *Pipeline) Run(ctx context.Context) error {
	if err := p.checkSavepoint(ctx); err != nil {
		return err
	}
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(p.opts.Brokers...)}, p.opts.ClientOpts...)...)
	if err != nil {
		return fmt.Errorf("sluice: client: %w", err)
	}
	err = p.createTopics(ctx, kadm.NewClient(cl))
	if err == nil {
		p.recordStages(ctx, cl)
	}
	cl.Close()
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, len(p.stages))
	for i, in := range p.stages {
		go func() {
			err := in.Run(ctx)
			if err != nil {
				err = fmt.Errorf("stage %s: %w", p.names[i], err)
			}
			errs <- err
			cancel() // a stage that ends ends the pipeline
		}()
	}
	var first error
	for range p.stages {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}

// createTopics creates the repartition topics, with the partition count of
// the pipeline's input unless a stage sets its own; it waits for the input
// as an Instance does.
func (p *Pipeline) createTopics(ctx context.Context, adm *kadm.Client) error {
	if p.opts.DisableTopicCreation {
		return nil // each stage waits for its input topic, saying so
	}
	log := p.stages[0].log
	backoff := 250 * time.Millisecond
	for {
		err := p.createTopicsOnce(ctx, adm)
		if err == nil || ctx.Err() != nil {
			return err
		}
		log.Warn("cannot create the repartition topics yet (brokers unreachable or the input missing); retrying", "err", err, "retry_in", backoff)
		if sleep(ctx, backoff) != nil {
			return ctx.Err()
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

func (p *Pipeline) createTopicsOnce(ctx context.Context, adm *kadm.Client) error {
	topics, err := adm.ListTopics(ctx)
	if err != nil {
		return err
	}
	input := p.opts.InputTopics[0]
	d, ok := topics[input]
	if !ok || d.Err != nil {
		return fmt.Errorf("input topic %s is not there yet: %v", input, d.Err)
	}
	for i := 1; i < len(p.stages); i++ {
		name := p.stages[i].cfg.InputTopics[0]
		if _, ok := topics[name]; ok {
			continue
		}
		parts := p.parts[i]
		if parts <= 0 {
			parts = int32(len(d.Partitions))
		}
		resp, err := adm.CreateTopic(ctx, parts, -1, nil, name)
		if err == nil {
			err = resp.Err
		}
		if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
			return fmt.Errorf("create repartition topic %s: %w", name, err)
		}
	}
	return nil
}

// checkSavepoint checks that the stages' parts of Options.RestoreFrom are
// one savepoint's: each later stage's was written with the first stage's
// (its app id is the first's and its name, its time the first's), not
// copied in from another. Each stage checks its own part against its job
// when it starts.
func (p *Pipeline) checkSavepoint(ctx context.Context) error {
	loc := p.opts.RestoreFrom
	if loc == "" {
		return nil
	}
	root, err := savepoint.Open(ctx, loc)
	if err != nil {
		return &RestoreError{loc, err.Error()}
	}
	defer root.Close()
	for _, st := range root.Manifest.Stages {
		sloc, err := savepoint.Join(loc, st.Dir)
		if err != nil {
			return &RestoreError{loc, err.Error()}
		}
		sp, err := savepoint.Open(ctx, sloc)
		if err != nil {
			return &RestoreError{loc, fmt.Sprintf("stage %s: %v", st.Name, err)}
		}
		m := sp.Manifest
		sp.Close()
		if want := root.Manifest.AppID + "-" + st.Name; m.AppID != want || !m.Created.Equal(root.Manifest.Created) {
			return &RestoreError{loc, fmt.Sprintf("stage %s's part is of app %s taken at %s, not of %s at %s: not one savepoint's", st.Name, m.AppID, m.Created.Format(time.RFC3339Nano), want, root.Manifest.Created.Format(time.RFC3339Nano))}
		}
	}
	return nil
}

// recordStages writes the pipeline's later stages to its control topic
// (control.PipelineKey), which is how `processor savepoint` knows them:
// topics named like its stages' could be another app's. It creates the
// topic unless topic creation is off. A failure is logged, not fatal: the
// pipeline runs without it, and `processor savepoint` then refuses the
// app, or goes by an earlier record.
func (p *Pipeline) recordStages(ctx context.Context, cl *kgo.Client) {
	app := p.opts.AppID
	rec := &kgo.Record{Topic: control.TopicName(app), Key: control.PipelineKey, Value: control.EncodePipeline(control.Pipeline{Stages: p.names[1:]})}
	// Bounded: a producer waits for a missing topic for good.
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	adm := kadm.NewClient(cl)
	var err error
	if p.opts.DisableTopicCreation {
		var topics kadm.TopicDetails
		if topics, err = adm.ListTopics(rctx, rec.Topic); err == nil && topics[rec.Topic].Err != nil {
			err = topics[rec.Topic].Err
		}
	} else {
		err = control.Create(rctx, adm, app)
	}
	if err == nil {
		err = cl.ProduceSync(rctx, rec).FirstErr()
	}
	if err != nil && ctx.Err() == nil {
		p.stages[0].log.Warn("cannot record the pipeline's stages in its control topic, where processor savepoint looks for them", "topic", rec.Topic, "err", err)
	}
}

// Forward sends a record to the next stage of the pipeline, keyed by key:
// it is written to the next stage's repartition topic, partitioned by key
// with murmur2, so the next stage's task of that key sees it, with the
// event time of what is being handled. Like Emit, it joins the epoch's
// transaction and is dropped with a record that fails. It fails the record
// when the job is not a stage with a next one.
func Forward(ctx Context, key, value []byte, headers ...Header) error {
	c, ts, ok := engineContext(ctx)
	if !ok || c.in.cfg.forwardTopic == "" {
		err := errors.New("sluice.Forward: the job is not a pipeline stage with a next stage")
		if ok {
			c.t.store.Fail(err)
		}
		return err
	}
	r := c.t.record(false)
	r.Topic, r.Key, r.Value, r.Headers, r.Timestamp = c.in.cfg.forwardTopic, key, value, kgoHeaders(headers), ts
	if ts.UnixMilli() > maxStampMs {
		// Not encodable (see stamp). Unlike an output's, a time before
		// 1970 is kept: the next stage reads it back as the record's
		// event time.
		r.Timestamp = c.wall
	}
	c.out = append(c.out, r)
	return nil
}

// purge deletes the records of the stage's input (a repartition topic)
// below the running tasks' committed offsets that moved since the last
// purge, at most every purgeEvery, in the background: nothing waits for it,
// and a failure is retried the next time. The loop calls it every
// iteration, so an idle stage purges what it committed last too.
func (l *loop) purge() {
	in := l.in
	if !in.cfg.purgeInput || time.Since(l.purgedAt) < purgeEvery || in.purging.Load() {
		return
	}
	if in.purgeFailed.Swap(false) {
		l.purged = nil // the last purge may have deleted nothing: send it all again
	}
	l.purgedAt = time.Now()
	below := kadm.Offsets{}
	for p, t := range l.tasks {
		for topic, off := range t.committed {
			if done, ok := l.purged.Lookup(topic, p); ok && done.At == off {
				continue
			}
			below.Add(kadm.Offset{Topic: topic, Partition: p, At: off, LeaderEpoch: -1})
		}
	}
	if len(below) == 0 {
		return
	}
	if l.purged == nil {
		l.purged = kadm.Offsets{}
	}
	below.Each(l.purged.Add)
	in.purging.Store(true)
	adm := in.adm // a Run after this one replaces it
	go func() {
		defer in.purging.Store(false)
		ctx, cancel := context.WithTimeout(l.ctx, 30*time.Second)
		defer cancel()
		resp, err := adm.DeleteRecords(ctx, below)
		if err == nil {
			err = resp.Error()
		}
		if err != nil && ctx.Err() == nil {
			in.log.Warn("purging consumed repartition records failed; retrying later", "err", err)
		}
		if err != nil {
			in.purgeFailed.Store(true)
		}
	}()
}
