package groupview

import (
	"errors"
	"reflect"
	"testing"
)

// The standby assignor's user data: both encodings round-trip, and what
// is cut short, too long or of another version is refused.
func TestStandbyUserDataRoundTrips(t *testing.T) {
	copies := map[int32]int64{0: 1, 7: 1 << 40, 3: 0}
	got, err := DecodeLocalCopies(EncodeLocalCopies(copies))
	if err != nil || !reflect.DeepEqual(got, copies) {
		t.Fatalf("copies %v, %v; want %v", got, err, copies)
	}
	if got, err := DecodeLocalCopies(EncodeLocalCopies(nil)); err != nil || len(got) != 0 {
		t.Fatalf("no copies: %v, %v", got, err)
	}
	ts := []int32{4, 1, 9}
	back, err := DecodeStandbys(EncodeStandbys(ts))
	if err != nil || !reflect.DeepEqual(back, ts) {
		t.Fatalf("standbys %v, %v; want %v", back, err, ts)
	}
	for _, bad := range [][]byte{nil, {9, 0, 0, 0, 0}, {1, 0, 0, 0, 2, 0, 0, 0, 1}, {1, 0, 0, 0, 1}} {
		if _, err := DecodeStandbys(bad); !errors.Is(err, ErrUserData) {
			t.Fatalf("standbys from %v: %v, want ErrUserData", bad, err)
		}
		if _, err := DecodeLocalCopies(bad); !errors.Is(err, ErrUserData) {
			t.Fatalf("copies from %v: %v, want ErrUserData", bad, err)
		}
	}
}
