//! `mail-breaker suppressions list|add|remove|import`: the suppression list of the stack
//! (`suppression=true`), read and changed through `SuppressionList`'s own methods.

use std::io::Read;
use std::path::PathBuf;

use clap::{Args, Subcommand, ValueEnum};
use mail_breaker::suppression::{Reason, Suppression, SuppressionError, SuppressionList};
use serde_json::{Value, json};

use crate::exit::{Exit, Failure};
use crate::output::{Out, rfc3339};
use crate::stack::Stack;

#[derive(Debug, Args)]
pub struct SuppressionsArgs {
    #[command(subcommand)]
    action: Action,
}

#[derive(Debug, Subcommand)]
enum Action {
    /// The addresses suppressed now, by address, a page at a time.
    List {
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        limit: u32,
        /// Start after this address (the previous page's last, `next_after` in --json).
        #[arg(long, value_name = "ADDRESS")]
        after: Option<String>,
    },
    /// Suppress an address for good (replacing what the list held for it).
    Add {
        /// The address (its domain is compared without case).
        address: String,
        /// Why.
        #[arg(long, value_enum, default_value_t = ReasonArg::Manual)]
        reason: ReasonArg,
    },
    /// Take an address off the list (and forget its transient bounces).
    Remove {
        /// The address.
        address: String,
    },
    /// Import a CSV file (`-` for stdin), all lines or none: `address[,reason]`, a header
    /// naming the columns optional; Postmark's and Mailgun's exports read as they are.
    Import {
        /// The file.
        file: PathBuf,
        /// The reason of lines that give none.
        #[arg(long, value_enum, default_value_t = ReasonArg::Manual)]
        reason: ReasonArg,
    },
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum ReasonArg {
    Bounced,
    Complained,
    Manual,
}

impl From<ReasonArg> for Reason {
    fn from(reason: ReasonArg) -> Reason {
        match reason {
            ReasonArg::Bounced => Reason::Bounced,
            ReasonArg::Complained => Reason::Complained,
            ReasonArg::Manual => Reason::Manual,
        }
    }
}

pub async fn run(stack: &Stack, out: &Out, args: SuppressionsArgs) -> Result<Exit, Failure> {
    let list = stack.mailer.suppression().ok_or_else(|| {
        Failure::usage(
            "the configuration has no suppression list: add `suppression=true` to the DSN \
             (with its outbox), or a [suppression] table to the TOML",
        )
    })?;
    match args.action {
        Action::List { limit, after } => list_page(list, out, after.as_deref(), limit).await,
        Action::Add { address, reason } => add(list, out, &address, reason.into()).await,
        Action::Remove { address } => remove(list, out, &address).await,
        Action::Import { file, reason } => import(list, out, &file, reason.into()).await,
    }
}

/// The exit code for an error of the list: what the person gave is 2, a store that failed 4.
fn failure(error: SuppressionError) -> Failure {
    let code = match error {
        SuppressionError::Store { .. } => Exit::Down,
        _ => Exit::Usage,
    };
    Failure::new(code, error.to_string())
}

fn entry_json(entry: &Suppression) -> Value {
    json!({
        "address": entry.address,
        "reason": entry.reason.as_str(),
        "provider": entry.provider,
        "event_id": entry.event_id,
        "at": rfc3339(entry.at),
        "until": entry.until.map(rfc3339),
    })
}

async fn list_page(
    list: &SuppressionList,
    out: &Out,
    after: Option<&str>,
    limit: u32,
) -> Result<Exit, Failure> {
    let page = list.list(after, limit).await.map_err(failure)?;
    // A full page may have more after it; a short one is the end.
    let full = u32::try_from(page.len()).is_ok_and(|len| len == limit && len > 0);
    let next = page
        .last()
        .filter(|_| full)
        .map(|entry| entry.address.clone());
    if out.json {
        out.json(&json!({
            "suppressions": page.iter().map(entry_json).collect::<Vec<_>>(),
            "next_after": next,
        }));
        return Ok(Exit::Ok);
    }
    out.table(
        &["address", "reason", "provider", "event", "since", "until"],
        page.iter()
            .map(|entry| {
                vec![
                    entry.address.clone(),
                    entry.reason.to_string(),
                    entry.provider.clone().unwrap_or_else(|| "-".into()),
                    entry.event_id.clone().unwrap_or_else(|| "-".into()),
                    rfc3339(entry.at),
                    entry
                        .until
                        .map(rfc3339)
                        .unwrap_or_else(|| "for good".into()),
                ]
            })
            .collect(),
    );
    if let Some(next) = next {
        // Quoted for bash, controls as escapes it reads back (`$'...'`).
        out.note(&format!(
            "more after this page: --after={}",
            shell_quoted(&next)
        ));
    }
    Ok(Exit::Ok)
}

async fn add(
    list: &SuppressionList,
    out: &Out,
    address: &str,
    reason: Reason,
) -> Result<Exit, Failure> {
    list.add(address, reason).await.map_err(failure)?;
    if out.json {
        out.json(&json!({ "added": address, "reason": reason.as_str() }));
    } else {
        out.line(&format!("{address} suppressed ({reason})"));
    }
    Ok(Exit::Ok)
}

async fn remove(list: &SuppressionList, out: &Out, address: &str) -> Result<Exit, Failure> {
    if !list.remove(address).await.map_err(failure)? {
        return Err(Failure::usage(format!(
            "{address} is not on the suppression list (the part before the @ is compared as \
             written; see `suppressions list`)"
        )));
    }
    if out.json {
        out.json(&json!({ "removed": address }));
    } else {
        out.line(&format!("{address} removed from the suppression list"));
    }
    Ok(Exit::Ok)
}

async fn import(
    list: &SuppressionList,
    out: &Out,
    file: &std::path::Path,
    reason: Reason,
) -> Result<Exit, Failure> {
    let text = if file.as_os_str() == "-" {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .map_err(|error| Failure::usage(format!("reading stdin: {error}")))?;
        text
    } else {
        std::fs::read_to_string(file)
            .map_err(|error| Failure::usage(format!("reading {}: {error}", file.display())))?
    };
    let imported = list.import(&text, reason).await.map_err(failure)?;
    if out.json {
        out.json(&json!({
            "read": imported.read,
            "added": imported.added,
            "skipped": imported.skipped,
        }));
    } else {
        out.line(&format!(
            "{} address{} read, {} added (the others were suppressed already)",
            imported.read,
            if imported.read == 1 { "" } else { "es" },
            imported.added
        ));
        if imported.skipped > 0 {
            out.line(&format!(
                "{} row{} skipped: {} status, code or reason says a temporary failure (4.x.x, \
                 4xx, a soft bounce), no reason to suppress for good",
                imported.skipped,
                if imported.skipped == 1 { "" } else { "s" },
                if imported.skipped == 1 {
                    "its"
                } else {
                    "their"
                }
            ));
        }
    }
    Ok(Exit::Ok)
}

/// `text` as a POSIX shell reads it back whole: as it is when it holds only characters no
/// shell treats specially, else in single quotes (a quoted local part holds spaces and `"`).
fn shell_quoted(text: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "@._+-=/:,%".contains(c);
    if !text.is_empty() && text.chars().all(plain) {
        return text.to_owned();
    }
    if !text.chars().any(crate::output::acts_on_a_terminal) {
        return format!("'{}'", text.replace('\'', "'\\''"));
    }
    // A control in single quotes would reach the terminal escaped (`\t`, two characters),
    // and the pasted cursor would be another key: bash's `$'...'` writes it as an escape
    // that the shell reads back, in printable characters the terminal shows as they are.
    let mut quoted = String::from("$'");
    for c in text.chars() {
        match c {
            '\\' => quoted.push_str("\\\\"),
            '\'' => quoted.push_str("\\'"),
            '\t' => quoted.push_str("\\t"),
            '\n' => quoted.push_str("\\n"),
            '\r' => quoted.push_str("\\r"),
            c if crate::output::acts_on_a_terminal(c) => {
                // Its UTF-8 bytes, two digits each: bash reads `\xHH` in every locale (`\u`
                // not in C's), and no hex letter after it is taken in.
                let mut bytes = [0; 4];
                for byte in c.encode_utf8(&mut bytes).bytes() {
                    quoted.push_str(&format!("\\x{byte:02x}"));
                }
            }
            c => quoted.push(c),
        }
    }
    quoted.push('\'');
    quoted
}

#[cfg(test)]
mod tests {
    use super::shell_quoted;

