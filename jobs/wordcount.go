package jobs

import (
	"bytes"
	"strconv"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/kstate"
)

// wordCount is the count stage's state: each word's running count.
var wordCount = kstate.Value[int64]("count", kstate.Int64())

// WordCount is the built-in wordcount pipeline: stage "split" splits each
// input line (the record value; the key is ignored, lines need none) on
// white space and forwards every word keyed by itself, through the
// repartition topic <app>-count-repartition, to stage "count", which keeps
// each word's count and emits key = word, value = the running count as
// base-10 text, once per occurrence.
func WordCount() []sluice.Stage {
	split := sluice.Job{
		Name: "wordcount-split",
		Process: func(ctx sluice.Context, rec *sluice.Record) error {
			for _, w := range bytes.Fields(rec.Value) {
				if err := sluice.Forward(ctx, w, nil); err != nil {
					return err
				}
			}
			return nil
		},
	}
	count := sluice.Job{
		Name:   "wordcount",
		Emits:  true,
		States: []string{wordCount.Name()},
		QueryState: func(s kstate.Scope, _ string) (any, bool, error) {
			n, ok, err := wordCount.Get(s)
			return n, ok, err
		},
		Process: func(ctx sluice.Context, rec *sluice.Record) error {
			n, _, err := wordCount.Get(ctx)
			if err != nil {
				return err
			}
			n++
			if err := wordCount.Set(ctx, n); err != nil {
				return err
			}
			ctx.Emit(rec.Key, strconv.AppendInt(nil, n, 10))
			return nil
		},
	}
	return []sluice.Stage{{Name: "split", Job: split}, {Name: "count", Job: count}}
}
