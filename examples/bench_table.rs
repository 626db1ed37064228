//! Prints the benchmarks' results as one markdown table, with the machine they ran on.
//!
//! ```text
//! cargo bench --features redis                       # overhead, smtp_throughput, redis_store
//! cargo build --release --example domain_memory      # the memory figure, run from here
//! cargo run --release --example bench_table
//! ```
//!
//! It reads each median from criterion's `target/criterion/<group>/<bench>/new/estimates.json`,
//! the Redis round trips the `redis_store` bench counted, and runs
//! `target/release/examples/domain_memory` in a process of its own for the peak memory.
//! A figure that was not measured shows as "not run".

use std::path::{Path, PathBuf};
use std::process::Command;

/// Where cargo puts its builds and criterion its results.
fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| PathBuf::from("target"), PathBuf::from)
}

/// The number after `"field":` in `json`, searched from the first `"section"`.
fn number_in(json: &str, section: &str, field: &str) -> Option<f64> {
    number(&json[json.find(&format!("\"{section}\""))?..], field)
}

/// The number after the first `"field":` in `json`.
fn number(json: &str, field: &str) -> Option<f64> {
    let rest = &json[json.find(&format!("\"{field}\":"))? + field.len() + 3..];
    let end = rest
        .find(|c: char| !(c.is_ascii_digit() || "+-.eE".contains(c)))
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

/// The median time of one iteration of `group/bench`, in nanoseconds.
fn median_ns(criterion: &Path, group: &str, bench: &str) -> Option<f64> {
    let path = criterion.join(group).join(bench).join("new/estimates.json");
    let json = std::fs::read_to_string(path).ok()?;
    number_in(&json, "median", "point_estimate")
}

fn time(ns: f64) -> String {
    if ns >= 1e9 {
        format!("{:.3} s", ns / 1e9)
    } else if ns >= 1e6 {
        format!("{:.2} ms", ns / 1e6)
    } else if ns >= 1e3 {
        format!("{:.1} µs", ns / 1e3)
    } else {
        format!("{ns:.1} ns")
    }
}

/// A difference, with its sign.
fn signed(ns: f64) -> String {
    if ns < 0.0 {
        format!("-{}", time(-ns))
    } else {
        format!("+{}", time(ns))
    }
}

fn cpu() -> String {
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|line| line.starts_with("model name"))
                .and_then(|line| line.split_once(':'))
                .map(|(_, model)| model.trim().to_owned())
        })
        .unwrap_or_else(|| String::from("unknown CPU"));
    let cores = std::thread::available_parallelism().map_or(0, usize::from);
    format!("{model}, {cores} cores")
}

fn command_line(program: &str, args: &[&str]) -> Option<String> {
    let output = Command::new(program).args(args).output().ok()?;
    Some(String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

/// The lines of the domain_memory example's output, run in its own process.
fn domain_memory(target: &Path) -> Option<String> {
    let binary = target.join("release/examples/domain_memory");
    let output = Command::new(binary).output().ok()?;
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).into_owned())
}

fn field<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(": "))
}

