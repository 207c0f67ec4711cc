package sluice

import (
	"strings"
	"testing"
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
		{"restore", func() Options { o := opts; o.RestoreFrom = "/sp"; return o }(), []Stage{{Name: "a", Job: job}, {Name: "b", Job: job}}, "not supported yet"},
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
}
