// Package savepoint owns the savepoint format: a portable, backend-neutral
// copy of an application's state as of each task's last committed epoch,
// owned by the user rather than by Kafka.
//
// A savepoint is a directory holding one data file per task
// (task-NNNN.data) and a manifest (manifest.json) that describes them. The
// manifest is written last, atomically, so a directory without one is an
// incomplete savepoint and Open refuses it. docs/savepoints.md specifies the
// bytes, for tools that read savepoints without this package.
//
// Writing, one task at a time so that memory stays bounded by the largest
// entry, not by the state:
//
//	w, err := savepoint.Create(dir, savepoint.Manifest{AppID: app, ...})
//	for each task {
//		err = w.WriteTask(savepoint.Cut{Partition: p, Epoch: e, ...}, backend)
//	}
//	err = w.Commit() // the manifest: only now is the savepoint complete
//
// Reading:
//
//	sp, err := savepoint.Open(dir)
//	err = sp.Verify() // sizes and SHA-256 of every data file
//	for _, t := range sp.Manifest.Tasks {
//		err = sp.Scan(t, func(k, v []byte) error { ... })
//	}
package savepoint
