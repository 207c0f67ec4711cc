package sluicetest_test

import (
	"fmt"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/kstate"
	"github.com/sluicehq/sluice/sluicetest"
)

// remindAt is when the customer's reminder is due, unix milliseconds;
// absent when none is armed.
var remindAt = kstate.Value[int64]("remind-at", kstate.Int64())

// cartReminder reminds a customer of a cart left for 30 minutes of
// processing time: "add" arms the reminder, "checkout" cancels it.
var cartReminder = sluice.Job{
	Name:  "cart-reminder",
	Emits: true,
	Process: func(ctx sluice.Context, rec *sluice.Record) error {
		at, armed, err := remindAt.Get(ctx)
		if err != nil {
			return err
		}
		switch string(rec.Value) {
		case "add":
			if armed {
				return nil
			}
			due := ctx.Now().Add(30 * time.Minute)
			ctx.Timers().RegisterProcessingTime(due)
			return remindAt.Set(ctx, due.UnixMilli())
		case "checkout":
			if armed {
				ctx.Timers().DeleteProcessingTime(time.UnixMilli(at))
			}
			return remindAt.Clear(ctx)
		}
		return fmt.Errorf("unknown event %q", rec.Value)
	},
	OnTimer: func(ctx sluice.Context, tm sluice.Timer) error {
		ctx.Emit(tm.Key, []byte("come back, your cart is waiting (at "+ctx.Now().Format("15:04")+")"))
		return remindAt.Clear(ctx)
	},
}

// A processing-time timer job under test: the clock moves only when the
// test advances it, and the reminders, being state, survive a crash. In a
// test function, pass its *testing.T to New instead of using Run.
func Example() {
	err := sluicetest.Run(func(t sluicetest.TB) {
		h := sluicetest.New(t, cartReminder, sluicetest.Options{})
		h.Send([]byte("ann"), []byte("add"), time.Time{})
		h.Send([]byte("bob"), []byte("add"), time.Time{})
		h.Settle()

		h.Advance(10 * time.Minute)
		h.Send([]byte("bob"), []byte("checkout"), time.Time{})
		h.Settle()

		h.Kill() // a crash; its successor restores the armed reminders
		h.Restart()
		h.Advance(19 * time.Minute)
		h.Settle()
		fmt.Println("after 29 minutes:", len(h.Output()), "reminders")

		h.Advance(time.Minute)
		h.Settle()
		for _, r := range h.Output() {
			fmt.Printf("%s: %s\n", r.Key, r.Value)
		}
	})
	if err != nil {
		fmt.Println(err)
	}
	// Output:
	// after 29 minutes: 0 reminders
	// ann: come back, your cart is waiting (at 00:30)
}
