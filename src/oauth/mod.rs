//! SMTP with OAuth 2.0 (DESIGN §16): the client logs in with `XOAUTH2` or `OAUTHBEARER`
//! (RFC 7628) and a token from a [`TokenSource`], given to
//! [`SmtpBuilder::oauth2`](crate::SmtpBuilder::oauth2).
//!
//! The transport keeps a token until a minute before it expires, for every connection it
//! opens; a server that refuses a token (`535`, or a `334` error challenge) gets one more,
//! fetched afresh, and a second refusal is the send's answer, `Authentication`. A token, a
//! client secret and a refresh token are never logged, never in a `Debug`, never in an error.
//!
//! Where the login meets SMTP (DESIGN §19):
//! - a token fetch is bounded by its source (the built-in ones by their `timeout`) and by
//!   [`TOKEN_FETCH_LIMIT`], not by the SMTP `connect_timeout`, which counts the server's time
//!   only: a slow token endpoint is never reported as the mail server's `smtp.timeout`;
//! - a failed fetch is remembered for [`FAILED_FETCH_BACKOFF`] and answered again, not
//!   attempted, by every send and every address of the host meanwhile: one request to a
//!   failing endpoint, not one per send;
//! - a fetch runs to its end in a task of its own, so a send that gives up on it (cut by a
//!   timeout, dropped) loses nothing: a refresh token the server rotated is kept;
//! - a `530` or `535` to `MAIL FROM` on a kept session (its token expired meanwhile) closes
//!   that session, forgets the token and sends on a new connection with a new one, once.
//!
//! With feature `oauth2`, two sources are built in, each over HTTPS to the provider's token
//! endpoint: [`ClientCredentials`] (an application's own identity: Microsoft 365's
//! client-credentials flow) and [`RefreshToken`] (a user's consent, kept as a refresh
//! token: Gmail, Google Workspace, Microsoft's delegated flow; a new refresh token the
//! server returns is kept and used next).
//!
//! # Sending through Microsoft 365
//! Microsoft 365 turns SMTP AUTH with passwords off by default at the end of December 2026.
//! Register an application in Microsoft Entra ID, give it the `SMTP.SendAsApp` permission of
//! Office 365 Exchange Online with admin consent, register its service principal in Exchange
//! Online (`New-ServicePrincipal`) and give it the mailbox (`Add-MailboxPermission`), and
//! turn SMTP AUTH on for that mailbox. Then the client-credentials flow, scope
//! `https://outlook.office365.com/.default`, to `smtp.office365.com:587` with STARTTLS:
//!
//! ```no_run
//! # #[cfg(feature = "oauth2")]
//! # fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use mail_breaker::oauth::{ClientCredentials, OAuthMechanism};
//! use mail_breaker::SmtpTransport;
//!
//! let tenant = std::env::var("TENANT_ID")?;
//! let tokens = ClientCredentials {
//!     token_url: format!("https://login.microsoftonline.com/{tenant}/oauth2/v2.0/token"),
//!     client_id: std::env::var("CLIENT_ID")?,
//!     client_secret: std::env::var("CLIENT_SECRET")?,
//!     scope: "https://outlook.office365.com/.default".to_owned(),
//! }
//! .build()?;
//! let smtp = SmtpTransport::starttls_relay("smtp.office365.com")?
//!     .oauth2("noreply@example.com", tokens)
//!     .oauth2_mechanism(OAuthMechanism::XOAuth2)
//!     .build()?;
//! # Ok(()) }
//! ```
//!
//! Or in a DSN (`Mailer::from_dsn`, feature `config`):
//! `smtp://noreply%40example.com@smtp.office365.com:587?auth=xoauth2&oauth2.token_url=https://login.microsoftonline.com/TENANT/oauth2/v2.0/token&oauth2.client_id=ID&oauth2.client_secret=${CLIENT_SECRET}&oauth2.scope=https://outlook.office365.com/.default`.
//!
//! # Sending through Gmail and Google Workspace
//! Google allows SMTP only with OAuth 2.0 (or an app password). Create an OAuth client in
//! the Google Cloud console, have the account consent once to the scope
//! `https://mail.google.com/` (any OAuth tool that gives a refresh token), and keep the
//! refresh token as a secret. Then the refresh-token flow to `smtp.gmail.com:587`:
//!
//! ```no_run
//! # #[cfg(feature = "oauth2")]
//! # fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use mail_breaker::oauth::RefreshToken;
//! use mail_breaker::SmtpTransport;
//!
//! let tokens = RefreshToken {
//!     token_url: "https://oauth2.googleapis.com/token".to_owned(),
//!     client_id: std::env::var("GOOGLE_CLIENT_ID")?,
//!     client_secret: std::env::var("GOOGLE_CLIENT_SECRET")?,
//!     refresh_token: std::env::var("GOOGLE_REFRESH_TOKEN")?,
//! }
//! .build()?;
//! let smtp = SmtpTransport::starttls_relay("smtp.gmail.com")?
//!     .oauth2("me@gmail.com", tokens)
//!     .build()?;
//! # Ok(()) }
//! ```
//!
//! In a DSN: `smtp://me%40gmail.com@smtp.gmail.com:587?auth=xoauth2&oauth2.token_url=https://oauth2.googleapis.com/token&oauth2.client_id=ID&oauth2.client_secret=${GOOGLE_CLIENT_SECRET}&oauth2.refresh_token=${GOOGLE_REFRESH_TOKEN}`.
//! Microsoft's delegated flow is the same with Microsoft's token URL and its refresh token.
//!
//! # A source of one's own
//! Any [`TokenSource`] will do: a token from a secrets manager, a workload identity, a
//! sidecar.
//!
//! ```
//! use std::time::Duration;
//! use mail_breaker::oauth::{AccessToken, TokenSource};
//! use mail_breaker::SendError;
//!
//! struct FromVault;
//!
//! #[async_trait::async_trait]
//! impl TokenSource for FromVault {
//!     async fn token(&self) -> Result<AccessToken, SendError> {
//!         Ok(AccessToken::new("ya29.a0...").expires_in(Duration::from_secs(3600)))
//!     }
//! }
//!
//! let smtp = mail_breaker::SmtpTransport::starttls_relay("smtp.gmail.com")?
//!     .oauth2("me@gmail.com", FromVault)
//!     .build()?;
//! # Ok::<(), mail_breaker::ConfigError>(())
//! ```

