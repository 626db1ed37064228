//! Idempotency keys that belong to one send (DESIGN §21, issue 65), against a Resend stand-in
//! that honours `Idempotency-Key` as Resend documents it: a key seen in the last 24 hours is
//! answered with the first request's result and nothing is sent again, and a key seen with
//! another request body is refused with `409 invalid_idempotent_request`.
#![cfg(all(feature = "resend", feature = "smtp", feature = "outbox"))]

mod support;

use std::collections::{HashMap, HashSet};
use std::net::TcpListener;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use mail_breaker::{
    Backoff, Envelope, Message, Outbox, OutboxTransport, PoolTransport, ResendTransport,
    RetryTransport, SmtpTransport, Transport, idempotency,
};
use mailin_embedded::{Handler, Response, Server, SslConfig};
use support::http_api::{ApiServer, Recorded, Reply};

const KEY: &str = "re_test_key_never_shown";
const TIMEOUT: Duration = Duration::from_millis(800);

/// What the stand-in does with the request of a given number (0 for the first), before it
/// looks at the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Door {
    /// Reads the key as Resend does.
    Open,
    /// Keeps the message (a delivery) and drops the connection without an answer: the
    /// sender cannot know it was delivered.
    DeliverThenDrop,
    /// `500`, before the key is looked at: nothing kept.
    Fails,
    /// `503`, before the key is looked at: nothing kept.
    Down,
}

/// Resend as far as keys go: every delivery it made (key and `to`/`bcc` recipients), and the
/// answer it keeps for each key with the body it came with.
#[derive(Debug, Default)]
struct Keyed {
    deliveries: Vec<(String, Vec<String>)>,
    answers: HashMap<String, (String, String)>,
}

struct Resend {
    server: ApiServer,
    state: Arc<Mutex<Keyed>>,
}

