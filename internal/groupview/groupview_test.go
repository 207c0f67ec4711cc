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
	sb := Standbys{Tasks: []int32{4, 1, 9, 2}, Warmup: []int32{9, 2}, Incoming: []int32{2}, AcceptableLag: 10000}
	back, err := DecodeStandbys(EncodeStandbys(sb))
	if err != nil || !reflect.DeepEqual(back, sb) {
		t.Fatalf("standbys %+v, %v; want %+v", back, err, sb)
	}
	if back, err := DecodeStandbys(EncodeStandbys(Standbys{})); err != nil || len(back.Tasks)+len(back.Warmup)+len(back.Incoming) != 0 || back.AcceptableLag != 0 {
		t.Fatalf("no standbys: %+v, %v", back, err)
	}
	valid := EncodeStandbys(sb)
	for _, bad := range [][]byte{nil, {9, 0, 0, 0, 0}, {2, 0, 0, 0, 2, 0, 0, 0, 1}, {2, 0, 0, 0, 1}, {2, 0, 0, 0, 0}, append(valid, 0), valid[:len(valid)-1]} {
		if _, err := DecodeStandbys(bad); !errors.Is(err, ErrUserData) {
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
