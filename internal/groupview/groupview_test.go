package groupview

import (
	"errors"
	"reflect"
	"testing"
)

// The standby assignor's user data: both encodings round-trip, and what
// is cut short, too long or of another version is refused.
func TestStandbyUserDataRoundTrips(t *testing.T) {
	copies := map[int32]Copy{0: {1, 0}, 7: {1 << 40, -1}, 3: {0, 12}}
	got, err := DecodeLocalCopies(EncodeLocalCopies(copies))
	if err != nil || !reflect.DeepEqual(got, copies) {
		t.Fatalf("copies %v, %v; want %v", got, err, copies)
	}
	if got, err := DecodeLocalCopies(EncodeLocalCopies(nil)); err != nil || len(got) != 0 {
		t.Fatalf("no copies: %v, %v", got, err)
	}
	ts, warm := []int32{4, 1, 9}, []int32{9}
	back, backWarm, err := DecodeStandbys(EncodeStandbys(ts, warm))
	if err != nil || !reflect.DeepEqual(back, ts) || !reflect.DeepEqual(backWarm, warm) {
		t.Fatalf("standbys %v %v, %v; want %v %v", back, backWarm, err, ts, warm)
	}
	if back, backWarm, err := DecodeStandbys(EncodeStandbys(nil, nil)); err != nil || len(back)+len(backWarm) != 0 {
		t.Fatalf("no standbys: %v %v, %v", back, backWarm, err)
	}
	valid := EncodeStandbys(ts, warm)
	for _, bad := range [][]byte{nil, {9, 0, 0, 0, 0}, {2, 0, 0, 0, 2, 0, 0, 0, 1}, {2, 0, 0, 0, 1}, {2, 0, 0, 0, 0}, append(valid, 0)} {
		if _, _, err := DecodeStandbys(bad); !errors.Is(err, ErrUserData) {
			t.Fatalf("standbys from %v: %v, want ErrUserData", bad, err)
		}
		if _, err := DecodeLocalCopies(bad); len(bad) != 5 && !errors.Is(err, ErrUserData) { // {2,0,0,0,0} is no copies
			t.Fatalf("copies from %v: %v, want ErrUserData", bad, err)
		}
	}
	if _, err := DecodeLocalCopies([]byte{2, 0, 0, 0, 1, 0, 0, 0, 1}); !errors.Is(err, ErrUserData) {
		t.Fatalf("a copy cut short: %v, want ErrUserData", err)
	}
}
