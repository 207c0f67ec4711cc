package main

// Tests of the Helm chart in deploy/helm/sluice. They live here, not next to
// the chart, because they check the rendered manifests against this binary:
// the job's environment must pass loadConfig, and the grace period and alert
// thresholds the chart derives must match Config's own derivations.

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

// helmModule is the Helm CLI the tests run, pinned. `go run` builds it from
// the module proxy: about 85 s on a cold build cache with 2 cores, then
// 0.6 s a run, as go run caches the executable.
const helmModule = "helm.sh/helm/v3/cmd/helm@v3.22.0"

const (
	chartDir = "../../deploy/helm/sluice"
	release  = "rel"
	// chartMargin is values.yaml's terminationGracePeriod.marginSeconds.
	chartMargin = 20 * time.Second
)

// helm runs the pinned Helm with args and returns its stdout, or an error
// carrying its stderr. Helm's own configuration, cache and data go to a
// temporary directory.
func helm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	home := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", append([]string{"run", helmModule}, args...)...)
	cmd.Env = append(os.Environ(),
		"HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"),
		"HELM_DATA_HOME="+filepath.Join(home, "data"),
	)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("helm %s: %v\n%s%s", strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String(), nil
}

// valuesFile writes values (YAML) to a file for helm -f.
func valuesFile(t *testing.T, values string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(p, []byte(values), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// The parts of the rendered objects the tests read. yaml.v3 matches
// lower-cased field names by default, hence the tags.
type (
	k8sMeta struct {
		Name   string            `yaml:"name"`
		Labels map[string]string `yaml:"labels"`
	}
	k8sEnvVar struct {
		Name      string  `yaml:"name"`
		Value     *string `yaml:"value"`
		ValueFrom *struct {
			FieldRef *struct {
				FieldPath string `yaml:"fieldPath"`
			} `yaml:"fieldRef"`
			SecretKeyRef *struct {
				Name     string `yaml:"name"`
				Key      string `yaml:"key"`
				Optional bool   `yaml:"optional"`
			} `yaml:"secretKeyRef"`
		} `yaml:"valueFrom"`
	}
	k8sProbe struct {
		HTTPGet *struct {
			Path string `yaml:"path"`
			Port any    `yaml:"port"`
		} `yaml:"httpGet"`
	}
	k8sContainer struct {
		Name  string      `yaml:"name"`
		Env   []k8sEnvVar `yaml:"env"`
		Ports []struct {
			Name          string `yaml:"name"`
			ContainerPort int    `yaml:"containerPort"`
		} `yaml:"ports"`
		LivenessProbe   k8sProbe `yaml:"livenessProbe"`
		ReadinessProbe  k8sProbe `yaml:"readinessProbe"`
		SecurityContext struct {
			ReadOnlyRootFilesystem   *bool `yaml:"readOnlyRootFilesystem"`
			AllowPrivilegeEscalation *bool `yaml:"allowPrivilegeEscalation"`
		} `yaml:"securityContext"`
		VolumeMounts []struct {
			Name      string `yaml:"name"`
			MountPath string `yaml:"mountPath"`
			ReadOnly  bool   `yaml:"readOnly"`
		} `yaml:"volumeMounts"`
	}
	statefulSet struct {
		Metadata k8sMeta `yaml:"metadata"`
		Spec     struct {
			Replicas    *int   `yaml:"replicas"`
			ServiceName string `yaml:"serviceName"`
			Selector    struct {
				MatchLabels map[string]string `yaml:"matchLabels"`
			} `yaml:"selector"`
			Template struct {
				Metadata k8sMeta `yaml:"metadata"`
				Spec     struct {
					TerminationGracePeriodSeconds *int64 `yaml:"terminationGracePeriodSeconds"`
					EnableServiceLinks            *bool  `yaml:"enableServiceLinks"`
					SecurityContext               struct {
						RunAsNonRoot *bool  `yaml:"runAsNonRoot"`
						RunAsUser    *int64 `yaml:"runAsUser"`
						FSGroup      *int64 `yaml:"fsGroup"`
					} `yaml:"securityContext"`
					Containers []k8sContainer `yaml:"containers"`
					Volumes    []struct {
						Name     string         `yaml:"name"`
						EmptyDir map[string]any `yaml:"emptyDir"`
					} `yaml:"volumes"`
				} `yaml:"spec"`
			} `yaml:"template"`
			VolumeClaimTemplates []struct {
				Metadata k8sMeta `yaml:"metadata"`
				Spec     struct {
					AccessModes []string `yaml:"accessModes"`
					Resources   struct {
						Requests map[string]string `yaml:"requests"`
					} `yaml:"resources"`
				} `yaml:"spec"`
			} `yaml:"volumeClaimTemplates"`
		} `yaml:"spec"`
	}
	scaledObject struct {
		Spec struct {
			ScaleTargetRef struct {
				Kind string `yaml:"kind"`
				Name string `yaml:"name"`
			} `yaml:"scaleTargetRef"`
			MinReplicaCount int `yaml:"minReplicaCount"`
			MaxReplicaCount int `yaml:"maxReplicaCount"`
			Advanced        struct {
				HPA struct {
					Behavior struct {
						ScaleDown struct {
							StabilizationWindowSeconds int `yaml:"stabilizationWindowSeconds"`
						} `yaml:"scaleDown"`
					} `yaml:"behavior"`
				} `yaml:"horizontalPodAutoscalerConfig"`
			} `yaml:"advanced"`
			Triggers []struct {
				Type     string            `yaml:"type"`
				Metadata map[string]string `yaml:"metadata"`
			} `yaml:"triggers"`
		} `yaml:"spec"`
	}
	alertRule struct {
		Alert       string            `yaml:"alert"`
		Expr        string            `yaml:"expr"`
		For         string            `yaml:"for"`
		Labels      map[string]string `yaml:"labels"`
		Annotations map[string]string `yaml:"annotations"`
	}
	ruleGroups struct {
		Groups []struct {
			Name  string      `yaml:"name"`
			Rules []alertRule `yaml:"rules"`
		} `yaml:"groups"`
	}
	service struct {
		Metadata k8sMeta `yaml:"metadata"`
		Spec     struct {
			ClusterIP string            `yaml:"clusterIP"`
			Selector  map[string]string `yaml:"selector"`
			Ports     []struct {
				Name       string `yaml:"name"`
				TargetPort any    `yaml:"targetPort"`
			} `yaml:"ports"`
		} `yaml:"spec"`
	}
	pdb struct {
		Spec struct {
			MaxUnavailable any `yaml:"maxUnavailable"`
			Selector       struct {
				MatchLabels map[string]string `yaml:"matchLabels"`
			} `yaml:"selector"`
		} `yaml:"spec"`
	}
)

// rendered is helm template's output by kind (one object of each here).
type rendered map[string]*yaml.Node

func parseManifests(t *testing.T, out string) rendered {
	t.Helper()
	objs := rendered{}
	dec := yaml.NewDecoder(strings.NewReader(out))
	for {
		var doc yaml.Node
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("rendered manifests: %v", err)
		}
		var hdr struct {
			Kind string `yaml:"kind"`
		}
		if err := doc.Decode(&hdr); err != nil || hdr.Kind == "" {
			continue // an empty document
		}
		if objs[hdr.Kind] != nil {
			t.Fatalf("two objects of kind %s", hdr.Kind)
		}
		objs[hdr.Kind] = &doc
	}
	return objs
}

func (r rendered) decode(t *testing.T, kind string, v any) bool {
	t.Helper()
	n := r[kind]
	if n == nil {
		return false
	}
	if err := n.Decode(v); err != nil {
		t.Fatalf("%s: %v", kind, err)
	}
	return true
}

// TestHelmChart lints the chart and renders it with several values, then
// checks the invariants of docs/deploy.md on what it renders.
func TestHelmChart(t *testing.T) {
	// Lint first and alone: on a cold build cache it builds Helm, which the
	// parallel renders below then reuse.
	for _, values := range []string{"", "autoscaling: {enabled: true}\nmetrics: {serviceMonitor: {enabled: true}, prometheusRule: {enabled: true}}\n"} {
		args := []string{"lint", "--strict", chartDir}
		if values != "" {
			args = append(args, "-f", valuesFile(t, values))
		}
		if out, err := helm(t, args...); err != nil {
			t.Fatal(err)
		} else {
			t.Logf("%s", out)
		}
	}

	copyOf, err := os.ReadFile(filepath.Join(chartDir, "files", "alerts.yml"))
	if err != nil {
		t.Fatal(err)
	}
	alerts, err := os.ReadFile("../../configs/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(copyOf, alerts) {
		t.Error("deploy/helm/sluice/files/alerts.yml differs from configs/alerts.yml: cp configs/alerts.yml deploy/helm/sluice/files/alerts.yml")
	}

	tests := []struct {
		name   string
		values string
		grace  time.Duration // terminationGracePeriodSeconds expected
	}{
		{"defaults", "", 30 * time.Second}, // ceil(10s - 100ms + 20s)
		{"autoscaling and monitoring", `
autoscaling: {enabled: true, minReplicas: 2}
partitions: 12
metrics: {serviceMonitor: {enabled: true}, prometheusRule: {enabled: true}}
secret: {create: true, values: {SLUICE_SASL_PASSWORD: hunter2}}
env: {SLUICE_SASL_MECHANISM: SCRAM-SHA-512, SLUICE_SASL_USERNAME: sluice, SLUICE_TLS_ENABLED: "true"}
`, 30 * time.Second},
		{"longer epoch", "env: {SLUICE_CHECKPOINT_INTERVAL: 2s}\nmetrics: {prometheusRule: {enabled: true}}", 38 * time.Second},
		{"min pause", "env: {SLUICE_CHECKPOINT_INTERVAL: 500ms, SLUICE_MIN_PAUSE: 3s}", 47 * time.Second},
		{"transaction timeout set", "env: {SLUICE_CHECKPOINT_INTERVAL: 1500ms, SLUICE_TRANSACTION_TIMEOUT: 1m30s}\nmetrics: {prometheusRule: {enabled: true}}", 109 * time.Second},
		{"checkpoint timeout set", "env: {SLUICE_CHECKPOINT_TIMEOUT: 45s}", 65 * time.Second},
		{"fixed grace period", "terminationGracePeriod: {seconds: 120}", 120 * time.Second},
		{"no persistence and no secret mount", "persistence: {enabled: false}\nsecret: {existingSecret: kafka-creds, mountPath: \"\"}\nreplicaCount: 8", 30 * time.Second},
	}
	t.Run("template", func(t *testing.T) {
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				t.Parallel()
				out, err := helm(t, "template", release, chartDir, "--namespace", "streams", "--kube-version", "1.30.0", "-f", valuesFile(t, tt.values))
				if err != nil {
					t.Fatal(err)
				}
				var values struct {
					Autoscaling struct {
						Enabled     bool `yaml:"enabled"`
						MinReplicas int  `yaml:"minReplicas"`
					} `yaml:"autoscaling"`
					Partitions   int `yaml:"partitions"`
					ReplicaCount int `yaml:"replicaCount"`
					Persistence  struct {
						Enabled *bool `yaml:"enabled"`
					} `yaml:"persistence"`
					Metrics struct {
						PrometheusRule struct {
							Enabled bool `yaml:"enabled"`
						} `yaml:"prometheusRule"`
					} `yaml:"metrics"`
				}
				values.Partitions, values.ReplicaCount = 6, 3 // values.yaml's
				if err := yaml.Unmarshal([]byte(tt.values), &values); err != nil {
					t.Fatal(err)
				}
				persistence := values.Persistence.Enabled == nil || *values.Persistence.Enabled
				checkRendered(t, parseManifests(t, out), tt.grace, values.Autoscaling.Enabled, values.Autoscaling.MinReplicas, values.Partitions, values.ReplicaCount, persistence, values.Metrics.PrometheusRule.Enabled)
			})
		}
	})

	// Values the chart must refuse, with a message naming the value.
	refused := []struct{ name, values, want string }{
		{"instance id set", "env: {SLUICE_INSTANCE_ID: fixed}", "env.SLUICE_INSTANCE_ID is set by the chart"},
		{"state dir set", "env: {SLUICE_STATE_DIR: /data}", "env.SLUICE_STATE_DIR is set by the chart"},
		{"secret in env", "env: {SLUICE_SASL_PASSWORD: hunter2}", "env.SLUICE_SASL_PASSWORD is a secret"},
		{"no app id", "env: {SLUICE_APP_ID: null}", "env.SLUICE_APP_ID is required"},
		{"two input topics", "env: {SLUICE_INPUT_TOPICS: \"a,b\"}", "one input topic"},
		{"not a Go duration", "env: {SLUICE_CHECKPOINT_INTERVAL: 2 seconds}", `"2 seconds" is not a Go duration`},
		{"grace period too short", "terminationGracePeriod: {seconds: 10}", "terminationGracePeriod.seconds=10 is shorter than the final checkpoint"},
		{"margin too short", "terminationGracePeriod: {marginSeconds: 1}", "terminationGracePeriod.marginSeconds=1"},
		{"scale to zero", "autoscaling: {enabled: true, minReplicas: 0}", "autoscaling.minReplicas=0"},
		{"not a SLUICE_ variable", "env: {GOMEMLIMIT: 1GiB}", "put other variables in extraEnv"},
	}
	t.Run("refuses", func(t *testing.T) {
		for _, tt := range refused {
			t.Run(tt.name, func(t *testing.T) {
				t.Parallel()
				out, err := helm(t, "template", release, chartDir, "-f", valuesFile(t, tt.values))
				if err == nil || !strings.Contains(err.Error(), tt.want) {
					t.Fatalf("rendered (error %v), want a failure saying %q\n%.300s", err, tt.want, out)
				}
			})
		}
	})
}

