//! An apalis worker whose job carries a [`SendRequest`] and whose service is the mail stack
//! (a `Mailer` from a DSN, on an SMTP server this example starts in its own process) as a
//! tower service, under tower's timeout.
//!
//! ```text
//! cargo run --example apalis_worker --features tower
//! ```
//!
//! The jobs are kept by apalis in SQLite (in memory here); each job's handler hands its
//! request to the service and answers with the receipt's response, and the worker stops once
//! every job is done.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use apalis::prelude::{BoxDynError, Data, TaskSink, WorkerBuilder, WorkerContext};
use apalis_sqlite::{SqlitePool, SqliteStorage};
use mail_breaker::Message;
use mail_breaker::config::Mailer;
use mail_breaker::tower::{SendRequest, TransportService};
use support::EmbeddedSmtp;
use tower::ServiceExt;
use tower::timeout::Timeout;

const JOBS: usize = 5;

/// The service every job sends through: the mail stack, each send bounded by a timeout.
type MailService = Timeout<TransportService<Mailer>>;

/// The job: sends its request, then stops the worker after the last one.
async fn send_mail(
    request: SendRequest,
    service: Data<MailService>,
    done: Data<Arc<AtomicUsize>>,
    worker: WorkerContext,
) -> Result<(), BoxDynError> {
    let receipt = (*service).clone().oneshot(request).await?;
    println!("sent: {:?}", receipt.response());
    if done.fetch_add(1, Ordering::SeqCst) + 1 == JOBS {
        let _ = worker.stop();
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let server = EmbeddedSmtp::start();
    let dsn = format!(
        "retry(smtp://127.0.0.1:{}?name=relay&breaker.threshold=3)?attempts=2",
        server.port()
    );
    let mailer = Mailer::from_dsn(&dsn)?.build().await?;
    let service = Timeout::new(TransportService::new(mailer), Duration::from_secs(10));

    let pool = SqlitePool::connect(":memory:").await?;
    SqliteStorage::setup(&pool).await?;
    let mut jobs = SqliteStorage::<SendRequest>::new(&pool);
    for number in 1..=JOBS {
        let message = Message::builder()
            .from("app@example.com".parse()?)
            .to("user@example.org".parse()?)
            .subject(format!("job {number}"))
            .body(String::from("hello from a job"))?;
        jobs.push(SendRequest::from(&message)).await?;
    }

    let worker = WorkerBuilder::new("mail")
        .backend(jobs)
        .data(service)
        .data(Arc::new(AtomicUsize::new(0)))
        .build(send_mail);
    tokio::time::timeout(Duration::from_secs(30), worker.run()).await??;
    println!("{} messages reached the SMTP server", server.accepted());
    assert_eq!(server.accepted(), JOBS);
    Ok(())
}
