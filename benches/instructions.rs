//! Instructions per send, counted by callgrind: the same sends as `overhead`'s `closed`, `open`
//! and `domains` groups, each in a loop on a current-thread runtime. Instructions are not
//! time, but they repeat exactly for the same binary whatever else the machine is doing, so
//! they show what a change to the send path does where a timing would drown in noise.
//!
//! `cargo bench --bench instructions` runs this binary under `valgrind --tool=callgrind` once
//! per case with `WARM_UP` sends and once with `WARM_UP + SENDS`, and prints the difference
//! divided by `SENDS`: the loop's own few instructions included, the runtime's start and the
//! setup not. Skipped, with a message, where valgrind is not installed.

#[path = "support/guards.rs"]
mod guards;

use std::hint::black_box;
use std::process::Command;

use guards::{
    FAILING, FailsafeTransport, OK, RecloserTransport, domain_envelopes, failsafe, message,
    per_domain, recloser,
};
use mail_breaker::{CircuitBreakerTransport, Envelope, Transport};

/// Sends counted, and sends made before the count in both runs (they fill the churn's map).
const SENDS: u64 = 100_000;
const WARM_UP: u64 = 20_000;
/// The churn's recipient domains, and how many the breaker keeps, as in `overhead`.
const DOMAINS: usize = 100_000;
const MAX_KEYS: usize = 10_000;

/// Every case: its name in the table and what it measures.
const CASES: [(&str, &str); 12] = [
    ("bare", "bare transport, `send`"),
    ("breaker", "**mail-breaker**, closed"),
    ("failsafe_transport", "failsafe as `Transport`, closed"),
    ("recloser_transport", "recloser as `Transport`, closed"),
    ("breaker_refusal", "**mail-breaker**, refusal"),
    ("failsafe_refusal", "failsafe as `Transport`, refusal"),
    (
        "bare_raw",
        "bare transport, `send_raw` to a new domain each time",
    ),
    (
        "per_transport",
        "**mail-breaker**, `Scope::Transport`, the same sends",
    ),
    (
        "per_domain_churn",
        "**mail-breaker**, `Scope::RecipientDomain`, the same sends",
    ),
    (
        "bare_raw_failing",
        "bare transport, `send_raw` to a new domain each time, failing",
    ),
    (
        "per_transport_failing",
        "**mail-breaker**, `Scope::Transport`, the same failing sends",
    ),
    (
        "per_domain_churn_failing",
        "**mail-breaker**, `Scope::RecipientDomain`, the same failing sends",
    ),
];

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let [_, flag, case, sends] = args.as_slice()
        && flag == "--loop"
    {
        let sends = sends.parse().expect("a number of sends");
        run(case, sends);
        return;
    }
    if Command::new("valgrind").arg("--version").output().is_err() {
        println!("SKIPPED instructions: `valgrind` is not installed (apt-get install valgrind)");
        return;
    }
    let me = std::env::current_exe().expect("this bench's own path");
    println!("| one send, current-thread runtime | instructions per send |");
    println!("|---|---|");
    for (case, label) in CASES {
        let count = |sends: u64| {
            let output = Command::new("valgrind")
                .args(["--tool=callgrind", "--callgrind-out-file=/dev/null"])
                .arg(&me)
                .args(["--loop", case, &sends.to_string()])
                .output()
                .expect("valgrind runs");
            let stderr = String::from_utf8_lossy(&output.stderr);
            stderr
                .lines()
                .find_map(|line| line.split("Collected :").nth(1))
                .and_then(|n| n.trim().parse::<u64>().ok())
                .unwrap_or_else(|| panic!("no count from callgrind for {case}:\n{stderr}"))
        };
        let (base, total) = (count(WARM_UP), count(WARM_UP + SENDS));
        println!(
            "| {label} | {:.0} |",
            total.saturating_sub(base) as f64 / SENDS as f64
        );
    }
}

/// Runs `sends` sends of `case` on a current-thread runtime.
fn run(case: &str, sends: u64) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a Tokio runtime");
    let message = message();
    // Only the churn's cases read envelopes: made for the others, they would be most of the
    // profile of a closed send.
    let envelopes = if case.contains("raw") || case.starts_with("per_") {
        domain_envelopes(DOMAINS)
    } else {
        Vec::new()
    };
    let raw = b"Subject: bench\r\n\r\nhello\r\n";
    let envelope = |i: u64| &envelopes[(i % DOMAINS as u64) as usize];
    rt.block_on(async {
        match case {
            "bare" => {
                for _ in 0..sends {
                    black_box(OK.send(&message).await.is_ok());
                }
            }
            "breaker" => {
                let breaker = CircuitBreakerTransport::new(OK);
                for _ in 0..sends {
                    black_box(breaker.send(&message).await.is_ok());
                }
            }
            "failsafe_transport" => {
                let guard = FailsafeTransport {
                    inner: OK,
                    machine: failsafe(),
                };
                for _ in 0..sends {
                    black_box(guard.send(&message).await.is_ok());
                }
            }
            "recloser_transport" => {
                let guard = RecloserTransport {
                    inner: OK,
                    recloser: recloser(),
                };
                for _ in 0..sends {
                    black_box(guard.send(&message).await.is_ok());
                }
            }
            "breaker_refusal" => {
                let breaker = CircuitBreakerTransport::new(FAILING);
                for _ in 0..10 {
                    let _ = breaker.send(&message).await;
                }
                for _ in 0..sends {
                    black_box(breaker.send(&message).await.is_ok());
                }
            }
            "failsafe_refusal" => {
                let guard = FailsafeTransport {
                    inner: FAILING,
                    machine: failsafe(),
                };
                for _ in 0..10 {
                    let _ = guard.send(&message).await;
                }
                for _ in 0..sends {
                    black_box(guard.send(&message).await.is_ok());
                }
            }
            "bare_raw" => {
                for i in 0..sends {
                    black_box(OK.send_raw(envelope(i), raw).await.is_ok());
                }
            }
            "per_transport" => {
                let breaker = CircuitBreakerTransport::new(OK);
                for i in 0..sends {
                    black_box(breaker.send_raw(envelope(i), raw).await.is_ok());
                }
            }
            "per_domain_churn" => {
                let breaker = per_domain(OK, MAX_KEYS);
                for i in 0..sends {
                    black_box(breaker.send_raw(envelope(i), raw).await.is_ok());
                }
            }
            "bare_raw_failing" => {
                for i in 0..sends {
                    black_box(FAILING.send_raw(envelope(i), raw).await.is_ok());
                }
            }
            "per_transport_failing" => {
                let breaker = CircuitBreakerTransport::builder(FAILING)
                    .failure_threshold(u32::MAX)
                    .build()
                    .expect("a valid breaker");
                for i in 0..sends {
                    black_box(breaker.send_raw(envelope(i), raw).await.is_ok());
                }
            }
            "per_domain_churn_failing" => {
                let breaker = per_domain(FAILING, MAX_KEYS);
                // The first domain is kept apart from the map: one outside the churn.
                let outside = Envelope::new(
                    None,
                    vec!["user@outside.example".parse().expect("a valid recipient")],
                )
                .expect("a valid envelope");
                let _ = breaker.send_raw(&outside, raw).await;
                for i in 0..sends {
                    black_box(breaker.send_raw(envelope(i), raw).await.is_ok());
                }
            }
            other => panic!("no such case: {other}"),
        }
    });
}
