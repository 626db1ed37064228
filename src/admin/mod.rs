//! The operator page (feature `admin`): a [`Mailer`]'s breakers, limiters, outbox and dead
//! letters on one page served by axum, with the actions an operator needs.
//!
//! Everything shown is read from the crate's own snapshots at each request: each member's
//! breaker ([`snapshot`](crate::CircuitBreakerTransport::snapshot) and
//! [`recent_changes`](crate::CircuitBreakerTransport::recent_changes)), each limiter
//! ([`Mailer::limiters`]), the outbox's [`stats`](crate::Outbox::stats) and
//! [`dead_letters_page`](crate::Outbox::dead_letters_page). The chart of the last hour is drawn from
//! `stats` read every 15 seconds by this process while the router lives, and from
//! [`sent_here`](crate::Outbox::sent_here): what this process's own workers delivered in
//! each period (workers in other processes are not counted).
//!
//! # Routes
//! | route | what |
//! | --- | --- |
//! | `GET /` | the page (HTML, refreshes itself every 5 s) |
//! | `GET /api/breakers`, `/api/limiters`, `/api/outbox`, `/api/dead` | the same data as JSON |
//! | `GET /?before=ID`, `GET /api/dead?before=ID&limit=N` | the dead letters older than `ID`, newest first (`N` up to 1000, 100 by default): the page's "older" link carries the last one's id |
//! | `POST /breakers/{name}/isolate`, `POST /breakers/{name}/reset` | hold a member's breaker open, or close it |
//! | `POST /outbox/dead/{id}/requeue`, `POST /outbox/dead/{id}/purge` | send a dead letter again, or delete it |
//! | `GET /api/reputation` | each member's reputation breaker (feature `webhooks`): tier, rates, sends counted, thresholds, and an SES member's account enforcement status (`HEALTHY`, `PROBATION`, `SHUTDOWN`, or `unknown` with why) |
//! | `POST /reputation/{name}/reset` | close a member's reputation breaker and clear its counts: only a person does |
//! | `GET /api/suppressions?q=TEXT&limit=N`, `GET /?suppressed=TEXT` | the suppression list's addresses holding `TEXT` (letters without case), by address, `N` up to 1000 (100 by default); `null` without a list |
//! | `POST /suppressions/{address}/remove` | take an address off the suppression list |
//!
//! A member's name goes into a path percent-encoded (`smtp%3A%2F%2Frelay%3A587`).
//!
//! # Safety of the actions
//! Each action is a plain HTML form that carries the page's token ([`Admin::token`]). A POST
//! without it, or whose `Origin` is another site's, is answered 403 and changes nothing; each
//! action done is logged with `tracing` (`admin.*` at INFO, refusals at WARN). With
//! [`Admin::read_only`] the page shows no form and every POST is answered 405.
//!
//! Behind a reverse proxy that sends the page another `Host` than the browser's (nginx's
//! default), [`Admin::public_origin`] names the origin the forms are posted from.
//!
//! # Who may use it
//! Without [`Admin::credential`] anyone who reaches the router reads the page and its token:
//! mount it behind the application's authentication. With one, every request must carry it
//! (a bearer token, or a user and password a browser asks for); serve it over TLS then.
//! After 10 wrong credentials within a minute from one address (an IPv6 /64), every request
//! from it is answered 429 for 5 minutes, so that the credential cannot be guessed at the
//! speed of the network; the address is axum's `ConnectInfo`, which [`Admin::serve`] gives
//! (an application that serves the router itself gives it with
//! `into_make_service_with_connect_info`, else all requests count as one address). Text from
//! a request that reaches the log (a path, a host, a member's name) has its control and
//! bidirectional characters escaped.
//!
//! # Example
//! ```no_run
//! use std::sync::Arc;
//! use mail_breaker::admin::Admin;
//! use mail_breaker::Mailer;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let mailer = Arc::new(Mailer::from_dsn(&std::env::var("MAILER_DSN")?)?.build().await?);
//! let app = axum::Router::new()
//!     // ... the application's own routes, and its authentication layer over this nest
//!     .nest("/admin/mail", Admin::new(Arc::clone(&mailer)).router());
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! axum::serve(listener, app).await?;
//! # Ok(())
//! # }
//! ```

