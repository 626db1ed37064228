//! The CPU time the machine's processes spent, read from Linux's `/proc`: the bench's own
//! process, smtp-sink and PostgreSQL, each summed over its processes, so that a bench can say
//! what a message cost the whole machine and not only how long it took.

use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::time::Duration;

/// The processes whose time is counted, by the name `/proc/<pid>/stat` gives them.
const COUNTED: [&str; 2] = ["smtp-sink", "postgres"];

/// The CPU time (user and system) of each counted process at one moment, by group and pid.
#[derive(Debug, Clone, Default)]
pub struct CpuTimes {
    ticks: BTreeMap<(&'static str, u32), u64>,
}

impl CpuTimes {
    /// Reads every counted process's time now; `None` where `/proc` cannot be read (not
    /// Linux).
    pub fn now() -> Option<CpuTimes> {
        let me = std::process::id();
        let mut ticks = BTreeMap::new();
        for entry in std::fs::read_dir("/proc").ok()?.flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            // A process may end between the listing and the read: it is skipped.
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            let Some((name, spent)) = parse_stat(&stat) else {
                continue;
            };
            let group = if pid == me {
                "bench"
            } else if let Some(counted) = COUNTED.iter().find(|counted| **counted == name) {
                counted
            } else {
                continue;
            };
            ticks.insert((group, pid), spent);
        }
        Some(CpuTimes { ticks })
    }

    /// What each group spent from `before` to `self`: a process started in between counts
    /// all its time, one that ended in between counts none of its last part.
    pub fn since(&self, before: &CpuTimes) -> BTreeMap<&'static str, Duration> {
        let tick = Duration::from_secs(1) / clock_ticks_per_second();
        let mut spent: BTreeMap<&'static str, Duration> = BTreeMap::new();
        for (key, ticks) in &self.ticks {
            let earlier = before.ticks.get(key).copied().unwrap_or(0);
            let ticks = u32::try_from(ticks.saturating_sub(earlier)).unwrap_or(u32::MAX);
            *spent.entry(key.0).or_default() += tick * ticks;
        }
        spent
    }
}

/// A process's name and its user plus system time in clock ticks, from its `stat` line: the
/// name is between the first `(` and the last `)`, and the times are the 14th and 15th fields.
fn parse_stat(stat: &str) -> Option<(&str, u64)> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let name = stat.get(open + 1..close)?;
    let mut fields = stat.get(close + 2..)?.split(' ').skip(11);
    let user: u64 = fields.next()?.parse().ok()?;
    let system: u64 = fields.next()?.parse().ok()?;
    Some((name, user + system))
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