func checkRendered(t *testing.T, objs rendered, grace time.Duration, autoscaling bool, minReplicas, partitions, replicas int, persistence, rules bool) {
	t.Helper()
	var sts statefulSet
	if !objs.decode(t, "StatefulSet", &sts) {
		t.Fatal("no StatefulSet")
	}
	pod := sts.Spec.Template.Spec
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers, want the processor alone", len(pod.Containers))
	}
	c := pod.Containers[0]

	// The instance id is the pod name; every other variable is accepted by
	// the processor as it would start in pod 0, with the keys the chart's
	// Secret has, if it made one.
	var secret struct {
		Data map[string]string `yaml:"data"`
	}
	objs.decode(t, "Secret", &secret)
	env := map[string]string{}
	for _, e := range c.Env {
		switch {
		case e.Value != nil:
			env[e.Name] = *e.Value
		case e.ValueFrom != nil && e.ValueFrom.FieldRef != nil:
			if e.Name != "SLUICE_INSTANCE_ID" || e.ValueFrom.FieldRef.FieldPath != "metadata.name" {
				t.Errorf("%s from field %s", e.Name, e.ValueFrom.FieldRef.FieldPath)
			}
			env[e.Name] = sts.Metadata.Name + "-0"
		case e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil:
			if !e.ValueFrom.SecretKeyRef.Optional || e.ValueFrom.SecretKeyRef.Key != e.Name {
				t.Errorf("%s from a Secret: want the optional key of the same name", e.Name)
			}
			if v, ok := secret.Data[e.Name]; ok {
				b, err := base64.StdEncoding.DecodeString(v)
				if err != nil {
					t.Fatalf("Secret key %s: %v", e.Name, err)
				}
				env[e.Name] = string(b)
			}
		default:
			t.Errorf("env %s has no value", e.Name)
		}
	}
	if env["SLUICE_INSTANCE_ID"] != sts.Metadata.Name+"-0" {
		t.Error("SLUICE_INSTANCE_ID does not come from the pod name (fieldRef metadata.name)")
	}
	cfg, err := loadConfig(env, jobSpecs())
	if err == nil {
		err = cfg.validateRun()
	}
	if err != nil {
		t.Fatalf("the processor refuses the chart's environment: %v", err)
	}

	// Probes on the metrics port, which is SLUICE_METRICS_ADDR's.
	_, port, _ := net.SplitHostPort(cfg.MetricsAddr)
	// State queries are redirected to a pod's name under the headless
	// Service, on that port.
	if !strings.HasPrefix(cfg.QueryPeerURL, "http://{instance}."+sts.Metadata.Name+".") || !strings.HasSuffix(cfg.QueryPeerURL, ".svc:"+port) {
		t.Errorf("SLUICE_QUERY_PEER_URL=%q: want the pods' names under the headless Service %s, on port %s", cfg.QueryPeerURL, sts.Metadata.Name, port)
	}
	if len(c.Ports) != 1 || c.Ports[0].Name != "metrics" || strconv.Itoa(c.Ports[0].ContainerPort) != port {
		t.Errorf("container ports %+v, want metrics on SLUICE_METRICS_ADDR's port %s", c.Ports, port)
	}
	for _, p := range []struct {
		name  string
		probe k8sProbe
		path  string
	}{{"liveness", c.LivenessProbe, "/healthz"}, {"readiness", c.ReadinessProbe, "/readyz"}} {
		if p.probe.HTTPGet == nil || p.probe.HTTPGet.Path != p.path || fmt.Sprint(p.probe.HTTPGet.Port) != "metrics" {
			t.Errorf("%s probe %+v, want GET %s on the metrics port", p.name, p.probe.HTTPGet, p.path)
		}
	}

	// Time to stop: the final checkpoint, then the leave.
	if g := pod.TerminationGracePeriodSeconds; g == nil || time.Duration(*g)*time.Second != grace {
		t.Errorf("terminationGracePeriodSeconds %s, want %v", fmtPtr(g), grace)
	} else if need := cfg.CheckpointTimeout() + leaveBound; grace < need {
		t.Errorf("grace period %v is shorter than the checkpoint timeout %v plus the leave %v", grace, cfg.CheckpointTimeout(), leaveBound)
	} else if derived := time.Duration(math.Ceil((cfg.CheckpointTimeout() + chartMargin).Seconds())) * time.Second; grace != 120*time.Second && grace != derived {
		t.Errorf("grace period %v, want the binary's checkpoint timeout %v plus %v, rounded up: %v", grace, cfg.CheckpointTimeout(), chartMargin, derived)
	}

	// State: the volume at SLUICE_STATE_DIR, one claim per pod.
	mounts := map[string]string{}
	for _, m := range c.VolumeMounts {
		mounts[m.Name] = m.MountPath
	}
	if mounts["state"] != cfg.StateDir {
		t.Errorf("state volume mounted at %q, SLUICE_STATE_DIR=%q", mounts["state"], cfg.StateDir)
	}
	claims := sts.Spec.VolumeClaimTemplates
	if persistence {
		if len(claims) != 1 || claims[0].Metadata.Name != "state" || claims[0].Spec.Resources.Requests["storage"] == "" || !slices.Equal(claims[0].Spec.AccessModes, []string{"ReadWriteOnce"}) {
			t.Errorf("volumeClaimTemplates %+v, want one ReadWriteOnce claim \"state\" per pod", claims)
		}
	} else if len(claims) != 0 || !slices.ContainsFunc(pod.Volumes, func(v struct {
		Name     string         `yaml:"name"`
		EmptyDir map[string]any `yaml:"emptyDir"`
	}) bool {
		return v.Name == "state" && v.EmptyDir != nil
	}) {
		t.Errorf("persistence off: want an emptyDir named state and no claims, got claims %+v", claims)
	}

	// Non-root, read-only root filesystem, no service links.
	if sc := pod.SecurityContext; sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.RunAsUser == nil || *sc.RunAsUser == 0 || sc.FSGroup == nil {
		t.Errorf("pod securityContext %+v: want runAsNonRoot, a non-root user and an fsGroup for the state volume", sc)
	}
	if sc := c.SecurityContext; sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Errorf("container securityContext %+v: want a read-only root filesystem and no privilege escalation", sc)
	}
	if pod.EnableServiceLinks == nil || *pod.EnableServiceLinks {
		t.Error("enableServiceLinks is not false: a Service named sluice... would inject SLUICE_* variables the processor refuses")
	}

	// The headless Service the StatefulSet names, and the budget.
	var svc service
	if !objs.decode(t, "Service", &svc) || svc.Metadata.Name != sts.Spec.ServiceName || svc.Spec.ClusterIP != "None" {
		t.Errorf("want the headless Service %q of the StatefulSet, got %+v", sts.Spec.ServiceName, svc)
	}
	if !subsetOf(svc.Spec.Selector, sts.Spec.Template.Metadata.Labels) || !subsetOf(sts.Spec.Selector.MatchLabels, sts.Spec.Template.Metadata.Labels) {
		t.Error("the Service or the StatefulSet does not select the pods")
	}
	var budget pdb
	if !objs.decode(t, "PodDisruptionBudget", &budget) || !subsetOf(budget.Spec.Selector.MatchLabels, sts.Spec.Template.Metadata.Labels) {
		t.Error("no PodDisruptionBudget selecting the pods")
	}

	// Autoscaling: a ScaledObject iff enabled, up to the partition count,
	// on the app's group lag; replicas left to it.
	var so scaledObject
	switch has := objs.decode(t, "ScaledObject", &so); {
	case has != autoscaling:
		t.Errorf("ScaledObject rendered: %v, autoscaling.enabled: %v", has, autoscaling)
	case autoscaling:
		if so.Spec.MaxReplicaCount != partitions || so.Spec.MinReplicaCount != minReplicas {
			t.Errorf("ScaledObject replicas %d to %d, want %d to partitions (%d)", so.Spec.MinReplicaCount, so.Spec.MaxReplicaCount, minReplicas, partitions)
		}
		if so.Spec.ScaleTargetRef.Kind != "StatefulSet" || so.Spec.ScaleTargetRef.Name != sts.Metadata.Name {
			t.Errorf("ScaledObject targets %+v", so.Spec.ScaleTargetRef)
		}
		if len(so.Spec.Triggers) != 1 || so.Spec.Triggers[0].Type != "kafka" {
			t.Fatalf("ScaledObject triggers %+v, want one kafka trigger", so.Spec.Triggers)
		}
		md := so.Spec.Triggers[0].Metadata
		if md["consumerGroup"] != cfg.AppID || md["topic"] != cfg.InputTopics[0] || md["bootstrapServers"] != strings.Join(cfg.Brokers, ",") || md["allowIdleConsumers"] != "false" {
			t.Errorf("kafka trigger %v: want group %s, topic %s, brokers %v, no idle consumers", md, cfg.AppID, cfg.InputTopics[0], cfg.Brokers)
		}
		if w := so.Spec.Advanced.HPA.Behavior.ScaleDown.StabilizationWindowSeconds; w < 300 {
			t.Errorf("scale-down stabilization window %ds: want a slow scale-down", w)
		}
		if sts.Spec.Replicas != nil {
			t.Error("the StatefulSet sets replicas while KEDA scales it: every upgrade would reset them")
		}
	default:
		if sts.Spec.Replicas == nil || *sts.Spec.Replicas != replicas {
			t.Errorf("StatefulSet replicas %s, want replicaCount %d", fmtPtr(sts.Spec.Replicas), replicas)
		}
	}

	var got ruleGroups
	switch has := objs.decode(t, "PrometheusRule", &struct {
		Spec *ruleGroups `yaml:"spec"`
	}{&got}); {
	case has != rules:
		t.Errorf("PrometheusRule rendered: %v, enabled: %v", has, rules)
	case rules:
		checkRules(t, got, svc.Metadata.Name, cfg.TransactionTimeout())
	}
}

