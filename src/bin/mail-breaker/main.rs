//! `mail-breaker`: test, check, send, and operate breakers and the outbox from a shell,
//! reading the same DSN or TOML as the application's [`Mailer`](mail_breaker::config::Mailer).
//!
//! Built with the crate's `cli` feature: `cargo install mail-breaker --features cli`.
//! Each command group is a module: `test_message` (`test`), `check`, `send` (which reads each
//! file with `eml`), `breakers`, `outbox`, `suppressions`, `reputation`, `serve`, `completions`. Everything printed goes
//! through [`output::Out`], which shows every password, key and token of the configuration as
//! `***`.

mod breakers;
mod check;
mod completions;
mod eml;
mod exit;
mod outbox;
mod output;
mod redact;
mod reputation;
mod send;
mod serve;
mod stack;
mod suppressions;
mod test_message;
mod tls;
mod trace;

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};

use exit::{Exit, Failure};
use output::Out;
use redact::Secrets;

/// The exit codes, listed by `--help`.
const EXIT_CODES: &str = "\
Exit codes:
  0  delivered, or queued in the outbox (or the command did what it said)
  1  anything else
  2  bad configuration or arguments (the message names the setting)
  3  refused: the provider rejected the message or a recipient, or the message is invalid
  4  provider down or timed out (breaker open, connection refused, 4xx, no answer)
  5  authentication or configuration refused at the provider
  6  rate limited
Several failures at once exit with the decisive one: 4, then 6, 5, 2, 3, then 1.

The stack is read from --dsn, --config FILE.toml, or the MAILER_DSN variable, as the
application's Mailer reads it. Passwords, API keys and tokens are shown as ***.";

/// Test, check, send and operate a mail stack (breakers, pool, retry, outbox) from a shell.
#[derive(Debug, Parser)]
#[command(name = "mail-breaker", version, after_help = EXIT_CODES)]
struct Cli {
    /// The stack as a DSN (`failover(smtp://... postmark://...)?outbox=...`); default: the
    /// MAILER_DSN variable.
    #[arg(long, global = true, value_name = "DSN", conflicts_with = "config")]
    dsn: Option<String>,

    /// The stack as a TOML file (the `[[member]]`, `[retry]`, `[outbox]`, `[redis]` tree).
    #[arg(long, global = true, value_name = "FILE.toml")]
    config: Option<PathBuf>,

    /// Print JSON for scripts instead of tables (JSON lines for `send`).
    #[arg(long, global = true)]
    json: bool,

    /// Also log what the crate does to stderr (-v: info, -vv: debug); secrets stay `***`.
    #[arg(long, short, global = true, action = clap::ArgAction::Count)]
    verbose: u8,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Send one message through the whole stack and print its trace: each member tried,
    /// the breakers' states before and after, the answer and the time taken.
    #[command(after_help = EXIT_CODES)]
    Test(test_message::TestArgs),
    /// Check each member (connect, EHLO, STARTTLS, AUTH; no message sent): one row each.
    #[command(after_help = EXIT_CODES)]
    Check,
    /// Send raw messages (.eml files, or `-` for one on stdin) through the stack.
    #[command(after_help = EXIT_CODES)]
    Send(send::SendArgs),
    /// Show the members' breakers; isolate or reset one for every process sharing Redis.
    #[command(after_help = EXIT_CODES)]
    Breakers(breakers::BreakersArgs),
    /// Read and operate the outbox: stats, dead letters, one message, requeue, purge, drain.
    #[command(after_help = EXIT_CODES)]
    Outbox(outbox::OutboxArgs),
    /// Read and change the suppression list (`suppression=true`): list, add, remove, import.
    #[command(after_help = EXIT_CODES)]
    Suppressions(suppressions::SuppressionsArgs),
    /// Show each member's reputation breaker (tier, bounce and complaint rates, sends,
    /// thresholds, an SES account's enforcement status); reset one for every process.
    #[command(after_help = EXIT_CODES)]
    Reputation(reputation::ReputationArgs),
    /// Print a shell completion script (bash, zsh or fish).
    Completions(completions::CompletionsArgs),
    /// Serve the operator page (breakers, limiters, the outbox, dead letters, and their
    /// actions) on 127.0.0.1 unless told otherwise, until Ctrl-C.
    #[command(after_help = EXIT_CODES)]
    Serve(serve::ServeArgs),
}

fn main() -> ExitCode {
    // `args_os`: an argument that is not UTF-8 is clap's usage error, not a panic.
    let args: Vec<OsString> = std::env::args_os().collect();
    // Every argument may hold a secret (a DSN given where clap or the command quotes it).
    let argv = Secrets::from_texts(texts(&args).iter().map(String::as_str));
    let cli = match parse(&args, &argv) {
        Ok(cli) => cli,
        Err(refusal) => {
            if refusal.on_stderr {
                eprint!("{}", refusal.text);
            } else {
                print!("{}", refusal.text);
            }
            return ExitCode::from(refusal.code);
        }
    };
    let code = run(cli, argv);
    ExitCode::from(code as u8)
}

