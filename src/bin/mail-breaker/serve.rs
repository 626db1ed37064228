//! `mail-breaker serve [--listen ADDR] [--read-only]`: the operator page
//! ([`mail_breaker::admin`]) over the configured stack, until Ctrl-C.
//!
//! ```text
//! mail-breaker serve --dsn "$MAILER_DSN"                    # http://127.0.0.1:8025/
//! mail-breaker serve --listen 127.0.0.1:0 --read-only       # any free port, no actions
//! ```
//!
//! It listens on 127.0.0.1 unless told otherwise, and prints the page's address first on
//! stdout (the port it got, for `:0`). The page's actions are forms that carry its token, which
//! is never printed: the page puts it into its own forms. On loopback the page answers only to
//! its loopback names; on any other address `--allow-host NAME:PORT` names the hosts it
//! answers to (required there, so that no other site's name reaches it).

use std::net::SocketAddr;
use std::sync::Arc;

use clap::Args;
use mail_breaker::admin::Admin;

use crate::exit::{Exit, Failure};
use crate::output::Out;
use crate::stack::Stack;

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// The address to listen on (`127.0.0.1:0`: any free port).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8025")]
    listen: SocketAddr,
    /// Show the page without its actions (isolate, reset, requeue, purge): every POST is 405.
    #[arg(long)]
    read_only: bool,
    /// A `NAME:PORT` the page answers to, beside its loopback names; required when listening
    /// on an address that is not loopback. May be given several times.
    #[arg(long, value_name = "NAME:PORT")]
    allow_host: Vec<String>,
}

pub async fn run(stack: Stack, out: &Out, args: ServeArgs) -> Result<Exit, Failure> {
    if !args.listen.ip().is_loopback() && args.allow_host.is_empty() {
        return Err(Failure::usage(format!(
            "--listen {} is not a loopback address: name the hosts the page answers to with \
             --allow-host NAME:PORT (the page has no authentication of its own)",
            args.listen
        )));
    }
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|error| {
            Failure::new(
                Exit::Other,
                format!("cannot listen on {}: {error}", args.listen),
            )
        })?;
    let address = listener.local_addr().map_err(|error| {
        Failure::new(
            Exit::Other,
            format!("cannot read the listening address: {error}"),
        )
    })?;
    let mut admin = Admin::new(Arc::new(stack.mailer));
    if args.read_only {
        admin = admin.read_only();
    }
    if !args.allow_host.is_empty() {
        admin = admin.allow_hosts(args.allow_host);
    }
    out.line(&format!("http://{address}/"));
    out.note(&format!(
        "serving the operator page on http://{address}/{} (Ctrl-C stops)",
        if admin.is_read_only() {
            ", read only"
        } else {
            ""
        }
    ));
    tokio::select! {
        served = admin.serve(listener) => match served {
            Ok(()) => Ok(Exit::Ok),
            Err(error) => Err(Failure::new(Exit::Other, format!("the page stopped: {error}"))),
        },
        _ = tokio::signal::ctrl_c() => Ok(Exit::Ok),
    }
}
