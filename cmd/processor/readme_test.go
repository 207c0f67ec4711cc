package main

import (
	"flag"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// updateREADME (-update) rewrites generated sections of checked-in files from the code:
//
//	go test ./cmd/processor -run README -update
var updateREADME = flag.Bool("update", false, "rewrite README.md's configuration table from config.go")

const (
	readmePath      = "../../README.md"
	readmeSection   = "## Configuration reference"
	envTableStart   = "<!-- env-table:start -->"
	envTableEnd     = "<!-- env-table:end -->"
	envTableHeader  = "| Variable | Default | Meaning |"
	envTableDivider = "|---|---|---|"
)

// TestREADMEConfigReference fails when README.md's configuration table is
// not the one config.go's struct tags produce.
func TestREADMEConfigReference(t *testing.T) {
	b, err := os.ReadFile(readmePath)
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	start, end, err := envTableSpan(readme)
	if err != nil {
		t.Fatal(err)
	}
	want := renderEnvTable(envReference())
	got := strings.Trim(readme[start:end], "\n")

	if *updateREADME {
		out := readme[:start] + "\n" + want + "\n" + readme[end:]
		if err := os.WriteFile(readmePath, []byte(out), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	if got == want {
		return
	}
	for _, d := range tableDiff(strings.Split(got, "\n"), strings.Split(want, "\n")) {
		t.Error(d)
	}
	t.Error("README.md's configuration table differs from config.go; run: go test ./cmd/processor -run README -update")
}

// envTableSpan finds the text between the table markers, which must sit in
// the configuration reference section.
func envTableSpan(readme string) (start, end int, err error) {
	return markedSpan(readme, readmeSection, envTableStart, envTableEnd)
}

// markedSpan finds the text between the markers startMark and endMark, which
// must sit in the section headed section (a "## " or "### " line).
func markedSpan(readme, section, startMark, endMark string) (start, end int, err error) {
	sec := strings.Index(readme, "\n"+section+"\n")
	if sec < 0 {
		return 0, 0, fmt.Errorf("%s: no %q section", readmePath, section)
	}
	sectionEnd := len(readme)
	if next := strings.Index(readme[sec+1+len(section):], "\n## "); next >= 0 {
		sectionEnd = sec + 1 + len(section) + next
	}
	s := strings.Index(readme, startMark)
	e := strings.Index(readme, endMark)
	if s < sec || e < s || e > sectionEnd {
		return 0, 0, fmt.Errorf("%s: want %s and %s, in this order, inside %q", readmePath, startMark, endMark, section)
	}
	return s + len(startMark), e, nil
}

func renderEnvTable(rows []envVar) string {
	lines := []string{envTableHeader, envTableDivider}
	for _, r := range rows {
		lines = append(lines, fmt.Sprintf("| `%s` | %s | %s |", r.Name, r.Default, r.Meaning))
	}
	return strings.Join(lines, "\n")
}

// tableDiff describes how the got table's rows differ from want's, by
// variable: missing, extra, changed, then out of order.
func tableDiff(got, want []string) []string {
	key := func(line string) string {
		cells := strings.Split(line, "|")
		if len(cells) < 3 {
			return line
		}
		return strings.TrimSpace(cells[1])
	}
	index := func(lines []string) (map[string]string, []string) {
		m := map[string]string{}
		var order []string
		for _, l := range lines {
			k := key(l)
			m[k] = l
			order = append(order, k)
		}
		return m, order
	}
	g, gotOrder := index(got)
	w, wantOrder := index(want)
	var diffs []string
	for _, k := range wantOrder {
		switch gl, ok := g[k]; {
		case !ok:
			diffs = append(diffs, "missing row: "+w[k])
		case gl != w[k]:
			diffs = append(diffs, fmt.Sprintf("row differs:\n  README: %s\n  want:   %s", gl, w[k]))
		}
	}
	for _, k := range gotOrder {
		if _, ok := w[k]; !ok {
			diffs = append(diffs, "extra row: "+g[k])
		}
	}
	if len(diffs) == 0 && !slices.Equal(gotOrder, wantOrder) {
		diffs = append(diffs, "rows are out of order")
	}
	return diffs
}

var htmlTag = regexp.MustCompile(`<[A-Za-z/!]`)

// TestConfigTagsRenderable keeps the tags fit for a one-line table cell.
func TestConfigTagsRenderable(t *testing.T) {
	for _, r := range envReference() {
		if r.Meaning == "" {
			t.Errorf("%s has no desc tag", r.Name)
		}
		for _, cell := range []string{r.Default, r.Meaning} {
			if strings.ContainsAny(cell, "|\n") || htmlTag.MatchString(cell) {
				t.Errorf("%s: %q cannot go in a markdown table cell (no '|', newline or HTML-like <word>)", r.Name, cell)
			}
		}
	}
}
