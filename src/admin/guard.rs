//! What keeps another site from acting through an operator's browser: the page's token in
//! every form, and a POST's `Origin` (or `Sec-Fetch-Site`) naming this site: the request's
//! own authority, or the public origin a proxy serves the page under.

use std::fmt::Write as _;

use std::sync::Arc;

use axum::extract::Request;
use axum::http::header::{HOST, ORIGIN};
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::text::Escaped;

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

/// Where a request says it is going: the authority of its URI (HTTP/2's `:authority`, or an
/// HTTP/1 request line in absolute form, which takes precedence over `Host`), else its `Host`.
pub(crate) fn authority<'a>(uri: &'a Uri, headers: &'a HeaderMap) -> Option<&'a str> {
    uri.authority()
        .map(|authority| authority.as_str())
        .or_else(|| headers.get(HOST).and_then(|host| host.to_str().ok()))
}

/// Where a POST came from and went to, for [`check`].
pub(crate) struct Site<'a> {
    /// The request's [`authority`].
    pub(crate) authority: Option<&'a str>,
    /// The origin the page is served under behind a proxy, if one was given.
    pub(crate) public_origin: Option<&'a str>,
    /// The scheme the page is served under (`http` or `https`), when known: a form posted
    /// from the same host under the other scheme comes from another origin.
    pub(crate) scheme: Option<&'a str>,
}

/// Whether a POST with `headers` and the form's `token`, to `site`, may act, for a page whose
/// token is `expected`.
pub(crate) fn check(
    headers: &HeaderMap,
    site: &Site<'_>,
    token: Option<&str>,
    expected: &str,
) -> Result<(), Refused> {
    same_site(headers, site)?;
    match token {
        Some(token) if !expected.is_empty() && equal(token.as_bytes(), expected.as_bytes()) => {
            Ok(())
        }
        _ => Err(Refused::Token),
    }
}

/// A request whose `Origin` is neither the public origin nor names the request's own
/// authority, or that the browser says came from another site, is refused; one without
/// either (a script, an old browser) is let through to the token's check.
fn same_site(headers: &HeaderMap, site: &Site<'_>) -> Result<(), Refused> {
    if let Some(site) = headers.get("sec-fetch-site")
        && !matches!(site.as_bytes(), b"same-origin" | b"none")
    {
        return Err(Refused::Origin);
    }
    let Some(origin) = headers.get(ORIGIN) else {
        return Ok(());
    };
    let origin = origin.to_str().map_err(|_| Refused::Origin)?;
    if site
        .public_origin
        .is_some_and(|public| public.eq_ignore_ascii_case(origin))
    {
        return Ok(());
    }
    let (scheme, from) = origin.split_once("://").ok_or(Refused::Origin)?;
    let scheme_fits = match site.scheme {
        Some(served) => scheme.eq_ignore_ascii_case(served),
        None => scheme.eq_ignore_ascii_case("http") || scheme.eq_ignore_ascii_case("https"),
    };
    let to = site.authority.ok_or(Refused::Origin)?;
    if scheme_fits && from.eq_ignore_ascii_case(to) {
        Ok(())
    } else {
        Err(Refused::Origin)
    }
}

/// Whether the request's [`authority`] is one of `hosts` (`host:port`, lower case); one
/// allowed with port 443 or 80 is also the name alone, as a browser sends it for its scheme's
/// default port. A page served on a loopback address answers only to its loopback names: a
/// site whose name an attacker points at 127.0.0.1 (DNS rebinding) would otherwise read the
/// page, and its token.
pub(crate) fn host_allowed(uri: &Uri, headers: &HeaderMap, hosts: &[String]) -> bool {
    authority(uri, headers).is_some_and(|host| {
        hosts.iter().any(|allowed| {
            allowed.eq_ignore_ascii_case(host)
                || [":443", ":80"].iter().any(|port| {
                    allowed
                        .strip_suffix(port)
                        .is_some_and(|name| name.eq_ignore_ascii_case(host))
                })
        })
    })
}

/// The middleware of [`Admin::allow_hosts`](super::Admin::allow_hosts): 403 for a request to
/// another host.
pub(crate) async fn only_hosts(hosts: Arc<[String]>, request: Request, next: Next) -> Response {
    if host_allowed(request.uri(), request.headers(), &hosts) {
        return next.run(request).await;
    }
    let host = authority(request.uri(), request.headers()).map(Escaped);
    tracing::warn!(
        host = host.as_ref().map(tracing::field::display),
        "admin.refused: a request to another host"
    );
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
    // A URL is only ever shown without its user and password.
    let shown = without_userinfo(url);
    let parsed =
        url::Url::parse(url).map_err(|error| format!("{shown:?} is not a URL: {error}"))?;
    if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
        return Err(format!(
            "{shown:?} is not an http or https origin (https://ops.example.com)"
        ));
    }
    if !parsed.username().is_empty()
        || parsed.password().is_some()
        || parsed.path() != "/"
        || parsed.query().is_some()
        || parsed.fragment().is_some()
    {
        return Err(format!(
            "{shown:?} holds more than an origin: give its scheme, host and port alone"
        ));
    }
    Ok(parsed.origin().ascii_serialization())
}

