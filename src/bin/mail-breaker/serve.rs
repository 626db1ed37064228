//! `mail-breaker serve [--listen ADDR] [--read-only] [--webhooks-only]`: the operator page
//! ([`mail_breaker::admin`]) over the configured stack, and the webhook receivers
//! ([`mail_breaker::webhooks`]) it configures, until Ctrl-C.
//!
//! ```text
//! mail-breaker serve --dsn "$MAILER_DSN"                    # http://127.0.0.1:8025/
//! mail-breaker serve --listen 127.0.0.1:0 --read-only       # any free port, no actions
//! mail-breaker serve --listen 0.0.0.0:8443 --allow-host ops.example.com \
//!     --credential-file /etc/mail-breaker/ops --tls-cert ops.pem --tls-key ops.key
//! ```
//!
//! It listens on 127.0.0.1 unless told otherwise, and prints the page's address first on
//! stdout (the port it got, for `:0`). The page's actions are forms that carry its token, which
//! is never printed: the page puts it into its own forms. On loopback the page answers only to
//! its loopback names; `--allow-host NAME:PORT` names more (required on any other address, so
//! that no other site's name reaches it).
//!
//! On an address that is not loopback whoever reaches the port would get the page and its
//! token, so its actions need a credential of the command's own (`--credential-file`, or
//! `MAILER_ADMIN_TOKEN`, or `MAILER_ADMIN_USER` with `MAILER_ADMIN_PASSWORD`), asked of every
//! request; without one it starts only `--read-only`. A credential crosses the network only
//! over TLS: `--tls-cert`/`--tls-key`, or `--behind-tls-proxy` when a proxy in front
//! terminates it. Behind a proxy, `--public-origin` names the origin the browser sees; a
//! form posted from the same host under the other scheme than the browser's is refused.
//! Ten wrong credentials within a minute hold their address back for five minutes; behind a
//! proxy, `--trusted-proxy ADDR` counts them against the client the proxy names in
//! `X-Forwarded-For` instead of the proxy, which would hold back everyone behind it (the
//! proxy must append to that header; a thousand wrong credentials through it within a
//! minute still hold back its clients not admitted within the hour, so that one passing on
//! its clients' own header does not make guessing free). A hundred from one network (an
//! IPv4 /24, an IPv6 /48) hold back that network.
//!
//! With receivers configured (`webhooks.*`), it also serves them at `/webhooks/{provider}`
//! (`/webhooks/ses`, `/webhooks/resend`...), outside the page's host, token, origin and
//! credential checks: each route authenticates its requests itself (a signature, or
//! Postmark's basic credentials), and reads at most `webhooks.body_limit` bytes (413 past
//! it). `--webhooks-only` serves the receivers without the page (every other path 404), so it
//! needs no credential and takes none of the page's options. Receivers on an address that is
//! not loopback need TLS (`--tls-cert`/`--tls-key`) or `--behind-tls-proxy` however the
//! page is served: Postmark's credentials and the recipients' addresses would otherwise
//! cross the network in clear.
//!
//! No connection holds the page for long ([`Admin::serve`]'s bounds: headers within 10 s,
//! idle keep-alive 10 s, a request 30 s, a connection 5 minutes, 1024 at once and 64 from
//! one address: behind a proxy, 64 from the proxy, 512 from the `--trusted-proxy` ones
//! together); over TLS each handshake runs in a task of its own for 10 s at most, 64 at
//! once and 8 from one address (32 from the trusted proxies together), the oldest of the
//! address with the most let go for a new one, so that connections that never finish
//! theirs keep no one out.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::Router;
use clap::Args;
use mail_breaker::admin::{Admin, Credential};

use crate::exit::{Exit, Failure};
use crate::output::Out;
use crate::stack::Stack;

