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
    // The one reader of the whole table is the count of the queue for the metrics, at most
    // once a second; a claim or a write that scanned it would read it hundreds of times.
    let (scans, rows_read) = table_statistics(&mut admin, "seq_scan, seq_tup_read").await;
    let counts = if cfg!(feature = "metrics") {
        1 + seconds
    } else {
        0
    };
    assert!(
        rows_read <= MESSAGES as i64 * counts as i64,
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
        "ALTER TABLE mail_breaker_outbox DROP COLUMN lease_until",
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
        (stats.queued, stats.leased),
        (1, 1),
        "the held one still held"
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
