// Package pgtest runs a real PostgreSQL server for a test: initdb in a
// temporary directory, a postmaster on a free 127.0.0.1 port with
// max_prepared_transactions set, stopped in t.Cleanup. There is no mock:
// the sink's protocol (PREPARE TRANSACTION, COMMIT PREPARED, the audit
// table) is only worth testing against the real thing.
//
// The server binaries are looked up in $PATH, then in
// /usr/lib/postgresql/<version>/bin. Without them the test fails (it does
// not skip): .ci/run installs the Debian package when they are missing.
// initdb refuses to run as root, so as root the server runs as the
// postgres OS user, which owns the data directory.
//
//	srv := pgtest.Start(t)
//	conn, _ := pgx.Connect(ctx, srv.URL())
//	srv.Stop(t)  // the database down, mid-test
//	srv.Restart(t)
package pgtest