/// The variables a credential is read from when no file is given.
const TOKEN_VARIABLE: &str = "MAILER_ADMIN_TOKEN";
const USER_VARIABLE: &str = "MAILER_ADMIN_USER";
const PASSWORD_VARIABLE: &str = "MAILER_ADMIN_PASSWORD";

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// The address to listen on (`127.0.0.1:0`: any free port).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8025")]
    listen: SocketAddr,
    /// Show the page without its actions (isolate, reset, requeue, purge): every POST to the
    /// page is 405. The webhook receivers, which are no action of the page, still take events.
    #[arg(long)]
    read_only: bool,
    /// A `NAME:PORT` the page answers to, beside its loopback names; required when listening
    /// on an address that is not loopback. May be given several times.
    #[arg(long, value_name = "NAME:PORT")]
    allow_host: Vec<String>,
    /// A file whose first line is the credential every request must carry: a bearer token
    /// (at least 16 characters), or `USER:PASSWORD` (a password of at least 12), which a
    /// browser asks for. Without it: MAILER_ADMIN_TOKEN, or MAILER_ADMIN_USER and
    /// MAILER_ADMIN_PASSWORD. Required for the actions on an address that is not loopback.
    #[arg(long, value_name = "FILE")]
    credential_file: Option<PathBuf>,
    /// Serve over TLS with this PEM certificate chain (and --tls-key).
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// A proxy in front terminates TLS: a credential may be taken over plain HTTP here.
    #[arg(long, conflicts_with = "tls_cert")]
    behind_tls_proxy: bool,
    /// The origin the browser sees the page under behind a proxy (`https://ops.example.com`):
    /// forms posted from it may act whatever `Host` the proxy sends.
    #[arg(long, value_name = "URL")]
    public_origin: Option<String>,
    /// The address of a reverse proxy in front of the page (may be given several times): a
    /// wrong credential through it counts against the client the proxy names in
    /// X-Forwarded-For, so that one client's guesses do not hold back everyone behind it.
    /// The proxy must append the address it was reached from (nginx:
    /// `proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;`); whatever it
    /// forwards, 1000 wrong credentials through it within a minute hold back every client
    /// behind it not admitted within the hour. The trusted proxies together may hold 512
    /// of the page's 1024 connections, not only one address's 64.
    #[arg(long, value_name = "ADDR")]
    trusted_proxy: Vec<IpAddr>,
    /// Serve only the webhook receivers (`/webhooks/{provider}`, configured by `webhooks.*`),
    /// without the page: no credential needed; TLS or --behind-tls-proxy off loopback.
    #[arg(
        long,
        conflicts_with_all = [
            "read_only",
            "allow_host",
            "credential_file",
            "public_origin",
            "trusted_proxy"
        ]
    )]
    webhooks_only: bool,
}

pub async fn run(stack: Stack, out: &Out, args: ServeArgs) -> Result<Exit, Failure> {
    // Each route authenticates itself: mounted beside the page, outside its checks.
    let receivers = stack
        .mailer
        .webhooks()
        .map(|webhooks| Router::new().nest("/webhooks", webhooks.router()));
    if args.webhooks_only {
        return serve_webhooks_only(receivers, out, &args).await;
    }
    let credential = credential(args.credential_file.as_deref())?;
    // Behind a proxy on this machine the page is as public as the proxy: naming a public
    // origin, a TLS proxy or a host that is not loopback says requests come from off it.
    let behind_proxy = args.public_origin.is_some()
        || args.behind_tls_proxy
        || !args.trusted_proxy.is_empty()
        || args.allow_host.iter().any(|host| !is_loopback_host(host));
    let public = !args.listen.ip().is_loopback() || behind_proxy;
    let origin_host = match &args.public_origin {
        Some(url) => Some(authority_of(url)?),
        None => None,
    };
    if !args.listen.ip().is_loopback() && args.allow_host.is_empty() && origin_host.is_none() {
        return Err(Failure::usage(format!(
            "--listen {} is not a loopback address: name the hosts the page answers to with \
             --allow-host NAME:PORT",
            args.listen
        )));
    }
    if public && credential.is_none() && !args.read_only {
        return Err(Failure::usage(format!(
            "--listen {} is reachable from off this machine (not a loopback address, or behind \
             the proxy --public-origin, --behind-tls-proxy, --trusted-proxy or --allow-host \
             names), where whoever reaches the page could act: \
             give the actions a credential with --credential-file FILE (a bearer token, or \
             USER:PASSWORD), or {TOKEN_VARIABLE}, or {USER_VARIABLE} and {PASSWORD_VARIABLE}; \
             or serve the page without them, --read-only",
            args.listen
        )));
    }
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(crate::tls::acceptor(cert, key)?),
        _ => None,
    };
    if credential.is_some()
        && args
            .public_origin
            .as_deref()
            // Read as the URL parser reads it: without the spaces and controls around it.
            .is_some_and(|url| {
                url.trim_matches(|c: char| c <= ' ')
                    .to_ascii_lowercase()
                    .starts_with("http://")
            })
    {
        return Err(Failure::usage(
            "--public-origin is plain http://: the credential would cross the network in clear; \
             serve the page under https://"
                .to_owned(),
        ));
    }
    if public && credential.is_some() && tls.is_none() && !args.behind_tls_proxy {
        return Err(Failure::usage(format!(
            "--listen {} is reachable from off this machine (not a loopback address, or behind \
             a proxy), and the credential would cross the network in clear: give --tls-cert \
             FILE and --tls-key FILE, or --behind-tls-proxy when a proxy in front terminates TLS",
            args.listen
        )));
    }
    if receivers.is_some() && public && tls.is_none() && !args.behind_tls_proxy {
        return Err(receivers_in_clear(args.listen));
    }
    let (listener, address) = bind(args.listen).await?;
    let mut admin = Admin::new(Arc::new(stack.mailer));
    if args.read_only {
        admin = admin.read_only();
    }
    let mut hosts = args.allow_host;
    hosts.extend(origin_host);
    if !hosts.is_empty() {
        // As --allow-host's help says: beside the loopback names, not instead of them.
        hosts.extend(loopback_names(address.port()));
        admin = admin.allow_hosts(hosts);
    }
    if let Some(url) = &args.public_origin {
        admin = admin
            .public_origin(url)
            .map_err(|error| Failure::usage(format!("--public-origin: {}", error.reason())))?;
    }
    if let Some(credential) = credential {
        admin = admin.credential(credential);
    }
    if !args.trusted_proxy.is_empty() {
        admin = admin.trusted_proxies(args.trusted_proxy.iter().copied());
    }
    // What the browser sees: a form posted from the same host under the other scheme is
    // another site's.
    let browser_scheme_is_https = tls.is_some()
        || args.behind_tls_proxy
        || args
            .public_origin
            .as_deref()
            .is_some_and(|url| url.to_ascii_lowercase().starts_with("https://"));
    admin = admin.served_over_https(browser_scheme_is_https);
    let scheme = if tls.is_some() { "https" } else { "http" };
    out.line(&format!("{scheme}://{address}/"));
    out.note(&format!(
        "serving the operator page on {scheme}://{address}/{} (Ctrl-C stops)",
        if admin.is_read_only() {
            ", read only"
        } else {
            ""
        }
    ));
    if receivers.is_some() {
        out.note(&format!(
            "and the webhook receivers on {scheme}://{address}/webhooks/{{provider}}"
        ));
    }
    let beside = receivers.unwrap_or_default();
    let served = async {
        match tls {
            Some(acceptor) => {
                let listener =
                    crate::tls::TlsListener::new(listener, acceptor, args.trusted_proxy.clone())?;
                admin.serve_beside(listener, beside).await
            }
            None => admin.serve_beside(listener, beside).await,
        }
    };
    tokio::select! {
        served = served => match served {
            Ok(()) => Ok(Exit::Ok),
            Err(error) => Err(Failure::new(Exit::Other, format!("the page stopped: {error}"))),
        },
        _ = tokio::signal::ctrl_c() => Ok(Exit::Ok),
    }
}

