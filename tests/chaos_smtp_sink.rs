//! Chaos against real servers (issue 7): 5,000 messages through
//! retry(pool(breaker(smtp-sink A), breaker(smtp-sink B))) while the test kills (SIGKILL) and
//! restarts A and B at random moments, both down together only for short spells that the
//! retry outlasts.
//!
//! Each server writes every message it accepts to a file; each message has a unique subject
//! and ends with a unique last line, so the files say which messages each server got, whole.
//! A watching proxy in front of each server notes every transaction whose final `.` reached
//! the server but whose reply never reached the client: the one place where SMTP itself can
//! duplicate a message (the server may have accepted it; the client saw a lost connection and
//! sent it again). The SMTP transport marks exactly those sends
//! [`maybe_delivered`](mail_breaker::SendError::maybe_delivered): a Network error or Timeout
//! after the final dot was written. The test notes every maybe-delivered error each server's
//! transport gave, proves that no message was lost, that every duplicate is one of those sends
//! (and one the proxy saw lose its reply after the `.`), and prints each one. With
//! `at_most_once()` on the retry and the pool, such a send would be answered as it is instead,
//! and there would be no duplicates.
//!
//! The randomness comes from a seed printed at the start; `CHAOS_SEED=<n>` runs another.

mod support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use futures::StreamExt;
use mail_breaker::{
    Backoff, CircuitBreakerTransport, Envelope, Message, MessageStream, PoolTransport, Receipt,
    ReceiptStream, RetryTransport, SendError, SmtpTransport, Strategy, Transport,
};
use support::smtp_sink::SmtpSink;
use support::smtp_watch::{SmtpWatch, Watched};

const TEST: &str = "five_thousand_messages_survive_servers_killed_at_random_with_none_lost";
const MESSAGES: usize = 5_000;
/// Messages per `send_many`; two batches run at once, so both servers take load.
const BATCH: usize = 250;
/// The time between the starts of two batches: 20 batches span about 14 s of chaos.
const BATCH_PACE: Duration = Duration::from_millis(700);
const DEFAULT_SEED: u64 = 0xc4a0_5007;

/// Each message's subject, and the last line of its body that shows the server got it whole.
fn subject(id: usize) -> String {
    format!("chaos {id}")
}

fn last_line(id: usize) -> String {
    format!("end of chaos {id}")
}

fn message(id: usize) -> Message {
    Message::builder()
        .from("app@example.com".parse().expect("a valid sender"))
        .to("user@example.org".parse().expect("a valid recipient"))
        .subject(subject(id))
        .body(format!("chaos message {id}\r\n{}", last_line(id)))
        .expect("a valid message")
}

/// The ids of the messages a server holds whole: files that end with the message's last line
/// and then the empty line the server writes once it has read the final `.`.
fn whole_messages(dumps: &[String]) -> (HashMap<usize, u32>, usize) {
    let mut whole = HashMap::new();
    let mut cut_short = 0;
    for dump in dumps {
        let id = dump
            .lines()
            .find_map(|line| line.strip_prefix("Subject: chaos "))
            .and_then(|id| id.trim().parse::<usize>().ok());
        match id {
            Some(id) if dump.ends_with(&format!("{}\n\n", last_line(id))) => {
                *whole.entry(id).or_default() += 1;
            }
            _ => cut_short += 1,
        }
    }
    (whole, cut_short)
}

/// What the chaos did.
#[derive(Debug, Default)]
struct Chaos {
    kills: [u32; 2],
    both_down: u32,
    longest_both_down: Duration,
}