use std::collections::VecDeque;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::{get, post};

use crate::{ConfigError, Mailer};

pub use credential::Credential;

mod actions;
mod chart;
mod credential;
mod guard;
mod page;
mod read;
#[cfg(feature = "webhooks")]
mod reputation;
mod serve;
#[cfg(feature = "webhooks")]
mod suppressions;
mod text;
mod throttle;

/// The operator page over one [`Mailer`]; see the [module docs](self).
///
/// Cheap to clone: clones share the mailer, the token and the chart's readings.
#[derive(Clone)]
pub struct Admin {
    shared: Arc<Shared>,
}

/// What every request of one page reads.
pub(crate) struct Shared {
    pub(crate) mailer: Arc<Mailer>,
    /// The token every action's form carries.
    pub(crate) token: String,
    pub(crate) read_only: bool,
    /// How often the outbox's counts are kept for the chart.
    pub(crate) chart_every: Duration,
    /// The `Host`s the page answers to (`host:port`); `None`: any.
    pub(crate) hosts: Option<Vec<String>>,
    /// What every request must carry, if anything.
    pub(crate) credential: Option<Arc<Credential>>,
    /// The reverse proxies whose `X-Forwarded-For` names the client a wrong credential is
    /// counted against.
    pub(crate) trusted_proxies: Arc<[std::net::IpAddr]>,
    /// The origin the page is served under behind a proxy (`https://ops.example.com`), as a
    /// browser's `Origin` names it.
    pub(crate) public_origin: Option<String>,
    /// The scheme the page is served under (`"http"` or `"https"`), when said.
    pub(crate) scheme: Option<&'static str>,
    /// The outbox's counts over the last hour, for the chart.
    pub(crate) history: Mutex<VecDeque<chart::Sample>>,
    /// The SES accounts' last readings (see [`reputation::SesReadings`]).
    #[cfg(feature = "webhooks")]
    #[cfg_attr(not(feature = "ses"), allow(dead_code))]
    pub(crate) ses_readings: reputation::SesReadings,
}

impl fmt::Debug for Admin {
    /// The mailer and whether it is read-only; never the token.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Admin")
            .field("mailer", &self.shared.mailer)
            .field("read_only", &self.shared.read_only)
            .finish_non_exhaustive()
    }
}

/// The shortest token [`Admin::with_token`] takes.
const SHORTEST_TOKEN: usize = 16;

impl Admin {
    /// The page over `mailer`, with its actions behind a token drawn at random from the
    /// operating system.
    pub fn new(mailer: Arc<Mailer>) -> Admin {
        Admin::with(Shared {
            mailer,
            token: guard::random_token(),
            read_only: false,
            chart_every: chart::EVERY,
            hosts: None,
            credential: None,
            trusted_proxies: Arc::from([]),
            public_origin: None,
            scheme: None,
            history: Mutex::new(VecDeque::new()),
            #[cfg(feature = "webhooks")]
            ses_readings: reputation::SesReadings::default(),
        })
    }

    /// The page with its actions behind `token` (at least 16 characters, letters, digits,
    /// `-` and `_`), for a server that keeps one token across restarts or shares it between
    /// processes.
    ///
    /// ```no_run
    /// # use std::sync::Arc;
    /// # fn run(mailer: Arc<mail_breaker::Mailer>) -> Result<(), mail_breaker::ConfigError> {
    /// let admin = mail_breaker::admin::Admin::new(mailer).with_token("a-long-token-from-a-secret-store")?;
    /// assert_eq!(admin.token(), "a-long-token-from-a-secret-store");
    /// # Ok(()) }
    /// ```
    pub fn with_token(self, token: impl Into<String>) -> Result<Admin, ConfigError> {
        let token = token.into();
        let fits = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
        if token.len() < SHORTEST_TOKEN || !token.chars().all(fits) {
            return Err(ConfigError::new(
                "token",
                format!(
                    "must be at least {SHORTEST_TOKEN} characters of letters, digits, '-' and '_'"
                ),
            ));
        }
        Ok(Admin::with(Shared {
            token,
            ..self.settings()
        }))
    }

    /// The page without any action: no form is shown and every POST is answered 405.
    pub fn read_only(self) -> Admin {
        Admin::with(Shared {
            read_only: true,
            ..self.settings()
        })
    }

