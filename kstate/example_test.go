package kstate_test

import (
	"fmt"
	"time"

	"github.com/sluicehq/sluice/kstate"
	"github.com/sluicehq/sluice/kstate/kstatetest"
)

// visits is declared once; the runtime scopes it to each record's key.
var visits = kstate.Value("visits", kstate.Int64())

func ExampleValue() {
	st := kstate.NewStore(kstate.NewMemory())
	sc := kstatetest.NewScope(st) // in a job, the processing context is the Scope

	for _, user := range []string{"ann", "bob", "ann"} {
		sc.SetKey(user)
		n, _, err := visits.Get(sc)
		if err == nil {
			err = visits.Set(sc, n+1)
		}
		if err != nil {
			st.RollbackRecord()
			continue
		}
		st.CommitRecord()
	}
	fmt.Println("dirty keys:", st.DirtyLen())

	// After the epoch's Kafka transaction commits:
	if err := st.Apply(st.Dirty(), kstate.Meta{Epoch: 1}); err != nil {
		panic(err)
	}
	for _, user := range []string{"ann", "bob", "cid"} {
		n, ok, _ := visits.Get(sc.SetKey(user))
		fmt.Println(user, n, ok)
	}
	// Output:
	// dirty keys: 2
	// ann 2 true
	// bob 1 true
	// cid 0 false
}

func ExampleDueTimers() {
	st := kstate.NewStore(kstate.NewMemory())
	sc := kstatetest.NewScope(st)
	for i, sensor := range []string{"s2", "s1", "s3"} {
		kstate.RegisterTimer(sc.SetKey(sensor), kstate.EventTime, kstatetest.Epoch.Add(time.Duration(10-i)*time.Second))
	}
	st.CommitRecord()

	// The watermark reached Epoch+9s: fire what is due, in time order.
	due, _ := kstate.DueTimers(st, kstate.EventTime, kstatetest.Epoch.Add(9*time.Second), 0)
	for _, t := range due {
		fmt.Printf("fire %s at +%v\n", t.Key, t.At.Sub(kstatetest.Epoch))
		kstate.RemoveTimer(st, t)
		st.CommitRecord()
	}
	// Output:
	// fire s3 at +8s
	// fire s1 at +9s
}
