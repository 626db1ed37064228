//! Who may use the page at all: a bearer token, or a user and a password, asked of every
//! request ([`Admin::credential`](super::Admin::credential)).

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::extract::{ConnectInfo, Request};
use axum::http::header::{AUTHORIZATION, RETRY_AFTER, WWW_AUTHENTICATE};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use tokio::time::Instant;

use super::text::Escaped;
use super::throttle::Throttle;
use crate::ConfigError;

/// The shortest bearer token and the shortest password a [`Credential`] takes.
const SHORTEST_TOKEN: usize = 16;
const SHORTEST_PASSWORD: usize = 12;

/// What every request to the page must carry when the page is given one with
/// [`Admin::credential`](super::Admin::credential): a bearer token (`Authorization: Bearer
/// TOKEN`, for scripts and proxies) or a user and a password (HTTP Basic, which a browser
/// asks its user for). It is compared in a time that does not depend on where it differs.
///
/// Over plain HTTP it crosses the network in clear: serve the page over TLS, or behind a
/// proxy that terminates TLS.
///
/// ```
/// use mail_breaker::admin::Credential;
///
/// let token = Credential::bearer("a-token-of-at-least-16-characters")?;
/// let user = Credential::user("ops", "a long password")?;
/// assert!(Credential::bearer("short").is_err());
/// assert!(!format!("{user:?}").contains("a long password"));
/// # Ok::<(), mail_breaker::ConfigError>(())
/// ```
///
/// Two credentials are not compared with `==`, whose time would tell where they first
/// differ: only the page compares what a request carries, in constant time.
///
/// ```compile_fail
/// use mail_breaker::admin::Credential;
///
/// fn same(a: &Credential, b: &Credential) -> bool {
///     a == b
/// }
/// ```
#[derive(Clone)]
pub struct Credential {
    kind: Kind,
}

#[derive(Clone)]
enum Kind {
    Bearer(String),
    User { user: String, password: String },
}

impl Credential {
    /// A bearer token: at least 16 characters of letters, digits and `-._~+/` (with `=` at
    /// the end only), as `Authorization: Bearer` carries it.
    pub fn bearer(token: impl Into<String>) -> Result<Credential, ConfigError> {
        let token = token.into();
        let body = token.trim_end_matches('=');
        let fits = |c: char| c.is_ascii_alphanumeric() || "-._~+/".contains(c);
        if token.len() < SHORTEST_TOKEN || body.is_empty() || !body.chars().all(fits) {
            return Err(ConfigError::new(
                "credential.token",
                format!(
                    "must be at least {SHORTEST_TOKEN} characters of letters, digits and \
                     '-._~+/' (with '=' only at the end)"
                ),
            ));
        }
        Ok(Credential {
            kind: Kind::Bearer(token),
        })
    }

    /// A user and a password, which a browser asks for (HTTP Basic): the user not empty and
    /// without `:`, the password at least 12 characters; neither with control characters.
    pub fn user(
        user: impl Into<String>,
        password: impl Into<String>,
    ) -> Result<Credential, ConfigError> {
        let (user, password) = (user.into(), password.into());
        if user.is_empty() || user.contains(':') || user.chars().any(char::is_control) {
            return Err(ConfigError::new(
                "credential.user",
                "must not be empty, and holds no ':' and no control character",
            ));
        }
        if password.chars().count() < SHORTEST_PASSWORD || password.chars().any(char::is_control) {
            return Err(ConfigError::new(
                "credential.password",
                format!(
                    "must be at least {SHORTEST_PASSWORD} characters, none of them a control \
                     character"
                ),
            ));
        }
        Ok(Credential {
            kind: Kind::User { user, password },
        })
    }