/// `url` with whatever stands before the last `@` of its authority (a user and password)
/// written `***`; read as text, so that a URL that does not parse is redacted too.
pub(crate) fn without_userinfo(url: &str) -> String {
    let start = url.find("://").map_or(0, |at| at + 3);
    let end = url[start..]
        .find(['/', '?', '#'])
        .map_or(url.len(), |at| start + at);
    match url[start..end].rfind('@') {
        Some(at) => format!("{}***{}", &url[..start], &url[start + at..]),
        None => url.to_owned(),
    }
}

/// Whether `given` is `expected`, in a time that depends on neither where they first differ
/// nor how long `given` is: every byte of `expected` is compared, whatever was given.
pub(crate) fn equal(given: &[u8], expected: &[u8]) -> bool {
    let lengths_differ = usize::from(given.len() != expected.len());
    let bytes_differ = expected.iter().enumerate().fold(0u8, |diff, (at, byte)| {
        diff | (given.get(at).copied().unwrap_or(!byte) ^ byte)
    });
    lengths_differ | usize::from(bytes_differ) == 0
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

    /// The site of a request with `headers` and an origin-form URI (`POST /path`), behind
    /// no proxy.
    fn site(headers: &HeaderMap) -> Site<'_> {
        Site {
            authority: headers.get(HOST).and_then(|host| host.to_str().ok()),
            public_origin: None,
            scheme: None,
        }
    }

    fn at(headers: &HeaderMap) -> Result<(), Refused> {
        check(headers, &site(headers), Some("t"), "t")
    }

    #[test]
    fn tokens_that_differ_in_two_places_alike_are_not_equal() {
        // 'a' ^ 'c' == 'c' ^ 'a': differences that would cancel out if only counted by parity.
        assert!(!equal(b"abcd", b"cbad"));
        assert!(!equal(b"abcd", b"abce"));
        assert!(!equal(b"abcd", b"abc"));
        assert!(!equal(b"abc", b"abcd"));
        assert!(!equal(b"", b"a"));
        assert!(equal(b"abcd", b"abcd"));
        assert!(equal(b"", b""));
        // Longer, and one bit off in what both hold: each difference is enough alone.
        assert!(!equal(b"abcX", b"abb"));
    }

    #[test]
    fn an_origin_of_this_host_with_the_token_may_act() {
        let same = headers(&[
            ("host", "127.0.0.1:8025"),
            ("origin", "http://127.0.0.1:8025"),
        ]);
        assert_eq!(
            check(&same, &site(&same), Some("secret-token"), "secret-token"),
            Ok(())
        );
    }

    #[test]
    fn an_origin_of_another_host_is_refused_even_with_the_token() {
        let other = headers(&[
            ("host", "127.0.0.1:8025"),
            ("origin", "https://evil.example"),
        ]);
        assert_eq!(at(&other), Err(Refused::Origin));
        let null = headers(&[("host", "127.0.0.1:8025"), ("origin", "null")]);
        assert_eq!(at(&null), Err(Refused::Origin));
        let cross = headers(&[("sec-fetch-site", "cross-site")]);
        assert_eq!(at(&cross), Err(Refused::Origin));
    }

    #[test]
    fn a_missing_wrong_or_empty_token_is_refused() {
        let none = HeaderMap::new();
        let nowhere = site(&none);
        assert_eq!(check(&none, &nowhere, None, "t"), Err(Refused::Token));
        assert_eq!(check(&none, &nowhere, Some("u"), "t"), Err(Refused::Token));
        assert_eq!(check(&none, &nowhere, Some(""), ""), Err(Refused::Token));
    }

    #[test]
    fn a_page_on_loopback_answers_to_its_loopback_names_only() {
        let v4 = loopback_hosts("127.0.0.1:8025".parse().unwrap()).unwrap();
        assert_eq!(v4, ["127.0.0.1:8025", "localhost:8025"]);
        let v6 = loopback_hosts("[::1]:8025".parse().unwrap()).unwrap();
        assert_eq!(v6, ["[::1]:8025", "localhost:8025"]);
        assert_eq!(loopback_hosts("0.0.0.0:8025".parse().unwrap()), None);
        let path = Uri::from_static("/");
        let allowed = |pairs| host_allowed(&path, &headers(pairs), &v4);
        assert!(allowed(&[("host", "LocalHost:8025")]));
        assert!(!allowed(&[("host", "rebound.example:8025")]));
        assert!(!allowed(&[("host", "localhost:8026")]));
        assert!(!allowed(&[]));
    }

    #[test]
    fn a_host_allowed_with_its_schemes_default_port_matches_a_browsers_host_without_it() {
        // A browser at https://ops.example.com sends `Host: ops.example.com`.
        let path = Uri::from_static("/");
        let allowed = [
            "ops.example.com:443".to_owned(),
            "plain.example.com:80".to_owned(),
            "other.example.com:8025".to_owned(),
        ];
        let host = |name: &'static str| host_allowed(&path, &headers(&[("host", name)]), &allowed);
        assert!(host("ops.example.com"));
        assert!(host("OPS.example.com:443"));
        assert!(host("plain.example.com"));
        assert!(!host("other.example.com"));
        assert!(!host("ops.example.com:8443"));
        assert!(!host("evil.example.com"));
        assert!(!host("ops.example"));
    }

    #[test]
    fn an_origin_is_checked_against_the_uris_authority_before_the_host() {
        // HTTP/2 sends `:authority` and no `Host`.
        let uri = Uri::from_static("https://ops.example:8443/breakers/a/isolate");
        let h2 = headers(&[("origin", "https://ops.example:8443")]);
        assert_eq!(authority(&uri, &h2), Some("ops.example:8443"));
        let to = Site {
            authority: authority(&uri, &h2),
            public_origin: None,
            scheme: None,
        };
        assert_eq!(check(&h2, &to, Some("t"), "t"), Ok(()));
        let both = headers(&[("host", "upstream:8025")]);
        assert_eq!(authority(&uri, &both), Some("ops.example:8443"));
        assert!(host_allowed(&uri, &both, &["ops.example:8443".to_owned()]));
        assert!(!host_allowed(&uri, &both, &["upstream:8025".to_owned()]));
    }

    #[test]
    fn an_origin_that_is_the_public_one_may_act_whatever_the_host() {
        let proxied = headers(&[
            ("host", "127.0.0.1:8025"),
            ("origin", "https://Ops.Example.com"),
        ]);
        let behind = Site {
            authority: Some("127.0.0.1:8025"),
            public_origin: Some("https://ops.example.com"),
            scheme: None,
        };
        assert_eq!(check(&proxied, &behind, Some("t"), "t"), Ok(()));
        let downgraded = headers(&[("origin", "http://ops.example.com")]);
        assert_eq!(
            check(&downgraded, &behind, Some("t"), "t"),
            Err(Refused::Origin)
        );
    }

    #[test]
    fn a_public_origin_is_kept_as_a_browser_names_it() {
        assert_eq!(
            parse_origin("https://ops.example.com:443/").as_deref(),
            Ok("https://ops.example.com")
        );
        assert_eq!(
            parse_origin("http://OPS.example.com:8025").as_deref(),
            Ok("http://ops.example.com:8025")
        );
        assert!(parse_origin("https://ops.example.com/mail").is_err());
        assert!(parse_origin("https://ops.example.com#top").is_err());
        assert!(parse_origin("https://user:pw@ops.example.com").is_err());
        assert!(parse_origin("file:///tmp").is_err());
        assert!(parse_origin("ftp://ops.example.com").is_err());
        assert!(parse_origin("https://ops@ops.example.com").is_err());
        assert!(parse_origin("https://:pw@ops.example.com").is_err());
    }

    #[test]
    fn without_a_public_origin_the_origins_scheme_must_be_the_one_the_page_is_served_under() {
        let from =
            |origin: &'static str| headers(&[("host", "ops.example:8443"), ("origin", origin)]);
        for (served, same, other) in [
            (
                "https",
                "https://ops.example:8443",
                "http://ops.example:8443",
            ),
            (
                "http",
                "HTTP://ops.example:8443",
                "https://ops.example:8443",
            ),
        ] {
            let to = Site {
                authority: Some("ops.example:8443"),
                public_origin: None,
                scheme: Some(served),
            };
            assert_eq!(check(&from(same), &to, Some("t"), "t"), Ok(()), "{served}");
            assert_eq!(
                check(&from(other), &to, Some("t"), "t"),
                Err(Refused::Origin),
                "{served}"
            );
        }
        // Not known: either, but no other scheme.
        for origin in ["http://ops.example:8443", "https://ops.example:8443"] {
            let either = from(origin);
            assert_eq!(at(&either), Ok(()), "{origin}");
        }
        let ftp = from("ftp://ops.example:8443");
        assert_eq!(at(&ftp), Err(Refused::Origin));
    }

    #[test]
    fn a_url_is_shown_without_its_user_and_password_whether_it_parses_or_not() {
        assert_eq!(
            without_userinfo("https://ops:pw@ops.example.com/x@y"),
            "https://***@ops.example.com/x@y"
        );
        assert_eq!(
            without_userinfo("https://o@ps:p@w@ops example.com"),
            "https://***@ops example.com"
        );
        assert_eq!(without_userinfo("ops:pw@host"), "***@host");
        assert_eq!(
            without_userinfo("https://ops.example.com/a@b?c@d#e@f"),
            "https://ops.example.com/a@b?c@d#e@f"
        );
        assert_eq!(
            without_userinfo("https://ops.example.com"),
            "https://ops.example.com"
        );
        for url in [
            "https://ops:secret-pw@ops.example.com",
            "https://ops:secret-pw@ops example.com",
            "ftp://ops:secret-pw@ops.example.com",
        ] {
            let why = parse_origin(url).unwrap_err();
            assert!(!why.contains("secret-pw"), "{why}");
        }
    }

    #[test]
    fn a_random_token_is_64_hex_digits_and_new_each_time() {
        let (a, b) = (random_token(), random_token());
        assert_eq!(a.len(), 64);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }
}
