package sluice_test

import (
	"os"
	"strings"
	"testing"
)

// The README's "Writing a job in Go" program is examples/views/main.go,
// which go vet and go build check with the rest of the module; this test
// keeps the two the same.
func TestREADMEProgram(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	program, err := os.ReadFile("examples/views/main.go")
	if err != nil {
		t.Fatal(err)
	}
	s := string(readme)
	i := strings.Index(s, "## Writing a job in Go")
	if i < 0 {
		t.Fatal(`README.md has no "Writing a job in Go" section`)
	}
	start := strings.Index(s[i:], "```go\n")
	if start < 0 {
		t.Fatal("the section has no Go block")
	}
	block := s[i+start+len("```go\n"):]
	end := strings.Index(block, "```")
	if end < 0 {
		t.Fatal("the Go block does not end")
	}
	if block[:end] != string(program) {
		t.Error("README.md's program differs from examples/views/main.go: copy one onto the other")
	}
}
