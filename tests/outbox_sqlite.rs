//! The outbox's rules on SQLite, in a file of its own per test; and what only a file shows.

mod support;

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

use mail_breaker::outbox::Outbox;

/// A folder of its own for one test's database, removed when dropped.
struct Folder(PathBuf);

impl Folder {
    fn new(test: &str) -> Folder {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!(
            "mail-breaker-outbox-{}-{n}-{test}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("a temporary folder");
        Folder(path)
    }

    fn database(&self) -> PathBuf {
        self.0.join("outbox.db")
    }
}

impl Drop for Folder {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

async fn open(test: &str) -> Option<(Outbox, Folder)> {
    let folder = Folder::new(test);
    let outbox = Outbox::sqlite(folder.database())
        .await
        .expect("an SQLite outbox");
    Some((outbox, folder))
}

all_outbox_rules!(open);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_enqueued_message_is_in_the_file_for_the_next_process_that_opens_it() {
    let folder = Folder::new("reopen");
    let first = Outbox::sqlite(folder.database()).await.unwrap();
    let id = first.enqueue(&support::message()).await.unwrap();
    drop(first);
    let reopened = Outbox::sqlite(folder.database()).await.unwrap();
    assert_eq!(reopened.stats().await.unwrap().queued, 1);
    assert!(reopened.purge(id).await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_in_commits_with_the_callers_transaction_and_rolls_back_with_it() {
    let folder = Folder::new("enqueue-in");
    let outbox = Outbox::sqlite(folder.database()).await.unwrap();
    let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}", folder.database().display()))
        .await
        .unwrap();
    sqlx::query("CREATE TABLE users (email TEXT)")
        .execute(&pool)
        .await
        .unwrap();

    let mut tx = pool.begin().await.unwrap();
    sqlx::query("INSERT INTO users VALUES ('a@example.org')")
        .execute(&mut *tx)
        .await
        .unwrap();
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
    sqlx::query("INSERT INTO users VALUES ('a@example.org')")
        .execute(&mut *tx)
        .await
        .unwrap();
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

#[tokio::test]
async fn an_outbox_in_a_folder_that_cannot_exist_is_a_configuration_error() {
    let error = Outbox::sqlite("/proc/no-such-folder/outbox.db")
        .await
        .unwrap_err();
    assert_eq!(error.category(), mail_breaker::Category::Configuration);
    assert_eq!(error.code(), "outbox.database");
    assert!(
        error.message().contains("opening the SQLite file"),
        "{error}"
    );
}

#[tokio::test]
async fn an_outbox_id_is_its_number_and_an_outbox_says_its_database_when_debugged() {
    let folder = Folder::new("ids");
    let outbox = Outbox::sqlite(folder.database()).await.unwrap();
    let first = outbox.enqueue(&support::message()).await.unwrap();
    let second = outbox.enqueue(&support::message()).await.unwrap();
    assert_eq!(i64::from(second), i64::from(first) + 1);
    assert_eq!(second.to_string(), i64::from(second).to_string());
    assert_eq!(
        mail_breaker::outbox::OutboxId::from(i64::from(first)),
        first
    );
    assert_eq!(format!("{outbox:?}"), "Outbox { kind: Sqlite }");
    let worker = outbox
        .worker(support::scripted::Scripted::new("p"))
        .concurrency(16);
    let shown = format!("{worker:?}");
    assert!(
        shown.starts_with("Worker {") && shown.contains("concurrency: 16"),
        "{shown}"
    );
}