    /// How often the outbox's counts are read for the chart (default 15 s; at least 100 ms).
    /// The chart keeps at most 720 readings, an hour at the default.
    ///
    /// ```no_run
    /// # use std::sync::Arc;
    /// # use std::time::Duration;
    /// # fn run(mailer: Arc<mail_breaker::Mailer>) -> Result<(), mail_breaker::ConfigError> {
    /// let admin = mail_breaker::admin::Admin::new(mailer).chart_every(Duration::from_secs(5))?;
    /// # Ok(()) }
    /// ```
    pub fn chart_every(self, every: Duration) -> Result<Admin, ConfigError> {
        if every < Duration::from_millis(100) {
            return Err(ConfigError::new(
                "chart_every",
                format!("must be at least 100 ms, got {every:?}"),
            ));
        }
        Ok(Admin::with(Shared {
            chart_every: every,
            ..self.settings()
        }))
    }

    /// Answers only requests whose `Host` (or HTTP/2 `:authority`) is one of `hosts`
    /// (`host:port`, e.g. `127.0.0.1:8025`, or `ops.example.com:443`, which also takes the
    /// `ops.example.com` a browser sends for its scheme's default port); any other is
    /// answered 403. Against
    /// DNS rebinding, where a site an operator visits points its own name at the page's
    /// address. [`serve`](Admin::serve) on a loopback address sets the loopback names itself.
    ///
    /// ```no_run
    /// # use std::sync::Arc;
    /// # fn run(mailer: Arc<mail_breaker::Mailer>) {
    /// let admin = mail_breaker::admin::Admin::new(mailer).allow_hosts(["mail-ops.internal:8025"]);
    /// # }
    /// ```
    pub fn allow_hosts<S: Into<String>>(self, hosts: impl IntoIterator<Item = S>) -> Admin {
        Admin::with(Shared {
            hosts: Some(hosts.into_iter().map(Into::into).collect()),
            ..self.settings()
        })
    }

    /// Every request (the page, its JSON and its actions) must carry `credential`, else it is
    /// answered 401 with a challenge a browser asks its user to answer. For a page that its
    /// application does not mount behind an authentication of its own; `mail-breaker serve`
    /// on an address that is not loopback gives it one. Over plain HTTP the credential
    /// crosses the network in clear: serve the page over TLS, or behind a proxy that
    /// terminates TLS. Wrong credentials are throttled per address (see the
    /// [module docs](self)).
    ///
    /// ```no_run
    /// # use std::sync::Arc;
    /// # fn run(mailer: Arc<mail_breaker::Mailer>) -> Result<(), mail_breaker::ConfigError> {
    /// use mail_breaker::admin::{Admin, Credential};
    ///
    /// let password = std::env::var("OPS_PASSWORD").unwrap_or_default();
    /// let admin = Admin::new(mailer).credential(Credential::user("ops", password)?);
    /// # Ok(()) }
    /// ```
    pub fn credential(self, credential: Credential) -> Admin {
        Admin::with(Shared {
            credential: Some(Arc::new(credential)),
            ..self.settings()
        })
    }

    /// The addresses of the reverse proxies in front of the page. A wrong credential that
    /// comes through one is counted against the client the proxy names: the rightmost
    /// address of `X-Forwarded-For` that is not itself one of these proxies (the entries to
    /// its left are the client's own claims, which anyone can write). Without it, every
    /// request through a proxy comes from the proxy's address, and ten wrong credentials
    /// from one client hold back everyone behind it. List only proxies that append the
    /// address they were reached from to `X-Forwarded-For` (nginx's
    /// `$proxy_add_x_forwarded_for`); the header from any other peer is ignored, and a
    /// request from a proxy without a readable one is counted against the proxy. Each proxy
    /// is also counted as a whole: a thousand wrong credentials through it within a minute
    /// hold back for five minutes every client it forwards that did not give the right
    /// credential within the last hour. (Each client's network, an IPv4 /24 or an IPv6 /48,
    /// is held back so after a hundred, behind a proxy or not.)
    ///
    /// ```no_run
    /// # use std::sync::Arc;
    /// # fn run(mailer: Arc<mail_breaker::Mailer>) {
    /// use std::net::{IpAddr, Ipv4Addr};
    ///
    /// let proxy = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 5));
    /// let admin = mail_breaker::admin::Admin::new(mailer).trusted_proxies([proxy]);
    /// # }
    /// ```
    pub fn trusted_proxies(self, proxies: impl IntoIterator<Item = std::net::IpAddr>) -> Admin {
        Admin::with(Shared {
            trusted_proxies: proxies
                .into_iter()
                .map(|proxy| proxy.to_canonical())
                .collect(),
            ..self.settings()
        })
    }

