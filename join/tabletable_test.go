package join_test

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/join"
	"github.com/sluicehq/sluice/sluicetest"
)

// tablesJob joins tables "a" (left) and "b" (right) into
// "<left>|<right>", "-" for a side without a value; "bad" fails, and so
// does "needs-left" without a left value.
func tablesJob(t *testing.T, leftOuter, rightOuter bool) sluice.Job {
	t.Helper()
	val := func(e *join.Element) string {
		if e == nil {
			return "-"
		}
		return string(e.Value)
	}
	job, err := join.TableTable(join.TableTableSpec{
		Name: "tt", Left: "a", Right: "b", LeftOuter: leftOuter, RightOuter: rightOuter,
		Join: func(key []byte, l, r *join.Element) ([]byte, error) {
			if val(l) == "bad" || val(r) == "bad" || l == nil && val(r) == "needs-left" {
				return nil, fmt.Errorf("cannot join %s and %s", val(l), val(r))
			}
			return fmt.Appendf(nil, "%s|%s", val(l), val(r)), nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return job
}

// byKey is each key's outputs in order, as "value@ms" (ms after base),
// "TOMBSTONE@ms" for a nil value.
func byKey(out []sluice.Record) map[string][]string {
	m := map[string][]string{}
	for _, r := range out {
		v := string(r.Value)
		if r.Value == nil {
			v = "TOMBSTONE"
		}
		m[string(r.Key)] = append(m[string(r.Key)], fmt.Sprintf("%s@%d", v, r.Timestamp.Sub(base).Milliseconds()))
	}
	return m
}

// The joined table's updates equal a model that applies both tables'
// records in time order: a row's value at each change of either side that
// leaves a row, a tombstone when a row goes, nothing otherwise, stamped
// with the later of the two sides' times; for inner, left, right and full
// joins, across a kill -9 mid-stream, on both backends.
func TestTableTableJoinMatchesModel(t *testing.T) {
	t.Parallel()
	kinds := []struct {
		name                  string
		leftOuter, rightOuter bool
	}{{"inner", false, false}, {"left", true, false}, {"right", false, true}, {"full", true, true}}
	for _, kind := range kinds {
		for _, backend := range []string{"bbolt", "memory"} {
			t.Run(kind.name+"/"+backend, func(t *testing.T) {
				t.Parallel()
				rng := rand.New(rand.NewPCG(11, 3))
				type rec struct {
					topic, key string
					value      []byte
				}
				type side struct {
					v  string
					ms int64
				}
				var recs []rec
				tables := map[string]map[string]side{"a": {}, "b": {}}
				row := func(l, r bool) bool { return l && r || l && kind.leftOuter || r && kind.rightOuter }
				want := map[string][]string{}
				for i := range 300 {
					topic := []string{"a", "b"}[rng.IntN(2)]
					other := map[string]string{"a": "b", "b": "a"}[topic]
					key := fmt.Sprintf("k%d", rng.IntN(6))
					var value []byte
					if rng.IntN(4) > 0 {
						value = fmt.Appendf(nil, "%s%d", topic, i)
					}
					recs = append(recs, rec{topic, key, value})
					_, had := tables[topic][key]
					o, has := tables[other][key]
					if value != nil {
						tables[topic][key] = side{string(value), int64(i)}
					} else {
						delete(tables[topic], key)
					}
					l0, r0, l1, r1 := had, has, value != nil, has
					if topic == "b" {
						l0, r0, l1, r1 = has, had, has, value != nil
					}
					ms := max(int64(i), map[bool]int64{true: o.ms, false: 0}[has])
					switch {
					case row(l1, r1):
						lv, rv := "-", "-"
						if s, ok := tables["a"][key]; ok {
							lv = s.v
						}
						if s, ok := tables["b"][key]; ok {
							rv = s.v
						}
						want[key] = append(want[key], fmt.Sprintf("%s|%s@%d", lv, rv, ms))
					case row(l0, r0):
						want[key] = append(want[key], fmt.Sprintf("TOMBSTONE@%d", ms))
					}
				}
				n := 0
				for _, vs := range want {
					n += len(vs)
				}
				if n < 60 {
					t.Fatalf("the model has %d outputs: too few to test anything", n)
				}
				h := sluicetest.New(t, tablesJob(t, kind.leftOuter, kind.rightOuter), tableOptions(backend, "a", "b"))
				sendKilled(h, len(recs), 100, 200, func(i int) {
					h.SendTo(recs[i].topic, []byte(recs[i].key), recs[i].value, at(int64(i)))
				})
				h.Settle()
				if got := byKey(h.Output()); !maps.EqualFunc(got, want, func(a, b []string) bool { return strings.Join(a, ",") == strings.Join(b, ",") }) {
					for k := range want {
						if strings.Join(got[k], ",") != strings.Join(want[k], ",") {
							t.Errorf("%s: got\n%s\nwant\n%s", k, strings.Join(got[k], ","), strings.Join(want[k], ","))
						}
					}
					t.FailNow()
				}
				if dl := h.DeadLetters(); len(dl) != 0 {
					t.Fatalf("dead letters: %v", dl)
				}
			})
		}
	}
}

// A Join error dead-letters the update, which changes nothing; a record
// without a key is dead-lettered; an empty value is a value, and the
// joined row's tombstone goes out when a side of an inner row goes.
func TestTableTableJoinFailuresAndTombstones(t *testing.T) {
	t.Parallel()
	h := sluicetest.New(t, tablesJob(t, false, false), tableOptions("bbolt", "a", "b"))
	h.SendTo("a", []byte("k"), []byte("l1"), at(1))
	h.SendTo("b", []byte("k"), []byte{}, at(2))      // empty, not a delete: a row
	h.SendTo("a", []byte("k"), []byte("bad"), at(3)) // fails: l1 stays
	h.SendTo("b", nil, []byte("r"), at(4))           // no key
	h.SendTo("b", []byte("k"), []byte("r2"), at(5))  // joins l1
	h.SendTo("a", []byte("k"), nil, at(6))           // the row goes
	h.SendTo("a", []byte("k"), nil, at(7))           // no row before or after: nothing
	h.SendTo("b", []byte("m"), []byte("r"), at(20))
	h.Settle()
	h.SendTo("a", []byte("m"), []byte("l"), at(15)) // out of order: stamped with b's later time
	h.Settle()
	outs := byKey(h.Output())
	if got, want := strings.Join(outs["k"], ","), "l1|@2,l1|r2@5,TOMBSTONE@6"; got != want {
		t.Fatalf("outputs %s, want %s", got, want)
	}
	if got, want := strings.Join(outs["m"], ","), "l|r@20"; got != want {
		t.Fatalf("outputs of m %s, want %s", got, want)
	}
	// The two come from other tasks: in either order.
	var dl []string
	for _, r := range h.DeadLetters() {
		dl = append(dl, string(r.Value))
	}
	slices.Sort(dl)
	if !slices.Equal(dl, []string{"bad", "r"}) {
		t.Fatalf("dead letters %q, want bad's and the unkeyed record's", dl)
	}
}

// The spec is checked before anything runs.
func TestTableTableSpecIsChecked(t *testing.T) {
	fn := func(key []byte, l, r *join.Element) ([]byte, error) { return nil, nil }
	for _, tc := range []struct {
		spec join.TableTableSpec
		want string
	}{
		{join.TableTableSpec{Left: "a", Right: "b", Join: fn}, "Name is empty"},
		{join.TableTableSpec{Name: "n", Left: "a", Join: fn}, "must name the two input topics"},
		{join.TableTableSpec{Name: "n", Left: "a", Right: "a", Join: fn}, "both \"a\""},
		{join.TableTableSpec{Name: "n", Left: "a", Right: "b"}, "Join is nil"},
	} {
		if _, err := join.TableTable(tc.spec); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.spec, err, tc.want)
		}
	}
}

// In an outer join a delete that leaves a row calls Join; its error
// dead-letters the delete, and the side keeps its value. An update of the
// right side that comes after a later left value is stamped with the
// left's time.
func TestTableTableOuterJoinFailedDelete(t *testing.T) {
	t.Parallel()
	h := sluicetest.New(t, tablesJob(t, true, true), tableOptions("bbolt", "a", "b"))
	h.SendTo("a", []byte("k"), []byte("l1"), at(1))
	h.SendTo("b", []byte("k"), []byte("bad"), at(2)) // fails: no right value
	h.SendTo("b", []byte("k"), []byte("r1"), at(3))
	h.Settle()
	h.SendTo("a", []byte("k"), []byte("l2"), at(10))
	h.Settle()
	h.SendTo("b", []byte("k"), []byte("r2"), at(5)) // out of order: stamped 10
	h.Settle()
	if got, want := strings.Join(byKey(h.Output())["k"], ","), "l1|-@1,l1|r1@3,l2|r1@10,l2|r2@10"; got != want {
		t.Fatalf("outputs %s, want %s", got, want)
	}
	// A left delete whose row Join refuses: the delete is dead-lettered
	// and the left keeps l2, which r3 then joins.
	h.SendTo("b", []byte("k"), []byte("needs-left"), at(11))
	h.SendTo("a", []byte("k"), nil, at(12)) // Join(nil, needs-left) fails
	h.SendTo("b", []byte("k"), []byte("r3"), at(13))
	h.Settle()
	if got, want := strings.Join(byKey(h.Output())["k"], ","), "l1|-@1,l1|r1@3,l2|r1@10,l2|r2@10,l2|needs-left@11,l2|r3@13"; got != want {
		t.Fatalf("outputs %s, want %s", got, want)
	}
	dl := h.DeadLetters()
	if len(dl) != 2 || string(dl[0].Value) != "bad" || dl[1].Value != nil || !strings.Contains(header(dl[1], sluice.HeaderError), "needs-left") {
		t.Fatalf("dead letters %v, want bad's and the refused delete", dl)
	}
}