// checkRules compares the PrometheusRule's rules with configs/alerts.yml:
// the same rules, every series selector limited to the release's pods, and
// SluiceTransactionTooOld's threshold at the transaction timeout.
func checkRules(t *testing.T, got ruleGroups, svc string, txTimeout time.Duration) {
	t.Helper()
	b, err := os.ReadFile("../../configs/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var want ruleGroups
	if err := yaml.Unmarshal(b, &want); err != nil {
		t.Fatal(err)
	}
	sel := fmt.Sprintf(`namespace="streams",service=%q`, svc)
	series := regexp.MustCompile(`\b(sluice_[a-z_]+|up)\b(\{[^}]*\})?`)
	if len(got.Groups) != len(want.Groups) {
		t.Fatalf("%d rule groups, want %d", len(got.Groups), len(want.Groups))
	}
	for i, g := range want.Groups {
		if len(got.Groups[i].Rules) != len(g.Rules) {
			t.Fatalf("group %s: %d rules, want %d", g.Name, len(got.Groups[i].Rules), len(g.Rules))
		}
		for j, w := range g.Rules {
			r := got.Groups[i].Rules[j]
			for _, m := range series.FindAllStringSubmatch(r.Expr, -1) {
				if !strings.Contains(m[2], sel) {
					t.Errorf("%s: series %s not limited to the release (%s)", r.Alert, m[0], sel)
				}
			}
			expr := strings.ReplaceAll(strings.ReplaceAll(r.Expr, "{"+sel+"}", ""), sel+",", "")
			if w.Alert == "SluiceTransactionTooOld" {
				w.Expr = strings.Replace(w.Expr, "> 10", fmt.Sprintf("> %v", txTimeout.Seconds()), 1)
			}
			r.Expr = expr
			if fmt.Sprint(r) != fmt.Sprint(w) {
				t.Errorf("rule differs from configs/alerts.yml (selector removed):\n got %+v\nwant %+v", r, w)
			}
		}
	}
}

func subsetOf(sub, of map[string]string) bool {
	if len(sub) == 0 {
		return false
	}
	for k, v := range sub {
		if of[k] != v {
			return false
		}
	}
	return true
}

func fmtPtr[T any](p *T) string {
	if p == nil {
		return "unset"
	}
	return fmt.Sprint(*p)
}