/// `--webhooks-only`: the receivers alone, no page; off loopback over TLS only.
async fn serve_webhooks_only(
    receivers: Option<Router>,
    out: &Out,
    args: &ServeArgs,
) -> Result<Exit, Failure> {
    let Some(receivers) = receivers else {
        return Err(Failure::usage(
            "--webhooks-only: the configuration names no webhook receivers; add their secrets, \
             such as webhooks.resend.secret=... or webhooks.ses.topics=ARN (a [webhooks] table \
             in TOML)"
                .to_owned(),
        ));
    };
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(crate::tls::acceptor(cert, key)?),
        _ => None,
    };
    if !args.listen.ip().is_loopback() && tls.is_none() && !args.behind_tls_proxy {
        return Err(receivers_in_clear(args.listen));
    }
    let (listener, address) = bind(args.listen).await?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    out.line(&format!("{scheme}://{address}/"));
    out.note(&format!(
        "serving the webhook receivers on {scheme}://{address}/webhooks/{{provider}}, without \
         the page (Ctrl-C stops)"
    ));
    let served = async {
        match tls {
            Some(acceptor) => {
                let listener =
                    crate::tls::TlsListener::new(listener, acceptor, args.trusted_proxy.clone())?;
                mail_breaker::admin::serve_bounded(listener, receivers).await
            }
            None => mail_breaker::admin::serve_bounded(listener, receivers).await,
        }
    };
    tokio::select! {
        served = served => match served {
            Ok(()) => Ok(Exit::Ok),
            Err(error) => Err(Failure::new(Exit::Other, format!("the receivers stopped: {error}"))),
        },
        _ = tokio::signal::ctrl_c() => Ok(Exit::Ok),
    }
}

/// Receivers on a public address without TLS: refused.
fn receivers_in_clear(listen: SocketAddr) -> Failure {
    Failure::usage(format!(
        "--listen {listen} is reachable from off this machine, and the webhook receivers would \
         take Postmark's credentials and the recipients' addresses in clear: give --tls-cert \
         FILE and --tls-key FILE, or --behind-tls-proxy when a proxy in front terminates TLS"
    ))
}

