package main

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/sluicehq/sluice"
)

const (
	// The least-privilege set lives in docs/security.md, the README links
	// it.
	securityDocPath = "../../docs/security.md"
	securitySection = "## Least-privilege ACLs"
	aclTableStart   = "<!-- acl-table:start -->"
	aclTableEnd     = "<!-- acl-table:end -->"
)

// placeholderConfig is a configuration whose names are the variables they
// come from, so the ACLs it needs read as a template.
func placeholderConfig() Config {
	return Config{
		AppID:       "${SLUICE_APP_ID}",
		InstanceID:  "${SLUICE_INSTANCE_ID}",
		Job:         "aggregate",
		InputTopics: []string{"${SLUICE_INPUT_TOPICS}"},
		OutputTopic: "${SLUICE_OUTPUT_TOPIC}",
		RawDLQTopic: "${SLUICE_DLQ_TOPIC}",
		Guarantee:   string(sluice.ExactlyOnce),
		// The default; the table says which rows it adds.
		CreateTopics: true,
	}
}

// renderACLTable is docs/security.md's least-privilege set: the ACLs
// sluice.Options.ACLs lists for the placeholder configuration, exactly the
// function TestLeastPrivilegeACLs grants (and withdraws one by one).
func renderACLTable() string {
	lines := []string{"| Resource | Name | Operation | Needed to |", "|---|---|---|---|"}
	for _, a := range engineOptions(placeholderConfig(), nil, nil).ACLs() {
		lines = append(lines, fmt.Sprintf("| %s | `%s` | `%s` | %s |", sluice.ResourceName(a.Resource), a.Name, a.Operation, a.Why))
	}
	return strings.Join(lines, "\n")
}

// TestREADMEACLTable fails when docs/security.md's least-privilege table is
// not the one the engine needs.
func TestREADMEACLTable(t *testing.T) {
	b, err := os.ReadFile(securityDocPath)
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	start, end, err := markedSpan(readme, securitySection, aclTableStart, aclTableEnd)
	if err != nil {
		t.Fatal(err)
	}
	want := renderACLTable()
	if *updateREADME {
		if err := os.WriteFile(securityDocPath, []byte(readme[:start]+"\n"+want+"\n"+readme[end:]), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	if got := strings.Trim(readme[start:end], "\n"); got != want {
		gotRows, wantRows := strings.Split(got, "\n"), strings.Split(want, "\n")
		for _, r := range wantRows {
			if !slices.Contains(gotRows, r) {
				t.Error("missing row: " + r)
			}
		}
		for _, r := range gotRows {
			if !slices.Contains(wantRows, r) {
				t.Error("extra row: " + r)
			}
		}
		t.Error("docs/security.md's ACL table differs from sluice.Options.ACLs; run: go test ./cmd/processor -run README -update")
	}
}
