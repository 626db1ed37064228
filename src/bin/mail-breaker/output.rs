//! Everything the command prints: tables for people (aligned, coloured only on a terminal
//! without `NO_COLOR`), JSON for scripts, every secret as `***`, and every control character
//! of the text shown escaped (see [`for_terminal`]): subjects, headers, errors and replies
//! come from messages, databases and servers, and a terminal acts on what they hold.

use std::borrow::Cow;
use std::fmt::Write as _;
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
            colour: colour_on(
                std::io::stdout().is_terminal(),
                std::env::var_os("NO_COLOR").as_deref(),
            ),
            secrets,
        }
    }

    /// A line on stdout, its controls (line feeds included) escaped.
    pub fn line(&self, text: &str) {
        let shown = self.secrets.redact(text);
        self.write_line(&for_terminal(&shown));
    }

    /// Writes a line on stdout as it is (secrets still hidden): for lines already escaped.
    fn write_line(&self, text: &str) {
        let shown = self.secrets.redact(text);
        let mut stdout = std::io::stdout().lock();
        // A closed pipe (`| head`) is not worth a panic.
        let _ = writeln!(stdout, "{shown}");
    }

    /// A line on stderr: a note for people beside the data, its controls (line feeds
    /// included: an error may quote a server) escaped.
    pub fn note(&self, text: &str) {
        let shown = self.secrets.redact(text);
        let _ = writeln!(std::io::stderr().lock(), "{}", for_terminal(&shown));
    }

    /// One JSON document (or one JSON line) on stdout, every control escaped (see
    /// [`json_for_terminal`]).
    pub fn json(&self, value: &Value) {
        let text = value.to_string();
        self.write_line(&json_for_terminal(&self.secrets.redact(&text)));
    }

    /// Raw bytes on stdout, as they are (`outbox show --raw`), for a file or a pipe. On a
    /// terminal each line is shown with its controls escaped instead.
    pub fn raw(&self, bytes: &[u8]) {
        let mut stdout = std::io::stdout().lock();
        if stdout.is_terminal() {
            let text = String::from_utf8_lossy(bytes);
            let _ = stdout.write_all(raw_for_terminal(&text).as_bytes());
        } else {
            let _ = stdout.write_all(bytes);
        }
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
        for line in self.render(header, rows) {
            self.write_line(&line);
        }
    }

    /// The lines of [`table`](Out::table), secrets already starred and each cell's controls
    /// escaped (the only escapes left are the table's own colours).
    fn render(&self, header: &[&str], rows: Vec<Vec<String>>) -> Vec<String> {
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
                let cell = Cell::new(for_terminal(&self.secrets.redact(&text)));
                match colour {
                    Some(colour) if self.colour => cell.fg(colour),
                    _ => cell,
                }
            }));
        }
        table
            .to_string()
            .lines()
            .map(|line| line.trim_end().to_owned())
            .collect()
    }
}

/// Whether a terminal acts on `c` rather than show it: the C0 controls, DEL, the C1 controls
/// (U+0080 to U+009F; U+009B is CSI) and the bidirectional controls (U+202A to U+202E,
/// U+2066 to U+2069), which reorder what follows them.
pub fn acts_on_a_terminal(c: char) -> bool {
    c.is_control()
        || ('\u{202a}'..='\u{202e}').contains(&c)
        || ('\u{2066}'..='\u{2069}').contains(&c)
}

/// `text` as a terminal shows it without acting on it: each control character (see
/// [`acts_on_a_terminal`]) escaped, as `\n`, `\r`, `\t` or `\u{1b}`. Everything the command
/// prints goes through it: the one place that decides what reaches a terminal.
pub fn for_terminal(text: &str) -> Cow<'_, str> {
    if !text.chars().any(acts_on_a_terminal) {
        return Cow::Borrowed(text);
    }
    let mut shown = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\n' => shown.push_str("\\n"),
            '\r' => shown.push_str("\\r"),
            '\t' => shown.push_str("\\t"),
            c if acts_on_a_terminal(c) => {
                let _ = write!(shown, "\\u{{{:x}}}", u32::from(c));
            }
            c => shown.push(c),
        }
    }
    Cow::Owned(shown)
}

/// `text` line by line through [`for_terminal`]: its line feeds end lines, and every other
/// control is escaped (for clap's messages, which span lines).
pub fn lines_for_terminal(text: &str) -> String {
    text.split('\n')
        .map(for_terminal)
        .collect::<Vec<_>>()
        .join("\n")
}

