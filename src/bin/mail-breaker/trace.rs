//! What the crate logs while a command runs: recorded for `test`'s trace and for `breakers`
//! (a store that did not answer), and with `--verbose` written to stderr, secrets as `***`
//! and controls escaped.

use std::io::Write;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::prelude::*;
use tracing_subscriber::{EnvFilter, fmt};

use crate::redact::Secrets;

/// One event the crate logged.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// Since the recording started.
    pub at: Duration,
    /// Its message: the event's name, as `pool.failover` or `breaker.open`.
    pub name: String,
    pub fields: Vec<(String, String)>,
}

impl Recorded {
    pub fn field(&self, name: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(field, _)| field == name)
            .map(|(_, value)| value.as_str())
    }
}

/// Records the crate's events between [`start`](Recorder::start) and
/// [`take`](Recorder::take).
#[derive(Clone, Default)]
pub struct Recorder(Arc<Mutex<Recording>>);

/// When the recording started and what it holds; `None` while not recording.
type Recording = Option<(Instant, Vec<Recorded>)>;

impl Recorder {
    pub fn start(&self) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some((Instant::now(), Vec::new()));
    }

    /// What was recorded since `start`; recording stops.
    pub fn take(&self) -> Vec<Recorded> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
            .map(|(_, events)| events)
            .unwrap_or_default()
    }
}

impl<S: Subscriber> Layer<S> for Recorder {
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let metadata = event.metadata();
        if !metadata.target().starts_with("mail_breaker") {
            return;
        }
        let mut guard = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let Some((started, events)) = guard.as_mut() else {
            return;
        };
        let mut visitor = Fields::default();
        event.record(&mut visitor);
        events.push(Recorded {
            at: started.elapsed(),
            name: visitor.message.unwrap_or_default(),
            fields: visitor.fields,
        });
    }
}

#[derive(Default)]
struct Fields {
    message: Option<String>,
    fields: Vec<(String, String)>,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.keep(field, value.to_owned());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.keep(field, format!("{value:?}"));
    }
}

impl Fields {
    fn keep(&mut self, field: &Field, value: String) {
        if field.name() == "message" {
            self.message = Some(value);
        } else {
            self.fields.push((field.name().to_owned(), value));
        }
    }
}

/// Installs the subscriber: the recorder always; with `verbose`, the crate's logs on stderr
/// (1: info, 2 or more: debug), each line with its secrets hidden.
pub fn init(verbose: u8, secrets: Arc<Secrets>) -> Recorder {
    let recorder = Recorder::default();
    let logs = (verbose > 0).then(|| {
        let level = if verbose == 1 { "info" } else { "debug" };
        fmt::layer()
            .with_writer(move || Redacting {
                secrets: Arc::clone(&secrets),
                buffer: Vec::new(),
            })
            .with_ansi(false)
            .with_filter(EnvFilter::new(format!("mail_breaker={level},warn")))
    });
    let _ = tracing_subscriber::registry()
        .with(recorder.clone())
        .with(logs)
        .try_init();
    recorder
}

/// One log line, written to stderr with its secrets hidden when it is done.
struct Redacting {
    secrets: Arc<Secrets>,
    buffer: Vec<u8>,
}

impl Write for Redacting {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.buffer.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Redacting {
    /// The line as it is written: secrets hidden, then every control escaped but the line
    /// feed that ends it (a server's reply in a field is text from outside).
    fn shown(&self) -> String {
        let text = String::from_utf8_lossy(&self.buffer);
        let text = self.secrets.redact(&text);
        let (line, end) = match text.strip_suffix('\n') {
            Some(line) => (line, "\n"),
            None => (&*text, ""),
        };
        format!("{}{end}", crate::output::for_terminal(line))
    }
}

impl Drop for Redacting {
    fn drop(&mut self) {
        let _ = std::io::stderr().lock().write_all(self.shown().as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::Arc;

    use tracing_subscriber::prelude::*;

    use super::{Recorder, Redacting};
    use crate::redact::Secrets;

    /// Runs `log` with `recorder` as the thread's subscriber.
    fn logged(recorder: &Recorder, log: impl FnOnce()) {
        let subscriber = tracing_subscriber::registry().with(recorder.clone());
        tracing::subscriber::with_default(subscriber, log);
    }

    #[test]
    fn the_crates_events_are_recorded_with_their_name_and_fields() {
        let recorder = Recorder::default();
        recorder.start();
        logged(&recorder, || {
            tracing::info!(target: "mail_breaker::pool", member = "smtp://a", tried = 2, "pool.failover");
        });
        let events = recorder.take();
        assert_eq!(events.len(), 1, "{events:?}");
        assert_eq!(events[0].name, "pool.failover");
        assert_eq!(events[0].field("member"), Some("smtp://a"));
        assert_eq!(events[0].field("tried"), Some("2"));
        assert_eq!(events[0].field("absent"), None);
    }

    #[test]
    fn other_crates_events_are_not_recorded() {
        let recorder = Recorder::default();
        recorder.start();
        logged(&recorder, || {
            tracing::info!(target: "hyper::client", "connected");
        });
        assert!(recorder.take().is_empty());
    }

    #[test]
    fn nothing_is_recorded_before_start_or_after_take() {
        let recorder = Recorder::default();
        logged(&recorder, || {
            tracing::info!(target: "mail_breaker::pool", "before");
        });
        recorder.start();
        logged(&recorder, || {
            tracing::info!(target: "mail_breaker::pool", "during");
        });
        let events = recorder.take();
        logged(&recorder, || {
            tracing::info!(target: "mail_breaker::pool", "after");
        });
        let names: Vec<&str> = events.iter().map(|event| event.name.as_str()).collect();
        assert_eq!(names, ["during"]);
        assert!(recorder.take().is_empty());
    }

    #[test]
    fn a_log_line_is_taken_whole_before_it_is_written() {
        let mut line = Redacting {
            secrets: Arc::new(Secrets::default()),
            buffer: Vec::new(),
        };
        assert_eq!(line.write(b"half ").unwrap(), 5);
        assert_eq!(line.write(b"a line\n").unwrap(), 7);
        line.flush().unwrap();
        assert_eq!(line.buffer, b"half a line\n");
        std::mem::take(&mut line.buffer);
    }
    #[test]
    fn a_log_line_is_written_with_its_secrets_starred_and_its_controls_escaped() {
        let line = |text: &str| Redacting {
            secrets: Arc::new(Secrets::from_texts(["smtp://u:hunter2@relay"])),
            buffer: text.as_bytes().to_vec(),
        };
        let mut logged = line("reply=\"550 \u{1b}]52;c;x\u{7}\nforged\" pass=hunter2\n");
        assert_eq!(
            logged.shown(),
            "reply=\"550 \\u{1b}]52;c;x\\u{7}\\nforged\" pass=***\n"
        );
        std::mem::take(&mut logged.buffer);
        let mut unended = line("no line feed \u{9b}");
        assert_eq!(unended.shown(), "no line feed \\u{9b}");
        std::mem::take(&mut unended.buffer);
    }
}