/// Kills and restarts the two servers at random until `stop`, never both down for long.
///
/// The first time round both go down for longer than [`BATCH_PACE`], so that a batch starts
/// while neither server answers and its messages must be retried, however the load on the
/// machine shifts the kills against the sends.
fn unleash(
    sinks: [Arc<Mutex<SmtpSink>>; 2],
    seed: u64,
    stop: Arc<AtomicBool>,
) -> thread::JoinHandle<Chaos> {
    thread::spawn(move || {
        let lock = |i: usize| sinks[i].lock().unwrap_or_else(PoisonError::into_inner);
        let mut rng = fastrand::Rng::with_seed(seed);
        let mut chaos = Chaos::default();
        while !stop.load(Ordering::Relaxed) {
            thread::sleep(Duration::from_millis(rng.u64(100..700)));
            let victim = rng.usize(..2);
            lock(victim).stop();
            chaos.kills[victim] += 1;
            thread::sleep(Duration::from_millis(rng.u64(50..400)));
            let first = chaos.both_down == 0;
            if rng.f64() < 0.25 || first {
                let other = 1 - victim;
                let down = Instant::now();
                lock(other).stop();
                chaos.kills[other] += 1;
                chaos.both_down += 1;
                let spell = Duration::from_millis(rng.u64(50..300));
                thread::sleep(if first { BATCH_PACE + spell } else { spell });
                lock(other).restart();
                chaos.longest_both_down = chaos.longest_both_down.max(down.elapsed());
            }
            lock(victim).restart();
        }
        chaos
    })
}

/// How many maybe-delivered errors each subject got from one server.
type MaybeDelivered = Arc<Mutex<HashMap<String, u32>>>;

/// A transport that notes, per subject, each maybe-delivered error its inner transport gives.
struct NotingMaybeDelivered<T> {
    inner: T,
    noted: MaybeDelivered,
}

impl<T> NotingMaybeDelivered<T> {
    fn note(&self, subject: &str, answer: &Result<Receipt, SendError>) {
        if answer.as_ref().is_err_and(SendError::is_maybe_delivered) {
            *self
                .noted
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .entry(subject.to_owned())
                .or_default() += 1;
        }
    }
}

fn subject_of(raw: &[u8]) -> String {
    String::from_utf8_lossy(raw)
        .lines()
        .find_map(|line| line.strip_prefix("Subject: ").map(str::to_owned))
        .unwrap_or_default()
}

#[async_trait::async_trait]
impl<T: Transport> Transport for NotingMaybeDelivered<T> {
    fn name(&self) -> &str {
        self.inner.name()
    }

    async fn send_raw(&self, envelope: &Envelope, raw: &[u8]) -> Result<Receipt, SendError> {
        let answer = self.inner.send_raw(envelope, raw).await;
        self.note(&subject_of(raw), &answer);
        answer
    }

    fn send_many<'a>(&'a self, messages: MessageStream<'a>) -> ReceiptStream<'a> {
        // The inner transport answers in the order it read the messages, one each.
        let subjects = Arc::new(Mutex::new(std::collections::VecDeque::new()));
        let read = Arc::clone(&subjects);
        let messages = messages
            .inspect(move |message| {
                read.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push_back(subject_of(&message.formatted()));
            })
            .boxed();
        self.inner
            .send_many(messages)
            .inspect(move |answer| {
                let subject = subjects
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .pop_front()
                    .unwrap_or_default();
                self.note(&subject, answer);
            })
            .boxed()
    }

    async fn verify(&self) -> Result<(), SendError> {
        self.inner.verify().await
    }
}