fn main() {
    let target = target_dir();
    let criterion = target.join("criterion");
    let not_run = || String::from("not run");
    let get = |group: &str, bench: &str| median_ns(&criterion, group, bench);

    println!("Measured on {}", cpu());
    if let Ok(load) = std::fs::read_to_string("/proc/loadavg") {
        let averages: Vec<&str> = load.split_whitespace().take(3).collect();
        println!(
            "(load average when the table was printed: {})",
            averages.join(", ")
        );
    }
    if let Some(kernel) = command_line("uname", &["-sr"]) {
        println!(
            "({kernel}, {})",
            command_line("rustc", &["--version"]).unwrap_or_default()
        );
    }
    println!();
    println!("| benchmark | candidate | median | vs. baseline |");
    println!("|---|---|---|---|");

    let candidates = [
        ("breaker", "**mail-breaker**"),
        ("failsafe_transport", "failsafe as `Transport`"),
        ("recloser_transport", "recloser as `Transport`"),
        ("failsafe_inline", "failsafe inline"),
        ("recloser_inline", "recloser inline"),
    ];
    let over = |median: Option<f64>, bare: Option<f64>| match (median, bare) {
        (Some(median), Some(bare)) => format!("{} overhead", signed(median - bare)),
        _ => String::new(),
    };
    let bare = get("closed", "bare");
    println!(
        "| one send, closed, 1 task | bare transport | {} | baseline |",
        bare.map_or_else(not_run, time)
    );
    for (bench, label) in candidates {
        let median = get("closed", bench);
        println!(
            "| one send, closed, 1 task | {label} | {} | {} |",
            median.map_or_else(not_run, time),
            over(median, bare)
        );
    }
    for (bench, label) in candidates {
        println!(
            "| refusal, open | {label} | {} | |",
            get("open", bench).map_or_else(not_run, time)
        );
    }

    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let one_core: Vec<Option<f64>> = candidates[..3]
        .iter()
        .map(|(bench, _)| Some(get("scaling_1", bench)? - get("scaling_1", "bare")?))
        .collect();
    for tasks in (1..=cores).filter(|n| n.is_power_of_two() || *n == cores) {
        let group = format!("scaling_{tasks}");
        let (task, worker) = if tasks == 1 {
            ("task", "worker")
        } else {
            ("tasks", "workers")
        };
        let label = format!("one send, closed, {tasks} {task} on {tasks} {worker}, per task");
        let bare = get(&group, "bare");
        println!(
            "| {label} | bare transport | {} | baseline |",
            bare.map_or_else(not_run, time)
        );
        for ((bench, name), one) in candidates[..3].iter().zip(&one_core) {
            let median = get(&group, bench);
            let ratio = match (median, bare, one) {
                (Some(median), Some(bare), Some(one)) if tasks > 1 && *one > 0.0 => {
                    format!("; {:.2}x the 1-task overhead", (median - bare) / one)
                }
                _ => String::new(),
            };
            println!(
                "| {label} | {name} | {} | {}{ratio} |",
                median.map_or_else(not_run, time),
                over(median, bare)
            );
        }
    }

    let bare = get("domains", "bare");
    let per_transport = get("domains", "per_transport");
    for (bench, label) in [
        ("bare", "bare transport"),
        ("per_transport", "**mail-breaker**, `Scope::Transport`"),
        (
            "per_domain_churn",
            "**mail-breaker**, `Scope::RecipientDomain`",
        ),
    ] {
        let median = get("domains", bench);
        let versus = match (bench, median, bare, per_transport) {
            ("bare", ..) => String::from("baseline"),
            ("per_domain_churn", Some(median), Some(bare), Some(transport)) => format!(
                "{}; {:.1}x the per-transport overhead",
                over(Some(median), Some(bare)),
                (median - bare) / (transport - bare)
            ),
            _ => over(median, bare),
        };
        println!(
            "| one `send_raw`, 100,000 domains through `max_keys` 10,000 | {label} | {} | {versus} |",
            median.map_or_else(not_run, time)
        );
    }

    let bare = get("send_many", "bare");
    for (bench, label) in [
        ("bare", "bare transport"),
        ("stack", "retry(pool(breaker, breaker))"),
    ] {
        let median = get("send_many", bench);
        let per_message = |ns: f64| ns / 10_000.0;
        let versus = match (bench, median, bare) {
            ("bare", ..) => String::from("baseline"),
            (_, Some(median), Some(bare)) => format!(
                "{} per message",
                signed(per_message(median) - per_message(bare))
            ),
            _ => String::new(),
        };
        println!(
            "| `send_many` of 10,000 | {label} | {} ({} per message) | {versus} |",
            median.map_or_else(not_run, time),
            median.map_or_else(String::new, |ns| time(per_message(ns)))
        );
    }
    let bare = get("stack_send", "bare");
    let stack = get("stack_send", "stack");
    println!(
        "| one `send` | retry(pool(breaker, breaker)) | {} | {} |",
        stack.map_or_else(not_run, time),
        over(stack, bare)
    );

    let bare = get("smtp_throughput", "bare_lettre");
    for candidate in ["bare_lettre", "smtp_transport", "breaker"] {
        let median = get("smtp_throughput", candidate);
        let rate = median.map(|ns| 2_000.0 / (ns / 1e9));
        let versus = match (median, bare) {
            (Some(median), Some(bare)) => {
                format!("{:.1} % of bare lettre's throughput", 100.0 * bare / median)
            }
            _ => String::new(),
        };
        println!(
            "| 2,000 messages to smtp-sink | {candidate} | {} ({}) | {versus} |",
            median.map_or_else(not_run, time),
            rate.map_or_else(String::new, |rate| format!("{rate:.0} msg/s"))
        );
    }

    for (bench, label) in [
        ("decision", "one decision (BreakerStore::acquire)"),
        ("send", "one guarded send, closed"),
    ] {
        for store in ["memory", "redis"] {
            // criterion keeps `decision/redis` in the folder `decision_redis`.
            let median = get("redis_store", &format!("{bench}_{store}"));
            let rate = median.map(|ns| 1e9 / ns);
            println!(
                "| {label} | {store} store | {} | {} |",
                median.map_or_else(not_run, time),
                rate.map_or_else(String::new, |rate| format!("{rate:.0} per second"))
            );
        }
    }
    let round_trips = std::fs::read_to_string(criterion.join("redis_store/round_trips.json")).ok();
    let trips = |field: &str| {
        round_trips.as_deref().and_then(|json| {
            number_in(json, field, field).or_else(|| {
                let start = json.find(&format!("\"{field}\":"))? + field.len() + 3;
                json[start..].split([',', '}']).next()?.trim().parse().ok()
            })
        })
    };
    match (
        trips("decisions"),
        trips("decision_round_trips"),
        trips("sends"),
        trips("send_round_trips"),
    ) {
        (Some(decisions), Some(decision_trips), Some(sends), Some(send_trips)) => println!(
            "| Redis round trips | redis store | {:.2} per decision, {:.2} per guarded send | counted with MONITOR over {decisions} of each |",
            decision_trips / decisions,
            send_trips / sends
        ),
        _ => println!("| Redis round trips | redis store | not run | |"),
    }

    match domain_memory(&target) {
        Some(output) => println!(
            "| 1,000,000 recipient domains, max_keys 10,000 | peak resident memory | {} | tracked_keys {}; target < 64 MiB |",
            field(&output, "peak resident memory (VmHWM)").unwrap_or("unknown"),
            field(&output, "tracked_keys").unwrap_or("unknown")
        ),
        None => println!(
            "| 1,000,000 recipient domains, max_keys 10,000 | peak resident memory | not run | cargo build --release --example domain_memory |"
        ),
    }
}
