package pgsink

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/sluicehq/sluice/txsink"
)

// Commit makes a prepared transaction visible (COMMIT PREPARED). One that
// is not prepared any more is looked up in the audit table: committed
// under id already (a commit whose answer was lost, or a restore that
// finished it) is success; anything else is ErrSinkConflict, since Kafka
// committed an epoch whose rows are gone.
func (s *Sink) Commit(ctx context.Context, id txsink.TxnID) error {
	pool, err := s.connPool()
	if err != nil {
		return err
	}
	_, err = pool.Exec(ctx, "COMMIT PREPARED "+quote(id.String()))
	if !isCode(err, "42704") { // undefined_object: no such prepared transaction
		if err != nil {
			return fmt.Errorf("pgsink: commit %s: %w", id, err)
		}
		return nil
	}
	var txn string
	err = pool.QueryRow(ctx, "SELECT txn FROM "+s.audit+" WHERE app = $1 AND task = $2 AND epoch = $3",
		id.App, id.Task, int64(id.Epoch)).Scan(&txn)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("%w: Kafka committed task %d epoch %d, but its prepared transaction %s is gone and the epoch is not in %s: its rows are lost (rolled back by hand?)",
			txsink.ErrSinkConflict, id.Task, id.Epoch, id, AuditTable)
	case err != nil:
		return fmt.Errorf("pgsink: commit %s: look it up: %w", id, err)
	case txn != id.String():
		return fmt.Errorf("%w: Kafka committed task %d epoch %d as %s, but %s holds that epoch as %s",
			txsink.ErrSinkConflict, id.Task, id.Epoch, id, AuditTable, txn)
	}
	return nil
}

// Abort rolls a prepared transaction back (ROLLBACK PREPARED); one that is
// not prepared is not an error.
func (s *Sink) Abort(ctx context.Context, id txsink.TxnID) error {
	pool, err := s.connPool()
	if err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, "ROLLBACK PREPARED "+quote(id.String())); err != nil && !isCode(err, "42704") {
		return fmt.Errorf("pgsink: roll back %s: %w", id, err)
	}
	return nil
}

// Claim reads the database's clock for a restore of task.
func (s *Sink) Claim(ctx context.Context, task int32) (txsink.Claim, error) {
	pool, err := s.connPool()
	if err != nil {
		return txsink.Claim{}, err
	}
	c := txsink.Claim{Task: task}
	if err := pool.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&c.At); err != nil {
		return txsink.Claim{}, fmt.Errorf("pgsink: claim task %d: %w", task, err)
	}
	return c, nil
}

// Recover finishes the restore that took c: the committed transaction (the
// last marker's) is committed if it is still prepared, and every other
// prepared transaction of the task that was prepared before the claim is
// rolled back (txsink.EpochSink, rule 5). pg_prepared_xacts.prepared is
// the time of PREPARE on the same server clock the claim read.
func (s *Sink) Recover(ctx context.Context, c txsink.Claim, committed string) error {
	pool, err := s.connPool()
	if err != nil {
		return err
	}
	if committed != "" {
		id, err := txsink.ParseTxnID(committed)
		if err != nil {
			return fmt.Errorf("%w: task %d: the last marker names sink transaction %q: %w", txsink.ErrSinkConflict, c.Task, committed, err)
		}
		if err := s.Commit(ctx, id); err != nil {
			return err
		}
	}
	prefix := txsink.TaskPrefix(s.cfg.App, c.Task)
	rows, err := pool.Query(ctx, `SELECT gid, prepared FROM pg_prepared_xacts
		WHERE database = current_database() AND left(gid, length($1)) = $1 AND prepared < $2`, prefix, c.At)
	if err != nil {
		return fmt.Errorf("pgsink: recover task %d: list prepared transactions: %w", c.Task, err)
	}
	type stray struct {
		gid string
		at  time.Time
	}
	var strays []stray
	for rows.Next() {
		var st stray
		if err := rows.Scan(&st.gid, &st.at); err != nil {
			return err
		}
		if st.gid != committed {
			strays = append(strays, st)
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("pgsink: recover task %d: list prepared transactions: %w", c.Task, err)
	}
	for _, st := range strays {
		if _, err := pool.Exec(ctx, "ROLLBACK PREPARED "+quote(st.gid)); err != nil && !isCode(err, "42704") {
			return fmt.Errorf("pgsink: recover task %d: roll back %s: %w", c.Task, st.gid, err)
		}
		s.cfg.Logger.Info("rolled back a prepared transaction whose epoch did not commit", "task", c.Task, "txn", st.gid, "prepared", st.at)
	}
	return nil
}

func isCode(err error, code string) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == code
}