    #[test]
    fn an_address_is_quoted_for_the_shell_only_when_it_must_be() {
        assert_eq!(shell_quoted("bob@example.org"), "bob@example.org");
        assert_eq!(
            shell_quoted("\"john doe\"@example.org"),
            "'\"john doe\"@example.org'"
        );
        assert_eq!(
            shell_quoted("o'neil@example.org"),
            "'o'\\''neil@example.org'"
        );
    }

    #[test]
    fn the_next_pages_after_hint_pasted_into_a_shell_continues_where_the_page_ended() {
        // The hint is printed through the terminal's escaping, then pasted into bash.
        for key in [
            "\"john\tdoe\"@example.org",
            "\"it's\\\tthe\r\"@example.org",
            "a\u{85}\u{202e}b@example.org",
            "o'neil@example.org",
        ] {
            let hint = crate::output::for_terminal(&shell_quoted(key)).into_owned();
            // In the C locale too (cron, `docker exec`), where bash reads no `\u`.
            let Ok(echoed) = std::process::Command::new("bash")
                .env("LC_ALL", "C")
                .arg("-c")
                .arg(format!("printf %s {hint}"))
                .output()
            else {
                println!("SKIPPED: no bash to paste the hint into");
                return;
            };
            assert_eq!(String::from_utf8_lossy(&echoed.stdout), key, "{hint}");
        }
    }
}
