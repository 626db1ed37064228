//! Everything the command prints: tables for people (aligned, coloured only on a terminal
//! without `NO_COLOR`), JSON for scripts, every secret as `***`.

use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use comfy_table::{Cell, Color, Table, presets};
use serde_json::{Value, json};

use crate::exit::Failure;
use crate::redact::Secrets;

/// Where output goes, and how.
pub struct Out {
    pub json: bool,
    colour: bool,
    secrets: Arc<Secrets>,
}

impl Out {
    pub fn new(json: bool, secrets: Arc<Secrets>) -> Out {
        Out {
            json,
            colour: colour_on(std::io::stdout().is_terminal()),
            secrets,
        }
    }

    /// A line on stdout.
    pub fn line(&self, text: &str) {
        let shown = self.secrets.redact(text);
        let mut stdout = std::io::stdout().lock();
        // A closed pipe (`| head`) is not worth a panic.
        let _ = writeln!(stdout, "{shown}");
    }

    /// A line on stderr: notes for people beside the data.
    pub fn note(&self, text: &str) {
        let shown = self.secrets.redact(text);
        let _ = writeln!(std::io::stderr().lock(), "{shown}");
    }

    /// One JSON document (or one JSON line) on stdout.
    pub fn json(&self, value: &Value) {
        self.line(&value.to_string());
    }

    /// Raw bytes on stdout, as they are (`outbox show --raw`).
    pub fn raw(&self, bytes: &[u8]) {
        let mut stdout = std::io::stdout().lock();
        let _ = stdout.write_all(bytes);
        let _ = stdout.flush();
    }

    /// How a command failed: on stderr for people, a JSON document on stdout with `--json`.
    pub fn failure(&self, failure: &Failure) {
        if self.json {
            self.json(&json!({
                "error": {
                    "message": failure.message,
                    "setting": failure.setting,
                    "exit_code": failure.code as u8,
                }
            }));
        } else {
            self.note(&format!("mail-breaker: {}", failure.message));
        }
    }

    /// An aligned table with a header row. Cells whose text is a state word are coloured
    /// on a terminal.
    pub fn table(&self, header: &[&str], rows: Vec<Vec<String>>) {
        let mut table = Table::new();
        table.load_style(presets::NOTHING);
        if !self.colour {
            table.force_no_tty();
        } else {
            table.enforce_styling();
        }
        table.set_header(header.iter().map(|h| Cell::new(h.to_uppercase())));
        for row in rows {
            table.add_row(row.into_iter().map(|text| {
                let colour = state_colour(&text);
                let cell = Cell::new(self.secrets.redact(&text));
                match colour {
                    Some(colour) if self.colour => cell.fg(colour),
                    _ => cell,
                }
            }));
        }
        for line in table.to_string().lines() {
            self.line(line.trim_end());
        }
    }
}

/// Colour only on a terminal, and never with `NO_COLOR` set to anything.
fn colour_on(terminal: bool) -> bool {
    terminal && std::env::var_os("NO_COLOR").is_none_or(|value| value.is_empty())
}

fn state_colour(text: &str) -> Option<Color> {
    match text {
        "ok" | "closed" | "delivered" | "sent" => Some(Color::Green),
        "half-open" | "queued" | "rate-limited" => Some(Color::Yellow),
        "open" | "isolated" | "down" | "timeout" | "refused" | "auth-refused" | "misconfigured"
        | "dead" | "failed" => Some(Color::Red),
        _ => None,
    }
}

/// A duration for people: `850 ms`, `12.3 s`, `4 min`, `3.2 h`, `2.0 d`.
pub fn human_duration(duration: Duration) -> String {
    let seconds = duration.as_secs_f64();
    if seconds < 1.0 {
        format!("{} ms", duration.as_millis())
    } else if seconds < 120.0 {
        format!("{seconds:.1} s")
    } else if seconds < 7_200.0 {
        format!("{:.0} min", seconds / 60.0)
    } else if seconds < 172_800.0 {
        format!("{:.1} h", seconds / 3_600.0)
    } else {
        format!("{:.1} d", seconds / 86_400.0)
    }
}

/// `at` as RFC 3339 in UTC, to the second: `2026-12-05T08:01:02Z`.
pub fn rfc3339(at: SystemTime) -> String {
    let seconds = at
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_secs());
    let days = i64::try_from(seconds / 86_400).unwrap_or(0);
    let rest = seconds % 86_400;
    // Howard Hinnant's days-to-civil.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rest / 3_600,
        rest % 3_600 / 60,
        rest % 60
    )
}

/// How long ago `at` was (zero for a time to come).
pub fn age(at: SystemTime) -> Duration {
    SystemTime::now().duration_since(at).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_time_is_written_as_rfc_3339_in_utc() {
        let at = UNIX_EPOCH + Duration::from_secs(1_796_457_662);
        assert_eq!(rfc3339(at), "2026-12-05T08:01:02Z");
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00Z");
    }

    #[test]
    fn no_colour_off_a_terminal_or_with_no_color() {
        assert!(!colour_on(false));
    }
}
