//! The outbox's rules on PostgreSQL, each test on a server of its own; and the database
//! going down mid-run.

mod support;

use mail_breaker::outbox::Outbox;
use support::postgres::PostgresServer;

async fn open(test: &str) -> Option<(Outbox, PostgresServer)> {
    let server = PostgresServer::start(test)?;
    let outbox = Outbox::postgres(&server.url())
        .await
        .expect("a PostgreSQL outbox");
    Some((outbox, server))
}

all_outbox_rules!(open);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_in_commits_with_the_callers_transaction_and_rolls_back_with_it() {
    let Some((outbox, server)) = open("enqueue_in_on_postgres").await else {
        return;
    };
    let pool = sqlx::PgPool::connect(&server.url()).await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    outbox
        .enqueue_in(&mut *tx, &support::message())
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(
        outbox.stats().await.unwrap().queued,
        0,
        "rolled back together"
    );
    let mut tx = pool.begin().await.unwrap();
    outbox
        .enqueue_in(&mut *tx, &support::message())
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(
        outbox.stats().await.unwrap().queued,
        1,
        "committed together"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_database_down_enqueue_fails_the_worker_waits_and_nothing_kept_is_lost() {
    use std::time::Duration;
    use support::scripted::{Reply, Scripted};

    let Some((outbox, mut server)) = open("database_down").await else {
        return;
    };
    let provider = Scripted::answering(
        "provider",
        Reply::after(Duration::from_millis(2), Reply::Ok),
    );
    // The server is killed, not shut down: answers are committed without waiting for the
    // WAL's flush, so the last ones written before the kill may be undone by its recovery.
    // Their messages stay leased and are sent again when the lease runs out (at least once),
    // so the lease is short enough for the queue to empty within the test's wait.
    let worker = outbox
        .worker(provider.clone())
        .concurrency(4)
        .lease(Duration::from_secs(2))
        .poll(Duration::from_millis(50));
    let running = support::outbox_rules::Running::start(worker);

    let producer = {
        let outbox = outbox.clone();
        tokio::spawn(async move {
            let (mut kept, mut failed) = (Vec::new(), 0);
            for (i, message) in support::numbered_messages(400).into_iter().enumerate() {
                match outbox.enqueue(&message).await {
                    Ok(_) => kept.push(format!("message {i}")),
                    Err(_) => failed += 1,
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            (kept, failed)
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    server.stop();
    // Longer than the pool's 3 s wait for a connection, so that enqueues fail.
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    server.restart();
    let (kept, failed) = producer.await.unwrap();
    assert!(failed > 0, "some enqueues met the database down");

    for _ in 0..300 {
        if outbox.stats().await.is_ok_and(|stats| stats.queued == 0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    running.stop().await;
    let sent: std::collections::HashSet<String> = provider.subjects().into_iter().collect();
    let lost: Vec<&String> = kept
        .iter()
        .filter(|subject| !sent.contains(*subject))
        .collect();
    assert!(
        lost.is_empty(),
        "{} enqueued with Ok but never sent: {lost:?}",
        lost.len()
    );
    assert_eq!(outbox.stats().await.unwrap().queued, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_at_rest_claims_nothing_before_the_next_due_time() {
    use sqlx::Connection as _;
    use std::time::Duration;
    use support::scripted::{Reply, Scripted};
    let Some(server) = PostgresServer::start("outbox_postgres_next_due") else {
        return;
    };
    // Every statement in the server's log, before the outbox opens its connections: a
    // connection that is already open takes a reloaded setting only after its next
    // statement, so the claim could go unlogged. Connections opened once the server has
    // reloaded start with it.
    let mut admin = sqlx::PgConnection::connect(&server.url()).await.unwrap();
    for setting in [
        "ALTER SYSTEM SET log_statement = 'all'",
        "SELECT pg_reload_conf()",
    ] {
        sqlx::query(setting).execute(&mut admin).await.unwrap();
    }
    for attempt in 1.. {
        let mut fresh = sqlx::PgConnection::connect(&server.url()).await.unwrap();
        let (logged,): (String,) = sqlx::query_as("SHOW log_statement")
            .fetch_one(&mut fresh)
            .await
            .unwrap();
        if logged == "all" {
            break;
        }
        assert!(
            attempt < 500,
            "the server did not reload its settings in 5 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let outbox = Outbox::postgres(&server.url())
        .await
        .expect("a PostgreSQL outbox");
    outbox.enqueue(&support::message()).await.unwrap();
    let down = mail_breaker::SendError::new(
        mail_breaker::Category::ServiceUnavailable,
        "test.down",
        "down",
    )
    .with_retry_after(Duration::from_secs(3_600));
    let provider = Scripted::answering("provider", Reply::Err(down));
    let worker = outbox
        .worker(provider.clone())
        .poll(Duration::from_secs(3_600));
    let running = support::outbox_rules::Running::start(worker);
    tokio::time::sleep(Duration::from_millis(500)).await;
    running.stop().await;
    assert_eq!(provider.sends(), 1, "due again in an hour");
    // The claim that found it, and at most one more that found nothing; then the worker
    // sleeps until the message is due (or the hourly poll).
    let claims = server.log().matches("WITH due AS").count();
    assert!((1..=2).contains(&claims), "{claims} claims");
}

/// Answers are written one write at a time, and those that come during a write go together
/// in the next: fewer, larger statements. Each write is made slow (a trigger sleeps 100 ms in
/// every DELETE, and counts it) and the answers come 30 ms apart, so they pile up; the test
/// watches how many DELETEs the server runs at once, and counts them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_are_written_one_write_at_a_time_each_taking_all_that_came_during_the_last() {
    use sqlx::Connection as _;
    use std::time::Duration;
    use support::scripted::{Reply, Scripted};
    let Some((outbox, server)) = open("outbox_postgres_one_write_at_a_time").await else {
        return;
    };
    let mut admin = sqlx::PgConnection::connect(&server.url()).await.unwrap();
    for statement in [
        "CREATE TABLE deletes (at timestamptz DEFAULT now())",
        "CREATE FUNCTION slow_delete() RETURNS trigger LANGUAGE plpgsql AS \
         $$ BEGIN INSERT INTO deletes DEFAULT VALUES; PERFORM pg_sleep(0.1); RETURN NULL; END $$",
        "CREATE TRIGGER slow_delete BEFORE DELETE ON mail_breaker_outbox \
         FOR EACH STATEMENT EXECUTE FUNCTION slow_delete()",
    ] {
        sqlx::raw_sql(statement).execute(&mut admin).await.unwrap();
    }
    const MESSAGES: u64 = 12;
    for _ in 0..MESSAGES {
        outbox.enqueue(&support::message()).await.unwrap();
    }
    let provider = Scripted::new("provider");
    provider.then((1..=MESSAGES).map(|i| Reply::after(Duration::from_millis(30 * i), Reply::Ok)));
    let worker = outbox.worker(provider.clone()).concurrency(16);
    let draining = tokio::spawn(async move { worker.drain().await });
    let mut most = 0;
    while !draining.is_finished() {
        let (deleting,): (i64,) = sqlx::query_as(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE state = 'active' AND query LIKE 'DELETE FROM mail_breaker_outbox%'",
        )
        .fetch_one(&mut admin)
        .await
        .unwrap();
        most = most.max(deleting);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    draining.await.unwrap().unwrap();
    assert_eq!(provider.sends(), MESSAGES as usize);
    assert_eq!(outbox.stats().await.unwrap().queued, 0);
    assert_eq!(most, 1, "answer writes running at once");
    let (writes,): (i64,) = sqlx::query_as("SELECT count(*) FROM deletes")
        .fetch_one(&mut admin)
        .await
        .unwrap();
    // 12 answers over 360 ms, each write 100 ms: about four writes, never one per answer.
    assert!(
        (2..=6).contains(&writes),
        "{writes} writes for {MESSAGES} answers"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_finds_every_row_it_claims_and_answers_by_index_never_reading_the_whole_table() {
    use sqlx::Connection as _;
    use std::time::Instant;
    use support::scripted::Scripted;
    let Some((outbox, server)) = open("outbox_postgres_by_index").await else {
        return;
    };
    // Enough rows that reading them all costs more than finding a claim's by index, as it
    // does under a backlog: a plan that scans the table is then a choice, not a tie.
    const MESSAGES: usize = 2_000;
    let messages = vec![support::message(); MESSAGES];
    outbox.enqueue_many(&messages).await.unwrap();
    // Statistics as autovacuum gathers them on a table that changes this much: the plans
    // below are chosen from them.
    let mut admin = sqlx::PgConnection::connect(&server.url()).await.unwrap();
    sqlx::raw_sql("ANALYZE mail_breaker_outbox")
        .execute(&mut admin)
        .await
        .unwrap();
    let provider = Scripted::new("provider");
    // One in flight makes many small claims and writes: each runs the plan kept for it.
    let worker = outbox.worker(provider.clone()).concurrency(1);
    let started = Instant::now();
    worker.drain().await.unwrap();
    let seconds = started.elapsed().as_secs();
    assert_eq!(provider.sends(), MESSAGES);
    drop(worker);
    drop(outbox);
    // Not one statement reads the whole table: not a claim or a write, each of which would
    // read it hundreds of times, nor the counts for the metrics, kept since issue 50.
    let (scans, rows_read) = table_statistics(&mut admin, "seq_scan, seq_tup_read").await;
    assert_eq!(
        rows_read, 0,
        "{rows_read} rows read by {scans} scans of the whole table in a drain of {seconds} s"
    );
}

/// Two of the outbox table's counters in `pg_stat_user_tables` (`columns`, comma-separated),
/// read once every other connection has closed: a server process counts its work in the
/// shared statistics when its connection ends.
async fn table_statistics(admin: &mut sqlx::PgConnection, columns: &str) -> (i64, i64) {
    until_the_others_close(admin).await;
    sqlx::query_as(&format!(
        "SELECT {columns} FROM pg_stat_user_tables WHERE relname = 'mail_breaker_outbox'"
    ))
    .fetch_one(admin)
    .await
    .unwrap()
}

/// Waits until no client connection but `admin`'s is open.
async fn until_the_others_close(admin: &mut sqlx::PgConnection) {
    use std::time::{Duration, Instant};
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (others,): (i64,) = sqlx::query_as(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()",
        )
        .fetch_one(&mut *admin)
        .await
        .unwrap();
        if others == 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the outbox's connections stay open"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A claim leases its rows without touching an indexed column, so PostgreSQL updates each in
/// place (HOT: the new version on the same page, no index entry written), with the room every
/// page keeps for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_updates_its_rows_in_place_writing_no_index_entry() {
    use sqlx::Connection as _;
    use support::scripted::Scripted;
    let Some((outbox, server)) = open("outbox_postgres_in_place").await else {
        return;
    };
    const MESSAGES: usize = 300;
    outbox
        .enqueue_many(&support::numbered_messages(MESSAGES))
        .await
        .unwrap();
    let mut admin = sqlx::PgConnection::connect(&server.url()).await.unwrap();
    let provider = Scripted::new("provider");
    outbox
        .worker(provider.clone())
        .concurrency(4)
        .drain()
        .await
        .unwrap();
    assert_eq!(provider.sends(), MESSAGES);
    drop(outbox);
    let (updated, in_place) = table_statistics(&mut admin, "n_tup_upd, n_tup_hot_upd").await;
    assert_eq!(updated, MESSAGES as i64, "one claim of each message");
    assert_eq!(in_place, updated, "claims updated in place");
}

/// A table an earlier version made, without `lease_until`, is upgraded when an outbox opens
/// it; a row that version leased (its lease's end written as its `due_at`) stays held until
/// then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_table_is_upgraded_and_keeps_the_leases_written_in_it() {
    use sqlx::Connection as _;
    use support::scripted::Scripted;
    let Some((outbox, server)) = open("outbox_postgres_upgrade").await else {
        return;
    };
    outbox
        .enqueue_many(&support::numbered_messages(2))
        .await
        .unwrap();
    drop(outbox);
    let mut admin = sqlx::PgConnection::connect(&server.url()).await.unwrap();
    for statement in [
        // The counts kept since issue 50, and what keeps them.
        "DROP TRIGGER mail_breaker_outbox_counted_in ON mail_breaker_outbox",
        "DROP TRIGGER mail_breaker_outbox_counted_changed ON mail_breaker_outbox",
        "DROP TRIGGER mail_breaker_outbox_counted_out ON mail_breaker_outbox",
        "DROP TABLE mail_breaker_outbox_changes",
        "DROP INDEX mail_breaker_outbox_waiting",
        "ALTER TABLE mail_breaker_outbox DROP COLUMN lease_until",
        // The idempotency keys kept since issue 65.
        "ALTER TABLE mail_breaker_outbox DROP COLUMN idempotency_key",
        "ALTER TABLE mail_breaker_outbox RESET (fillfactor)",
        "UPDATE mail_breaker_outbox SET leased = TRUE, attempts = 1, \
         due_at = (extract(epoch FROM now()) * 1000)::bigint + 3600000 \
         WHERE id = (SELECT max(id) FROM mail_breaker_outbox)",
    ] {
        sqlx::query(statement).execute(&mut admin).await.unwrap();
    }
    let outbox = Outbox::postgres(&server.url())
        .await
        .expect("an outbox on the older table");
    let provider = Scripted::new("provider");
    outbox.worker(provider.clone()).drain().await.unwrap();
    assert_eq!(provider.subjects(), ["message 0"], "the free one only");
    let stats = outbox.stats().await.unwrap();
    assert_eq!(
        (stats.queued, stats.leased, stats.due),
        (1, 1, 0),
        "the held one still held, and counted"
    );
    let (options,): (Option<Vec<String>>,) =
        sqlx::query_as("SELECT reloptions FROM pg_class WHERE relname = 'mail_breaker_outbox'")
            .fetch_one(&mut admin)
            .await
            .unwrap();
    assert_eq!(options, Some(vec![String::from("fillfactor=50")]));
    Outbox::postgres(&server.url())
        .await
        .expect("an outbox on the upgraded table");
}

/// How each queued body is stored, in the order of the rows: `lz4`, `pglz`, or `None` (not
/// compressed).
async fn compression(admin: &mut sqlx::PgConnection) -> Vec<Option<String>> {
    let rows: Vec<(Option<String>,)> =
        sqlx::query_as("SELECT pg_column_compression(raw) FROM mail_breaker_outbox ORDER BY id")
            .fetch_all(admin)
            .await
            .unwrap();
    rows.into_iter().map(|(how,)| how).collect()
}

/// Issue 50: bodies are stored compressed with lz4 where the server has it (PostgreSQL 14 and
/// later, built with it, as Debian's is), which stores a body of 2 KB for about a third less
/// of the server's CPU than PostgreSQL's default, pglz (`benches/README.md`). A table made
/// before gets it when next opened; the bodies already in it stay as they were and read back
/// whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_are_stored_compressed_with_lz4_and_an_older_table_gets_it_when_opened() {
    use sqlx::Connection as _;
    let Some((outbox, server)) = open("outbox_postgres_lz4").await else {
        return;
    };
    let mut admin = sqlx::PgConnection::connect(&server.url()).await.unwrap();
    let (offers_lz4,): (bool,) = sqlx::query_as(
        "SELECT EXISTS (SELECT 1 FROM pg_settings \
         WHERE name = 'default_toast_compression' AND 'lz4' = ANY(enumvals))",
    )
    .fetch_one(&mut admin)
    .await
    .unwrap();
    if !offers_lz4 {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "under CI, the PostgreSQL the suite runs has lz4"
        );
        println!("SKIPPED: this PostgreSQL was built without lz4; bodies stay with pglz");
        return;
    }
    let big = |subject: &str| {
        mail_breaker::Message::builder()
            .from("app@example.com".parse().unwrap())
            .to("user@example.org".parse().unwrap())
            .subject(subject)
            .body("a body that compresses well, ".repeat(200))
            .unwrap()
    };
    let messages = [big("first"), big("older"), big("after")];
    let mut ids = vec![outbox.enqueue(&messages[0]).await.unwrap()];
    assert_eq!(compression(&mut admin).await, [Some(String::from("lz4"))]);

    // A table as made before: the server's default compression, and a body stored with it.
    sqlx::query("ALTER TABLE mail_breaker_outbox ALTER COLUMN raw SET COMPRESSION default")
        .execute(&mut admin)
        .await
        .unwrap();
    ids.push(outbox.enqueue(&messages[1]).await.unwrap());
    drop(outbox);
    let outbox = Outbox::postgres(&server.url()).await.unwrap();
    ids.push(outbox.enqueue(&messages[2]).await.unwrap());
    assert_eq!(
        compression(&mut admin).await,
        [Some("lz4"), Some("pglz"), Some("lz4")].map(|how| how.map(String::from)),
        "the older body as it was stored, the next with lz4"
    );
    for (id, message) in ids.into_iter().zip(&messages) {
        let stored = outbox.message(id).await.unwrap().expect("still queued");
        assert_eq!(stored.raw, message.formatted(), "read back whole");
    }

    // A compression someone chose for the column stays chosen.
    sqlx::query("ALTER TABLE mail_breaker_outbox ALTER COLUMN raw SET COMPRESSION pglz")
        .execute(&mut admin)
        .await
        .unwrap();
    drop(outbox);
    let outbox = Outbox::postgres(&server.url()).await.unwrap();
    outbox.enqueue(&messages[0]).await.unwrap();
    assert_eq!(
        compression(&mut admin).await.last(),
        Some(&Some(String::from("pglz"))),
        "the column's own choice, kept"
    );
}

/// Issue 45, point 4: PostgreSQL behind a link that drops packets (a relay that stops
/// forwarding, closing nothing). `enqueue` answers `Err` within its bounds (the pool's 3 s
/// wait for a connection, the statement's bound), the worker neither hangs nor loses a
/// message, and everything drains once the link is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_database_blackholed_enqueue_fails_within_its_bound_and_all_drains_after() {
    use std::time::{Duration, Instant};
    use support::relay::Relay;
    use support::scripted::{Reply, Scripted};

    let Some(server) = PostgresServer::start("outbox_blackholed") else {
        return;
    };
    let relay = Relay::start(server.port()).await;
    let url = server.url().replace(
        &format!(":{}/", server.port()),
        &format!(":{}/", relay.port()),
    );
    let options =
        mail_breaker::outbox::OutboxOptions::new().statement_timeout(Duration::from_millis(300));
    let outbox = Outbox::postgres_with(&url, &options).await.unwrap();
    let provider = Scripted::answering(
        "provider",
        Reply::after(Duration::from_millis(2), Reply::Ok),
    );
    let worker = outbox
        .worker(provider.clone())
        .concurrency(2)
        .lease(Duration::from_secs(3))
        .poll(Duration::from_millis(50));
    let running = support::outbox_rules::Running::start(worker);
    let messages = support::numbered_messages(30);
    let mut kept = Vec::new();
    for (i, message) in messages.iter().enumerate().take(10) {
        outbox.enqueue(message).await.unwrap();
        kept.push(format!("message {i}"));
    }

    relay.blackhole();
    for (i, message) in messages.iter().enumerate().skip(10).take(3) {
        let started = Instant::now();
        let outcome = outbox.enqueue(message).await;
        let took = started.elapsed();
        assert!(
            took < Duration::from_millis(4_500),
            "an enqueue answered after {took:?} with the link down"
        );
        let error = outcome.expect_err("no Ok with the link down");
        assert!(
            ["outbox.database", "outbox.maybe_queued"].contains(&error.code()),
            "{error}"
        );
        if error.code() == "outbox.maybe_queued" {
            println!("message {i} may be queued: {error}");
        }
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    relay.forward();

    for (i, message) in messages.iter().enumerate().skip(13) {
        outbox.enqueue(message).await.unwrap();
        kept.push(format!("message {i}"));
    }
    for _ in 0..300 {
        if outbox.stats().await.is_ok_and(|stats| stats.queued == 0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    running.stop().await;
    let sent: std::collections::HashSet<String> = provider.subjects().into_iter().collect();
    let lost: Vec<&String> = kept.iter().filter(|s| !sent.contains(*s)).collect();
    assert!(lost.is_empty(), "enqueued with Ok, never sent: {lost:?}");
    assert_eq!(outbox.stats().await.unwrap().queued, 0);
}

/// Issue 45, point 4: an enqueue whose statement went out on a held connection and whose
/// answer never comes back (the link died after the server committed) answers `Err` within
/// the client's bound, marked maybe-queued; the message is sent once the link is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_enqueue_whose_answer_is_lost_answers_maybe_queued_within_the_bound() {
    use sqlx::Connection as _;
    use std::time::{Duration, Instant};
    use support::relay::Relay;
    use support::scripted::Scripted;

    let Some(server) = PostgresServer::start("outbox_answer_lost") else {
        return;
    };
    let relay = Relay::start(server.port()).await;
    let url = server.url().replace(
        &format!(":{}/", server.port()),
        &format!(":{}/", relay.port()),
    );
    let options =
        mail_breaker::outbox::OutboxOptions::new().statement_timeout(Duration::from_secs(2));
    let outbox = Outbox::postgres_with(&url, &options).await.unwrap();
    // Each insert takes 600 ms on the server, so that the link goes down while it runs.
    let mut admin = sqlx::PgConnection::connect(&server.url()).await.unwrap();
    for statement in [
        "CREATE FUNCTION slow_insert() RETURNS trigger AS $$ \
         BEGIN PERFORM pg_sleep(0.6); RETURN NEW; END $$ LANGUAGE plpgsql",
        "CREATE TRIGGER slow_insert BEFORE INSERT ON mail_breaker_outbox \
         FOR EACH ROW EXECUTE FUNCTION slow_insert()",
    ] {
        sqlx::query(statement).execute(&mut admin).await.unwrap();
    }
    let enqueuing = {
        let outbox = outbox.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let outcome = outbox.enqueue(&support::message()).await;
            (outcome, started.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    relay.blackhole(); // the insert commits unanswered
    let (outcome, took) = tokio::time::timeout(Duration::from_secs(10), enqueuing)
        .await
        .expect("enqueue answered")
        .unwrap();
    let error = outcome.expect_err("its answer never came");
    assert_eq!(error.code(), "outbox.maybe_queued", "{error}");
    assert!(
        took < Duration::from_millis(3_800),
        "answered after {took:?}"
    );

    relay.forward();
    let provider = Scripted::new("provider");
    outbox.worker(provider.clone()).drain().await.unwrap();
    assert_eq!(provider.sends(), 1, "committed unanswered: sent once");
}

/// The stats as `OutboxStats` defines them, counted from the rows at the database's time:
/// queued, not dead; due, queued and free for a claim to take (due by now, and not leased or
/// its lease run out: `lease_until` passed, or none, as in a row an older version leased,
/// whose `due_at` was its lease's end); held, queued and leased but not free; dead; and how
/// long the oldest queued has waited, in whole milliseconds.
async fn stats_by_the_rules(admin: &mut sqlx::PgConnection) -> (u64, u64, u64, u64, Option<i64>) {
    type Row = (Option<i64>, i64, bool, Option<i64>, i64, i64);
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT dead_at, due_at, leased, lease_until, enqueued_at, \
           (EXTRACT(EPOCH FROM now()) * 1000)::bigint FROM mail_breaker_outbox",
    )
    .fetch_all(admin)
    .await
    .unwrap();
    let (mut queued, mut due, mut held, mut dead, mut oldest) = (0, 0, 0, 0, None::<i64>);
    for (dead_at, due_at, leased, lease_until, enqueued_at, now) in rows {
        if dead_at.is_some() {
            dead += 1;
            continue;
        }
        queued += 1;
        oldest = Some(oldest.map_or(now - enqueued_at, |o| o.max(now - enqueued_at)));
        let free = due_at <= now && (!leased || lease_until.is_none_or(|end| end <= now));
        if free {
            due += 1;
        } else if leased {
            held += 1;
        }
    }
    (queued, due, held, dead, oldest)
}

/// Issue 50: `stats` no longer counts the rows; what it reads is kept by triggers as the
/// rows change. After every kind of write (the outbox's own, a caller's transaction committed
/// or rolled back, and statements that change many rows at once in several ways), it says
/// what the rows say. Every time written is an hour before or after now, so that nothing
/// becomes due or free between the two reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_agree_with_the_rows_after_every_kind_of_write() {
    use sqlx::Connection as _;
    let Some((outbox, server)) = open("outbox_postgres_kept_counts").await else {
        return;
    };
    let mut admin = sqlx::PgConnection::connect(&server.url()).await.unwrap();
    let pool = sqlx::PgPool::connect(&server.url()).await.unwrap();
    let mut random = fastrand::Rng::with_seed(50);
    // An hour before or after the database's now, in milliseconds, as SQL.
    let hour = |random: &mut fastrand::Rng| {
        let sign = if random.bool() { '+' } else { '-' };
        format!("(EXTRACT(EPOCH FROM now()) * 1000)::bigint {sign} 3600000")
    };
    for step in 0..300 {
        let some = random.usize(1..4);
        let write = match random.u8(0..11) {
            0 | 1 => {
                let messages = support::numbered_messages(some);
                outbox.enqueue_many(&messages).await.unwrap();
                None
            }
            2 => {
                let mut tx = pool.begin().await.unwrap();
                outbox
                    .enqueue_in(&mut *tx, &support::message())
                    .await
                    .unwrap();
                if random.bool() {
                    tx.commit().await.unwrap();
                } else {
                    tx.rollback().await.unwrap();
                }
                None
            }
            // Claimed: due rows leased, as now or as an older version leased them.
            3 => Some(if random.bool() {
                format!(
                    "UPDATE mail_breaker_outbox SET leased = TRUE, attempts = attempts + 1, \
                     lease_until = {} WHERE id IN (SELECT id FROM mail_breaker_outbox \
                     WHERE dead_at IS NULL AND due_at <= (EXTRACT(EPOCH FROM now()) * 1000) \
                     ORDER BY random() LIMIT {some})",
                    hour(&mut random)
                )
            } else {
                format!(
                    "UPDATE mail_breaker_outbox SET leased = TRUE, lease_until = NULL, \
                     due_at = {} WHERE id IN (SELECT id FROM mail_breaker_outbox \
                     WHERE dead_at IS NULL ORDER BY random() LIMIT {some})",
                    hour(&mut random)
                )
            }),
            // Renewed, or given back, or due again later, or dead: leased rows answered.
            4 => Some(format!(
                "UPDATE mail_breaker_outbox SET lease_until = {} WHERE leased",
                hour(&mut random)
            )),
            5 => Some(format!(
                "UPDATE mail_breaker_outbox SET leased = FALSE, due_at = {} \
                 WHERE id IN (SELECT id FROM mail_breaker_outbox WHERE leased \
                 ORDER BY random() LIMIT {some})",
                hour(&mut random)
            )),
            6 => Some(format!(
                "UPDATE mail_breaker_outbox SET leased = FALSE, \
                 dead_at = (EXTRACT(EPOCH FROM now()) * 1000)::bigint \
                 WHERE id IN (SELECT id FROM mail_breaker_outbox ORDER BY random() LIMIT {some})"
            )),
            // Sent: deleted; or purged, or requeued, through the outbox.
            7 => Some(format!(
                "DELETE FROM mail_breaker_outbox WHERE id IN (SELECT id FROM mail_breaker_outbox \
                 WHERE leased ORDER BY random() LIMIT {some})"
            )),
            8 => {
                let ids: Vec<i64> = sqlx::query_scalar("SELECT id FROM mail_breaker_outbox")
                    .fetch_all(&mut admin)
                    .await
                    .unwrap();
                if let Some(id) = ids.get(random.usize(..ids.len().max(1))) {
                    let id = mail_breaker::outbox::OutboxId::from(*id);
                    if random.bool() {
                        outbox.requeue(id).await.unwrap();
                    } else {
                        outbox.purge(id).await.unwrap();
                    }
                }
                None
            }
            // The next write of the counts folds them all into one row.
            9 => Some(String::from(FOLD_NEXT)),
            // Many rows changed several ways in one statement.
            _ => Some(format!(
                "UPDATE mail_breaker_outbox SET \
                 dead_at = CASE WHEN id % 3 = 0 THEN NULL ELSE dead_at END, \
                 leased = (id % 2 = 0), lease_until = {}",
                hour(&mut random)
            )),
        };
        if let Some(write) = write {
            sqlx::query(&write).execute(&mut admin).await.unwrap();
        }
        let kept = outbox.stats().await.unwrap();
        let rules = stats_by_the_rules(&mut admin).await;
        let oldest = kept.oldest.map(|wait| wait.as_millis() as i64);
        assert_eq!(
            (kept.queued, kept.due, kept.leased, kept.dead),
            (rules.0, rules.1, rules.2, rules.3),
            "after step {step}"
        );
        assert_eq!(oldest.is_some(), rules.4.is_some(), "after step {step}");
        if let (Some(kept), Some(rules)) = (oldest, rules.4) {
            assert!(
                rules - kept < 2_000 && rules >= kept,
                "the oldest waited {kept} ms, then {rules} ms, after step {step}"
            );
        }
    }
    sqlx::query(FOLD_NEXT).execute(&mut admin).await.unwrap();
    outbox.enqueue(&support::message()).await.unwrap();
    // One row of the queued and dead, and one per end of a hold still to come.
    let (rows, ends): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT COUNT(*) FROM mail_breaker_outbox_changes), \
           (SELECT COUNT(DISTINCT GREATEST(due_at, lease_until)) FROM mail_breaker_outbox \
            WHERE leased AND dead_at IS NULL \
              AND GREATEST(due_at, lease_until) > (EXTRACT(EPOCH FROM now()) * 1000))",
    )
    .fetch_one(&mut admin)
    .await
    .unwrap();
    assert_eq!(rows, 1 + ends, "the changes folded");
}

/// Makes the next row of changes the thousandth, which folds them.
const FOLD_NEXT: &str = "SELECT setval(pg_get_serial_sequence('mail_breaker_outbox_changes', 'id'), \
     (SELECT (COALESCE(MAX(id), 0) / 1000 + 1) * 1000 - 1 FROM mail_breaker_outbox_changes))";

/// A fold of the counts deletes their rows: in a caller's transaction that reads from one
/// snapshot (`REPEATABLE READ`), rows another fold deleted since would fail the caller's
/// enqueue ("could not serialize access"). Such a transaction only adds its row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_enqueue_in_a_repeatable_read_transaction_never_fails_for_a_fold_of_the_counts() {
    use sqlx::Connection as _;
    let Some((outbox, server)) = open("outbox_postgres_fold_snapshot").await else {
        return;
    };
    let mut admin = sqlx::PgConnection::connect(&server.url()).await.unwrap();
    let pool = sqlx::PgPool::connect(&server.url()).await.unwrap();
    outbox.enqueue(&support::message()).await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        .execute(&mut *tx)
        .await
        .unwrap();
    // The transaction's snapshot, taken before the fold below.
    sqlx::query("SELECT COUNT(*) FROM mail_breaker_outbox_changes")
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query(FOLD_NEXT).execute(&mut admin).await.unwrap();
    outbox.enqueue(&support::message()).await.unwrap();
    sqlx::query(FOLD_NEXT).execute(&mut admin).await.unwrap();
    outbox
        .enqueue_in(&mut *tx, &support::message())
        .await
        .expect("enqueued in the caller's transaction");
    tx.commit().await.unwrap();
    assert_eq!(outbox.stats().await.unwrap().queued, 3);
}

/// The plans PostgreSQL logged (auto_explain) in `log`, each with its statement, that read the
/// queue's table from end to end.
fn queue_scans(log: &str) -> Vec<String> {
    log.split("duration: ")
        .filter(|plan| {
            plan.match_indices("Seq Scan on mail_breaker_outbox")
                .any(|(at, found)| {
                    // The queue itself, not the small tables of its counts.
                    !plan[at + found.len()..].starts_with('_')
                })
        })
        .map(str::to_owned)
        .collect()
}

/// Issue 50: with 100,000 messages queued in the states a long outage leaves (most due, a
/// thousand held, some of them dead or due again later), no statement the outbox runs reads
/// the whole queue: every plan PostgreSQL chose, logged by `auto_explain` with the statements
/// the triggers run, finds its rows through an index. A worker runs every statement of a
/// drain (claims, renewals, answers of each kind, give-backs at its stop); the outbox's reads
/// and admin writes run once each. The first statements of the walk to the next due time run
/// in a second phase, with nothing due, as a worker at rest runs it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_statement_reads_the_queue_from_end_to_end_with_100_000_messages_queued() {
    use mail_breaker::Category;
    use sqlx::Connection as _;
    use std::time::Duration;
    use support::scripted::{Reply, Scripted};
    let Some((filling, server)) = open("outbox_postgres_plans").await else {
        return;
    };
    let batch = support::numbered_messages(1_000);
    for _ in 0..100 {
        filling.enqueue_many(&batch).await.unwrap();
    }
    drop(filling);
    let mut admin = sqlx::PgConnection::connect(&server.url()).await.unwrap();
    for statement in [
        "UPDATE mail_breaker_outbox SET leased = TRUE, attempts = 1, \
         lease_until = (EXTRACT(EPOCH FROM now()) * 1000)::bigint + 3600000 WHERE id <= 1000",
        "UPDATE mail_breaker_outbox SET leased = FALSE, \
         dead_at = (EXTRACT(EPOCH FROM now()) * 1000)::bigint WHERE id <= 250",
        "UPDATE mail_breaker_outbox SET leased = FALSE, \
         due_at = (EXTRACT(EPOCH FROM now()) * 1000)::bigint + 3600000 WHERE id BETWEEN 251 AND 500",
        "VACUUM ANALYZE mail_breaker_outbox",
        // Every connection opened from now on logs the plan of each statement it runs.
        "ALTER DATABASE postgres SET session_preload_libraries = 'auto_explain'",
        "ALTER DATABASE postgres SET auto_explain.log_min_duration = 0",
        "ALTER DATABASE postgres SET auto_explain.log_nested_statements = on",
    ] {
        sqlx::query(statement).execute(&mut admin).await.unwrap();
    }
    let logged_before = server.log().len();
    let outbox = Outbox::postgres(&server.url()).await.unwrap();
    outbox.enqueue(&support::message()).await.unwrap();
    let pool = sqlx::PgPool::connect(&server.url()).await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    outbox
        .enqueue_in(&mut *tx, &support::message())
        .await
        .unwrap();
    tx.commit().await.unwrap();
    outbox.stats().await.unwrap();
    let dead = outbox.dead_letters(10).await.unwrap();
    outbox.message(dead[0].id).await.unwrap();
    outbox.requeue(dead[0].id).await.unwrap();
    outbox.purge(dead[1].id).await.unwrap();
    // One at a time in a 1 s lease: a send of 600 ms makes the next one's lease short.
    let provider = Scripted::new("provider");
    provider.then([
        Reply::Ok,
        Reply::fail(Category::ServerError),
        Reply::fail(Category::Rejected),
        Reply::after(Duration::from_millis(600), Reply::Ok),
        Reply::Ok,
    ]);
    let worker = outbox
        .worker(provider.clone())
        .concurrency(1)
        .lease(Duration::from_secs(1));
    worker
        .run(tokio::time::sleep(Duration::from_millis(1_500)))
        .await
        .unwrap();
    drop(worker);
    // Nothing due: a worker at rest walks to the next due time.
    sqlx::query(
        "UPDATE mail_breaker_outbox SET leased = FALSE, \
         due_at = (EXTRACT(EPOCH FROM now()) * 1000)::bigint + 3600000 WHERE dead_at IS NULL",
    )
    .execute(&mut admin)
    .await
    .unwrap();
    let resting = outbox
        .worker(provider.clone())
        .poll(Duration::from_millis(100));
    // Until it has walked once (on a loaded machine its first turns may take a while).
    let running = support::outbox_rules::Running::start(resting);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !server.log()[logged_before..].contains("WITH RECURSIVE walk")
        && std::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    running.stop().await;
    drop(outbox);
    let log = server.log()[logged_before..].to_owned();
    for statement in [
        "INSERT INTO mail_breaker_outbox",
        "FOR UPDATE SKIP LOCKED",
        "WITH RECURSIVE walk",
    ] {
        assert!(
            log.contains(statement),
            "no plan of {statement} logged:\n{log}"
        );
    }
    // The second phase's counts, with every message waiting, read every waiting one: `stats`
    // reads the messages waiting for a retry (see `stats`), so only its first phase counts.
    let (first, second) = log.split_at(log.find("WITH RECURSIVE walk").unwrap_or(log.len()));
    let scans: Vec<String> = queue_scans(first)
        .into_iter()
        .chain(
            queue_scans(second)
                .into_iter()
                .filter(|plan| plan.contains("walk")),
        )
        .collect();
    assert!(scans.is_empty(), "{}", scans.join("\n----\n"));
}
