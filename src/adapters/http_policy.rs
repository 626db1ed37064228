//! The one policy of every HTTP client the crate makes (the provider transports', the OAuth
//! token endpoint's): no redirect followed, each request bounded by one timeout, an answer
//! read up to a bound, and `https` only: `http` to a loopback host, or where the caller said
//! so (`allow_insecure_http`).

use std::time::Duration;

/// A reqwest client under the policy: each request takes at most `timeout`, connecting within
/// half of it, and no redirect is followed; an error only when the TLS backend cannot start.
pub(crate) fn client(timeout: Duration) -> Result<reqwest::Client, reqwest::Error> {
    reqwest::Client::builder()
        .timeout(timeout)
        // Half, so that a connect that hangs ends as a connect failure (nothing sent) before
        // the whole request's timeout, which would mean "maybe delivered".
        .connect_timeout(timeout / 2)
        // reqwest replays a 307 or 308 with its body (an API key's message, a client secret)
        // wherever it points, over clear HTTP too, and strips only `Authorization` on a hop
        // to another host: a 3xx is an answer, never followed.
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("mail-breaker/", env!("CARGO_PKG_VERSION")))
        .build()
}

/// An answer's body, read up to a bound.
pub(crate) struct Body {
    /// The body's first octets, the bound at most.
    pub(crate) bytes: Vec<u8>,
    /// The body was longer than the bound: the rest was dropped unread. Only the token
    /// endpoint refuses such an answer; a provider's is read from its start.
    #[cfg_attr(not(feature = "oauth2"), allow(dead_code))]
    pub(crate) over: bool,
    /// The body could not be read to its end (the connection dropped, or the timeout passed).
    pub(crate) cut_off: Option<reqwest::Error>,
}

/// Reads `response`'s body up to `limit` octets, leaving the rest unread (it goes with the
/// response and its connection).
pub(crate) async fn read(response: &mut reqwest::Response, limit: usize) -> Body {
    let mut bytes = Vec::new();
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                let room = limit - bytes.len();
                if chunk.len() > room {
                    bytes.extend_from_slice(&chunk[..room]);
                    return Body {
                        bytes,
                        over: true,
                        cut_off: None,
                    };
                }
                bytes.extend_from_slice(&chunk);
            }
            Ok(None) => {
                return Body {
                    bytes,
                    over: false,
                    cut_off: None,
                };
            }
            Err(error) => {
                return Body {
                    bytes,
                    over: false,
                    cut_off: Some(error),
                };
            }
        }
    }
}

/// Why a URL breaks the policy's scheme rule, or `None` when it keeps it: `https`, or `http`
/// to a loopback host (`localhost`, 127.0.0.0/8, `::1`) or with `insecure_allowed`. Any
/// other scheme is the caller's to refuse.
pub(crate) fn clear_http_refused(url: &reqwest::Url, insecure_allowed: bool) -> Option<String> {
    if url.scheme() != "http" || insecure_allowed || is_loopback(url) {
        return None;
    }
    Some(format!(
        "http:// to {} would send secrets in clear text: expected https:// (http:// is \
         taken for a loopback host, or with allow_insecure_http())",
        url.host_str().unwrap_or_default()
    ))
}

/// Whether `url`'s host is this machine: `localhost`, or a loopback address.
pub(crate) fn is_loopback(url: &reqwest::Url) -> bool {
    let Some(host) = url.host_str() else {
        return false;
    };
    // An IPv6 host is written in brackets.
    let address = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || address
            .parse::<std::net::IpAddr>()
            .is_ok_and(|address| address.is_loopback())
}

/// Says, once for the client it is called for, that `http://` is allowed to any host.
pub(crate) fn warn_insecure_http(client: &str, url: &str) {
    tracing::warn!(
        client,
        url,
        "allow_insecure_http: this client may send its secrets over clear http:// to any host"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response(body: &'static str) -> reqwest::Response {
        reqwest::Response::from(http::Response::new(body))
    }

    #[tokio::test]
    async fn a_body_of_exactly_the_bound_is_read_whole_and_one_octet_more_is_over() {
        let whole = read(&mut response("12345"), 5).await;
        assert_eq!((whole.bytes.as_slice(), whole.over), (&b"12345"[..], false));
        let over = read(&mut response("123456"), 5).await;
        assert_eq!((over.bytes.as_slice(), over.over), (&b"12345"[..], true));
    }

    #[tokio::test]
    async fn a_connect_that_hangs_ends_as_a_connect_timeout_before_the_requests_timeout() {
        // An accept queue of one place, taken: the next connect hangs, unanswered.
        let socket = tokio::net::TcpSocket::new_v4().expect("a socket");
        socket
            .bind("127.0.0.1:0".parse().expect("an address"))
            .expect("a port");
        let listener = socket.listen(0).expect("listening");
        let address = listener.local_addr().expect("an address");
        let _taken = tokio::net::TcpStream::connect(address)
            .await
            .expect("the one place");

        let error = client(Duration::from_secs(2))
            .expect("a client")
            .get(format!("http://{address}/"))
            .send()
            .await
            .expect_err("no connection");
        // A connect failure: nothing was sent, so no send is "maybe delivered"; the request's
        // own timeout would have been an error without the connect in it.
        assert!(error.is_connect() && error.is_timeout(), "{error:?}");
    }
}
