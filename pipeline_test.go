package sluice

import (
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/savepoint"
)

func TestNewPipelineValidates(t *testing.T) {
	job := Job{Name: "j", Process: func(Context, *Record) error { return nil }}
	opts := Options{Brokers: []string{"127.0.0.1:9092"}, AppID: "app", InstanceID: "i1", InputTopics: []string{"in"}}
	tests := []struct {
		name   string
		opts   Options
		stages []Stage
		want   string
	}{
		{"one stage", opts, []Stage{{Name: "a", Job: job}}, "two stages or more"},
		{"bad name", opts, []Stage{{Name: "a", Job: job}, {Name: "b/c", Job: job}}, `name "b/c"`},
		{"same name", opts, []Stage{{Name: "a", Job: job}, {Name: "a", Job: job}}, `name "a"`},
		{"bad job", opts, []Stage{{Name: "a", Job: job}, {Name: "b"}}, "stage b: job: Name is empty"},
		{"restore from nowhere", func() Options { o := opts; o.RestoreFrom = "s3://"; return o }(), []Stage{{Name: "a", Job: job}, {Name: "b", Job: job}}, "Options.RestoreFrom"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewPipeline(tt.opts, tt.stages...)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want it to say %q", err, tt.want)
			}
		})
	}
	p, err := NewPipeline(opts, Stage{Name: "split", Job: job}, Stage{Name: "count", Job: job})
	if err != nil {
		t.Fatal(err)
	}
	first, second := p.stages[0].cfg, p.stages[1].cfg
	if first.AppID != "app" || first.forwardTopic != "app-count-repartition" || first.purgeInput ||
		second.AppID != "app-count" || second.InputTopics[0] != "app-count-repartition" || second.forwardTopic != "" || !second.purgeInput ||
		second.controlApp != "app" || second.DLQTopic != "app-dlq" {
		t.Fatalf("stages: %+v\n%+v", first, second)
	}
	// Restored, each stage from its part of the pipeline's savepoint.
	o := opts
	o.Registry = prometheus.NewRegistry()
	o.RestoreFrom = "/sp/words-1"
	p, err = NewPipeline(o, Stage{Name: "split", Job: job}, Stage{Name: "count", Job: job})
	if err != nil {
		t.Fatal(err)
	}
	first, second = p.stages[0].cfg, p.stages[1].cfg
	if first.RestoreFrom != "/sp/words-1" || !slices.Equal(first.pipelineStages, []string{"count"}) ||
		second.RestoreFrom != "/sp/words-1/stage-count" || second.pipelineStages != nil {
		t.Fatalf("restored stages: %q %q, %q %q", first.RestoreFrom, first.pipelineStages, second.RestoreFrom, second.pipelineStages)
	}
}

// A pipeline's savepoint restores into the first stage of a pipeline of the
// same later stages (in any order), and only there.
func TestCheckStages(t *testing.T) {
	pipeline := savepoint.Manifest{Job: "split", Stages: []savepoint.Stage{{Name: "count", Dir: "stage-count"}, {Name: "b", Dir: "stage-b"}}}
	single := savepoint.Manifest{Job: "aggregate"}
	for _, tt := range []struct {
		stages []string
		m      savepoint.Manifest
		want   string
	}{
		{nil, single, ""},
		{[]string{"b", "count"}, pipeline, ""},
		{[]string{"count", "b"}, pipeline, ""},
		{nil, pipeline, "it is the savepoint of a pipeline (its later stages: b, count)"},
		{[]string{"count"}, single, `it is the savepoint of one job, "aggregate", not of a pipeline`},
		{[]string{"count"}, pipeline, "it holds a pipeline whose later stages are b, count; this pipeline's are count"},
	} {
		in := &Instance{cfg: Options{pipelineStages: tt.stages}}
		if got := in.checkStages(tt.m); !strings.HasPrefix(got, tt.want) || (tt.want == "") != (got == "") {
			t.Errorf("stages %q, savepoint stages %v: %q, want %q", tt.stages, tt.m.Stages, got, tt.want)
		}
	}
}
