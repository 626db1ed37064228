//! Three OS processes on one Redis (issue 64, acceptance: "events received by one open it for
//! all"): each process sends for the member `postmark` through its reputation breaker kept in
//! a real redis-server; one of them also serves Postmark's webhook route. Hard bounces past
//! the minimum volume, posted to that one, open the breaker in the other two, whose sends are
//! then answered `reputation.open` without reaching their provider.
//!
//! The test re-executes its own binary as the three processes: the ignored test
//! `reputation_fleet_process` does a process's work when `REPUTATION_FLEET_REDIS` is set,
//! reading commands from its stdin and answering each on its stdout, so the processes are
//! always built from the code under test.
#![cfg(all(feature = "redis", feature = "webhooks"))]

mod support;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use mail_breaker::events::Provider;
use mail_breaker::reputation::ReputationBreaker;
use mail_breaker::webhooks::{BasicAuth, Webhooks};
use mail_breaker::{Envelope, Receipt, RedisStore, SendError, Transport};
use support::redis::RedisServer;

/// The redis-server the process shares with the others; set only in a child.
const REDIS_URL: &str = "REPUTATION_FLEET_REDIS";
/// Set (to anything) in the child that serves Postmark's webhook route.
const RECEIVER: &str = "REPUTATION_FLEET_RECEIVER";
const MEMBER: &str = "postmark";
const NAMESPACE: &str = "reputation-processes";
const CREDENTIALS: (&str, &str) = ("postmark", "fleet-s3cret");
/// What starts each line a process answers with.
const SAID: &str = "fleet: ";
/// The sends each process makes before the bounces: 1,200 in the fleet's window.
const SENDS_EACH: usize = 400;
/// Hard bounces posted: 49 in 1,200 sends is 4.08 %, past the default open threshold of 4 %.
const BOUNCES: usize = 49;

/// A provider that takes everything and counts what reached it.
#[derive(Debug, Clone, Default)]
struct Counting(Arc<AtomicUsize>);

#[async_trait::async_trait]
impl Transport for Counting {
    fn name(&self) -> &str {
        MEMBER
    }

    async fn send_raw(&self, _: &Envelope, _: &[u8]) -> Result<Receipt, SendError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok(Receipt::new(MEMBER))
    }
}

/// One process of the fleet. Prints `ready` (the receiver: `ready <port>`), then answers
/// each line of its stdin: `send N` with `sent <ok> <last error code or -> <reached the
/// provider in all>`, `tier` with the tier it reads from Redis; it ends at end of input.
#[test]
#[ignore = "a process of the fleet, run as a child by three_processes_on_one_redis_events_received_by_one_open_the_breaker_for_all"]
fn reputation_fleet_process() {
    let Ok(url) = std::env::var(REDIS_URL) else {
        return;
    };
    let runtime = tokio::runtime::Runtime::new().expect("a tokio runtime");
    runtime.block_on(async {
        let store = RedisStore::connect(&url)
            .await
            .expect("a valid URL")
            .with_namespace(NAMESPACE)
            .with_timeout(Duration::from_secs(2));
        assert!(
            store.is_shared(),
            "the process reaches the test's redis-server"
        );
        let breaker = ReputationBreaker::builder(MEMBER)
            .store(Arc::new(store))
            .build()
            .expect("default rules");
        let provider = Counting::default();
        let member = breaker.wrap(provider.clone());
        if std::env::var(RECEIVER).is_ok() {
            let router = Webhooks::new(Arc::new(breaker.clone()))
                .postmark(BasicAuth::new(CREDENTIALS.0, CREDENTIALS.1))
                .member(Provider::Postmark, MEMBER)
                .router();
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("a loopback port");
            let port = listener.local_addr().expect("its address").port();
            tokio::spawn(async move { axum::serve(listener, router).await });
            println!("{SAID}ready {port}");
        } else {
            println!("{SAID}ready");
        }
        let mut lines = BufReader::new(std::io::stdin()).lines();
        while let Some(Ok(line)) = tokio::task::block_in_place(|| lines.next()) {
            match line.split_whitespace().collect::<Vec<_>>().as_slice() {
                ["send", count] => {
                    let count: usize = count.parse().expect("a number of sends");
                    let (mut sent, mut last) = (0, String::from("-"));
                    for _ in 0..count {
                        match member.send(&support::message()).await {
                            Ok(_) => sent += 1,
                            Err(error) => last = error.code().to_owned(),
                        }
                    }
                    println!(
                        "{SAID}sent {sent} {last} {}",
                        provider.0.load(Ordering::SeqCst)
                    );
                }
                ["tier"] => {
                    let standing = breaker.standing().await.expect("Redis answers");
                    println!("{SAID}tier {}", standing.tier);
                }
                other => panic!("an unknown command: {other:?}"),
            }
        }
    });
}