    /// The origin the page is served under (`https://ops.example.com`, or with its port),
    /// for a page behind a reverse proxy: a form POSTed from it may act even when the proxy
    /// sends the page another `Host` (nginx sends its upstream's name unless told
    /// otherwise). Without it an action's `Origin` must name the request's own authority
    /// (its `Host`, or HTTP/2's `:authority`). Only an `http` or `https` origin, with no
    /// path, query or user, is taken.
    ///
    /// ```no_run
    /// # use std::sync::Arc;
    /// # fn run(mailer: Arc<mail_breaker::Mailer>) -> Result<(), mail_breaker::ConfigError> {
    /// let admin = mail_breaker::admin::Admin::new(mailer).public_origin("https://ops.example.com")?;
    /// # Ok(()) }
    /// ```
    pub fn public_origin(self, url: &str) -> Result<Admin, ConfigError> {
        let origin =
            guard::parse_origin(url).map_err(|why| ConfigError::new("public_origin", why))?;
        Ok(Admin::with(Shared {
            public_origin: Some(origin),
            ..self.settings()
        }))
    }

    /// Says whether the page is served over `https` (by a TLS listener, or a proxy in front
    /// that terminates TLS) or plain `http`: without a [`public_origin`](Admin::public_origin),
    /// an action's `Origin` must then name the request's own authority under that scheme, so
    /// that a form posted from `http://ops.example.com` does not act on a page served at
    /// `https://ops.example.com`. Unsaid, either scheme is taken (the page cannot know how
    /// an application serves it); `mail-breaker serve` says it.
    ///
    /// ```no_run
    /// # use std::sync::Arc;
    /// # fn run(mailer: Arc<mail_breaker::Mailer>) {
    /// let admin = mail_breaker::admin::Admin::new(mailer).served_over_https(true);
    /// # }
    /// ```
    pub fn served_over_https(self, https: bool) -> Admin {
        Admin::with(Shared {
            scheme: Some(if https { "https" } else { "http" }),
            ..self.settings()
        })
    }

    /// This page's settings, with a chart of its own.
    fn settings(&self) -> Shared {
        let shared = &self.shared;
        Shared {
            mailer: Arc::clone(&shared.mailer),
            token: shared.token.clone(),
            read_only: shared.read_only,
            chart_every: shared.chart_every,
            hosts: shared.hosts.clone(),
            credential: shared.credential.clone(),
            trusted_proxies: Arc::clone(&shared.trusted_proxies),
            public_origin: shared.public_origin.clone(),
            scheme: shared.scheme,
            history: Mutex::new(VecDeque::new()),
            #[cfg(feature = "webhooks")]
            ses_readings: reputation::SesReadings::default(),
        }
    }

    fn with(shared: Shared) -> Admin {
        Admin {
            shared: Arc::new(shared),
        }
    }

    /// The token the page's forms carry (a secret: whoever holds it and reaches the router
    /// can act).
    pub fn token(&self) -> &str {
        &self.shared.token
    }

    /// Whether the actions are removed.
    pub fn is_read_only(&self) -> bool {
        self.shared.read_only
    }

