package kstatetest_test

import (
	"fmt"
	"time"

	"github.com/sluicehq/sluice/kstate"
	"github.com/sluicehq/sluice/kstate/kstatetest"
)

// lastLogin expires an hour after it was written.
var lastLogin = kstate.Value("last-login", kstate.String(), kstate.WithTTL(time.Hour, kstate.OnCreateAndWrite))

// A Scope stands in for the processing context: the test sets the record
// key and moves the processing-time clock that state TTL runs on.
func ExampleScope() {
	sc := kstatetest.NewScope(kstate.NewStore(kstate.NewMemory()))
	if err := lastLogin.Set(sc.SetKey("ann"), "berlin"); err != nil {
		panic(err)
	}
	sc.Advance(59 * time.Minute)
	v, ok, _ := lastLogin.Get(sc)
	fmt.Printf("after 59m: %q %v\n", v, ok)
	sc.Advance(time.Minute)
	v, ok, _ = lastLogin.Get(sc)
	fmt.Printf("after 1h:  %q %v\n", v, ok)
	_, ok, _ = lastLogin.Get(sc.SetKey("bob"))
	fmt.Println("bob:", ok)
	// Output:
	// after 59m: "berlin" true
	// after 1h:  "" false
	// bob: false
}
