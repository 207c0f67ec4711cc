package jobs

import (
	"errors"
	"strconv"
	"testing"
)

func FuzzParseIntIsStrconv(f *testing.F) {
	for _, s := range []string{
		"0", "7", "-7", "+7", "-0", "", "-", "+", "1_000", " 1", "1 ", "0x10", "12a",
		"999999999999999999", "-999999999999999999", // 18 digits: parsed here
		"9223372036854775807", "-9223372036854775808", // 19 digits: strconv's
		"9223372036854775808", "-9223372036854775809", "99999999999999999999",
		"+-1", "--1", "٣",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, gotErr := parseInt([]byte(s))
		want, wantErr := strconv.ParseInt(s, 10, 64)
		if got != want || (gotErr == nil) != (wantErr == nil) {
			t.Fatalf("parseInt(%q) = %d, %v; strconv says %d, %v", s, got, gotErr, want, wantErr)
		}
		if gotErr != nil && gotErr.Error() != wantErr.Error() {
			t.Fatalf("parseInt(%q) error %q; strconv's %q", s, gotErr, wantErr)
		}
		var ne *strconv.NumError
		if gotErr != nil && !errors.As(gotErr, &ne) {
			t.Fatalf("parseInt(%q) error %T, not a *strconv.NumError", s, gotErr)
		}
	})
}

func TestParseIntDoesNotAllocate(t *testing.T) {
	b := []byte("-123456789")
	if n := testing.AllocsPerRun(100, func() {
		if v, err := parseInt(b); err != nil || v != -123456789 {
			t.Fatal(v, err)
		}
	}); n != 0 {
		t.Fatalf("parseInt allocates %.0f times a call", n)
	}
}