#[cfg(feature = "oauth2")]
mod endpoint;
#[cfg(feature = "oauth2")]
mod settings;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use tokio::time::Instant;

use crate::SendError;

#[cfg(feature = "oauth2")]
pub use endpoint::TokenEndpoint;
#[cfg(feature = "oauth2")]
pub use settings::{ClientCredentials, InsecureHttp, RefreshToken};

/// How long before its expiry a token is no longer used: it is fetched afresh instead.
pub const REFRESH_BEFORE_EXPIRY: Duration = Duration::from_secs(60);

/// An OAuth 2.0 access token and when it expires. Its `Debug` shows `***`, never the token.
///
/// ```
/// use std::time::Duration;
/// use mail_breaker::oauth::AccessToken;
///
/// let token = AccessToken::new("ya29.secret").expires_in(Duration::from_secs(3600));
/// assert_eq!(token.secret(), "ya29.secret");
/// assert!(!format!("{token:?}").contains("ya29"));
/// ```
#[derive(Clone)]
pub struct AccessToken {
    secret: Arc<str>,
    expires_at: Option<Instant>,
}

impl AccessToken {
    /// A token whose expiry is not known: used until a server refuses it.
    pub fn new(secret: impl Into<String>) -> AccessToken {
        AccessToken {
            secret: Arc::from(secret.into()),
            expires_at: None,
        }
    }

    /// The same token, expiring `lifetime` from now (a token endpoint's `expires_in`).
    pub fn expires_in(mut self, lifetime: Duration) -> AccessToken {
        self.expires_at = Some(crate::time::later(Instant::now(), lifetime));
        self
    }

    /// The token itself, to put in a request: never log it.
    pub fn secret(&self) -> &str {
        &self.secret
    }

    /// When it expires, if known.
    pub fn expires_at(&self) -> Option<Instant> {
        self.expires_at
    }

    /// Whether it may still be used at `now`: more than [`REFRESH_BEFORE_EXPIRY`] before
    /// its expiry, or its expiry unknown.
    pub fn is_fresh(&self, now: Instant) -> bool {
        self.expires_at.is_none_or(|at| {
            at.checked_duration_since(now)
                .is_some_and(|left| left > REFRESH_BEFORE_EXPIRY)
        })
    }
}

impl fmt::Debug for AccessToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AccessToken")
            .field("secret", &"***")
            .field("expires_at", &self.expires_at)
            .finish()
    }
}

impl PartialEq for AccessToken {
    /// The same token (whatever its expiry).
    fn eq(&self, other: &AccessToken) -> bool {
        self.secret == other.secret
    }
}

