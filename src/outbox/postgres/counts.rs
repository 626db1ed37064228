//! The counts of `stats` on PostgreSQL, kept as the queue changes, so that `stats` never
//! reads the whole queue (issue 50: a million queued took it 0.7 s to 1.3 s).
//!
//! A trigger on the queue, one per statement (not per row), reads the rows the statement
//! changed from its transition tables and adds what they change to `mail_breaker_outbox_changes`:
//! rows of how many messages it adds to the queued, to the dead and to the held, grouped by
//! the end of the hold (`GREATEST(due_at, lease_until)`: no claim takes a leased row before
//! both). A claim adds its batch to the held under its lease's end; the answer, renewal,
//! give-back or next claim of each takes it away again under the same end. So the queued and
//! the dead are the sums of every row, and the held the sum of the rows whose end is still to
//! come: exactly the messages a running lease holds.
//!
//! Writers only add rows: no two wait on one counter row (an enqueue in a caller's long
//! transaction holds no lock another needs), and a process of an older version is counted
//! too. The thousandth row folds them: one row of the queued and dead, and one per end still
//! to come. Each trigger is one `INSERT`; a call costs the server 20 µs to 60 µs whatever it
//! does, about 10 µs per message in a drain whose answer writes carry two or three messages
//! each (the server's CPU per drained message: 40 µs, against 31 µs without the counts).
//! Versions that kept one row per end by upserts cost as much or more, 40 µs to 47 µs
//! (`benches/README.md`).
//!
//! The leases themselves stay out of every index of the queue, so that a claim's update is
//! still HOT (see `postgres.rs`); what `stats` reads of the queue is an index's first entry
//! (the oldest) and the messages waiting for a retry, through the schedule's index.

/// Whether the queue lacks its kept counts: only then does opening take the lock and make
/// them (in the transaction that holds the schema's advisory lock).
pub(super) const LACKS_COUNTS: &str = "SELECT to_regclass('mail_breaker_outbox_changes') IS NULL";

/// What each row of transition table `$table` adds, `$sign` being 1 for the rows as they are
/// now and -1 for the rows as they were: the end of its hold if it is held, and 1 (or -1)
/// to the queued, the dead and the held it counts in.
macro_rules! row_changes {
    ($table:literal, $sign:literal) => {
        concat!(
            "SELECT CASE WHEN leased AND dead_at IS NULL \
               THEN GREATEST(due_at, lease_until) END AS until, \
             CASE WHEN dead_at IS NULL THEN ",
            $sign,
            " ELSE 0 END AS queued, CASE WHEN dead_at IS NULL THEN 0 ELSE ",
            $sign,
            " END AS dead, CASE WHEN leased AND dead_at IS NULL THEN ",
            $sign,
            " ELSE 0 END AS held FROM ",
            $table
        )
    };
}

/// A trigger function named `$name` that adds the changes of `$rows` as one row per end of
/// hold, and folds when one of those is the thousandth row.
macro_rules! recount {
    ($name:literal, $rows:expr) => {
        concat!(
            "CREATE OR REPLACE FUNCTION ",
            $name,
            "() RETURNS trigger LANGUAGE plpgsql AS $body$ \
             DECLARE fold BOOLEAN; \
             BEGIN \
               WITH added AS (INSERT INTO mail_breaker_outbox_changes (until, queued, dead, held) \
                 SELECT until, SUM(queued), SUM(dead), SUM(held) FROM (",
            $rows,
            ") AS changed GROUP BY until \
                 HAVING SUM(queued) <> 0 OR SUM(dead) <> 0 OR SUM(held) <> 0 \
                 RETURNING id) \
               SELECT bool_or(id % 1000 = 0) INTO fold FROM added; \
               IF fold THEN PERFORM mail_breaker_outbox_fold(); END IF; \
               RETURN NULL; \
             END $body$"
        )
    };
}

