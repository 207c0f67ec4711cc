package main

import (
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// TestComposeSidecarFile checks docker-compose.sidecar.yml, the override
// that runs each processor of docker-compose.yml in sidecar mode: every
// processor's merged environment is accepted with SLUICE_JOB=function, and
// beside each is a function container in its network namespace listening
// where the processor calls it, with a healthcheck. With docker-compose
// installed, `docker-compose config` must accept the two files together.
func TestComposeSidecarFile(t *testing.T) {
	base := readCompose(t)
	b, err := os.ReadFile("../../docker-compose.sidecar.yml")
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Services map[string]struct {
			composeService `yaml:",inline"`
			NetworkMode    string `yaml:"network_mode"`
		} `yaml:"services"`
	}
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	functions := map[string]string{} // network owner → function service
	for name, s := range f.Services {
		if owner, ok := strings.CutPrefix(s.NetworkMode, "service:"); ok {
			functions[owner] = name
		}
	}
	processors := 0
	for name, s := range base {
		if s.Image != "sluice/processor:dev" || len(s.Command) > 0 {
			continue
		}
		processors++
		env := map[string]string{}
		for k, v := range s.Environment {
			env[k] = fmt.Sprint(v)
		}
		for k, v := range f.Services[name].Environment {
			env[k] = fmt.Sprint(v)
		}
		cfg, err := loadConfig(env, jobSpecs())
		if err == nil {
			err = cfg.validateRun()
		}
		if err != nil {
			t.Errorf("%s in sidecar mode: the processor refuses its environment: %v", name, err)
			continue
		}
		if cfg.Job != functionJob {
			t.Errorf("%s runs job %s, want function", name, cfg.Job)
		}
		fn, ok := functions[name]
		if !ok {
			t.Errorf("%s has no function container in its network namespace", name)
			continue
		}
		fs := f.Services[fn]
		u, err := url.Parse(cfg.FunctionURL)
		if err != nil || u.Hostname() != "127.0.0.1" || fmt.Sprint(fs.Environment["FUNCTION_LISTEN"]) != u.Host {
			t.Errorf("%s calls %s, but %s listens on %v", name, cfg.FunctionURL, fn, fs.Environment["FUNCTION_LISTEN"])
		}
		if fs.Healthcheck == nil || len(fs.Healthcheck.Test) == 0 || fs.Healthcheck.Test[0] != "CMD" {
			t.Errorf("%s: want an exec-form healthcheck", fn)
		}
		for _, v := range fs.Volumes {
			src, _, _ := strings.Cut(v, ":")
			if _, err := os.Stat("../../" + src); err != nil {
				t.Errorf("%s mounts %s: %v", fn, src, err)
			}
		}
	}
	if processors == 0 || len(functions) != processors {
		t.Errorf("%d processors, %d function containers: want one beside each", processors, len(functions))
	}
	if _, err := exec.LookPath("docker-compose"); err != nil {
		t.Log("docker-compose not installed: the files' syntax is not checked")
		return
	}
	cmd := exec.Command("docker-compose", "-f", "docker-compose.yml", "-f", "docker-compose.sidecar.yml", "config", "-q")
	cmd.Dir = "../.."
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("docker-compose config: %v\n%s", err, out)
	}
}
