package join_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/join"
	"github.com/sluicehq/sluice/sluicetest"
)

// enrich is a left join of "orders" (the stream) with "customers" (the
// table): "<order>@<customer>", or "<order>@?" without a customer.
func enrich(t *testing.T) sluice.Job {
	t.Helper()
	job, err := join.Table(join.TableSpec{
		Name: "tj", Stream: "orders", Table: "customers",
		Join: func(key []byte, order join.Element, customer []byte, found bool) ([]byte, error) {
			switch {
			case string(order.Value) == "skip":
				return nil, nil
			case string(order.Value) == "bad":
				return nil, fmt.Errorf("cannot join %s", order.Value)
			case !found:
				return fmt.Appendf(nil, "%s@?", order.Value), nil
			}
			return fmt.Appendf(nil, "%s@%s", order.Value, customer), nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return job
}

// tableOptions has the table topic first, so that a table update and an
// order of the same time are taken in that order. Should a poll bring one
// topic and not the other, the task waits for the other up to MaxTaskIdle
// (under Settle's 30 s) rather than go on out of time order.
func tableOptions(backend string, topics ...string) sluicetest.Options {
	if len(topics) == 0 {
		topics = []string{"customers", "orders"}
	}
	return sluicetest.Options{Partitions: 2, Backend: backend, InputTopics: topics,
		Configure: func(o *sluice.Options) { o.MaxTaskIdle = 20 * time.Second }}
}

// Each order is joined with its key's customer as of the order's time:
// the outputs equal a model that applies the records in time order, across
// a kill -9 mid-stream, on both backends. Table records emit nothing, a
// nil value deletes the key.
func TestTableJoinMatchesModel(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{"bbolt", "memory"} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(7, 1))
			type rec struct {
				topic, key string
				value      []byte
			}
			var recs []rec
			table := map[string]string{}
			var want []string
			for i := range 300 {
				key := fmt.Sprintf("k%d", rng.IntN(6))
				switch r := rng.IntN(10); {
				case r < 3:
					v := fmt.Sprintf("c%d", i)
					recs = append(recs, rec{"customers", key, []byte(v)})
					table[key] = v
				case r < 4:
					recs = append(recs, rec{"customers", key, nil}) // a tombstone
					delete(table, key)
				default:
					v := fmt.Sprintf("o%d", i)
					recs = append(recs, rec{"orders", key, []byte(v)})
					c, ok := table[key]
					if !ok {
						c = "?"
					}
					// Stamped with the order's time.
					want = append(want, fmt.Sprintf("%s:%s@%s@%d", key, v, c, i))
				}
			}
			slices.Sort(want)

			h := sluicetest.New(t, enrich(t), tableOptions(backend))
			sendKilled(h, len(recs), 100, 200, func(i int) {
				h.SendTo(recs[i].topic, []byte(recs[i].key), recs[i].value, at(int64(i)))
			})
			h.Settle()
			expectModel(t, h, joinedAt(h.Output()), want)
		})
	}
}

// An order without a key, or whose Join fails, is dead-lettered; a table
// record without a key too (it cannot be a table entry); a nil Join value
// emits nothing.
func TestTableJoinFailures(t *testing.T) {
	t.Parallel()
	h := sluicetest.New(t, enrich(t), tableOptions("memory"))
	h.SendTo("customers", []byte("k"), []byte("ada"), at(1))
	h.SendTo("customers", nil, []byte("nobody"), at(2))
	h.SendTo("orders", nil, []byte("o-nokey"), at(3))
	h.SendTo("orders", []byte("k"), []byte("bad"), at(4))
	h.SendTo("orders", []byte("k"), []byte("skip"), at(5))
	h.SendTo("orders", []byte("k"), []byte("o1"), at(6))
	h.Settle()
	if got, want := joined(h.Output()), []string{"k:o1@ada"}; !slices.Equal(got, want) {
		t.Fatalf("outputs %q, want %q", got, want)
	}
	var dead []string
	for _, r := range h.DeadLetters() {
		dead = append(dead, string(r.Value)+": "+header(r, sluice.HeaderError))
	}
	slices.Sort(dead)
	if len(dead) != 3 || !strings.HasPrefix(dead[0], "bad: ") || !strings.Contains(dead[1], "without a key") || !strings.Contains(dead[2], "without a key") {
		t.Fatalf("dead letters %q, want bad, nobody and o-nokey", dead)
	}
}

func TestTableSpecIsChecked(t *testing.T) {
	ok := join.TableSpec{Name: "t", Stream: "s", Table: "t",
		Join: func([]byte, join.Element, []byte, bool) ([]byte, error) { return nil, nil }}
	job, err := join.Table(ok)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(job.States, []string{"t.table"}) {
		t.Fatalf("job states %q", job.States)
	}
	for name, mutate := range map[string]func(*join.TableSpec){
		"Name is empty":     func(s *join.TableSpec) { s.Name = "" },
		"must name the two": func(s *join.TableSpec) { s.Table = "" },
		"want two topics":   func(s *join.TableSpec) { s.Table = "s" },
		"Join is nil":       func(s *join.TableSpec) { s.Join = nil },
	} {
		s := ok
		mutate(&s)
		if _, err := join.Table(s); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: got %v", name, err)
		}
	}
}

// A table update and an order of the same time, both on the broker when
// the instance starts: the order sees the update when the table topic is
// named first in InputTopics, and not when the stream is.
func TestTableJoinTies(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		topics []string
		want   string
	}{
		{[]string{"customers", "orders"}, "k:o@c1"},
		{[]string{"orders", "customers"}, "k:o@c0"},
	} {
		t.Run(tc.topics[0]+"-first", func(t *testing.T) {
			t.Parallel()
			h := sluicetest.New(t, enrich(t), tableOptions("memory", tc.topics...))
			h.Kill()
			h.SendTo("customers", []byte("k"), []byte("c0"), at(9))
			h.SendTo("customers", []byte("k"), []byte("c1"), at(10))
			h.SendTo("orders", []byte("k"), []byte("o"), at(10))
			h.Restart()
			h.Settle()
			if got := joined(h.Output()); !slices.Equal(got, []string{tc.want}) {
				t.Fatalf("outputs %q, want %q", got, tc.want)
			}
		})
	}
}

// An empty table value is a value, not a delete; a stream record with a
// nil value is joined as any (Kafka Streams skips them; Join decides here).
func TestTableJoinEmptyAndNilValues(t *testing.T) {
	t.Parallel()
	job, err := join.Table(join.TableSpec{Name: "tj", Stream: "orders", Table: "customers",
		Join: func(key []byte, order join.Element, customer []byte, found bool) ([]byte, error) {
			return fmt.Appendf(nil, "%q@%q:%v", order.Value, customer, found), nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	h := sluicetest.New(t, job, tableOptions("bbolt"))
	h.SendTo("customers", []byte("k"), []byte{}, at(1))
	h.SendTo("orders", []byte("k"), nil, at(2))
	h.Settle()
	if got, want := joined(h.Output()), []string{`k:""@"":true`}; !slices.Equal(got, want) {
		t.Fatalf("outputs %q, want %q", got, want)
	}
}