/// The listener on `listen`, and the address it got.
async fn bind(listen: SocketAddr) -> Result<(tokio::net::TcpListener, SocketAddr), Failure> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|error| {
            Failure::new(Exit::Other, format!("cannot listen on {listen}: {error}"))
        })?;
    let address = listener.local_addr().map_err(|error| {
        Failure::new(
            Exit::Other,
            format!("cannot read the listening address: {error}"),
        )
    })?;
    Ok((listener, address))
}

/// The names a browser on this machine gives a page on `port`.
/// Whether an `--allow-host` value (`NAME:PORT`, `[::1]:PORT`) names this machine.
fn is_loopback_host(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(bracketed) => bracketed.split(']').next().unwrap_or_default(),
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    };
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|address| address.is_loopback())
}

fn loopback_names(port: u16) -> [String; 3] {
    [
        format!("127.0.0.1:{port}"),
        format!("[::1]:{port}"),
        format!("localhost:{port}"),
    ]
}

/// The `Host` a browser sends for a page at the origin `url` (`ops.example.com`, or with its
/// port when it is not the scheme's default).
fn authority_of(url: &str) -> Result<String, Failure> {
    // Shown without the user and password it may hold.
    let shown = without_userinfo(url);
    let parsed = url::Url::parse(url)
        .map_err(|error| Failure::usage(format!("--public-origin {shown:?}: {error}")))?;
    let host = parsed.host_str().ok_or_else(|| {
        Failure::usage(format!(
            "--public-origin {shown:?}: names no host (https://ops.example.com)"
        ))
    })?;
    Ok(match parsed.port() {
        Some(port) => format!("{host}:{port}"),
        None => host.to_owned(),
    })
}

/// `url` with whatever stands before the last `@` of its authority (a user and password)
/// written `***`, read as text so that a URL that does not parse is redacted too.
fn without_userinfo(url: &str) -> String {
    let start = url.find("://").map_or(0, |at| at + 3);
    let end = url[start..]
        .find(['/', '?', '#'])
        .map_or(url.len(), |at| start + at);
    match url[start..end].rfind('@') {
        Some(at) => format!("{}***{}", &url[..start], &url[start + at..]),
        None => url.to_owned(),
    }
}

/// The credential of `--credential-file`, else of the environment, else none. Nothing here
/// says what a file or a variable holds: a wrong credential is described, never shown.
fn credential(file: Option<&Path>) -> Result<Option<Credential>, Failure> {
    let variable = |name: &str| std::env::var(name).ok().filter(|value| !value.is_empty());
    let (token, user, password) = (
        variable(TOKEN_VARIABLE),
        variable(USER_VARIABLE),
        variable(PASSWORD_VARIABLE),
    );
    if let Some(path) = file {
        if token.is_some() || user.is_some() || password.is_some() {
            return Err(Failure::usage(format!(
                "a credential both in --credential-file and in {TOKEN_VARIABLE}, {USER_VARIABLE} \
                 or {PASSWORD_VARIABLE}: give one"
            )));
        }
        return from_file(path).map(Some);
    }
    let described = |error: mail_breaker::ConfigError| {
        Failure::usage(format!(
            "the credential's {}: {}",
            error.setting(),
            error.reason()
        ))
    };
    match (token, user, password) {
        (None, None, None) => Ok(None),
        (Some(token), None, None) => Credential::bearer(token).map(Some).map_err(described),
        (None, Some(user), Some(password)) => Credential::user(user, password)
            .map(Some)
            .map_err(described),
        _ => Err(Failure::usage(format!(
            "give either {TOKEN_VARIABLE}, or {USER_VARIABLE} and {PASSWORD_VARIABLE} together"
        ))),
    }
}

/// The first line of `path` that is not blank, without the spaces around it: `USER:PASSWORD`,
/// else a bearer token.
fn from_file(path: &Path) -> Result<Credential, Failure> {
    let text = std::fs::read_to_string(path).map_err(|error| {
        Failure::usage(format!(
            "cannot read the credential file {}: {error}",
            path.display()
        ))
    })?;
    let line = text
        .lines()
        .map(str::trim)
        .find(|line| !line.is_empty())
        .ok_or_else(|| {
            Failure::usage(format!("the credential file {} is empty", path.display()))
        })?;
    let credential = match line.split_once(':') {
        Some((user, password)) => Credential::user(user, password),
        None => Credential::bearer(line),
    };
    credential.map_err(|error| {
        Failure::usage(format!(
            "the credential file {}: its {} {}",
            path.display(),
            error.setting().trim_start_matches("credential."),
            error.reason()
        ))
    })
}