/// A child process of the fleet, spoken to line by line.
struct Process {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Process {
    fn start(redis: &str, receiver: bool) -> Process {
        let program = std::env::current_exe().expect("the test binary's path");
        let mut command = Command::new(program);
        command
            .args([
                "reputation_fleet_process",
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(REDIS_URL, redis)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        if receiver {
            command.env(RECEIVER, "1");
        }
        let mut child = command.spawn().expect("starting a process of the fleet");
        let stdin = child.stdin.take().expect("its stdin");
        let stdout = BufReader::new(child.stdout.take().expect("its stdout"));
        Process {
            child,
            stdin,
            stdout,
        }
    }

    /// What the next line of ours the process printed says (the test harness prints its own).
    fn line(&mut self) -> String {
        loop {
            let mut line = String::new();
            let read = self
                .stdout
                .read_line(&mut line)
                .expect("reading the process");
            assert!(read > 0, "the process ended early");
            // The harness may print on the same line before ours ("test name ... ").
            if let Some(at) = line.find(SAID) {
                return line[at + SAID.len()..].trim().to_owned();
            }
        }
    }

    fn ask(&mut self, command: &str) -> String {
        writeln!(self.stdin, "{command}").expect("writing to the process");
        self.stdin.flush().expect("flushing");
        self.line()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Postmark's bounce webhook for `n`: a hard bounce with its own record id.
fn hard_bounce(n: usize) -> String {
    format!(
        r#"{{"RecordType":"Bounce","MessageStream":"outbound","ID":{id},"Type":"HardBounce","TypeCode":1,"Name":"Hard bounce","MessageID":"00000000-0000-0000-0000-{n:012}","ServerID":23,"Description":"The server was unable to deliver your message (ex: unknown user, mailbox not found).","Details":"smtp;550 5.1.1 unknown user","Email":"gone{n}@example.org","From":"sender@example.com","BouncedAt":"2019-11-05T16:33:54.9070259Z","DumpAvailable":false,"Inactive":true,"CanActivate":true,"Subject":"Test subject"}}"#,
        id = 1_000 + n
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_processes_on_one_redis_events_received_by_one_open_the_breaker_for_all() {
    let Some(server) = RedisServer::start("reputation_three_processes") else {
        return;
    };
    let url = server.url();
    let (mut fleet, port) = within_deadline(tokio::task::spawn_blocking(move || {
        let mut receiver = Process::start(&url, true);
        let port: u16 = receiver
            .line()
            .strip_prefix("ready ")
            .and_then(|port| port.parse().ok())
            .expect("the receiver's port");
        let mut fleet = vec![receiver];
        for _ in 0..2 {
            let mut process = Process::start(&url, false);
            assert_eq!(process.line(), "ready");
            fleet.push(process);
        }
        for process in &mut fleet {
            assert_eq!(
                process.ask(&format!("send {SENDS_EACH}")),
                format!("sent {SENDS_EACH} - {SENDS_EACH}")
            );
        }
        (fleet, port)
    }))
    .await;

    let client = reqwest::Client::new();
    for n in 0..BOUNCES {
        let answer = client
            .post(format!("http://127.0.0.1:{port}/postmark"))
            .basic_auth(CREDENTIALS.0, Some(CREDENTIALS.1))
            .header("content-type", "application/json")
            .body(hard_bounce(n))
            .send()
            .await
            .unwrap();
        assert!(
            answer.status().is_success(),
            "bounce {n}: {}",
            answer.status()
        );
    }

    within_deadline(tokio::task::spawn_blocking(move || {
        for (index, process) in fleet.iter_mut().enumerate() {
            assert_eq!(process.ask("tier"), "tier open", "process {index}");
            assert_eq!(
                process.ask("send 3"),
                format!("sent 0 reputation.open {SENDS_EACH}"),
                "process {index}: held back, nothing more reached its provider"
            );
        }
    }))
    .await;
}

/// What `talk` gives, or a failure if the processes have not answered within a minute (a
/// process whose test ends reads the end of its input and ends too).
async fn within_deadline<T>(talk: tokio::task::JoinHandle<T>) -> T {
    tokio::time::timeout(Duration::from_secs(60), talk)
        .await
        .expect("the processes answered within a minute")
        .expect("talking to the processes")
}
