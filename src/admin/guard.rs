//! What keeps another site from acting through an operator's browser: the page's token in
//! every form, and a POST's `Origin` (or `Sec-Fetch-Site`) naming this site.

use std::fmt::Write as _;

use std::sync::Arc;

use axum::extract::Request;
use axum::http::header::{HOST, ORIGIN};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// A token of 32 random bytes from the operating system, in hex.
pub(crate) fn random_token() -> String {
    let mut bytes = [0u8; 32];
    if getrandom::fill(&mut bytes).is_err() {
        // No randomness from the system: a token nobody can guess is still needed, and a
        // page whose actions nobody can use is the safe way to fail.
        return String::new();
    }
    let mut token = String::with_capacity(64);
    for byte in bytes {
        let _ = write!(token, "{byte:02x}");
    }
    token
}

/// Why a POST was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// The form's token is missing or not the page's.
    Token,
    /// The request came from another site's page.
    Origin,
}

impl Refused {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Refused::Token => "the form's token is missing or wrong",
            Refused::Origin => "the request came from another site",
        }
    }
}

/// Whether a POST with `headers` and the form's `token` may act, for a page whose token is
/// `expected`.
pub(crate) fn check(
    headers: &HeaderMap,
    token: Option<&str>,
    expected: &str,
) -> Result<(), Refused> {
    same_site(headers)?;
    match token {
        Some(token) if !expected.is_empty() && equal(token.as_bytes(), expected.as_bytes()) => {
            Ok(())
        }
        _ => Err(Refused::Token),
    }
}

/// A request whose `Origin` names another host than its `Host`, or that the browser says
/// came from another site, is refused; one without either (a script, an old browser) is let
/// through to the token's check.
fn same_site(headers: &HeaderMap) -> Result<(), Refused> {
    if let Some(site) = headers.get("sec-fetch-site")
        && !matches!(site.as_bytes(), b"same-origin" | b"none")
    {
        return Err(Refused::Origin);
    }
    let Some(origin) = headers.get(ORIGIN) else {
        return Ok(());
    };
    let origin = origin.to_str().map_err(|_| Refused::Origin)?;
    let authority = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"))
        .ok_or(Refused::Origin)?;
    let host = headers
        .get(HOST)
        .and_then(|host| host.to_str().ok())
        .ok_or(Refused::Origin)?;
    if authority.eq_ignore_ascii_case(host) {
        Ok(())
    } else {
        Err(Refused::Origin)
    }
}

/// Whether the request's `Host` is one of `hosts` (`host:port`, lower case). A page served
/// on a loopback address answers only to its loopback names: a site whose name an attacker
/// points at 127.0.0.1 (DNS rebinding) would otherwise read the page, and its token.
pub(crate) fn host_allowed(headers: &HeaderMap, hosts: &[String]) -> bool {
    headers
        .get(HOST)
        .and_then(|host| host.to_str().ok())
        .is_some_and(|host| {
            hosts
                .iter()
                .any(|allowed| allowed.eq_ignore_ascii_case(host))
        })
}

/// The middleware of [`Admin::allow_hosts`](super::Admin::allow_hosts): 403 for a request to
/// another host.
pub(crate) async fn only_hosts(hosts: Arc<[String]>, request: Request, next: Next) -> Response {
    if host_allowed(request.headers(), &hosts) {
        return next.run(request).await;
    }
    let host = request
        .headers()
        .get(HOST)
        .and_then(|host| host.to_str().ok());
    tracing::warn!(host, "admin.refused: a request to another host");
    (
        StatusCode::FORBIDDEN,
        "forbidden: this page does not answer to that host name\n",
    )
        .into_response()
}

/// The names a browser gives a server bound to `address` when it is a loopback address:
/// `127.0.0.1:PORT` and `localhost:PORT` (`[::1]:PORT` for IPv6); `None` for any other
/// address, whose names cannot be known.
pub(crate) fn loopback_hosts(address: std::net::SocketAddr) -> Option<Vec<String>> {
    if !address.ip().is_loopback() {
        return None;
    }
    let port = address.port();
    Some(vec![
        match address {
            std::net::SocketAddr::V4(v4) => format!("{}:{port}", v4.ip()),
            std::net::SocketAddr::V6(v6) => format!("[{}]:{port}", v6.ip()),
        },
        format!("localhost:{port}"),
    ])
}

