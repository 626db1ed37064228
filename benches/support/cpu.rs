//! The CPU time the machine's processes spent, read from Linux's `/proc`: the bench's own
//! process, smtp-sink and PostgreSQL, each summed over its processes, so that a bench can say
//! what a message cost the whole machine and not only how long it took.

use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// The processes whose time is counted, by the name `/proc/<pid>/stat` gives them.
const COUNTED: [&str; 2] = ["smtp-sink", "postgres"];

/// The postmaster whose server is counted as `postgres`, once a bench has named it (0: none).
static POSTMASTER: AtomicU32 = AtomicU32::new(0);

/// Counts as `postgres` only the server of the postmaster `pid` (it and its children, the
/// backends and the background writers), not every PostgreSQL on the machine: the test suite
/// and other runs may be starting clusters of their own meanwhile. The last call wins.
pub fn count_postgres_of(pid: u32) {
    POSTMASTER.store(pid, Ordering::Relaxed);
}

/// The CPU time (user and system) of each counted process at one moment, by group and pid, in
/// nanoseconds: from the scheduler's count of each thread's time on a CPU (`schedstat`),
/// where the kernel keeps it, else from the clock ticks of `stat` (10 ms each, too coarse to
/// tell a few microseconds per message apart over a short run).
#[derive(Debug, Clone, Default)]
pub struct CpuTimes {
    nanos: BTreeMap<(&'static str, u32), u64>,
}

impl CpuTimes {
    /// Reads every counted process's time now; `None` where `/proc` cannot be read (not
    /// Linux).
    pub fn now() -> Option<CpuTimes> {
        let me = std::process::id();
        let mut nanos = BTreeMap::new();
        for entry in std::fs::read_dir("/proc").ok()?.flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            // A process may end between the listing and the read: it is skipped.
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            let Some((name, parent, spent)) = parse_stat(&stat) else {
                continue;
            };
            let group = if pid == me {
                "bench"
            } else if let Some(counted) = COUNTED.iter().find(|counted| **counted == name) {
                let postmaster = POSTMASTER.load(Ordering::Relaxed);
                let another_server = *counted == "postgres"
                    && postmaster != 0
                    && postmaster != pid
                    && postmaster != parent;
                if another_server {
                    continue;
                }
                counted
            } else {
                continue;
            };
            let tick = 1_000_000_000 / u64::from(clock_ticks_per_second());
            let spent = scheduled_nanos(pid).unwrap_or(spent * tick);
            nanos.insert((group, pid), spent);
        }
        Some(CpuTimes { nanos })
    }

    /// What each group spent from `before` to `self`: a process started in between counts
    /// all its time, one that ended in between (or a thread of it) none of its last part.
    pub fn since(&self, before: &CpuTimes) -> BTreeMap<&'static str, Duration> {
        let mut spent: BTreeMap<&'static str, Duration> = BTreeMap::new();
        for (key, nanos) in &self.nanos {
            let earlier = before.nanos.get(key).copied().unwrap_or(0);
            *spent.entry(key.0).or_default() += Duration::from_nanos(nanos.saturating_sub(earlier));
        }
        spent
    }
}

/// A process's name, its parent's pid and its user plus system time in clock ticks, from its
/// `stat` line: the name is between the first `(` and the last `)`, the parent is the 4th
/// field and the times are the 14th and 15th.
fn parse_stat(stat: &str) -> Option<(&str, u32, u64)> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let name = stat.get(open + 1..close)?;
    let mut fields = stat.get(close + 2..)?.split(' ').skip(1);
    let parent: u32 = fields.next()?.parse().ok()?;
    let mut fields = fields.skip(9);
    let user: u64 = fields.next()?.parse().ok()?;
    let system: u64 = fields.next()?.parse().ok()?;
    Some((name, parent, user + system))
}

/// The nanoseconds the threads of process `pid` have spent on a CPU, each from the first
/// field of its `/proc/<pid>/task/<tid>/schedstat`; `None` where the kernel keeps no such count.
fn scheduled_nanos(pid: u32) -> Option<u64> {
    let mut sum = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .flatten()
    {
        // A thread may end between the listing and the read: it counts nothing.
        let Ok(schedstat) = std::fs::read_to_string(task.path().join("schedstat")) else {
            continue;
        };
        let nanos: u64 = schedstat.split(' ').next()?.parse().ok()?;
        sum += nanos;
    }
    Some(sum)
}

/// The kernel's clock ticks per second (`getconf CLK_TCK`, asked once), 100 if it cannot be
/// asked.
fn clock_ticks_per_second() -> u32 {
    static TICKS: OnceLock<u32> = OnceLock::new();
    *TICKS.get_or_init(ask_clock_ticks)
}

fn ask_clock_ticks() -> u32 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|output| String::from_utf8(output.stdout).ok())
        .and_then(|ticks| ticks.trim().parse().ok())
        .filter(|ticks| *ticks > 0)
        .unwrap_or(100)
}
