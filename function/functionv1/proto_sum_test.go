package functionv1

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"testing"
)

// The generated code must come from the committed .proto: edit the .proto,
// run make proto, commit both.
func TestGeneratedFromCommittedProto(t *testing.T) {
	b, err := os.ReadFile("../../proto/sluice/function/v1/function.proto")
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	if got := hex.EncodeToString(sum[:]); got != ProtoSHA256 {
		t.Fatalf("function.proto has SHA-256 %s, the generated code was made from %s: run make proto", got, ProtoSHA256)
	}
}