/// The arguments as text, for finding their secrets (a byte that is not UTF-8 as U+FFFD).
fn texts(args: &[OsString]) -> Vec<String> {
    args.iter()
        .map(|arg| arg.to_string_lossy().into_owned())
        .collect()
}

/// What clap answers to arguments it refuses (or to `--help`): its text, secrets hidden and
/// controls escaped, where it goes, and the exit code.
struct Refusal {
    text: String,
    on_stderr: bool,
    code: u8,
}

fn parse(args: &[OsString], secrets: &Secrets) -> Result<Cli, Refusal> {
    Cli::try_parse_from(args).map_err(|error| {
        // clap's message may quote an argument; a DSN given there may hold a password.
        let rendered = error.render().to_string();
        let text = output::lines_for_terminal(&secrets.redact(&rendered));
        Refusal {
            text,
            on_stderr: error.use_stderr(),
            code: u8::try_from(error.exit_code()).unwrap_or(2),
        }
    })
}

fn run(cli: Cli, argv: Secrets) -> Exit {
    if let Command::Completions(args) = &cli.command {
        return completions::print(args);
    }
    let source = stack::Source::from_args(cli.dsn.clone(), cli.config.clone());
    let secrets = Arc::new(match &source {
        Ok(source) => argv.with(&Secrets::from_source(source)),
        Err(_) => argv,
    });
    let out = Out::new(cli.json, Arc::clone(&secrets));
    let recorder = trace::init(cli.verbose, Arc::clone(&secrets));
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            out.failure(&Failure::new(
                Exit::Other,
                format!("cannot start the async runtime: {error}"),
            ));
            return Exit::Other;
        }
    };
    let result = runtime.block_on(async {
        let source = source?;
        let uses = match &cli.command {
            Command::Check
            | Command::Breakers(_)
            | Command::Reputation(_)
            | Command::Completions(_) => stack::Uses::Members,
            // A one-off send queues only in an outbox that exists: one made here would keep
            // mail that no worker of the application ever sends.
            Command::Test(_)
            | Command::Send(_)
            | Command::Outbox(_)
            | Command::Serve(_)
            | Command::Suppressions(_) => stack::Uses::ExistingOutbox,
        };
        let stack = stack::Stack::load(&source, uses).await?;
        match cli.command {
            Command::Test(args) => test_message::run(&stack, &out, &recorder, args).await,
            Command::Check => check::run(&stack, &out).await,
            Command::Send(args) => send::run(&stack, &out, args).await,
            Command::Breakers(args) => breakers::run(&stack, &out, args).await,
            Command::Outbox(args) => outbox::run(&stack, &out, args).await,
            Command::Suppressions(args) => suppressions::run(&stack, &out, args).await,
            Command::Reputation(args) => reputation::run(&stack, &out, args).await,
            Command::Serve(args) => serve::run(stack, &out, args).await,
            Command::Completions(_) => Ok(Exit::Ok),
        }
    });
    // Sends cut off by the end of the runtime are answered by their leases' end.
    runtime.shutdown_timeout(std::time::Duration::from_millis(200));
    match result {
        Ok(code) => code,
        Err(failure) => {
            out.failure(&failure);
            failure.code
        }
    }
}

#[cfg(test)]
mod tests {
    use std::ffi::OsString;

    use proptest::prelude::*;

    use super::{Secrets, parse, texts};

