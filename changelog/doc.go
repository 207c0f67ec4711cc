// Package changelog owns Sluice's changelog topic: the record format, the
// creation and validation of the compacted topic, and restoring a task's
// store from its changelog partition.
//
// Every epoch a task writes, inside the epoch's Kafka transaction, one record
// per key it dirtied (the value, or a tombstone for a delete) and then one
// epoch marker carrying its next input offsets. The record key is the
// backend key itself (kstate.EncodeKey), so restoring is copying records
// into the backend; the marker has a key of its own kind, the same for every
// epoch, so compaction keeps only the newest.
//
// A restore reads the task's partition read_committed from the offset its
// backend stored, applies complete epochs only (everything up to a marker),
// and finishes only when nothing is still landing: the partition has no open
// transaction and the group's stable committed offsets agree with the last
// marker.
package changelog