/// A message's bytes on a terminal: its lines (CRLF or LF) through [`for_terminal`].
fn raw_for_terminal(text: &str) -> String {
    let mut shown = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        let line = line.strip_suffix('\n').unwrap_or(line);
        let line = line.strip_suffix('\r').unwrap_or(line);
        shown.push_str(&for_terminal(line));
        shown.push('\n');
    }
    shown
}

/// A JSON text with the controls serde_json leaves as they are (DEL, C1, bidirectional) written
/// as `\u` escapes: the same JSON value for a script, nothing a terminal acts on. Outside its
/// strings a JSON text holds only ASCII punctuation, letters and spaces, so each such
/// character is inside a string, where `\uXXXX` means it.
pub fn json_for_terminal(json: &str) -> Cow<'_, str> {
    if !json.chars().any(acts_on_a_terminal) {
        return Cow::Borrowed(json);
    }
    let mut shown = String::with_capacity(json.len() + 8);
    for c in json.chars() {
        // White space between tokens stays; inside a string serde_json escaped it already.
        if acts_on_a_terminal(c) && !matches!(c, '\n' | '\r' | '\t') {
            // All of them are in the Basic Multilingual Plane: one `\uXXXX` each.
            let _ = write!(shown, "\\u{:04x}", u32::from(c));
        } else {
            shown.push(c);
        }
    }
    Cow::Owned(shown)
}