/// Where an SMTP transport gets its OAuth 2.0 tokens. The transport keeps each token until
/// a minute before it expires; a source need not keep them itself.
///
/// An error is the send's answer: `Authentication` for credentials the provider refused
/// (a revoked refresh token), `Configuration` for a source that cannot work as set, and the
/// network's categories for an endpoint that cannot be reached, so a breaker counts them as
/// it counts the provider's own.
#[async_trait::async_trait]
pub trait TokenSource: Send + Sync {
    /// A token to log in with.
    async fn token(&self) -> Result<AccessToken, SendError>;

    /// A server refused `token`: a source that keeps tokens should not give it again. The
    /// transport asks for a token once more after this.
    async fn refused(&self, _token: &AccessToken) {}
}

#[async_trait::async_trait]
impl<S: TokenSource + ?Sized> TokenSource for Arc<S> {
    async fn token(&self) -> Result<AccessToken, SendError> {
        (**self).token().await
    }

    async fn refused(&self, token: &AccessToken) {
        (**self).refused(token).await
    }
}

/// The SASL mechanism an OAuth 2.0 login speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OAuthMechanism {
    /// Google's and Microsoft's `XOAUTH2`.
    XOAuth2,
    /// RFC 7628's `OAUTHBEARER`.
    OAuthBearer,
}

impl OAuthMechanism {
    /// Its name in `AUTH` and in EHLO.
    pub fn name(self) -> &'static str {
        match self {
            OAuthMechanism::XOAuth2 => "XOAUTH2",
            OAuthMechanism::OAuthBearer => "OAUTHBEARER",
        }
    }

    /// The initial response (base64) for `user` with `token`; OAUTHBEARER also names the
    /// server's `host` and `port` (RFC 7628 §3.1).
    pub(crate) fn initial_response(
        self,
        user: &str,
        token: &AccessToken,
        host: &str,
        port: u16,
    ) -> String {
        let text = match self {
            OAuthMechanism::XOAuth2 => {
                format!("user={user}\x01auth=Bearer {}\x01\x01", token.secret())
            }
            OAuthMechanism::OAuthBearer => {
                // RFC 5801's saslname: `=` and `,` escaped.
                let user = user.replace('=', "=3D").replace(',', "=2C");
                format!(
                    "n,a={user},\x01host={host}\x01port={port}\x01auth=Bearer {}\x01\x01",
                    token.secret()
                )
            }
        };
        BASE64.encode(text)
    }

    /// What the client answers a `334` error challenge with, to end the exchange and read
    /// the server's final reply: an empty line for XOAUTH2, `%x01` for OAUTHBEARER (RFC 7628
    /// §3.2.3).
    pub(crate) fn end_of_failed_exchange(self) -> &'static str {
        match self {
            OAuthMechanism::XOAuth2 => "",
            OAuthMechanism::OAuthBearer => "AQ==",
        }
    }
}

/// A token kept until a minute before it expires, fetched once for all who ask at once: the
/// built-in token endpoints' own cache.
#[cfg(feature = "oauth2")]
#[derive(Default)]
pub(crate) struct TokenCache {
    current: tokio::sync::Mutex<Option<AccessToken>>,
}

#[cfg(feature = "oauth2")]
impl TokenCache {
    /// The kept token while fresh, else one `fetch` gives (and is kept).
    pub(crate) async fn get<F>(&self, fetch: F) -> Result<AccessToken, SendError>
    where
        F: std::future::Future<Output = Result<AccessToken, SendError>>,
    {
        let mut current = self.current.lock().await;
        if let Some(token) = current
            .as_ref()
            .filter(|token| token.is_fresh(Instant::now()))
        {
            return Ok(token.clone());
        }
        let token = fetch.await?;
        *current = Some(token.clone());
        Ok(token)
    }

    /// Forgets `token` if it is the one kept.
    pub(crate) async fn forget(&self, token: &AccessToken) {
        let mut current = self.current.lock().await;
        if current.as_ref() == Some(token) {
            *current = None;
        }
    }
}

/// How long a failed token fetch is remembered and answered again, without asking the
/// endpoint: a thousand sends to a host with three addresses, the endpoint down, make one
/// request, not three thousand.
pub const FAILED_FETCH_BACKOFF: Duration = Duration::from_secs(5);

/// The longest a token fetch may take when its source has no bound of its own; the built-in
/// sources answer within their `timeout` (30 s by default), well before it.
pub const TOKEN_FETCH_LIMIT: Duration = Duration::from_secs(120);

