package sluice

import (
	"context"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Several input topics (co-processing).
//
// A task owns partition p of every input topic: the topics must have equal
// partition counts (prepare refuses others at start) and the group's
// balancer is the range assignor (balancer), which gives partition p of
// each topic to one member. The state is shared: a key's state is the same
// whichever topic its record came from (Record.Topic says which).
//
// Ordering rules:
//   - A task runs only while this member owns partition p of every input
//     topic (ownsTask). Under KIP-848 a member's partitions can arrive topic
//     by topic; a task started on part of them would share its partition
//     number with a previous owner still running. Losing any one releases
//     the task, and its other partitions are paused until it runs again.
//   - Within a task, records of the topics are processed in timestamp order
//     (ties: the order of Options.InputTopics), so a job that combines them
//     sees the same interleaving on a replay as on the first run. A topic
//     whose records run out in a poll while it still has records on the
//     broker (the task has not read up to its last known high-water mark)
//     holds the others back: their remaining records are fetched again,
//     for at most Options.MaxTaskIdle, after which the task goes on without
//     it (Kafka Streams' max.task.idle.ms idea, bounded).

// noteOwned records which partitions the group gave or took.
func (l *loop) noteOwned(ev event) {
	for topic, ps := range ev.parts {
		for _, p := range ps {
			if ev.kind == "assigned" {
				if l.owned[p] == nil {
					l.owned[p] = map[string]bool{}
				}
				l.owned[p][topic] = true
			} else if l.owned[p] != nil {
				delete(l.owned[p], topic)
			}
		}
	}
}

// ownsTask reports whether this member owns partition p of every input.
func (l *loop) ownsTask(p int32) bool {
	for _, topic := range l.in.cfg.InputTopics {
		if !l.owned[p][topic] {
			return false
		}
	}
	return true
}

// pauseOwned pauses the partitions of p this member still owns after the
// task was released for the loss of another: they fetch again once the
// task runs.
func (l *loop) pauseOwned(p int32) {
	ps := map[string][]int32{}
	for topic := range l.owned[p] {
		ps[topic] = []int32{p}
	}
	if len(ps) > 0 {
		l.sess.Client().PauseFetchPartitions(ps)
	}
}

// coInput is what a task knows of one of its input topics, for the ordering
// rule: the last high-water mark seen, since when the task has been waiting
// for the topic's records, and how far its fetches went. dataTo is the
// offset after the last data record fetched, fetchedTo after the last
// record of any kind: a topic written in transactions has commit and abort
// markers, which the consumer is given (KeepControlRecords, with several
// input topics) and the loop drops (noteFetched), and records of aborted
// transactions, which read_committed leaves out. Once the task has taken
// every data record fetched, it is at fetchedTo, whatever the offsets
// between hold.
type coInput struct {
	hwm               int64
	waitingSince      time.Time
	dataTo, fetchedTo int64
}

// noteFetched drops the control records (transaction markers) of a fetch
// of the topic, in place, and notes how far the fetch went; recs are in
// offset order.
func (ci *coInput) noteFetched(recs []*kgo.Record) []*kgo.Record {
	if len(recs) == 0 {
		return recs
	}
	ci.fetchedTo = max(ci.fetchedTo, recs[len(recs)-1].Offset+1)
	data := slices.DeleteFunc(recs, isControl)
	if len(data) > 0 {
		ci.dataTo = max(ci.dataTo, data[len(data)-1].Offset+1)
	}
	return data
}

func isControl(r *kgo.Record) bool { return r.Attrs.IsControl() }

// at is where a task whose next offset is next stands in the topic: there,
// or, once it took every data record fetched, where the fetches went.
func (ci *coInput) at(next int64) int64 {
	if next >= ci.dataTo {
		return max(next, ci.fetchedTo)
	}
	return next
}

// learnEnds sets the known high-water marks of tasks just installed, with
// one request for all of them, so that their first poll already knows which
// topics have records to wait for.
func (l *loop) learnEnds(ts []*task) {
	if len(l.in.cfg.InputTopics) < 2 {
		return
	}
	ctx, cancel := context.WithTimeout(l.ctx, 5*time.Second)
	defer cancel()
	ends, err := l.in.adm.ListEndOffsets(ctx, l.in.cfg.InputTopics...)
	if err != nil {
		l.in.log.Warn("listing the input's end offsets failed; the tasks' first records are ordered as they come", "tasks", len(ts), "err", err)
	}
	for _, t := range ts {
		t.co = map[string]*coInput{}
		for _, topic := range l.in.cfg.InputTopics {
			ci := &coInput{}
			if o, ok := ends.Lookup(topic, t.p); ok && o.Err == nil {
				ci.hwm = o.Offset
			}
			t.co[topic] = ci
		}
	}
}

// behind reports whether the task has not read topic up to its last known
// high-water mark: records are on the broker that a poll has not brought.
// The task is at its next offset, or, once it took every data record
// fetched, where the fetches went: the markers and aborted records after
// them are no records to wait for. (It used to allow one offset short, for
// a transactional input's commit marker, and so waited Options.MaxTaskIdle
// whenever a topic's tail held more, as after an aborted transaction, and
// did not wait for a topic written without transactions one record short
// before its first fetch.)
func (t *task) behind(topic string) bool {
	ci := t.co[topic]
	if ci == nil || ci.hwm <= 0 {
		return false
	}
	next, ok := t.next[topic]
	if !ok {
		next = t.committed[topic] // 0 when none: from the start
	}
	return ci.at(next) < ci.hwm
}

// merged returns the records of a poll for task t in the order the task
// processes them (see the ordering rules), and for each topic the offset
// from which the rest must be fetched again (none when everything is taken).
func (l *loop) merged(t *task, byTopic map[string][]*kgo.Record) ([]*kgo.Record, map[string]int64) {
	topics := l.in.cfg.InputTopics
	now := time.Now()
	waitFor := func(topic string) bool {
		ci := t.co[topic]
		if ci == nil || !t.behind(topic) {
			return false
		}
		if ci.waitingSince.IsZero() {
			ci.waitingSince = now
		}
		return now.Sub(ci.waitingSince) < l.in.cfg.MaxTaskIdle
	}
	var out []*kgo.Record
	heads := map[string]int{}
	for {
		best := ""
		for _, topic := range topics {
			recs := byTopic[topic]
			if heads[topic] >= len(recs) {
				if waitFor(topic) {
					// Its next record may come before the others'.
					return out, rest(byTopic, heads)
				}
				continue
			}
			if best == "" || recs[heads[topic]].Timestamp.Before(byTopic[best][heads[best]].Timestamp) {
				best = topic
			}
		}
		if best == "" {
			return out, nil
		}
		out = append(out, byTopic[best][heads[best]])
		heads[best]++
		if ci := t.co[best]; ci != nil {
			ci.waitingSince = time.Time{}
		}
	}
}

// rest is, per topic, the offset of its first record not taken.
func rest(byTopic map[string][]*kgo.Record, heads map[string]int) map[string]int64 {
	r := map[string]int64{}
	for topic, recs := range byTopic {
		if h := heads[topic]; h < len(recs) {
			r[topic] = recs[h].Offset
		}
	}
	return r
}

// processMerged is process for several input topics: each running task's
// records of the poll, merged across its topics (see merged).
func (l *loop) processMerged(fs kgo.Fetches) error {
	in := l.in
	rewind := offsets{}
	byTask := map[int32]map[string][]*kgo.Record{}
	parts := 0
	fs.EachPartition(func(ftp kgo.FetchTopicPartition) {
		t := l.tasks[ftp.Partition]
		if len(ftp.Records) == 0 {
			return
		}
		if t == nil {
			rewind.set(ftp.Topic, ftp.Partition, ftp.Records[0].Offset)
			return
		}
		fetchedTo := ftp.Records[len(ftp.Records)-1].Offset + 1 // markers included
		if ci := t.co[ftp.Topic]; ci != nil {
			ci.hwm = max(ci.hwm, ftp.HighWatermark)
			ftp.Records = ci.noteFetched(ftp.Records)
		} else { // a task learnEnds did not install
			ftp.Records = slices.DeleteFunc(ftp.Records, isControl)
		}
		in.m.lag.WithLabelValues(ftp.Topic, t.label).Set(float64(max(0, ftp.HighWatermark-fetchedTo)))
		if len(ftp.Records) == 0 {
			t.skipMarkers(ftp.Topic) // markers only
			return
		}
		if byTask[ftp.Partition] == nil {
			byTask[ftp.Partition] = map[string][]*kgo.Record{}
		}
		if byTask[ftp.Partition][ftp.Topic] == nil {
			parts++
		}
		byTask[ftp.Partition][ftp.Topic] = append(byTask[ftp.Partition][ftp.Topic], ftp.Records...)
	})
	if parts > 0 {
		in.m.pollPartitions.Observe(float64(parts))
	}
	ps := make([]int32, 0, len(byTask))
	for p := range byTask {
		ps = append(ps, p)
	}
	slices.Sort(ps)
	worked, err := l.eachTask(len(ps), rewind, func(i int, rewind offsets) (bool, error) {
		p := ps[i]
		t := l.tasks[p]
		recs, again := l.merged(t, byTask[p])
		for topic, off := range again {
			rewind.set(topic, p, off)
		}
		worked := false
		t.beginBatch(in)
		for i, r := range recs {
			took, stop, err := l.take(t, r, rewind)
			if err != nil {
				return worked, err
			}
			if stop {
				// The rest of the task's records come again, each
				// topic from its first record not taken (before
				// what merged held back: found by review).
				seen := map[string]bool{r.Topic: true}
				for _, later := range recs[i+1:] {
					if !seen[later.Topic] {
						seen[later.Topic] = true
						rewind.set(later.Topic, p, later.Offset)
					}
				}
				return worked, nil
			}
			worked = worked || took
		}
		for topic := range t.co {
			t.skipMarkers(topic)
		}
		return worked, nil
	})
	return l.afterProcess(rewind, worked, false, err)
}

// skipMarkers moves the task's next offset of topic past the markers and
// aborted records fetched after its data, once it took every data record
// fetched: the consumer is there, and the offsets the epoch commits must be
// where it is (alignOffsets), or it would be moved back to fetch the
// markers again at every epoch. Not past the end of the replay of a refused
// commit (replayUntil), which takes nothing beyond it.
func (t *task) skipMarkers(topic string) {
	ci := t.co[topic]
	if ci == nil {
		return
	}
	next, ok := t.next[topic]
	if !ok {
		return
	}
	if until, ok := t.replayUntil[topic]; ok && ci.fetchedTo > until {
		return
	}
	t.next[topic] = ci.at(next)
}