    /// The page's routes, to mount with `Router::nest` (or serve alone). Inside a Tokio
    /// runtime it also starts reading the outbox's counts every 15 seconds for the chart,
    /// until the router and every clone of this `Admin` are dropped.
    pub fn router(&self) -> Router {
        chart::start_sampling(Arc::downgrade(&self.shared), self.shared.chart_every);
        let routes = Router::new()
            .route("/", get(page::show))
            .route("/api/breakers", get(read::breakers_json))
            .route("/api/limiters", get(read::limiters_json))
            .route("/api/outbox", get(read::outbox_json))
            .route("/api/dead", get(read::dead_json));
        let actions = [
            "/breakers/{name}/isolate",
            "/breakers/{name}/reset",
            "/outbox/dead/{id}/requeue",
            "/outbox/dead/{id}/purge",
        ];
        let routes = if self.shared.read_only {
            actions.into_iter().fold(routes, |routes, path| {
                routes.route(path, post(actions::read_only))
            })
        } else {
            // Each handler's flag: isolate (else reset), requeue (else purge).
            routes
                .route(actions[0], post(actions::on_breaker::<true>))
                .route(actions[1], post(actions::on_breaker::<false>))
                .route(actions[2], post(actions::on_dead_letter::<true>))
                .route(actions[3], post(actions::on_dead_letter::<false>))
        };
        #[cfg(feature = "webhooks")]
        let routes = suppressions::routes(
            reputation::routes(routes, self.shared.read_only),
            self.shared.read_only,
        );
        // The host is checked before the credential is asked for: a browser sent to the page
        // under another site's name (DNS rebinding) is not prompted for it.
        let routes = match &self.shared.credential {
            Some(credential) => {
                let credential = Arc::clone(credential);
                let throttle = Arc::new(credential::Throttles::default());
                let proxies = Arc::clone(&self.shared.trusted_proxies);
                routes.layer(axum::middleware::from_fn(move |request, next| {
                    credential::required(
                        Arc::clone(&credential),
                        Arc::clone(&throttle),
                        Arc::clone(&proxies),
                        request,
                        next,
                    )
                }))
            }
            None => routes,
        };
        let routes = match &self.shared.hosts {
            Some(hosts) => {
                let hosts: Arc<[String]> = hosts.clone().into();
                routes.layer(axum::middleware::from_fn(move |request, next| {
                    guard::only_hosts(Arc::clone(&hosts), request, next)
                }))
            }
            None => routes,
        };
        routes.with_state(Arc::clone(&self.shared))
    }

    /// Serves the page alone on `listener` until the server fails: what `mail-breaker serve`
    /// does. Bind to 127.0.0.1 unless something in front authenticates, or the page has a
    /// [`credential`](Admin::credential). On a loopback address, unless
    /// [`allow_hosts`](Admin::allow_hosts) was set, the page answers only to
    /// `127.0.0.1:PORT` (or `[::1]:PORT`) and `localhost:PORT`. Any axum listener serves:
    /// a `TcpListener`, or one that makes a TLS handshake on each connection first.
    ///
    /// No connection holds the server for long: a request's headers must arrive within 10
    /// seconds of the connection waiting for one (which also ends an idle keep-alive
    /// connection), a request is answered within 30 seconds (else 408), a connection lives
    /// at most 5 minutes, and at most 1024 are open at once, 64 of them from one address
    /// (an IPv6 /64; 512 from the [trusted proxies](Admin::trusted_proxies) together) (one more is
    /// closed unanswered). Each request carries its peer's address as axum's
    /// [`ConnectInfo`](axum::extract::ConnectInfo), which the
    /// [`credential`](Admin::credential)'s throttle keys on.
    ///
    /// ```no_run
    /// # use std::sync::Arc;
    /// # async fn run(mailer: Arc<mail_breaker::Mailer>) -> std::io::Result<()> {
    /// let admin = mail_breaker::admin::Admin::new(mailer);
    /// let listener = tokio::net::TcpListener::bind("127.0.0.1:8025").await?;
    /// println!("the operator page: http://{}/", listener.local_addr()?);
    /// admin.serve(listener).await
    /// # }
    /// ```
    pub async fn serve<L>(&self, listener: L) -> std::io::Result<()>
    where
        L: axum::serve::Listener<Addr = std::net::SocketAddr>,
    {
        self.serve_beside(listener, Router::new()).await
    }