    /// `password` in a URL's user part: what RFC 3986 allows there kept, the rest
    /// percent-encoded.
    fn in_userinfo(password: &str) -> String {
        let mut encoded = String::new();
        for byte in password.bytes() {
            if byte.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=".contains(&byte) {
                encoded.push(char::from(byte));
            } else {
                encoded.push_str(&format!("%{byte:02X}"));
            }
        }
        encoded
    }

    /// The forms of `password` no output may hold: as it is, as the DSN writes it, every
    /// byte percent-encoded (upper and lower case), and as JSON writes it.
    fn forms_of(password: &str) -> Vec<String> {
        let upper: String = password.bytes().map(|b| format!("%{b:02X}")).collect();
        let lower: String = password.bytes().map(|b| format!("%{b:02x}")).collect();
        let json = serde_json::to_string(password).unwrap_or_default();
        vec![
            password.to_owned(),
            in_userinfo(password),
            upper,
            lower,
            json.trim_matches('"').to_owned(),
        ]
    }

    /// Every way the arguments can fail clap's parsing with `dsn` among them.
    fn refused_arguments(dsn: &str) -> Vec<Vec<String>> {
        let dsn_equals = format!("--dsn={dsn}");
        let dns_equals = format!("--dns={dsn}");
        let to_equals = format!("--to={dsn}");
        let shapes: Vec<Vec<&str>> = vec![
            vec!["check", "--dsn", dsn, "--no-such-option"],
            vec!["check", dsn],
            vec![dsn],
            vec![dsn, "check"],
            vec![&dsn_equals, "chek"],
            vec!["--dns", dsn, "check"],
            vec![&dns_equals, "check"],
            vec!["check", &dns_equals],
            vec!["send", "--concurrency", dsn, "x.eml"],
            vec!["send", "--concurrency", "0", "--dsn", dsn, "x.eml"],
            vec!["send", "--dsn", dsn],
            vec!["check", "--dsn", dsn, "--config", "x.toml"],
            vec!["check", "--config", dsn, "--dsn", dsn],
            vec!["check", "--dsn", dsn, "--dsn", dsn],
            vec!["check", "--dsn"],
            vec!["outbox", "show", dsn, "--dsn", dsn],
            vec!["outbox", "requeue", dsn],
            vec!["outbox", "requeue", "1", "--all", "--dsn", dsn],
            vec!["outbox", dsn],
            vec!["outbox", "dead", "--limit", dsn],
            vec!["breakers", "isolate", "--dsn", dsn],
            vec!["breakers", dsn, "x"],
            vec!["completions", dsn],
            vec!["--dsn", dsn],
            vec!["--dsn", dsn, "-vvv", "check", "--json", "--json"],
            vec!["test", "--dsn", dsn],
            vec!["test", &to_equals, "--to", dsn],
            vec!["serve", "--listen", dsn],
            vec!["serve", "--dsn", dsn, "--allow-host"],
        ];
        shapes
            .into_iter()
            .map(|shape| {
                std::iter::once("mail-breaker")
                    .chain(shape)
                    .map(str::to_owned)
                    .collect()
            })
            .collect()
    }

    /// What `mail-breaker ARGS` prints when clap refuses its arguments (`None`: they parse).
    fn refusal_of(args: &[String]) -> Option<String> {
        let args: Vec<OsString> = args.iter().map(OsString::from).collect();
        let secrets = Secrets::from_texts(texts(&args).iter().map(String::as_str));
        parse(&args, &secrets).err().map(|refusal| refusal.text)
    }

    /// A password of 8 to 24 characters: printable ASCII, or any printable UTF-8. (`${NAME}`
    /// is not a password but a reference to the environment, whose value is hidden.)
    fn password() -> impl Strategy<Value = String> {
        prop_oneof!["[ -~]{8,24}", "[ -~\\PC]{8,24}"]
            .prop_filter("a reference to the environment", |p| {
                !(p.starts_with("${") && p.ends_with('}'))
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        #[test]
        fn no_refused_argument_shows_a_password_in_any_form(password in password()) {
            let dsn = format!("smtp://mailer:{}@relay.example.com:587", in_userinfo(&password));
            for args in refused_arguments(&dsn) {
                let Some(text) = refusal_of(&args) else {
                    prop_assert!(false, "{args:?} parsed");
                    continue;
                };
                for form in forms_of(&password) {
                    prop_assert!(!text.contains(&form), "{args:?} shows {form:?}: {text}");
                }
            }
        }
    }

    #[test]
    fn each_refused_argument_shape_is_a_usage_error_that_shows_the_argument_starred() {
        let dsn = "smtp://mailer:pa,ss'wo)rd@relay.example.com:587";
        let text =
            refusal_of(&["mail-breaker".into(), "check".into(), dsn.into()]).unwrap_or_default();
        assert!(
            text.contains("'smtp://mailer:***@relay.example.com:587'"),
            "{text}"
        );
        for args in refused_arguments(dsn) {
            let os: Vec<OsString> = args.iter().map(OsString::from).collect();
            let code = parse(&os, &Secrets::default()).err().map(|r| r.code);
            assert_eq!(code, Some(2), "{args:?}");
        }
    }

    #[cfg(unix)]
    #[test]
    fn an_argument_that_is_not_utf8_is_refused_as_a_usage_error() {
        use std::os::unix::ffi::OsStringExt;
        let args = vec![
            OsString::from("mail-breaker"),
            OsString::from("check"),
            OsString::from_vec(b"--dsn=\xff".to_vec()),
        ];
        let refusal = parse(&args, &Secrets::default()).err();
        assert_eq!(refusal.map(|r| (r.code, r.on_stderr)), Some((2, true)));
    }

    #[test]
    fn help_is_no_refusal_of_the_arguments_and_goes_to_stdout() {
        let args = [OsString::from("mail-breaker"), OsString::from("--help")];
        let refusal = parse(&args, &Secrets::default()).err();
        assert_eq!(
            refusal.as_ref().map(|r| (r.code, r.on_stderr)),
            Some((0, false))
        );
        assert!(refusal.is_some_and(|r| r.text.contains("Exit codes:")));
    }

    #[test]
    fn a_refused_argument_is_quoted_with_its_controls_escaped_and_the_lines_kept() {
        let text = refusal_of(&[
            "mail-breaker".into(),
            "check".into(),
            "\u{1b}]52;c;eA==\u{7}\u{9b}2J".into(),
        ])
        .unwrap_or_default();
        // clap's plain text already drops the ANSI sequences it knows (OSC, CSI by ESC [),
        // not the C1 CSI.
        assert!(text.contains(r"'\u{9b}2J'"), "{text}");
        assert!(!text.contains(['\u{1b}', '\u{7}', '\u{9b}']), "{text:?}");
        assert!(text.lines().count() > 2, "clap's lines stay lines: {text}");
    }
}