impl Resend {
    /// A stand-in whose `n`th request meets `doors[n]` (and every later one `Door::Open`).
    async fn start(doors: &[Door]) -> Resend {
        let state: Arc<Mutex<Keyed>> = Arc::default();
        let doors = doors.to_vec();
        let count = Arc::new(Mutex::new(0_usize));
        let keyed = Arc::clone(&state);
        let server = ApiServer::start(move |request: &Recorded| {
            let n = {
                let mut count = count.lock().unwrap_or_else(PoisonError::into_inner);
                *count += 1;
                *count - 1
            };
            let door = doors.get(n).copied().unwrap_or(Door::Open);
            match door {
                Door::Fails => return Reply::json(500, r#"{"name":"internal_server_error"}"#),
                Door::Down => {
                    return Reply::json(503, r#"{"name":"service_unavailable"}"#)
                        .with_header("Retry-After", "0");
                }
                Door::Open | Door::DeliverThenDrop => {}
            }
            let mut keyed = keyed.lock().unwrap_or_else(PoisonError::into_inner);
            let answer = keyed.answer(request);
            if door == Door::DeliverThenDrop {
                Reply::Drop
            } else {
                answer
            }
        })
        .await;
        Resend { server, state }
    }

    fn transport(&self) -> ResendTransport {
        ResendTransport::new(KEY)
            .with_endpoint(self.server.endpoint())
            .with_timeout(TIMEOUT)
    }

    /// Sends what `outbox` holds through it, then returns.
    async fn drain(&self, outbox: &Outbox) {
        outbox
            .worker(self.transport())
            .drain()
            .await
            .expect("drained");
    }

    /// The deliveries it made: each key and the recipients it sent to.
    fn deliveries(&self) -> Vec<(String, Vec<String>)> {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .deliveries
            .clone()
    }

    /// The `Idempotency-Key` of every request it read, in order.
    fn keys(&self) -> Vec<String> {
        self.server
            .requests()
            .iter()
            .map(|request| request.header("idempotency-key").unwrap_or("").to_owned())
            .collect()
    }
}

impl Keyed {
    fn answer(&mut self, request: &Recorded) -> Reply {
        let Some(key) = request.header("idempotency-key").map(str::to_owned) else {
            return Reply::json(400, r#"{"name":"validation_error"}"#);
        };
        let body = request.text();
        if let Some((first_body, first_answer)) = self.answers.get(&key) {
            if *first_body != body {
                return Reply::json(
                    409,
                    r#"{"statusCode":409,"name":"invalid_idempotent_request","message":"Same idempotency key used with a different request payload."}"#,
                );
            }
            return Reply::json(200, first_answer);
        }
        let json = request.json();
        let mut recipients: Vec<String> = ["to", "cc", "bcc"]
            .iter()
            .flat_map(|field| json[field].as_array().cloned().unwrap_or_default())
            .filter_map(|value| value.as_str().map(str::to_owned))
            .collect();
        recipients.sort();
        let answer = format!(r#"{{"id":"email-{}"}}"#, self.deliveries.len());
        self.deliveries.push((key.clone(), recipients));
        self.answers.insert(key, (body, answer.clone()));
        Reply::json(200, &answer)
    }
}

/// The same alert twice: no Message-ID (lettre adds none), the same `Date:`, so the same
/// bytes.
fn alert() -> Message {
    Message::builder()
        .from("app@example.com".parse().expect("a sender"))
        .to("ops@example.org".parse().expect("a recipient"))
        .subject("disk full")
        .date(SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000))
        .body(String::from("disk full on db-1"))
        .expect("a message")
}

#[tokio::test]
async fn two_messages_of_identical_content_without_a_message_id_are_both_delivered() {
    let resend = Resend::start(&[]).await;
    let transport = resend.transport();
    assert_eq!(alert().formatted(), alert().formatted(), "the same bytes");
    let first = transport.send(&alert()).await.expect("the first");
    let second = transport.send(&alert()).await.expect("the second");
    assert_ne!(first.message_id(), second.message_id());
    assert_eq!(resend.deliveries().len(), 2, "{:?}", resend.deliveries());
}

fn outbox_folder() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("mail-breaker-idempotency-")
        .tempdir()
        .expect("a temporary folder")
}

/// An outbox in a folder of its own, removed when the folder is dropped.
async fn sqlite_outbox() -> (tempfile::TempDir, Outbox) {
    let folder = outbox_folder();
    let outbox = Outbox::sqlite(folder.path().join("outbox.db"))
        .await
        .expect("an outbox");
    (folder, outbox)
}

#[tokio::test]
async fn a_maybe_delivered_first_send_is_resent_by_the_outbox_under_its_key_and_delivered_once() {
    let resend = Resend::start(&[Door::DeliverThenDrop]).await;
    let (_folder, outbox) = sqlite_outbox().await;
    let send_or_queue = OutboxTransport::send_or_queue(outbox.clone(), resend.transport());
    let receipt = send_or_queue.send(&alert()).await.expect("queued");
    assert!(receipt.is_queued(), "{receipt:?}");
    assert_eq!(receipt.maybe_delivered_recipients().len(), 1);

    resend.drain(&outbox).await;
    assert_eq!(outbox.stats().await.expect("stats").queued, 0, "answered");
    let keys = resend.keys();
    assert_eq!(keys.len(), 2, "{keys:?}");
    assert_eq!(keys[0], keys[1], "the worker's key is the first try's");
    assert_eq!(resend.deliveries().len(), 1, "delivered once");
}

#[tokio::test]
async fn every_message_the_outbox_keeps_is_sent_under_a_key_of_its_own() {
    let resend = Resend::start(&[]).await;
    let (_folder, outbox) = sqlite_outbox().await;
    outbox.enqueue(&alert()).await.expect("one");
    outbox.enqueue(&alert()).await.expect("two");
    outbox
        .enqueue_many(&[alert(), alert()])
        .await
        .expect("two more");
    resend.drain(&outbox).await;
    let keys: HashSet<String> = resend.keys().into_iter().collect();
    assert_eq!(keys.len(), 4, "{keys:?}");
    assert_eq!(resend.deliveries().len(), 4);
}

#[tokio::test]
async fn the_retry_layers_second_try_of_one_call_carries_the_first_trys_key() {
    let resend = Resend::start(&[Door::Fails]).await;
    let retry = RetryTransport::builder(resend.transport())
        .max_attempts(2)
        .backoff(Backoff::constant(Duration::from_millis(10)))
        .build()
        .expect("a retry");
    retry
        .send(&alert())
        .await
        .expect("delivered by the second try");
    let keys = resend.keys();
    assert_eq!(keys.len(), 2, "{keys:?}");
    assert_eq!(keys[0], keys[1]);
    // And the next call, of the same bytes, is another send.
    retry.send(&alert()).await.expect("the next alert");
    let keys = resend.keys();
    assert_ne!(keys[2], keys[0]);
    assert_eq!(resend.deliveries().len(), 2);
}

#[tokio::test]
async fn a_key_given_by_the_application_is_kept_by_the_outbox_it_enqueues_into() {
    let resend = Resend::start(&[]).await;
    let (_folder, outbox) = sqlite_outbox().await;
    idempotency::with_key("order-7", outbox.enqueue(&alert()))
        .await
        .expect("enqueued");
    resend.drain(&outbox).await;
    let keys = resend.keys();
    assert_eq!(keys.len(), 1);
    assert!(keys[0].starts_with("order-7."), "{keys:?}");
}

/// An SMTP server (mailin-embedded, in this process) that answers `450` to the `RCPT TO` of
/// the recipients it defers and takes the rest; it keeps the recipients of each message it
/// took.
#[derive(Clone)]
struct Greylisting {
    defer: Arc<HashSet<String>>,
    taken: Arc<Mutex<Vec<Vec<String>>>>,
}

impl Handler for Greylisting {
    fn rcpt(&mut self, to: &str) -> Response {
        if self.defer.contains(to) {
            Response::custom(450, "4.2.0 greylisted, try again later".to_owned())
        } else {
            mailin_embedded::response::OK
        }
    }

    fn data_start(&mut self, _domain: &str, _from: &str, _is8bit: bool, to: &[String]) -> Response {
        let mut to = to.to_vec();
        to.sort();
        self.taken
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(to);
        mailin_embedded::response::OK
    }
}

fn greylisting(defer: &[&str]) -> (u16, Arc<Mutex<Vec<Vec<String>>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
    let port = listener.local_addr().expect("its address").port();
    let taken: Arc<Mutex<Vec<Vec<String>>>> = Arc::default();
    let handler = Greylisting {
        defer: Arc::new(defer.iter().map(|to| (*to).to_owned()).collect()),
        taken: Arc::clone(&taken),
    };
    let mut server = Server::new(handler);
    server
        .with_name("greylisting.localhost")
        .with_num_threads(4)
        .with_ssl(SslConfig::None)
        .expect("no TLS")
        .with_tcp_listener(listener);
    std::thread::spawn(move || {
        let _ = server.serve();
    });
    (port, taken)
}

/// Carol in To, Alice and Bob as blind copies: a resend to Carol alone names no one in its
/// headers who is not in its envelope, so Resend can carry it.
fn to_three() -> Message {
    let envelope = Envelope::new(
        Some("app@example.com".parse().expect("a sender")),
        ["alice@example.org", "bob@example.org", "carol@example.org"]
            .iter()
            .map(|to| to.parse().expect("a recipient"))
            .collect(),
    )
    .expect("an envelope");
    Message::builder()
        .from("app@example.com".parse().expect("a sender"))
        .to("carol@example.org".parse().expect("a recipient"))
        .subject("invoice")
        .envelope(envelope)
        .body(String::from("your invoice"))
        .expect("a message")
}

/// Resend takes the whole message first, and the connection drops before its answer (maybe
/// delivered): the pool fails over to its SMTP member, which takes Alice and Bob and defers
/// Carol. The retry sends Carol's copy again: Resend is down, the SMTP member defers her
/// again, and the next try's Resend takes it: a request with another body than the first,
/// under a key of its own (under the first request's key, Resend would refuse it with 409).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_smtp_member_defers_one_of_three_and_the_retry_sends_it_through_resend_not_refused_with_409()
 {
    let resend = Resend::start(&[Door::DeliverThenDrop, Door::Down]).await;
    let (port, taken) = greylisting(&["carol@example.org"]);
    let smtp = SmtpTransport::unencrypted("127.0.0.1", port).with_timeout(TIMEOUT);
    let pool = PoolTransport::builder()
        .add(resend.transport(), 1)
        .add(smtp, 2)
        .build()
        .expect("a pool");
    let retry = RetryTransport::builder(pool)
        .max_attempts(4)
        .backoff(Backoff::constant(Duration::from_millis(10)))
        .build()
        .expect("a retry");
    let receipt = retry.send(&to_three()).await.expect("an answer");
    assert!(
        receipt.deferred_recipients().is_empty() && receipt.rejected_recipients().is_empty(),
        "{receipt:?}"
    );
    let taken = taken.lock().unwrap_or_else(PoisonError::into_inner).clone();
    assert_eq!(
        taken,
        [vec![
            "alice@example.org".to_owned(),
            "bob@example.org".to_owned()
        ]]
    );
    let deliveries = resend.deliveries();
    let recipients: Vec<&Vec<String>> = deliveries.iter().map(|(_, to)| to).collect();
    assert_eq!(
        recipients,
        [
            &vec![
                "alice@example.org".to_owned(),
                "bob@example.org".to_owned(),
                "carol@example.org".to_owned()
            ],
            &vec!["carol@example.org".to_owned()],
        ],
        "{deliveries:?}"
    );
    assert_ne!(deliveries[0].0, deliveries[1].0, "a key for each body");
    // Both keys are the one send's: the same handover, another recipients' hash.
    let handover = |key: &str| key.rsplit_once('.').map(|(head, _)| head.to_owned());
    assert_eq!(handover(&deliveries[0].0), handover(&deliveries[1].0));
}

// Hostile review of the keys (issue 65): each test failed on the first version of them.

/// A transport of one's own that takes keys: it keeps each try's key and answers from a
/// script (an error that may pass, then deliveries).
#[derive(Clone, Default)]
struct KeyTaker {
    keys: Arc<Mutex<Vec<String>>>,
    fail_first: bool,
}

#[async_trait::async_trait]
impl Transport for KeyTaker {
    fn name(&self) -> &str {
        "key-taker"
    }

    async fn send_raw(
        &self,
        envelope: &Envelope,
        raw: &[u8],
    ) -> Result<mail_breaker::Receipt, mail_breaker::SendError> {
        let key = idempotency::try_key(envelope, None, raw);
        let mut keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        keys.push(key);
        if self.fail_first && keys.len() == 1 {
            return Err(mail_breaker::SendError::new(
                mail_breaker::Category::Timeout,
                "key-taker.timeout",
                "no answer",
            )
            .maybe_delivered());
        }
        Ok(mail_breaker::Receipt::new("key-taker"))
    }
}

#[tokio::test]
async fn a_message_an_earlier_version_kept_without_a_key_is_tried_under_that_versions_key() {
    let folder = outbox_folder();
    let path = folder.path().join("outbox.db");
    let outbox = Outbox::sqlite(&path).await.expect("an outbox");
    let with_id = Message::builder()
        .from("app@example.com".parse().expect("a sender"))
        .to("ops@example.org".parse().expect("a recipient"))
        .message_id(Some("<m-1@example.com>".to_owned()))
        .body(String::from("kept before keys"))
        .expect("a message");
    outbox.enqueue(&with_id).await.expect("kept");
    outbox.enqueue(&alert()).await.expect("kept");
    {
        use sqlx::Connection as _;
        let mut earlier = sqlx::SqliteConnection::connect(&format!("sqlite://{}", path.display()))
            .await
            .expect("the file");
        sqlx::query("UPDATE mail_breaker_outbox SET idempotency_key = NULL")
            .execute(&mut earlier)
            .await
            .expect("as an earlier version kept them");
    }
    let resend = Resend::start(&[]).await;
    resend.drain(&outbox).await;
    let keys = resend.keys();
    let raw = alert().formatted();
    let bytes_key = format!("raw-{:016x}-{}", fnv1a(&raw), raw.len());
    assert_eq!(keys, ["m-1@example.com".to_owned(), bytes_key]);
}

/// The hash the version before keys made a key of, for a message without a Message-ID.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[tokio::test]
async fn a_streamed_message_without_a_message_id_is_retried_under_its_first_key() {
    use futures::StreamExt;
    let resend = Resend::start(&[Door::DeliverThenDrop]).await;
    let retry = RetryTransport::builder(resend.transport())
        .max_attempts(2)
        .backoff(Backoff::constant(Duration::from_millis(10)))
        .build()
        .expect("a retry");
    let answers: Vec<_> = retry
        .send_many(futures::stream::iter([alert()]).boxed())
        .collect()
        .await;
    assert!(answers[0].is_ok(), "{answers:?}");
    let keys = resend.keys();
    assert_eq!(keys.len(), 2, "{keys:?}");
    assert_eq!(keys[0], keys[1]);
    assert_eq!(resend.deliveries().len(), 1, "delivered once");
}

fn welcome_and_verify() -> [Message; 2] {
    ["welcome", "verify your address"].map(|subject| {
        Message::builder()
            .from("app@example.com".parse().expect("a sender"))
            .to("bob@example.org".parse().expect("a recipient"))
            .subject(subject)
            .body(String::from("hello"))
            .expect("a message")
    })
}

#[tokio::test]
async fn two_messages_enqueued_under_one_given_key_are_both_delivered() {
    let resend = Resend::start(&[]).await;
    let (_folder, outbox) = sqlite_outbox().await;
    let [welcome, verify] = welcome_and_verify();
    idempotency::with_key("job-1", async {
        outbox.enqueue(&welcome).await.expect("the welcome");
        outbox.enqueue(&verify).await.expect("the verification");
    })
    .await;
    idempotency::with_key("job-2", outbox.enqueue_many(&welcome_and_verify()))
        .await
        .expect("both");
    resend.drain(&outbox).await;
    assert_eq!(outbox.dead_letters(10).await.expect("read").len(), 0);
    assert_eq!(resend.deliveries().len(), 4, "{:?}", resend.deliveries());
    let keys = resend.keys();
    for (key, job) in keys
        .iter()
        .zip(["job-1.", "job-1~1.", "job-2.", "job-2~1."])
    {
        assert!(key.starts_with(job), "{keys:?}");
    }
}

/// A job's message as each run of the job builds it.
fn receipt_for_job(message_id: Option<String>) -> Message {
    let builder = Message::builder()
        .from("app@example.com".parse().expect("a sender"))
        .to("bob@example.org".parse().expect("a recipient"))
        .subject("receipt")
        .date(SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000));
    let builder = match message_id {
        Some(_) => builder.message_id(None),
        None => builder,
    };
    builder.body(String::from("thank you")).expect("a message")
}

#[tokio::test]
async fn a_jobs_second_run_of_the_same_message_under_its_key_is_answered_with_the_first_runs_result()
 {
    let resend = Resend::start(&[]).await;
    let run = || {
        let transport = resend.transport();
        idempotency::with_key("job-42", async move {
            transport.send(&receipt_for_job(None)).await
        })
    };
    let first = run().await.expect("the first run");
    let second = run().await.expect("the second run");
    assert_eq!(first.message_id(), second.message_id());
    assert_eq!(resend.deliveries().len(), 1);
}

#[tokio::test]
async fn a_jobs_second_run_that_built_its_message_anew_is_refused_and_not_delivered_twice() {
    let resend = Resend::start(&[]).await;
    let run = || {
        let transport = resend.transport();
        // Another Message-ID each run: other bytes under the job's key.
        let message = receipt_for_job(Some(String::new()));
        idempotency::with_key("job-43", async move { transport.send(&message).await })
    };
    run().await.expect("the first run");
    let refused = run().await.expect_err("the second run");
    assert_eq!(refused.code(), "resend.invalid_idempotent_request");
    assert_eq!(resend.deliveries().len(), 1);
}

#[tokio::test]
async fn a_worker_sends_every_attempt_of_a_row_under_the_key_it_keeps() {
    let (_folder, outbox) = sqlite_outbox().await;
    outbox.enqueue(&alert()).await.expect("kept");
    let taker = KeyTaker {
        fail_first: true,
        ..KeyTaker::default()
    };
    let worker = outbox
        .worker(taker.clone())
        .backoff(Backoff::constant(Duration::from_millis(10)));
    worker.drain().await.expect("the first attempt");
    tokio::time::sleep(Duration::from_millis(50)).await;
    worker.drain().await.expect("the second");
    let keys = taker
        .keys
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    assert_eq!(keys.len(), 2, "{keys:?}");
    assert_eq!(keys[0], keys[1]);
}