    /// Whether `headers` carry this credential in their `Authorization`.
    pub(crate) fn admits(&self, headers: &HeaderMap) -> bool {
        let Some(given) = headers
            .get(AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
        else {
            return false;
        };
        let Some((scheme, value)) = given.trim().split_once(' ') else {
            return false;
        };
        let value = value.trim();
        match &self.kind {
            Kind::Bearer(token) => {
                scheme.eq_ignore_ascii_case("bearer")
                    && super::guard::equal(value.as_bytes(), token.as_bytes())
            }
            Kind::User { user, password } => {
                if !scheme.eq_ignore_ascii_case("basic") {
                    return false;
                }
                let Ok(decoded) = base64::engine::general_purpose::STANDARD.decode(value) else {
                    return false;
                };
                let Some(colon) = decoded.iter().position(|&byte| byte == b':') else {
                    return false;
                };
                let (given_user, given_password) = (&decoded[..colon], &decoded[colon + 1..]);
                // Both compared whatever the first says: how long an answer takes tells
                // nothing of which was wrong.
                let user_matches = super::guard::equal(given_user, user.as_bytes());
                let password_matches = super::guard::equal(given_password, password.as_bytes());
                user_matches & password_matches
            }
        }
    }

    /// The challenge of a 401: what a browser (or a script) is to answer with.
    fn challenge(&self) -> HeaderValue {
        HeaderValue::from_static(match self.kind {
            Kind::Bearer(_) => "Bearer realm=\"mail-breaker\"",
            Kind::User { .. } => "Basic realm=\"mail-breaker\", charset=\"UTF-8\"",
        })
    }
}

impl fmt::Debug for Credential {
    /// The kind and the user; never the token or the password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Bearer(_) => f.write_str("Credential::Bearer(***)"),
            Kind::User { user, .. } => f
                .debug_struct("Credential::User")
                .field("user", user)
                .field("password", &"***")
                .finish(),
        }
    }
}

/// The wrong credentials counted for a page: of each client, of each client's network, and
/// of each trusted proxy as a whole (see [`throttle`](super::throttle)).
#[derive(Debug)]
pub(crate) struct Throttles {
    clients: Throttle,
    networks: Throttle,
    proxies: Throttle,
    /// The clients that gave the right credential lately: a network or a proxy held back
    /// for the wrong ones of others still lets them through.
    admitted: super::throttle::Admitted,
}

impl Default for Throttles {
    fn default() -> Throttles {
        Throttles {
            clients: Throttle::default(),
            networks: Throttle::allowing(super::throttle::WRONG_FROM_A_NETWORK_AT_MOST),
            proxies: Throttle::allowing(super::throttle::WRONG_THROUGH_A_PROXY_AT_MOST),
            admitted: super::throttle::Admitted::default(),
        }
    }
}

