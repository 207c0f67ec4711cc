package sluicetest

import (
	"sync"
	"time"
)

// clock is a harness's processing-time clock (sluice.Options.Clock): it
// stands still until the test advances it, and then wakes the running
// instance's loop, which otherwise would notice only at its next poll.
type clock struct {
	mu   sync.Mutex
	now  time.Time
	wake func()
}

// Now is what the instance's jobs see as Context.Now.
func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// NotifyAdvance is called by each instance the harness starts, with the
// function that wakes its loop. One instance runs at a time, so the newest
// replaces the one before: a killed or stopped instance needs no waking.
func (c *clock) NotifyAdvance(wake func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.wake = wake
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	wake := c.wake
	c.mu.Unlock()
	if wake != nil {
		wake()
	}
}
