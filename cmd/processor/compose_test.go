package main

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

// leaveBound is how long a stopping instance may spend leaving the group
// after its final checkpoint (the engine's leave timeout).
const leaveBound = 5 * time.Second

// composeService is the part of a docker-compose.yml service these tests read.
type composeService struct {
	Image       string         `yaml:"image"`
	Build       any            `yaml:"build"`
	Command     []string       `yaml:"command"`
	Environment map[string]any `yaml:"environment"`
	Healthcheck *struct {
		Test    []string `yaml:"test"`
		Disable bool     `yaml:"disable"`
	} `yaml:"healthcheck"`
	StopGracePeriod string                       `yaml:"stop_grace_period"`
	DependsOn       map[string]map[string]string `yaml:"depends_on"`
	Volumes         []string                     `yaml:"volumes"`
	Restart         string                       `yaml:"restart"`
}

func readCompose(t *testing.T) map[string]composeService {
	t.Helper()
	b, err := os.ReadFile("../../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Services map[string]composeService `yaml:"services"`
	}
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	return f.Services
}

// TestComposeFile checks docker-compose.yml against the binary (docker is
// not needed; `docker-compose config` validates the syntax): the image is
// built once under the tag `make docker` builds, every long-running service
// has an exec-form healthcheck (the processor image has no shell), every
// processor's environment is accepted and gets a stop grace period that
// covers its final checkpoint, and the start order waits on readiness.
func TestComposeFile(t *testing.T) {
	services := readCompose(t)
	const image = "sluice/processor:dev"

	makefile, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(makefile), "docker build -t "+image+" .") {
		t.Errorf("make docker does not build %s, the image the compose file and the Dockerfile's example run", image)
	}
	dockerfile, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	// The examples are comment lines; a trailing backslash continues one.
	var runs []string
	for _, line := range strings.Split(strings.ReplaceAll(string(dockerfile), "\\\n#", " "), "\n") {
		if _, run, ok := strings.Cut(line, "docker run -"); ok {
			runs = append(runs, run)
		}
	}
	if len(runs) == 0 {
		t.Error("the Dockerfile shows no docker run example")
	}
	for _, r := range runs {
		if !strings.Contains(r, " "+image) || !strings.Contains(r, "SLUICE_INSTANCE_ID=") {
			t.Errorf("Dockerfile example %q: want the image %s and a SLUICE_INSTANCE_ID", r, image)
		}
	}

	var builders, processors []string
	for name, s := range services {
		if s.Build != nil {
			builders = append(builders, name)
			if s.Image != image {
				t.Errorf("%s builds image %q, want %q", name, s.Image, image)
			}
		}
		if s.Image == image && len(s.Command) == 0 {
			processors = append(processors, name)
		}
		hc := s.Healthcheck
		switch {
		case s.Restart == "no":
			// a one-shot job: others wait for it to complete
		case hc == nil:
			t.Errorf("%s has no healthcheck", name)
		case hc.Disable:
			if s.Image != image || len(s.Command) == 0 {
				t.Errorf("%s turns its healthcheck off; only processor subcommands without endpoints may", name)
			}
		case len(hc.Test) == 0 || hc.Test[0] != "CMD":
			t.Errorf("%s healthcheck %q: want the exec form [\"CMD\", ...]", name, hc.Test)
		}
	}
	if len(builders) != 1 {
		t.Errorf("services with build: %q; want exactly one, the others running its image", builders)
	}
	slices.Sort(processors)
	if len(processors) < 2 {
		t.Fatalf("processor services %q: want several replicas", processors)
	}

	ids := map[string]string{}
	volumes := map[string]string{}
	for _, name := range processors {
		s := services[name]
		env := map[string]string{}
		for k, v := range s.Environment {
			env[k] = fmt.Sprint(v)
		}
		cfg, err := loadConfig(env, jobSpecs())
		if err == nil {
			err = cfg.validateRun()
		}
		if err != nil {
			t.Errorf("%s: the processor refuses its environment: %v", name, err)
			continue
		}
		if id, ok := env["SLUICE_INSTANCE_ID"]; !ok {
			t.Errorf("%s sets no SLUICE_INSTANCE_ID (the container id would change at every recreate)", name)
		} else if other, dup := ids[id]; dup {
			t.Errorf("%s and %s share SLUICE_INSTANCE_ID=%s", name, other, id)
		} else {
			ids[id] = name
		}
		if len(s.Volumes) != 1 || !strings.HasSuffix(s.Volumes[0], ":/var/lib/sluice") {
			t.Errorf("%s volumes %q: want one volume at the image's state dir /var/lib/sluice", name, s.Volumes)
		} else if other, dup := volumes[s.Volumes[0]]; dup {
			t.Errorf("%s and %s share the state volume %s", name, other, s.Volumes[0])
		} else {
			volumes[s.Volumes[0]] = name
		}
		if want := []string{"CMD", "/processor", "healthz", "--ready"}; s.Healthcheck == nil || !slices.Equal(s.Healthcheck.Test, want) {
			t.Errorf("%s healthcheck: want %q", name, want)
		}
		grace, err := time.ParseDuration(s.StopGracePeriod)
		if need := cfg.CheckpointTimeout() + leaveBound; err != nil || grace < need {
			t.Errorf("%s stop_grace_period %q: want at least the checkpoint timeout (%v) plus the leave (%v)", name, s.StopGracePeriod, cfg.CheckpointTimeout(), leaveBound)
		}
	}

	for _, name := range processors {
		if c := services["generator"].DependsOn[name]["condition"]; c != "service_healthy" {
			t.Errorf("generator depends on %s with %q, want service_healthy (input starts once the group is ready)", name, c)
		}
		if c := services["prometheus"].DependsOn[name]["condition"]; c == "" {
			t.Errorf("prometheus does not depend on %s", name)
		}
	}
}