fn member(
    port: u16,
    name: &str,
    noted: MaybeDelivered,
) -> CircuitBreakerTransport<NotingMaybeDelivered<SmtpTransport>> {
    CircuitBreakerTransport::builder(NotingMaybeDelivered {
        inner: SmtpTransport::unencrypted("127.0.0.1", port)
            .with_name(name)
            .with_timeout(Duration::from_secs(3)),
        noted,
    })
    .failure_threshold(3)
    .reset_timeout(Duration::from_millis(200))
    .probe_timeout(Duration::from_secs(3))
    .build()
    .expect("valid breaker settings")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_thousand_messages_survive_servers_killed_at_random_with_none_lost() {
    let Some(sink_a) = SmtpSink::start_counting(TEST, &[]) else {
        return;
    };
    let Some(sink_b) = SmtpSink::start_counting(TEST, &[]) else {
        return;
    };
    let seed = std::env::var("CHAOS_SEED")
        .ok()
        .and_then(|seed| seed.parse().ok())
        .unwrap_or(DEFAULT_SEED);
    println!("chaos seed {seed} (set CHAOS_SEED to run another)");
    let watch_a = SmtpWatch::start(sink_a.address()).await;
    let watch_b = SmtpWatch::start(sink_b.address()).await;
    let sinks = [Arc::new(Mutex::new(sink_a)), Arc::new(Mutex::new(sink_b))];

    let maybe_delivered: [MaybeDelivered; 2] = Default::default();
    let pool = PoolTransport::builder()
        .add(
            member(watch_a.port(), "A", Arc::clone(&maybe_delivered[0])),
            1,
        )
        .add(
            member(watch_b.port(), "B", Arc::clone(&maybe_delivered[1])),
            1,
        )
        .strategy(Strategy::RoundRobin)
        .build()
        .expect("a pool with members");
    // Both servers are down together for at most ~1 s (the first spell) plus a restart; the
    // retry waits far longer than that before it gives up.
    let transport = RetryTransport::builder(pool)
        .max_attempts(40)
        .backoff(Backoff::exponential(
            Duration::from_millis(20),
            Duration::from_millis(500),
        ))
        .max_elapsed(Duration::from_secs(60))
        .build()
        .expect("valid retry settings");

    let stop = Arc::new(AtomicBool::new(false));
    let chaos = unleash(sinks.clone(), seed, Arc::clone(&stop));
    let started = Instant::now();
    let batches: Vec<Vec<Message>> = (0..MESSAGES)
        .step_by(BATCH)
        .map(|first| {
            (first..(first + BATCH).min(MESSAGES))
                .map(message)
                .collect()
        })
        .collect();
    // Batches go out at a steady pace, so the run outlasts enough kills to prove something
    // (a fast transport would otherwise finish between two of them).
    let answers: Vec<_> = futures::stream::iter(batches.into_iter().enumerate())
        .then(|(index, batch)| async move {
            let due = tokio::time::Instant::from_std(started) + BATCH_PACE * index as u32;
            tokio::time::sleep_until(due).await;
            batch
        })
        .map(|batch| {
            transport
                .send_many(futures::stream::iter(batch).boxed())
                .collect::<Vec<_>>()
        })
        .buffered(2)
        .flat_map(futures::stream::iter)
        .collect()
        .await;
    let elapsed = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    let chaos = tokio::task::spawn_blocking(move || chaos.join().expect("the chaos thread"))
        .await
        .expect("joining the chaos thread");

    // The chaos happened: a broken killer would pass everything below while testing nothing.
    // A run kills each server about a dozen times, and both are down together several times.
    assert!(
        chaos.kills.iter().all(|&kills| kills >= 3) && chaos.both_down >= 1,
        "seed {seed}: too little chaos to prove anything: {chaos:?}"
    );

    // Every message has exactly one answer, a receipt naming the server that took it.
    assert_eq!(answers.len(), MESSAGES);
    let failed: Vec<_> = answers
        .iter()
        .enumerate()
        .filter_map(|(id, answer)| answer.as_ref().err().map(|e| (id, e.to_string())))
        .collect();
    assert!(
        failed.is_empty(),
        "seed {seed}: {} failed: {:?}",
        failed.len(),
        &failed[..failed.len().min(10)]
    );
    let receipt_server = |id: usize| -> usize {
        match answers[id].as_ref().map(|r| r.transport()) {
            Ok("A") => 0,
            Ok("B") => 1,
            other => panic!("seed {seed}: answer {id} from {other:?}"),
        }
    };

    let dumps = [0, 1].map(|i| {
        sinks[i]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .received_dumps()
    });
    let (whole, cut_short): (Vec<_>, Vec<_>) = dumps.iter().map(|d| whole_messages(d)).unzip();
    let watched: [Watched; 2] = [watch_a.watched(), watch_b.watched()];
    assert!(
        watched.iter().all(|seen| seen.refused >= 1),
        "seed {seed}: the kills never turned a connection away"
    );
    assert!(
        answers
            .iter()
            .any(|a| a.as_ref().is_ok_and(|r| r.attempts() > 1)),
        "seed {seed}: no message needed a retry: the faults never reached a send"
    );
    let names = ["A", "B"];

    // None lost: the server named by each receipt holds the message whole.
    let lost: Vec<usize> = (0..MESSAGES)
        .filter(|&id| !whole[receipt_server(id)].contains_key(&id))
        .collect();
    assert!(
        lost.is_empty(),
        "seed {seed}: {} receipts whose server has no whole copy: {:?}; a file: {:?}",
        lost.len(),
        &lost[..lost.len().min(10)],
        dumps.iter().flatten().next()
    );

    // Every copy past the one the receipt stands for is a send that server's transport
    // answered maybe-delivered, and a transaction whose `.` reached that server and whose
    // reply never came back.
    let maybe_delivered = maybe_delivered
        .map(|noted| std::mem::take(&mut *noted.lock().unwrap_or_else(PoisonError::into_inner)));
    let mut duplicates = Vec::new();
    for id in 0..MESSAGES {
        for server in 0..2 {
            let copies = whole[server].get(&id).copied().unwrap_or(0);
            let expected = u32::from(receipt_server(id) == server);
            if copies > expected {
                let extra = copies - expected;
                let marked = maybe_delivered[server]
                    .get(&subject(id))
                    .copied()
                    .unwrap_or(0);
                assert!(
                    extra <= marked,
                    "seed {seed}: message {id} has {copies} copies on {} (receipt from {}), \
                     but only {marked} of its sends there were answered maybe-delivered",
                    names[server],
                    names[receipt_server(id)]
                );
                let unanswered = watched[server]
                    .unanswered_after_dot
                    .get(&subject(id))
                    .copied()
                    .unwrap_or(0);
                assert!(
                    extra <= unanswered,
                    "seed {seed}: message {id} has {copies} copies on {} (receipt from {}), \
                     but only {unanswered} of its transactions there lost their reply after the '.'",
                    names[server],
                    names[receipt_server(id)]
                );
                duplicates.push((id, server, extra));
            }
        }
    }

    println!(
        "{MESSAGES} messages in {elapsed:?}: {} by A, {} by B, {} retried; \
         {} kills of A, {} of B, {} times both down (longest {:?})",
        (0..MESSAGES).filter(|&id| receipt_server(id) == 0).count(),
        (0..MESSAGES).filter(|&id| receipt_server(id) == 1).count(),
        answers
            .iter()
            .filter(|a| a.as_ref().is_ok_and(|r| r.attempts() > 1))
            .count(),
        chaos.kills[0],
        chaos.kills[1],
        chaos.both_down,
        chaos.longest_both_down,
    );
    for server in 0..2 {
        let seen = &watched[server];
        println!(
            "{}: {} connections ({} refused while down), {} transactions answered, \
             {} lost their reply after the '.', {} cut off before it; {} files cut short by a \
             kill; {} sends answered maybe-delivered",
            names[server],
            seen.connections,
            seen.refused,
            seen.answered.values().sum::<u32>(),
            seen.unanswered_after_dot.values().sum::<u32>(),
            seen.cut_before_dot,
            cut_short[server],
            maybe_delivered[server].values().sum::<u32>(),
        );
    }
    println!(
        "lost: 0; duplicates: {} (each a send answered maybe-delivered: its connection was lost \
         after the final '.' and before the server's reply, so the client could not know it \
         was accepted, and at-least-once sent it again)",
        duplicates.iter().map(|(_, _, extra)| extra).sum::<u32>()
    );
    for (id, server, extra) in &duplicates {
        println!(
            "  duplicate: '{}' {extra} extra on {}: its '.' reached {} and the server was \
             killed before its reply reached the client (answered maybe-delivered); it was \
             then sent again and delivered by {} (the receipt)",
            subject(*id),
            names[*server],
            names[*server],
            names[receipt_server(*id)],
        );
    }
}
