// Package configs holds the deployment files of the docker-compose demo;
// its test checks the Grafana dashboard against the metrics the engine
// really registers.
package configs_test

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

type panel struct {
	ID         int    `json:"id"`
	Type       string `json:"type"`
	Title      string `json:"title"`
	Datasource struct {
		UID string `json:"uid"`
	} `json:"datasource"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
}

// The dashboard's queries name only metrics the engine registers (a
// renamed metric would leave an empty panel), use the provisioned data
// source, and cover what an operator watches first.
func TestGrafanaDashboard(t *testing.T) {
	var dash struct {
		UID    string  `json:"uid"`
		Panels []panel `json:"panels"`
	}
	b, err := os.ReadFile("grafana/dashboards/sluice.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatal(err)
	}

	var ds struct {
		Datasources []struct {
			UID string `yaml:"uid"`
		} `yaml:"datasources"`
	}
	b, err = os.ReadFile("grafana/provisioning/datasources/prometheus.yml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &ds); err != nil || len(ds.Datasources) != 1 {
		t.Fatalf("datasource provisioning: %v", err)
	}

	src, err := os.ReadFile("../metrics.go")
	if err != nil {
		t.Fatal(err)
	}
	registered := map[string]bool{}
	for _, m := range regexp.MustCompile(`Name: "(sluice_[a-z_]+)"`).FindAllStringSubmatch(string(src), -1) {
		registered[m[1]] = true
	}
	if len(registered) < 10 {
		t.Fatalf("found %d metrics in metrics.go; has the file moved?", len(registered))
	}

	used := map[string]bool{}
	ids := map[int]bool{}
	metric := regexp.MustCompile(`sluice_[a-z_]+`)
	for _, p := range dash.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d twice", p.ID)
		}
		ids[p.ID] = true
		if p.Type == "row" {
			continue
		}
		if p.Datasource.UID != ds.Datasources[0].UID {
			t.Errorf("panel %q uses data source %q, provisioned is %q", p.Title, p.Datasource.UID, ds.Datasources[0].UID)
		}
		for _, tg := range p.Targets {
			for _, name := range metric.FindAllString(tg.Expr, -1) {
				base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(name, "_bucket"), "_sum"), "_count")
				if !registered[base] {
					t.Errorf("panel %q queries %s, which the engine does not register", p.Title, name)
				}
				used[base] = true
			}
		}
	}
	for _, want := range []string{
		"sluice_records_in_total", "sluice_records_out_total", "sluice_consumer_lag",
		"sluice_checkpoint_duration_seconds", "sluice_transactions_total", "sluice_restore_records_remaining",
		"sluice_state_bytes", "sluice_open_transaction_age_seconds", "sluice_ready",
	} {
		if !used[want] {
			t.Errorf("no panel shows %s", want)
		}
	}
}

// The Helm chart ships the same dashboard.
func TestChartDashboardIsACopy(t *testing.T) {
	a, err := os.ReadFile("grafana/dashboards/sluice.json")
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile("../deploy/helm/sluice/files/sluice-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	if string(a) != string(b) {
		t.Error("deploy/helm/sluice/files/sluice-dashboard.json differs: cp configs/grafana/dashboards/sluice.json deploy/helm/sluice/files/sluice-dashboard.json")
	}
}