/// The middleware of [`Admin::credential`](super::Admin::credential): 401 with a challenge
/// for a request without the credential, and 429 for every request of a peer that sent too
/// many wrong ones lately ([`throttle`](super::throttle)).
pub(crate) async fn required(
    credential: Arc<Credential>,
    throttles: Arc<Throttles>,
    proxies: Arc<[IpAddr]>,
    request: Request,
    next: Next,
) -> Response {
    let connected = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(address)| address.ip());
    let peer =
        connected.map(|address| super::throttle::client(address, request.headers(), &proxies));
    // The trusted proxy the request came through, counted as a whole as well.
    let proxy = connected.filter(|address| super::throttle::is_trusted(*address, &proxies));
    let network = peer.map(super::throttle::network_of);
    let throttle = &throttles.clients;
    let now = Instant::now();
    // A network or a proxy held back keeps out whom it does not know, not a client admitted
    // lately.
    let held = throttle.held(peer, now).or_else(|| {
        if peer.is_some_and(|peer| throttles.admitted.lately(peer, now)) {
            return None;
        }
        throttles
            .networks
            .held(network, now)
            .or_else(|| proxy.and_then(|proxy| throttles.proxies.held(Some(proxy), now)))
    });
    if let Some(wait) = held {
        // Whatever it carries: a guess answered 200 here would let the guessing go on.
        let seconds = wait.as_secs().saturating_add(1);
        return (
            StatusCode::TOO_MANY_REQUESTS,
            [(RETRY_AFTER, HeaderValue::from(seconds))],
            "too many wrong credentials from this address: try again later\n",
        )
            .into_response();
    }
    if credential.admits(request.headers()) {
        throttle.admitted(peer);
        if let Some(peer) = peer {
            throttles.admitted.note(peer, now);
        }
        return next.run(request).await;
    }
    if request.headers().contains_key(AUTHORIZATION) {
        // A browser's first request carries none: only a wrong one counts, and is worth an
        // operator's look.
        throttle.wrong(peer, now);
        throttles.networks.wrong(network, now);
        if let Some(proxy) = proxy {
            throttles.proxies.wrong(Some(proxy), now);
        }
        tracing::warn!(
            path = %Escaped(request.uri().path()),
            peer = ?peer,
            "admin.refused: a wrong credential"
        );
    }
    (
        StatusCode::UNAUTHORIZED,
        [(WWW_AUTHENTICATE, credential.challenge())],
        "unauthorized: this page needs its credential\n",
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn authorization(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(AUTHORIZATION, value.parse().unwrap());
        headers
    }

    fn basic(user_and_password: &str) -> HeaderMap {
        let encoded = base64::engine::general_purpose::STANDARD.encode(user_and_password);
        authorization(&format!("Basic {encoded}"))
    }

    #[test]
    fn a_bearer_token_admits_only_itself_under_the_bearer_scheme() {
        let credential = Credential::bearer("0123456789abcdef").unwrap();
        assert!(credential.admits(&authorization("Bearer 0123456789abcdef")));
        assert!(credential.admits(&authorization("bearer 0123456789abcdef")));
        assert!(!credential.admits(&authorization("Bearer 0123456789abcdeg")));
        assert!(!credential.admits(&authorization("Bearer 0123456789abcde")));
        assert!(!credential.admits(&authorization("Basic 0123456789abcdef")));
        assert!(!credential.admits(&authorization("Bearer")));
        assert!(!credential.admits(&HeaderMap::new()));
    }

    #[test]
    fn a_user_admits_only_their_user_and_password_under_the_basic_scheme() {
        let credential = Credential::user("ops", "correct horse battery").unwrap();
        assert!(credential.admits(&basic("ops:correct horse battery")));
        assert!(!credential.admits(&basic("ops:correct horse batterY")));
        assert!(!credential.admits(&basic("opz:correct horse battery")));
        assert!(!credential.admits(&basic("ops")));
        assert!(!credential.admits(&authorization("Basic not-base64!")));
        assert!(!credential.admits(&authorization(
            "Bearer b3BzOmNvcnJlY3QgaG9yc2UgYmF0dGVyeQ=="
        )));
    }

    #[test]
    fn a_password_may_hold_colons_after_the_first() {
        let credential = Credential::user("ops", "pass:word:with:colons").unwrap();
        assert!(credential.admits(&basic("ops:pass:word:with:colons")));
    }

    #[test]
    fn a_credential_too_short_or_that_no_header_can_carry_is_refused() {
        assert_eq!(
            Credential::bearer("fifteen-chars-x").unwrap_err().setting(),
            "credential.token"
        );
        assert!(Credential::bearer("sixteen-chars-xy").is_ok());
        assert!(Credential::bearer("a token with spaces").is_err());
        assert!(Credential::bearer("================").is_err());
        assert!(Credential::bearer("base64+/token/with==").is_ok());
        assert_eq!(
            Credential::user("", "long enough password")
                .unwrap_err()
                .setting(),
            "credential.user"
        );
        assert!(Credential::user("o:ps", "long enough password").is_err());
        assert!(Credential::user("ops\n", "long enough password").is_err());
        assert_eq!(
            Credential::user("ops", "elevenchars")
                .unwrap_err()
                .setting(),
            "credential.password"
        );
        assert!(Credential::user("ops", "twelve chars").is_ok());
        assert!(Credential::user("ops", "twelve\u{7}chars").is_err());
    }

    #[test]
    fn a_credentials_debug_never_shows_its_secret() {
        let token = format!("{:?}", Credential::bearer("never-shown-token-1").unwrap());
        assert_eq!(token, "Credential::Bearer(***)");
        let user = format!(
            "{:?}",
            Credential::user("ops", "never shown password").unwrap()
        );
        assert!(
            user.contains("ops") && !user.contains("never shown"),
            "{user}"
        );
    }
}