/// What an OAuth 2.0 login keeps between sends: its token, or the failure of its last fetch
/// until [`FAILED_FETCH_BACKOFF`] has passed.
#[derive(Default)]
struct Kept {
    token: Option<AccessToken>,
    failed: Option<(SendError, Instant)>,
}

/// An SMTP transport's OAuth 2.0 login: the mailbox, the source and its kept token, and the
/// mechanism if the builder chose one. Shared by every connection of the transport.
pub(crate) struct OAuthLogin {
    pub(crate) user: String,
    source: Arc<dyn TokenSource>,
    kept: Arc<tokio::sync::Mutex<Kept>>,
    pub(crate) mechanism: Option<OAuthMechanism>,
}

impl OAuthLogin {
    pub(crate) fn new(
        user: String,
        source: Box<dyn TokenSource>,
        mechanism: Option<OAuthMechanism>,
    ) -> OAuthLogin {
        OAuthLogin {
            user,
            source: Arc::from(source),
            kept: Arc::default(),
            mechanism,
        }
    }

    /// The kept token while fresh, else a new one from the source, fetched once for all who
    /// ask at once (DESIGN §19):
    /// - a failed fetch is kept for [`FAILED_FETCH_BACKOFF`] and answered again, marked
    ///   [not attempted](SendError::is_not_attempted), without asking the source;
    /// - the fetch runs in a task of its own, which keeps the lock while it runs: a caller
    ///   that gives up (its send cut by a timeout, or dropped) loses nothing the fetch
    ///   brings, such as a refresh token the server rotated, and the next caller gets it;
    /// - a source that never answers is cut at [`TOKEN_FETCH_LIMIT`].
    pub(crate) async fn token(&self) -> Result<AccessToken, SendError> {
        let mut kept = Arc::clone(&self.kept).lock_owned().await;
        let now = Instant::now();
        if let Some(token) = kept.token.as_ref().filter(|token| token.is_fresh(now)) {
            return Ok(token.clone());
        }
        if let Some(remembered) = remembered(&kept, now) {
            return Err(remembered);
        }
        let source = Arc::clone(&self.source);
        let fetch = tokio::spawn(async move {
            let fetched = match tokio::time::timeout(TOKEN_FETCH_LIMIT, source.token()).await {
                Ok(fetched) => fetched,
                Err(_elapsed) => Err(SendError::fixed(
                    crate::Category::Timeout,
                    "oauth2.timeout",
                    "the token source did not answer within its limit",
                )),
            };
            match &fetched {
                Ok(token) => {
                    kept.token = Some(token.clone());
                    kept.failed = None;
                }
                Err(error) => {
                    let until = crate::time::later(Instant::now(), FAILED_FETCH_BACKOFF);
                    kept.failed = Some((error.clone(), until));
                }
            }
            fetched
        });
        match fetch.await {
            Ok(fetched) => fetched,
            // The source's bug, not this message's: a panic of the member's login.
            Err(failed) if failed.is_panic() => Err(SendError::fixed(
                crate::Category::Configuration,
                "oauth2.panicked",
                "the token source panicked",
            )),
            Err(_cancelled) => Err(SendError::fixed(
                crate::Category::Configuration,
                "oauth2.cancelled",
                "the token fetch was cancelled: the runtime is shutting down",
            )),
        }
    }

    /// The failure of the last fetch while it is remembered: checked before a connection
    /// is opened, so that a login that cannot work costs the mail server nothing.
    pub(crate) async fn remembered_failure(&self) -> Option<SendError> {
        remembered(&*self.kept.lock().await, Instant::now())
    }

    /// A server refused `token`: neither the transport nor the source gives it again.
    pub(crate) async fn refused(&self, token: &AccessToken) {
        {
            let mut kept = self.kept.lock().await;
            if kept.token.as_ref() == Some(token) {
                kept.token = None;
            }
        }
        self.source.refused(token).await;
    }
}

/// The remembered failure at `now`, if its backoff has not passed: answered again as a
/// refusal of every message through this login, not attempted, due again when it ends.
fn remembered(kept: &Kept, now: Instant) -> Option<SendError> {
    let (error, until) = kept.failed.as_ref()?;
    let left = until
        .checked_duration_since(now)
        .filter(|left| !left.is_zero())?;
    Some(
        error
            .clone()
            .not_attempted()
            .refusing_every_message()
            .with_retry_after(left),
    )
}