/// The kept counts, made from the queue as it is under a lock that stops its writers (not
/// its readers) until the transaction commits; then the trigger that keeps them.
pub(super) const KEEP_COUNTS: [&str; 12] = [
    "LOCK TABLE mail_breaker_outbox IN SHARE ROW EXCLUSIVE MODE",
    "CREATE TABLE mail_breaker_outbox_changes (
        id BIGINT GENERATED ALWAYS AS IDENTITY,
        until BIGINT,
        queued BIGINT NOT NULL,
        dead BIGINT NOT NULL,
        held BIGINT NOT NULL
    )",
    "INSERT INTO mail_breaker_outbox_changes (until, queued, dead, held) \
     SELECT NULL, COUNT(*) FILTER (WHERE dead_at IS NULL), \
       COUNT(*) FILTER (WHERE dead_at IS NOT NULL), 0 FROM mail_breaker_outbox",
    "INSERT INTO mail_breaker_outbox_changes (until, queued, dead, held) \
     SELECT GREATEST(due_at, lease_until), 0, 0, COUNT(*) FROM mail_breaker_outbox \
     WHERE leased AND dead_at IS NULL GROUP BY 1",
    // The oldest queued message, read from the first entry.
    "CREATE INDEX IF NOT EXISTS mail_breaker_outbox_waiting \
     ON mail_breaker_outbox (enqueued_at) WHERE dead_at IS NULL",
    // The rows folded into one of the queued and dead, and one per end of hold still to come
    // (one past can never count again); unless another fold is under way, or the caller's
    // transaction reads from one snapshot, where a fold could meet a row another fold
    // deleted since, and fail the caller's write.
    concat!(
        "CREATE OR REPLACE FUNCTION mail_breaker_outbox_fold() RETURNS void \
         LANGUAGE plpgsql AS $body$ \
         BEGIN \
           IF current_setting('transaction_isolation') = 'read committed' \
              AND pg_try_advisory_xact_lock(7881696737120646259) THEN \
             WITH gone AS (DELETE FROM mail_breaker_outbox_changes \
                 RETURNING until, queued, dead, held), \
               clock AS (SELECT ",
        now_ms!(),
        " AS now) \
             INSERT INTO mail_breaker_outbox_changes (until, queued, dead, held) \
               SELECT NULL, COALESCE(SUM(queued), 0), COALESCE(SUM(dead), 0), 0 FROM gone \
               UNION ALL \
               SELECT until, 0, 0, SUM(held) FROM gone, clock WHERE until > clock.now \
                 GROUP BY until HAVING SUM(held) <> 0; \
           END IF; \
         END $body$"
    ),
    recount!(
        "mail_breaker_outbox_recount_in",
        row_changes!("new_rows", "1")
    ),
    recount!(
        "mail_breaker_outbox_recount_changed",
        concat!(
            row_changes!("new_rows", "1"),
            " UNION ALL ",
            row_changes!("old_rows", "-1")
        )
    ),
    recount!(
        "mail_breaker_outbox_recount_out",
        row_changes!("old_rows", "-1")
    ),
    "CREATE TRIGGER mail_breaker_outbox_counted_in AFTER INSERT ON mail_breaker_outbox \
     REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT \
     EXECUTE FUNCTION mail_breaker_outbox_recount_in()",
    "CREATE TRIGGER mail_breaker_outbox_counted_changed AFTER UPDATE ON mail_breaker_outbox \
     REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT \
     EXECUTE FUNCTION mail_breaker_outbox_recount_changed()",
    "CREATE TRIGGER mail_breaker_outbox_counted_out AFTER DELETE ON mail_breaker_outbox \
     REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT \
     EXECUTE FUNCTION mail_breaker_outbox_recount_out()",
];

/// The counts of `stats`, at the database's time (also what the oldest's wait is counted
/// to): the queued, the dead and the held as kept, the held being those whose hold ends
/// later; the due, the queued less the held and less those free and not due yet (a retry's
/// wait), read through the schedule's index. So it reads the messages waiting for a retry,
/// none of the due backlog, and the first entry of the index of enqueue times.
pub(super) const STATS: &str = concat!(
    "SELECT kept.queued, kept.queued - waiting.count - kept.held, kept.held, kept.dead, \
       (SELECT MIN(enqueued_at) FROM mail_breaker_outbox WHERE dead_at IS NULL), clock.now \
     FROM (SELECT ",
    now_ms!(),
    " AS now) AS clock, \
       LATERAL (SELECT COALESCE(SUM(queued), 0)::bigint AS queued, \
          COALESCE(SUM(dead), 0)::bigint AS dead, \
          COALESCE(SUM(held) FILTER (WHERE until > clock.now), 0)::bigint AS held \
          FROM mail_breaker_outbox_changes) AS kept, \
       LATERAL (SELECT COUNT(*) AS count FROM mail_breaker_outbox \
          WHERE dead_at IS NULL AND due_at > clock.now AND NOT leased) AS waiting"
);