/// The origin `url` names as a browser's `Origin` header names it (`https://host[:port]`,
/// the default port left out), or why it is not one: an `http` or `https` URL with a host and
/// no user, path, query or fragment.
pub(crate) fn parse_origin(url: &str) -> Result<String, String> {
    let parsed = url::Url::parse(url).map_err(|error| format!("{url:?} is not a URL: {error}"))?;
    if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
        return Err(format!(
            "{url:?} is not an http or https origin (https://ops.example.com)"
        ));
    }
    if !parsed.username().is_empty()
        || parsed.password().is_some()
        || parsed.path() != "/"
        || parsed.query().is_some()
        || parsed.fragment().is_some()
    {
        return Err(format!(
            "{url:?} holds more than an origin: give its scheme, host and port alone"
        ));
    }
    Ok(parsed.origin().ascii_serialization())
}

/// Compares in a time that does not depend on where the first difference is.
pub(crate) fn equal(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |diff, (x, y)| diff | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.insert(*name, value.parse().unwrap());
        }
        headers
    }

    #[test]
    fn tokens_that_differ_in_two_places_alike_are_not_equal() {
        // 'a' ^ 'c' == 'c' ^ 'a': differences that would cancel out if only counted by parity.
        assert!(!equal(b"abcd", b"cbad"));
        assert!(!equal(b"abcd", b"abce"));
        assert!(!equal(b"abcd", b"abc"));
        assert!(equal(b"abcd", b"abcd"));
    }

    #[test]
    fn an_origin_of_this_host_with_the_token_may_act() {
        let same = headers(&[
            ("host", "127.0.0.1:8025"),
            ("origin", "http://127.0.0.1:8025"),
        ]);
        assert_eq!(check(&same, Some("secret-token"), "secret-token"), Ok(()));
    }

    #[test]
    fn an_origin_of_another_host_is_refused_even_with_the_token() {
        let other = headers(&[
            ("host", "127.0.0.1:8025"),
            ("origin", "https://evil.example"),
        ]);
        assert_eq!(check(&other, Some("t"), "t"), Err(Refused::Origin));
        let null = headers(&[("host", "127.0.0.1:8025"), ("origin", "null")]);
        assert_eq!(check(&null, Some("t"), "t"), Err(Refused::Origin));
        let cross = headers(&[("sec-fetch-site", "cross-site")]);
        assert_eq!(check(&cross, Some("t"), "t"), Err(Refused::Origin));
    }

    #[test]
    fn a_missing_wrong_or_empty_token_is_refused() {
        let none = HeaderMap::new();
        assert_eq!(check(&none, None, "t"), Err(Refused::Token));
        assert_eq!(check(&none, Some("u"), "t"), Err(Refused::Token));
        assert_eq!(check(&none, Some(""), ""), Err(Refused::Token));
    }

    #[test]
    fn a_page_on_loopback_answers_to_its_loopback_names_only() {
        let v4 = loopback_hosts("127.0.0.1:8025".parse().unwrap()).unwrap();
        assert_eq!(v4, ["127.0.0.1:8025", "localhost:8025"]);
        let v6 = loopback_hosts("[::1]:8025".parse().unwrap()).unwrap();
        assert_eq!(v6, ["[::1]:8025", "localhost:8025"]);
        assert_eq!(loopback_hosts("0.0.0.0:8025".parse().unwrap()), None);
        assert!(host_allowed(&headers(&[("host", "LocalHost:8025")]), &v4));
        assert!(!host_allowed(
            &headers(&[("host", "rebound.example:8025")]),
            &v4
        ));
        assert!(!host_allowed(&headers(&[("host", "localhost:8026")]), &v4));
        assert!(!host_allowed(&HeaderMap::new(), &v4));
    }

    #[test]
    fn a_random_token_is_64_hex_digits_and_new_each_time() {
        let (a, b) = (random_token(), random_token());
        assert_eq!(a.len(), 64);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }
}
