//! `mail-breaker`: test, check, send, and operate breakers and the outbox from a shell,
//! reading the same DSN or TOML as the application's [`Mailer`](mail_breaker::config::Mailer).
//!
//! Built with the crate's `cli` feature: `cargo install mail-breaker --features cli`.
//! Each command group is a module: `test_message` (`test`), `check`, `send`, `breakers`,
//! `outbox`, `serve`, `completions`. Everything printed goes through [`output::Out`], which shows
//! every password, key and token of the configuration as `***`.

mod breakers;
mod check;
mod completions;
mod exit;
mod outbox;
mod output;
mod redact;
mod send;
mod serve;
mod stack;
mod test_message;
mod tls;
mod trace;

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
    /// Print a shell completion script (bash, zsh or fish).
    Completions(completions::CompletionsArgs),
    /// Serve the operator page (breakers, limiters, the outbox, dead letters, and their
    /// actions) on 127.0.0.1 unless told otherwise, until Ctrl-C.
    #[command(after_help = EXIT_CODES)]
    Serve(serve::ServeArgs),
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let cli = match Cli::try_parse_from(&args) {
        Ok(cli) => cli,
        Err(error) => {
            // clap's message may quote an argument; a DSN given there may hold a password.
            let secrets = Secrets::from_texts(args.iter().map(String::as_str));
            let text = error.render().to_string();
            let shown = secrets.redact(&text);
            if error.use_stderr() {
                eprint!("{shown}");
            } else {
                print!("{shown}");
            }
            return ExitCode::from(u8::try_from(error.exit_code()).unwrap_or(2));
        }
    };
    let code = run(cli);
    ExitCode::from(code as u8)
}

fn run(cli: Cli) -> Exit {
    if let Command::Completions(args) = &cli.command {
        return completions::print(args);
    }
    let source = stack::Source::from_args(cli.dsn.clone(), cli.config.clone());
    let secrets = Arc::new(match &source {
        Ok(source) => Secrets::from_source(source),
        Err(_) => Secrets::default(),
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
            Command::Check | Command::Breakers(_) | Command::Completions(_) => stack::Uses::Members,
            Command::Test(_) | Command::Send(_) => stack::Uses::QueueingOutbox,
            Command::Outbox(_) | Command::Serve(_) => stack::Uses::ExistingOutbox,
        };
        let stack = stack::Stack::load(&source, uses).await?;
        match cli.command {
            Command::Test(args) => test_message::run(&stack, &out, &recorder, args).await,
            Command::Check => check::run(&stack, &out).await,
            Command::Send(args) => send::run(&stack, &out, args).await,
            Command::Breakers(args) => breakers::run(&stack, &out, args).await,
            Command::Outbox(args) => outbox::run(&stack, &out, args).await,
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