/// Colour only on a terminal, and never with `NO_COLOR` set to anything (`no_color`: its
/// value, if set).
fn colour_on(terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    terminal && no_color.is_none_or(|value| value.is_empty())
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
    fn leap_days_and_century_years_are_written_as_the_calendar_has_them() {
        let cases = [
            (946_684_799, "1999-12-31T23:59:59Z"),
            (951_782_400, "2000-02-29T00:00:00Z"),
            (951_868_800, "2000-03-01T00:00:00Z"),
            (1_709_210_096, "2024-02-29T12:34:56Z"),
            (4_107_456_000, "2100-02-28T00:00:00Z"),
            (4_107_542_400, "2100-03-01T00:00:00Z"),
            (13_574_563_200, "2400-02-29T00:00:00Z"),
        ];
        for (seconds, written) in cases {
            assert_eq!(rfc3339(UNIX_EPOCH + Duration::from_secs(seconds)), written);
        }
    }

    #[test]
    fn an_age_is_how_long_ago_and_zero_for_a_time_to_come() {
        let hour = Duration::from_secs(3_600);
        let age_of_an_hour_ago = age(SystemTime::now() - hour);
        assert!(age_of_an_hour_ago >= hour, "{age_of_an_hour_ago:?}");
        assert!(age_of_an_hour_ago < hour * 2, "{age_of_an_hour_ago:?}");
        assert_eq!(age(SystemTime::now() + hour), Duration::ZERO);
    }

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        let set = std::ffi::OsStr::new("1");
        let empty = std::ffi::OsStr::new("");
        assert!(colour_on(true, None));
        assert!(colour_on(true, Some(empty)), "NO_COLOR set to nothing");
        assert!(!colour_on(true, Some(set)));
        assert!(!colour_on(false, None));
    }

    fn out(colour: bool) -> Out {
        Out {
            json: false,
            colour,
            secrets: Arc::new(Secrets::from_texts(["smtp://u:hunter2@relay"])),
        }
    }

    #[test]
    fn a_table_colours_its_state_words_on_a_terminal_and_nothing_elsewhere() {
        let rows = || vec![vec!["smtp://relay".to_owned(), "down".to_owned()]];
        let coloured = out(true).render(&["member", "state"], rows()).join("\n");
        assert!(coloured.contains('\u{1b}'), "{coloured:?}");
        let plain = out(false).render(&["member", "state"], rows()).join("\n");
        assert!(!plain.contains('\u{1b}'), "{plain:?}");
        assert_eq!(plain, " MEMBER        STATE\n smtp://relay  down");
    }

    #[test]
    fn a_tables_cells_have_their_secrets_starred() {
        let rows = vec![vec!["smtp://u:hunter2@relay".to_owned()]];
        let lines = out(false).render(&["member"], rows);
        assert!(!lines.join("\n").contains("hunter2"), "{lines:?}");
    }

    #[test]
    fn each_state_word_has_the_colour_of_how_it_went() {
        for word in ["ok", "closed", "delivered", "sent"] {
            assert_eq!(state_colour(word), Some(Color::Green), "{word}");
        }
        for word in ["half-open", "queued", "rate-limited"] {
            assert_eq!(state_colour(word), Some(Color::Yellow), "{word}");
        }
        for word in [
            "open",
            "isolated",
            "down",
            "timeout",
            "refused",
            "auth-refused",
            "misconfigured",
            "dead",
            "failed",
        ] {
            assert_eq!(state_colour(word), Some(Color::Red), "{word}");
        }
        assert_eq!(state_colour("smtp://relay"), None);
    }

    #[test]
    fn a_duration_is_written_in_the_unit_a_person_reads_it_in() {
        let cases = [
            (Duration::from_millis(999), "999 ms"),
            (Duration::from_secs(1), "1.0 s"),
            (Duration::from_millis(119_900), "119.9 s"),
            (Duration::from_secs(120), "2 min"),
            (Duration::from_secs(7_199), "120 min"),
            (Duration::from_secs(7_200), "2.0 h"),
            (Duration::from_secs(172_799), "48.0 h"),
            (Duration::from_secs(172_800), "2.0 d"),
        ];
        for (duration, written) in cases {
            assert_eq!(human_duration(duration), written, "{duration:?}");
        }
    }
    #[test]
    fn every_c0_del_c1_and_bidi_control_is_shown_escaped_and_the_rest_as_it_is() {
        let hostile =
            "a\u{1b}]52;c;x\u{7}b\r\n\tc\u{7f}\u{80}\u{9b}\u{9f}\u{202a}\u{202e}\u{2066}\u{2069}d";
        assert_eq!(
            for_terminal(hostile),
            r"a\u{1b}]52;c;x\u{7}b\r\n\tc\u{7f}\u{80}\u{9b}\u{9f}\u{202a}\u{202e}\u{2066}\u{2069}d"
        );
        // Their neighbours are text: U+00A0, U+2029, U+202F, U+206A, and the rest of UTF-8.
        let text = "é ✓ \u{a0}\u{2029}\u{202f}\u{206a} \\u{1b} 日本";
        assert!(matches!(for_terminal(text), Cow::Borrowed(_)), "{text}");
    }

    #[test]
    fn lines_keep_their_line_feeds_and_escape_every_other_control() {
        assert_eq!(
            lines_for_terminal("one\u{1b}[2J\ntwo\r\n"),
            "one\\u{1b}[2J\ntwo\\r\n"
        );
    }

    #[test]
    fn a_message_on_a_terminal_is_its_lines_with_their_controls_escaped() {
        assert_eq!(
            raw_for_terminal("Subject: \u{1b}[2J\r\nX: \u{9b}1m\n\r\nbody"),
            "Subject: \\u{1b}[2J\nX: \\u{9b}1m\n\nbody\n"
        );
    }

    #[test]
    fn json_writes_del_c1_and_bidi_controls_as_unicode_escapes_and_means_the_same() {
        let value = json!({ "subject": "\u{1b}]52\u{7f}\u{9b}\u{202e}\u{2069}x" });
        let shown = json_for_terminal(&value.to_string()).into_owned();
        assert_eq!(shown, r#"{"subject":"\u001b]52\u007f\u009b\u202e\u2069x"}"#);
        assert_eq!(serde_json::from_str::<Value>(&shown).unwrap(), value);
        let pretty = serde_json::to_string_pretty(&value).unwrap();
        let read: Value = serde_json::from_str(&json_for_terminal(&pretty)).unwrap();
        assert_eq!(read, value, "the white space between tokens is kept");
        assert!(matches!(
            json_for_terminal(r#"{"a":"b"}"#),
            Cow::Borrowed(_)
        ));
    }

    #[test]
    fn a_tables_cells_have_their_controls_escaped_and_keep_their_colours() {
        let rows = || vec![vec!["\u{1b}[2Jsubject\n".to_owned(), "down".to_owned()]];
        let plain = out(false).render(&["subject", "state"], rows()).join("\n");
        assert_eq!(
            plain,
            " SUBJECT             STATE\n \\u{1b}[2Jsubject\\n  down"
        );
        let coloured = out(true).render(&["subject", "state"], rows()).join("\n");
        assert!(!coloured.contains("\u{1b}[2J"), "{coloured:?}");
        assert!(
            coloured.contains("\u{1b}["),
            "the state's colour: {coloured:?}"
        );
    }
}
