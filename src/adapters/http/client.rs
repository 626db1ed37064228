//! The one HTTP client of the provider transports: a request bounded by one timeout, no
//! redirect followed, an answer read up to 64 KiB.

use std::sync::Arc;
use std::time::Duration;

use reqwest::header::HeaderMap;

use crate::adapters::http_policy;
use crate::{Category, SendError};

/// The most of an answer's body that is read; the rest is dropped unread (an error body is a
/// sentence or two, a success a small JSON object).
pub(crate) const MAX_BODY_BYTES: usize = 64 * 1024;

/// A reqwest client whose requests are bounded by one timeout, or why none could be built.
///
/// Building a client only fails when the TLS backend cannot start; the transports' `new`
/// cannot return an error, so the reason is kept and every request answers with it.
#[derive(Clone)]
pub(crate) struct HttpClient {
    client: Result<reqwest::Client, Arc<str>>,
    timeout: Duration,
}

impl HttpClient {
    /// A client under the crate's one HTTP policy (`adapters::http_policy`): each request takes at
    /// most `timeout`, connecting within half of it, following no redirect.
    pub(crate) fn new(timeout: Duration) -> Self {
        let client = http_policy::client(timeout).map_err(|error| Arc::from(error.to_string()));
        HttpClient { client, timeout }
    }

    /// The bound on each request.
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// A request to `url`, or a Configuration error when no client could be built.
    pub(crate) fn request(
        &self,
        provider: &str,
        method: reqwest::Method,
        url: &str,
    ) -> Result<reqwest::RequestBuilder, SendError> {
        match &self.client {
            Ok(client) => Ok(client.request(method, url)),
            Err(why) => Err(SendError::new(
                Category::Configuration,
                format!("{provider}.client"),
                format!("no HTTP client could be built: {why}"),
            )),
        }
    }

    /// Sends `request` and reads the answer, whatever its status, its body up to
    /// [`MAX_BODY_BYTES`]; an error only when no answer came (see the module's table).
    pub(crate) async fn send(
        &self,
        provider: &str,
        request: reqwest::RequestBuilder,
    ) -> Result<Answer, SendError> {
        let mut response = request
            .send()
            .await
            .map_err(|error| request_failure(provider, &error, self.timeout))?;
        let status = response.status().as_u16();
        let headers = std::mem::take(response.headers_mut());
        // A body over the bound is kept cut at it: a provider's answer is read for its id or
        // its error, both near the start.
        let body = http_policy::read(&mut response, MAX_BODY_BYTES).await;
        if let Some(error) = &body.cut_off {
            tracing::warn!(
                provider,
                status,
                error = %error,
                "the body of the provider's answer was cut off"
            );
        }
        Ok(Answer {
            status,
            headers,
            cut_off: body.cut_off.is_some(),
            body: body.bytes,
        })
    }
}

/// A provider's HTTP answer.
#[derive(Debug)]
pub struct Answer {
    pub(crate) status: u16,
    pub(crate) headers: HeaderMap,
    /// The body's first [`MAX_BODY_BYTES`] at most.
    pub(crate) body: Vec<u8>,
    /// The body could not be read to its end: the connection dropped, or the timeout passed,
    /// in the middle of it.
    pub(crate) cut_off: bool,
}

impl Answer {
    /// Whether the provider took the request (a 2xx status).
    pub(crate) fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// The body read as JSON into `T`, or `None` when it is not that.
    #[cfg(any(
        feature = "postmark",
        feature = "resend",
        feature = "sendgrid",
        feature = "mailgun"
    ))]
    pub(crate) fn json<T: serde::de::DeserializeOwned>(&self) -> Option<T> {
        serde_json::from_slice(&self.body).ok()
    }

    /// A header's value, where it is there and is text.
    #[cfg(feature = "sendgrid")]
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name)?.to_str().ok()
    }
}

/// Sorts a request that got no HTTP answer (see the module's table).
pub(crate) fn request_failure(
    provider: &str,
    error: &reqwest::Error,
    timeout: Duration,
) -> SendError {
    let source = crate::receipt::SourceText::masked(error_chain(error));
    let sorted = if error.is_builder() {
        SendError::new(
            Category::Configuration,
            format!("{provider}.client"),
            "the request could not be built (is the endpoint a valid URL?)",
        )
    } else if error.is_connect() && error.is_timeout() {
        SendError::new(
            Category::Timeout,
            format!("{provider}.timeout"),
            format!(
                "no connection to {provider} within {} ms",
                (timeout / 2).as_millis()
            ),
        )
    } else if error.is_connect() {
        SendError::new(
            Category::Network,
            format!("{provider}.network"),
            format!("the connection to {provider} could not be made"),
        )
    } else if error.is_timeout() {
        SendError::new(
            Category::Timeout,
            format!("{provider}.timeout"),
            format!(
                "{provider} did not answer within {} ms; it may have taken the message",
                timeout.as_millis()
            ),
        )
        .maybe_delivered()
    } else {
        SendError::new(
            Category::Network,
            format!("{provider}.network"),
            format!(
                "the connection to {provider} dropped before it answered; it may have taken the message"
            ),
        )
        .maybe_delivered()
    };
    sorted.with_source(source)
}

/// An error and its causes as one line: reqwest's own text says only "error sending request".
fn error_chain(error: &reqwest::Error) -> String {
    let mut text = error.to_string();
    let mut cause = std::error::Error::source(error);
    while let Some(inner) = cause {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        cause = inner.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Answers one request with a 200 and a body of `length` octets, then closes.
    async fn answering_with(length: usize) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port");
        let address = listener.local_addr().expect("an address");
        tokio::spawn(async move {
            if let Ok((mut stream, _)) = listener.accept().await {
                let mut request = [0_u8; 4096];
                let _ = stream.read(&mut request).await;
                let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {length}\r\n\r\n");
                let _ = stream.write_all(head.as_bytes()).await;
                let _ = stream.write_all(&vec![b'x'; length]).await;
            }
        });
        format!("http://{address}/")
    }

    async fn body_of(length: usize) -> Answer {
        let client = HttpClient::new(Duration::from_secs(5));
        let url = answering_with(length).await;
        let request = client
            .request("test", reqwest::Method::GET, &url)
            .expect("a client");
        client.send("test", request).await.expect("an answer")
    }

    #[tokio::test]
    async fn a_request_that_cannot_connect_keeps_the_causes_reqwest_hides() {
        let unused = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port")
            .local_addr()
            .expect("an address");
        let client = HttpClient::new(Duration::from_secs(5));
        let request = client
            .request("test", reqwest::Method::GET, &format!("http://{unused}/"))
            .expect("a client");
        let error = client
            .send("test", request)
            .await
            .expect_err("nothing listens");
        let source = std::error::Error::source(&error)
            .expect("the causes are kept as the source")
            .to_string();
        // reqwest's own text is only "error sending request"; the cause says why.
        assert!(source.starts_with("error sending request"), "{source}");
        assert!(
            source.len() > "error sending request".len() + 10,
            "{source}"
        );
    }

    #[tokio::test]
    async fn a_body_of_64_kib_is_read_whole() {
        let answer = body_of(64 * 1024).await;
        assert_eq!(answer.body.len(), 64 * 1024);
        assert!(!answer.cut_off);
    }

    #[tokio::test]
    async fn a_body_over_64_kib_is_read_up_to_64_kib() {
        let answer = body_of(64 * 1024 + 100).await;
        assert_eq!(answer.body.len(), 64 * 1024);
        assert!(!answer.cut_off);
    }
}