    /// Serves the page as [`serve`](Self::serve) does, with `beside`'s routes next to it
    /// and outside its checks: no host, token, origin or credential is asked of them, so
    /// each must authenticate its requests itself (the webhook receivers, which
    /// `mail-breaker serve` mounts at `/webhooks/`). Their paths must not be the page's.
    ///
    /// ```no_run
    /// # use std::sync::Arc;
    /// # async fn run(mailer: Arc<mail_breaker::Mailer>, receivers: axum::Router) -> std::io::Result<()> {
    /// // `receivers`: `Router::new().nest("/webhooks", mailer.webhooks()?.router())`.
    /// let admin = mail_breaker::admin::Admin::new(mailer);
    /// let listener = tokio::net::TcpListener::bind("127.0.0.1:8025").await?;
    /// admin.serve_beside(listener, receivers).await
    /// # }
    /// ```
    pub async fn serve_beside<L>(&self, listener: L, beside: Router) -> std::io::Result<()>
    where
        L: axum::serve::Listener<Addr = std::net::SocketAddr>,
    {
        let loopback = guard::loopback_hosts(listener.local_addr()?);
        let admin = match loopback {
            Some(hosts) if self.shared.hosts.is_none() => self.clone().allow_hosts(hosts),
            _ => self.clone(),
        };
        // The page's checks are layers of its own router: merged, they stay on its routes.
        let proxies = Arc::clone(&admin.shared.trusted_proxies);
        serve::serve(listener, beside.merge(admin.router()), proxies).await
    }
}

/// Serves `router` alone on `listener`, its connections held within the bounds
/// [`Admin::serve`] holds the page's to (headers within 10 s, a request 30 s, a connection 5
/// minutes, 1024 at once): what `mail-breaker serve --webhooks-only` serves the receivers
/// with.
///
/// ```no_run
/// # async fn run(receivers: axum::Router) -> std::io::Result<()> {
/// // `receivers`: the webhooks' router, which checks each request itself.
/// let app = axum::Router::new().nest("/webhooks", receivers);
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:8026").await?;
/// mail_breaker::admin::serve_bounded(listener, app).await
/// # }
/// ```
pub async fn serve_bounded<L>(listener: L, router: Router) -> std::io::Result<()>
where
    L: axum::serve::Listener<Addr = std::net::SocketAddr>,
{
    serve::serve(listener, router, Arc::from([])).await
}

/// `Admin::new(mailer).router()`: the page with its actions behind a random token.
pub fn router(mailer: Arc<Mailer>) -> Router {
    Admin::new(mailer).router()
}

impl Shared {
    /// Keeps a reading of the outbox for the chart, unless one was kept less than `every` ago.
    pub(crate) fn keep(&self, sample: chart::Sample, every: Duration) {
        let mut history = self.history.lock().unwrap_or_else(PoisonError::into_inner);
        chart::keep(&mut history, sample, every, Instant::now());
    }

    /// The chart's readings, oldest first.
    pub(crate) fn history(&self) -> Vec<chart::Sample> {
        let history = self.history.lock().unwrap_or_else(PoisonError::into_inner);
        history.iter().copied().collect()
    }
}

/// The path the router is mounted at (`""` at the root, `/ops/mail` under `nest`), from the
/// request's path as it came (`original`) and as the router sees it (`routed`).
pub(crate) fn mount_path<'a>(original: &'a str, routed: &str) -> &'a str {
    match original.strip_suffix(routed) {
        Some(mount) => mount,
        // `nest("/ops/mail", ..)` routes `/ops/mail` itself to `/`.
        None if routed == "/" => original.trim_end_matches('/'),
        None => "",
    }
}

/// What the sampler holds: the page's state while anything else does.
pub(crate) type WeakShared = Weak<Shared>;

#[cfg(test)]
mod tests {
    use super::mount_path;

    #[test]
    fn the_mount_is_what_the_request_path_holds_before_the_routed_one() {
        assert_eq!(mount_path("/ops/mail/api/dead", "/api/dead"), "/ops/mail");
        assert_eq!(mount_path("/api/dead", "/api/dead"), "");
    }

    #[test]
    fn a_router_nested_at_a_path_sees_that_path_itself_as_its_root() {
        assert_eq!(mount_path("/ops/mail", "/"), "/ops/mail");
        assert_eq!(mount_path("/ops/mail/", "/"), "/ops/mail");
    }

    #[test]
    fn a_routed_path_that_does_not_end_the_request_path_mounts_the_page_at_the_root() {
        assert_eq!(mount_path("/ops/mail/api/dead", "/api/breakers"), "");
    }
}