impl fmt::Debug for OAuthLogin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OAuthLogin")
            .field("mechanism", &self.mechanism)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// A source that gives `token-N` (N counting from 1), each expiring after `lifetime`.
    struct Counting {
        fetched: AtomicUsize,
        lifetime: Duration,
    }

    #[async_trait::async_trait]
    impl TokenSource for Counting {
        async fn token(&self) -> Result<AccessToken, SendError> {
            let n = self.fetched.fetch_add(1, Ordering::SeqCst) + 1;
            Ok(AccessToken::new(format!("token-{n}")).expires_in(self.lifetime))
        }
    }

    fn login(lifetime: Duration) -> OAuthLogin {
        let source = Counting {
            fetched: AtomicUsize::new(0),
            lifetime,
        };
        OAuthLogin::new("me@example.com".to_owned(), Box::new(source), None)
    }

    #[tokio::test(start_paused = true)]
    async fn a_token_is_kept_until_a_minute_before_it_expires() {
        let login = login(Duration::from_secs(3600));
        assert_eq!(login.token().await.unwrap().secret(), "token-1");
        tokio::time::advance(Duration::from_secs(3600 - 61)).await;
        assert_eq!(login.token().await.unwrap().secret(), "token-1");
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(login.token().await.unwrap().secret(), "token-2");
    }

    #[tokio::test(start_paused = true)]
    async fn a_refused_token_is_fetched_afresh() {
        let login = login(Duration::from_secs(3600));
        let first = login.token().await.unwrap();
        login.refused(&first).await;
        assert_eq!(login.token().await.unwrap().secret(), "token-2");
    }

    #[tokio::test(start_paused = true)]
    async fn a_token_without_an_expiry_is_kept_until_refused() {
        struct Once;
        #[async_trait::async_trait]
        impl TokenSource for Once {
            async fn token(&self) -> Result<AccessToken, SendError> {
                Ok(AccessToken::new("forever"))
            }
        }
        let login = OAuthLogin::new("u".to_owned(), Box::new(Once), None);
        let token = login.token().await.unwrap();
        tokio::time::advance(Duration::from_secs(365 * 86_400)).await;
        assert_eq!(login.token().await.unwrap(), token);
    }

    /// Counts its fetches; each takes `delay` and gives `token-N`, or fails if `fail`.
    struct Delayed {
        fetched: Arc<AtomicUsize>,
        delay: Duration,
        fail: bool,
    }

    #[async_trait::async_trait]
    impl TokenSource for Delayed {
        async fn token(&self) -> Result<AccessToken, SendError> {
            let n = self.fetched.fetch_add(1, Ordering::SeqCst) + 1;
            tokio::time::sleep(self.delay).await;
            if self.fail {
                return Err(SendError::new(
                    crate::Category::Network,
                    "oauth2.network",
                    "down",
                ));
            }
            Ok(AccessToken::new(format!("token-{n}")).expires_in(Duration::from_secs(3600)))
        }
    }

    fn delayed(delay: Duration, fail: bool) -> (OAuthLogin, Arc<AtomicUsize>) {
        let fetched = Arc::new(AtomicUsize::new(0));
        let source = Delayed {
            fetched: Arc::clone(&fetched),
            delay,
            fail,
        };
        let login = OAuthLogin::new("u".to_owned(), Box::new(source), None);
        (login, fetched)
    }

    #[tokio::test(start_paused = true)]
    async fn a_fetch_whose_caller_gave_up_still_keeps_its_token_for_the_next_caller() {
        let (login, fetched) = delayed(Duration::from_secs(10), false);
        let cut = tokio::time::timeout(Duration::from_secs(1), login.token()).await;
        assert!(cut.is_err(), "the caller gave up");
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(login.token().await.unwrap().secret(), "token-1");
        assert_eq!(fetched.load(Ordering::SeqCst), 1, "kept, not fetched again");
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_fetch_is_answered_from_memory_until_its_backoff_ends() {
        let (login, fetched) = delayed(Duration::ZERO, true);
        let first = login.token().await.unwrap_err();
        assert!(!first.is_not_attempted(), "the fetch itself is the news");
        let again = login.token().await.unwrap_err();
        assert_eq!(again.code(), "oauth2.network");
        assert!(again.is_not_attempted(), "remembered: nothing was tried");
        assert_eq!(fetched.load(Ordering::SeqCst), 1);
        tokio::time::advance(FAILED_FETCH_BACKOFF).await;
        login.token().await.unwrap_err();
        assert_eq!(
            fetched.load(Ordering::SeqCst),
            2,
            "asked again after the backoff"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_source_that_never_answers_is_cut_at_the_fetch_limit() {
        let (login, _) = delayed(Duration::from_secs(86_400), false);
        let error = login.token().await.unwrap_err();
        assert_eq!(error.code(), "oauth2.timeout");
    }

    #[test]
    fn the_initial_responses_are_the_mechanisms_own() {
        let token = AccessToken::new("tok");
        let decode = |text: String| String::from_utf8(BASE64.decode(text).unwrap()).unwrap();
        assert_eq!(
            decode(OAuthMechanism::XOAuth2.initial_response("a@b.c", &token, "h", 587)),
            "user=a@b.c\x01auth=Bearer tok\x01\x01"
        );
        assert_eq!(
            decode(OAuthMechanism::OAuthBearer.initial_response("a=,b", &token, "h", 587)),
            "n,a=a=3D=2Cb,\x01host=h\x01port=587\x01auth=Bearer tok\x01\x01"
        );
    }

    #[test]
    fn a_token_never_shows_in_a_debug() {
        let token = AccessToken::new("hunter2-token").expires_in(Duration::from_secs(5));
        assert!(!format!("{token:?}").contains("hunter2"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_tokens_expiry_is_its_lifetime_from_now_and_unknown_without_one() {
        let now = Instant::now();
        let token = AccessToken::new("t").expires_in(Duration::from_secs(90));
        assert_eq!(token.expires_at(), Some(now + Duration::from_secs(90)));
        assert_eq!(AccessToken::new("t").expires_at(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_tokens_debug_shows_its_expiry_and_stars_for_the_secret() {
        let token = AccessToken::new("hunter2-token").expires_in(Duration::from_secs(5));
        let shown = format!("{token:?}");
        assert!(shown.starts_with("AccessToken"), "{shown}");
        assert!(shown.contains("***"), "{shown}");
        assert!(shown.contains("expires_at: Some("), "{shown}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_late_refusal_of_a_token_no_longer_kept_leaves_the_kept_one() {
        let login = login(Duration::from_secs(3600));
        let first = login.token().await.unwrap();
        login.refused(&first).await;
        assert_eq!(login.token().await.unwrap().secret(), "token-2");
        // Another connection refused the first token too, after the second was fetched.
        login.refused(&first).await;
        assert_eq!(login.token().await.unwrap().secret(), "token-2");
    }

    #[tokio::test]
    async fn a_source_shared_through_an_arc_hears_of_each_refusal() {
        #[derive(Default)]
        struct Listening {
            refused: std::sync::Mutex<Vec<String>>,
        }
        #[async_trait::async_trait]
        impl TokenSource for Listening {
            async fn token(&self) -> Result<AccessToken, SendError> {
                Ok(AccessToken::new("only"))
            }
            async fn refused(&self, token: &AccessToken) {
                let mut refused = self.refused.lock().unwrap_or_else(|e| e.into_inner());
                refused.push(token.secret().to_owned());
            }
        }
        let source = Arc::new(Listening::default());
        let login = OAuthLogin::new("u".to_owned(), Box::new(Arc::clone(&source)), None);
        let token = login.token().await.unwrap();
        login.refused(&token).await;
        assert_eq!(*source.refused.lock().unwrap(), ["only"]);
    }

    #[test]
    fn a_failed_exchange_is_ended_with_an_empty_line_for_xoauth2_and_x01_for_oauthbearer() {
        // RFC 7628 §3.2.3: the client answers the server's error challenge with a single
        // %x01; Google's XOAUTH2 protocol asks for an empty response.
        let decode = |text: &str| BASE64.decode(text).unwrap();
        assert_eq!(
            decode(OAuthMechanism::XOAuth2.end_of_failed_exchange()),
            b""
        );
        assert_eq!(
            decode(OAuthMechanism::OAuthBearer.end_of_failed_exchange()),
            b"\x01"
        );
    }

    #[test]
    fn a_logins_debug_names_its_mechanism_and_nothing_of_its_token() {
        let login = OAuthLogin::new(
            "me@example.com".to_owned(),
            Box::new(Counting {
                fetched: AtomicUsize::new(0),
                lifetime: Duration::from_secs(60),
            }),
            Some(OAuthMechanism::OAuthBearer),
        );
        assert_eq!(
            format!("{login:?}"),
            "OAuthLogin { mechanism: Some(OAuthBearer), .. }"
        );
    }
}
