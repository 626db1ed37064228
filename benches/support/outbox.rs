//! The outboxes the benches measure: SQLite in a temporary folder and PostgreSQL from a
//! cluster of the bench's own, each opened by name, and how to empty one between runs.

use mail_breaker::Message;
use mail_breaker::outbox::Outbox;

use super::postgres::PostgresServer;

/// The outboxes' databases: a temporary folder for SQLite files, and PostgreSQL when
/// installed (started from a temporary folder, as `nobody` under root).
pub struct Databases {
    pub folder: std::path::PathBuf,
    pub postgres: Option<PostgresServer>,
}

impl Databases {
    /// Makes the folder and starts PostgreSQL; `bench` names them in the folder's name and in
    /// a message when PostgreSQL is skipped.
    pub fn start(bench: &str) -> Databases {
        let folder =
            std::env::temp_dir().join(format!("mail-breaker-{bench}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&folder);
        std::fs::create_dir_all(&folder).expect("a temporary folder");
        let postgres = super::installed("pg_ctlcluster", &format!("{bench} on PostgreSQL"))
            .then(|| PostgresServer::start(bench))
            .flatten();
        if let Some(pid) = postgres.as_ref().and_then(PostgresServer::pid) {
            super::cpu::count_postgres_of(pid);
        }
        Databases { folder, postgres }
    }

    /// Each outbox by name.
    pub async fn open(&self) -> Vec<Measured> {
        let mut outboxes = vec![Measured {
            name: "sqlite",
            outbox: Outbox::sqlite(self.folder.join("outbox.db"))
                .await
                .expect("an SQLite outbox"),
            postgres: None,
        }];
        if let Some(server) = &self.postgres {
            outboxes.push(Measured {
                name: "postgres",
                outbox: Outbox::postgres(&server.url())
                    .await
                    .expect("a Postgres outbox"),
                postgres: Some(server.url()),
            });
        }
        outboxes
    }
}

impl Drop for Databases {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.folder);
    }
}

/// An outbox to measure, by name; for PostgreSQL, its server's URL.
pub struct Measured {
    pub name: &'static str,
    pub outbox: Outbox,
    pub postgres: Option<String>,
}

/// Deletes whatever an earlier measurement left. On PostgreSQL it also vacuums the table, as
/// autovacuum does between real drains: else each drain would scan the dead rows of every
/// drain before it, and the figure would depend on how many iterations were run.
pub async fn empty(measured: &Measured) {
    use sqlx::Connection as _;
    let outbox = &measured.outbox;
    let stats = outbox.stats().await.expect("stats");
    if stats.queued + stats.dead > 0 {
        let provider = mail_breaker::LettreTransport::new(
            lettre::transport::stub::AsyncStubTransport::new_ok(),
            |_| unreachable!(),
        );
        outbox
            .worker(provider)
            .concurrency(64)
            .drain()
            .await
            .expect("emptied");
    }
    if let Some(url) = &measured.postgres {
        let mut connection = sqlx::PgConnection::connect(url).await.expect("connected");
        sqlx::raw_sql("VACUUM mail_breaker_outbox")
            .execute(&mut connection)
            .await
            .expect("vacuumed");
    }
}

/// `count` receipts of about 2 KB each, to one recipient: the messages every outbox bench
/// queues.
pub fn receipts(count: usize) -> Vec<Message> {
    let paragraph = "Thank you for your order. It ships within two working days; the \
                     tracking link follows in a separate message once it leaves us.\r\n";
    let body = paragraph.repeat(2_000 / paragraph.len() + 1);
    (0..count)
        .map(|i| {
            Message::builder()
                .from("app@example.com".parse().expect("a sender"))
                .to("user@example.org".parse().expect("a recipient"))
                .subject(format!("receipt {i}"))
                .body(format!("Receipt number {i}\r\n{body}"))
                .expect("a message")
        })
        .collect()
}
