//! The frame every provider transport shares: its settings and setters, the request and the
//! reading of its answer, written once; a [`Provider`] fills in what is its own.

use std::fmt;
use std::time::Duration;

use reqwest::header::HeaderMap;

use super::ApiKey;
use super::client::{Answer, HttpClient};
use crate::adapters::http_policy;
use crate::{Envelope, MessageStream, Receipt, ReceiptStream, SendError, Transport};

/// A login's token, kept to be forgotten if the provider refuses it; none without `graph`.
#[cfg(feature = "graph")]
type Token = crate::oauth::AccessToken;
#[cfg(not(feature = "graph"))]
type Token = std::convert::Infallible;

/// How long a request may take unless the transport is given another timeout.
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// How many messages `send_many` sends at once unless told otherwise.
const DEFAULT_CONCURRENCY: usize = 10;

/// What one provider adds to the frame: its request, the shape of its success answer, its
/// error table and its `verify`. Not nameable outside the crate: the four providers are the
/// ones there are.
pub trait Provider: fmt::Debug + Clone + Send + Sync + 'static {
    /// The provider in codes (`postmark.422.406`) and logs.
    const NAME: &'static str;
    /// The name of the transport type, for `Debug`.
    const TYPE_NAME: &'static str;
    /// The base URL of the provider's API.
    const DEFAULT_ENDPOINT: &'static str;

    /// `request` with the key in the header the provider reads it from.
    fn authorize(&self, request: reqwest::RequestBuilder, key: &ApiKey) -> reqwest::RequestBuilder;

    /// The request that sends the formatted message `raw` to `envelope`'s recipients, or why
    /// this provider cannot (Unsupported, InvalidMessage).
    fn send_call(&self, envelope: &Envelope, raw: &[u8]) -> Result<Call, SendError>;

    /// What a 2xx answer to [`send_call`](Self::send_call) says, read from its (whole) body.
    fn sent(&self, answer: &Answer) -> Sent;

    /// An error answer as a [`SendError`]; `body` has the key redacted.
    fn classify(&self, status: u16, headers: &HeaderMap, body: &[u8]) -> SendError;

    /// The request `verify` makes: one a key that may only send can pass.
    fn verify_call(&self) -> Call;

    /// Whether `answer` to [`verify_call`](Self::verify_call) shows a usable key and
    /// account; `failure` sorts it as an error. By default a 2xx is a usable key.
    fn verified(
        &self,
        answer: &Answer,
        failure: impl FnOnce() -> SendError,
    ) -> Result<(), SendError> {
        if answer.is_success() {
            Ok(())
        } else {
            Err(failure())
        }
    }

    /// Under a login, a check of its token that takes the place of
    /// [`verify_call`](Self::verify_call) (Graph reads the permissions the token grants);
    /// `None` makes the call.
    fn verify_token(&self, _token: &str) -> Option<Result<(), SendError>> {
        None
    }
}

/// One request: method, path below the endpoint, extra headers, body.
pub struct Call {
    pub(crate) method: reqwest::Method,
    pub(crate) path: String,
    /// The path with its variable parts named (`/v1.0/users/{sender}/sendMail`), for the
    /// span's `url.template`; `None` when the path has none.
    pub(crate) template: Option<&'static str>,
    pub(crate) headers: Vec<(&'static str, String)>,
    pub(crate) body: CallBody,
}

/// The host of an endpoint URL, for a span's `server.address` (empty if it has none).
fn host_of(endpoint: &str) -> String {
    reqwest::Url::parse(endpoint)
        .ok()
        .and_then(|url| url.host_str().map(str::to_owned))
        .unwrap_or_default()
}

impl Call {
    /// A request without a body.
    pub(crate) fn new(method: reqwest::Method, path: impl Into<String>) -> Self {
        Call {
            method,
            path: path.into(),
            template: None,
            headers: Vec::new(),
            body: CallBody::Empty,
        }
    }

    /// A POST of `body` as JSON.
    #[cfg(any(feature = "postmark", feature = "resend", feature = "sendgrid"))]
    pub(crate) fn post_json(path: &str, body: &impl serde::Serialize) -> Result<Self, SendError> {
        let bytes = serde_json::to_vec(body).map_err(|_| {
            SendError::fixed(
                crate::Category::InvalidMessage,
                "http.json",
                "the request body could not be written as JSON",
            )
        })?;
        Ok(Call {
            body: CallBody::Json(bytes),
            ..Call::new(reqwest::Method::POST, path)
        })
    }

    /// The request with one more header.
    #[cfg(feature = "resend")]
    pub(crate) fn header(mut self, name: &'static str, value: String) -> Self {
        self.headers.push((name, value));
        self
    }
}

/// The body of a [`Call`].
pub enum CallBody {
    /// None.
    Empty,
    /// JSON, already written.
    #[cfg(any(feature = "postmark", feature = "resend", feature = "sendgrid"))]
    Json(Vec<u8>),
    /// A `multipart/form-data` upload.
    #[cfg(feature = "mailgun")]
    Form(reqwest::multipart::Form),
    /// Text (`text/plain`): Graph's base64 MIME.
    #[cfg(feature = "graph")]
    Text(Vec<u8>),
}

/// What a 2xx answer to a send says.
#[derive(Debug, PartialEq, Eq)]
pub enum Sent {
    /// The provider took the message; its id, where the answer gives one.
    Delivered(Option<String>),
    /// The provider's own answer, saying it did not take the message (Postmark's
    /// `ErrorCode` on a 200): sorted by the error table.
    Refused,
    /// Not the provider's answer (a proxy's page, a wrong endpoint).
    Foreign,
    /// The provider took the message and never gives an id (Graph's `202`): the receipt's
    /// response says so, and nothing is logged.
    #[cfg(feature = "graph")]
    DeliveredWithoutId(&'static str),
}

/// A transport for an HTTP e-mail API: the settings every provider shares (key, endpoint,
/// client and timeout, name, concurrency) and their setters, with the provider `P`'s own
/// parts. Used through its names per provider:
/// [`PostmarkTransport`](crate::PostmarkTransport), [`ResendTransport`](crate::ResendTransport),
/// [`SendGridTransport`](crate::SendGridTransport), [`MailgunTransport`](crate::MailgunTransport).
///
/// # What every provider transport does
/// - **No redirect is followed**: a 3xx is an error (Configuration), so the key and the
///   message go nowhere but the endpoint.
/// - **An answer body is read up to 64 KiB**; the rest is dropped unread.
/// - **A 2xx is a delivery only with the provider's success answer**: a 2xx with another body
///   (a proxy's HTML page, a wrong endpoint) is ServerError, code `<provider>.unexpected_answer`,
///   maybe delivered. A 2xx whose body is *unreadable* (the connection dropped or the timeout
///   passed in the middle of it) is a delivery without a message id, with a WARN: the status
///   said the provider took it.
/// - **The key** is an [`ApiKey`]: no `Debug`, log line or error shows it; an error body
///   that echoes it has it replaced.
///
/// ```
/// use std::time::Duration;
/// use mail_breaker::{PostmarkTransport, Transport};
///
/// let postmark = PostmarkTransport::new("server-token")
///     .with_endpoint("http://127.0.0.1:8080/")
///     .with_timeout(Duration::from_secs(5))
///     .with_name("postmark-eu")
///     .with_concurrency(4);
/// assert_eq!(postmark.name(), "postmark-eu");
/// assert_eq!(postmark.timeout(), Duration::from_secs(5));
/// assert!(!format!("{postmark:?}").contains("server-token"));
/// ```
#[derive(Clone)]
pub struct HttpTransport<P> {
    provider: P,
    key: ApiKey,
    /// An OAuth 2.0 login whose token authorizes each request instead of `key` (Graph).
    #[cfg(feature = "graph")]
    login: Option<std::sync::Arc<crate::oauth::OAuthLogin>>,
    endpoint: String,
    client: HttpClient,
    name: String,
    concurrency: usize,
    /// `http://` is taken to any host, not only to a loopback one.
    insecure_http: bool,
}

impl<P: Provider> HttpTransport<P> {
    /// A transport for `provider` with `key`, named `name`, at the provider's endpoint, with
    /// the default timeout and concurrency.
    pub(crate) fn with_provider(provider: P, key: ApiKey, name: String) -> Self {
        HttpTransport {
            provider,
            key,
            #[cfg(feature = "graph")]
            login: None,
            endpoint: P::DEFAULT_ENDPOINT.to_owned(),
            client: HttpClient::new(DEFAULT_TIMEOUT),
            name,
            concurrency: DEFAULT_CONCURRENCY,
            insecure_http: false,
        }
    }

    /// A transport whose requests carry `login`'s token rather than a key: a `401` forgets
    /// the token and the request is made once more with a new one.
    #[cfg(feature = "graph")]
    pub(crate) fn with_login(mut self, login: crate::oauth::OAuthLogin) -> Self {
        self.login = Some(std::sync::Arc::new(login));
        self
    }

    /// The provider's own settings.
    #[cfg(any(feature = "mailgun", feature = "graph"))]
    pub(crate) fn provider(&self) -> &P {
        &self.provider
    }

    /// The provider's own settings, to change.
    #[cfg(feature = "postmark")]
    pub(crate) fn provider_mut(&mut self) -> &mut P {
        &mut self.provider
    }

    /// Sends to another base URL than the provider's (a test server, a proxy, a region);
    /// trailing slashes are dropped. `https://`, or `http://` to a loopback host: a send to
    /// `http://` elsewhere, which would carry the key in clear text, is a Configuration error
    /// (`<provider>.endpoint`) unless [`allow_insecure_http`](Self::allow_insecure_http).
    ///
    /// ```
    /// let resend = mail_breaker::ResendTransport::new("re_123").with_endpoint("http://127.0.0.1:8080");
    /// # let _ = resend;
    /// ```
    pub fn with_endpoint(mut self, url: impl Into<String>) -> Self {
        let mut endpoint = url.into();
        while endpoint.ends_with('/') {
            endpoint.pop();
        }
        self.endpoint = endpoint;
        self
    }

    /// Takes an endpoint of `http://` to any host, which sends the API key and the message in
    /// clear text: for a relay on a network the operator trusts. Logged (WARN) once, here.
    ///
    /// ```
    /// let postmark = mail_breaker::PostmarkTransport::new("server-token")
    ///     .with_endpoint("http://mail-relay.internal:8080")
    ///     .allow_insecure_http();
    /// # let _ = postmark;
    /// ```
    pub fn allow_insecure_http(mut self) -> Self {
        http_policy::warn_insecure_http(P::NAME, &self.endpoint);
        self.insecure_http = true;
        self
    }

    /// Bounds each request (default 30 s), reading the answer included; connecting gets half
    /// of it (see the [module table](crate::adapters::http)).
    ///
    /// ```
    /// # use std::time::Duration;
    /// let sendgrid = mail_breaker::SendGridTransport::new("SG.key").with_timeout(Duration::from_secs(5));
    /// assert_eq!(sendgrid.timeout(), Duration::from_secs(5));
    /// ```
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.client = HttpClient::new(timeout);
        self
    }

    /// Sets the name used in logs, receipts and breaker keys (default: the provider's, and
    /// `mailgun:<domain>` for Mailgun).
    ///
    /// ```
    /// use mail_breaker::Transport;
    /// let resend = mail_breaker::ResendTransport::new("re_123").with_name("resend-marketing");
    /// assert_eq!(resend.name(), "resend-marketing");
    /// ```
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// How many messages `send_many` sends at once (default 10; at least 1). Keep it near
    /// the account's rate limit.
    ///
    /// ```
    /// let mailgun = mail_breaker::MailgunTransport::new("key-123", "mg.example.com").with_concurrency(4);
    /// # let _ = mailgun;
    /// ```
    pub fn with_concurrency(mut self, concurrency: usize) -> Self {
        self.concurrency = concurrency.max(1);
        self
    }

    /// The bound on each request.
    ///
    /// ```
    /// # use std::time::Duration;
    /// assert_eq!(mail_breaker::ResendTransport::new("re_123").timeout(), Duration::from_secs(30));
    /// ```
    pub fn timeout(&self) -> Duration {
        self.client.timeout()
    }

    /// The key a request is authorized with: the transport's API key, or its login's token
    /// (the token as well, to forget if refused), waited for no longer than the transport's
    /// timeout or the send's deadline (a cut is `oauth2.timeout`, not attempted).
    async fn key(&self) -> Result<(ApiKey, Option<Token>), SendError> {
        #[cfg(feature = "graph")]
        if let Some(login) = &self.login {
            let token = self.within_timeout(login.token()).await??;
            return Ok((ApiKey::new(token.secret()), Some(token)));
        }
        Ok((self.key.clone(), None))
    }

    /// `wait` (on a login: its token, or forgetting one) bounded by the transport's timeout
    /// and the send's deadline, as SMTP's login is: a cut is `oauth2.timeout`, not attempted.
    #[cfg(feature = "graph")]
    async fn within_timeout<F: std::future::Future>(
        &self,
        wait: F,
    ) -> Result<F::Output, SendError> {
        let cut = || {
            SendError::fixed(
                crate::Category::Timeout,
                "oauth2.timeout",
                "the token source did not answer within the send's timeout; nothing was sent",
            )
            .not_attempted()
        };
        let bounded = tokio::time::timeout(self.client.timeout(), wait);
        crate::deadline::bounded(async { bounded.await.map_err(|_elapsed| cut()) }, || {
            Err(cut())
        })
        .await
    }

    /// Makes `call` with `key` and reads its answer.
    async fn call(&self, call: Call, key: &ApiKey) -> Result<Answer, SendError> {
        let url = format!("{}{}", self.endpoint, call.path);
        // A URL that does not parse is left to reqwest, which says so (`<provider>.client`).
        if let Ok(parsed) = reqwest::Url::parse(&url)
            && let Some(why) = http_policy::clear_http_refused(&parsed, self.insecure_http)
        {
            return Err(SendError::new(
                crate::Category::Configuration,
                format!("{}.endpoint", P::NAME),
                why,
            ));
        }
        let span = crate::telemetry::http_span(
            &self.name,
            call.method.as_str(),
            call.template.unwrap_or(&call.path),
            &host_of(&self.endpoint),
        );
        let mut request = self.client.request(P::NAME, call.method, &url)?;
        request = self.provider.authorize(request, key);
        for (name, value) in call.headers {
            request = request.header(name, value);
        }
        request = match call.body {
            CallBody::Empty => request,
            #[cfg(any(feature = "postmark", feature = "resend", feature = "sendgrid"))]
            CallBody::Json(bytes) => request
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(bytes),
            #[cfg(feature = "mailgun")]
            CallBody::Form(form) => request.multipart(form),
            #[cfg(feature = "graph")]
            CallBody::Text(bytes) => request
                .header(reqwest::header::CONTENT_TYPE, "text/plain")
                .body(bytes),
        };
        let answer =
            tracing::Instrument::instrument(self.client.send(P::NAME, request), span.clone()).await;
        match &answer {
            Ok(answer) => crate::telemetry::answered(&span, answer.status),
            Err(error) => crate::telemetry::failed(&span, error),
        }
        answer
    }

    /// One send: the call, and its answer read; under a login, a `401` makes it once more
    /// with a new token.
    async fn send_once(&self, envelope: &Envelope, raw: &[u8]) -> Result<Receipt, SendError> {
        let tag = |error: SendError| error.with_transport(&self.name);
        let call = self.provider.send_call(envelope, raw).map_err(tag)?;
        let (key, token) = self.key().await.map_err(tag)?;
        // Handed to the client: a deadline's cut from now on may leave the message with the
        // provider (DESIGN §19).
        crate::deadline::may_have_reached();
        let answer = self.call(call, &key).await.map_err(tag)?;
        let (answer, key) = self
            .again_if_refused(answer, key, token, envelope, raw)
            .await
            .map_err(tag)?;
        if !answer.is_success() {
            return Err(tag(self.failure(&answer, &key)));
        }
        let receipt = Receipt::new(&self.name);
        if answer.cut_off {
            tracing::warn!(
                transport = %self.name,
                status = answer.status,
                "the provider took the message, but its answer was cut off: no message id"
            );
            return Ok(receipt);
        }
        match self.provider.sent(&answer) {
            Sent::Delivered(Some(id)) => Ok(receipt.with_message_id(id)),
            Sent::Delivered(None) => {
                tracing::warn!(transport = %self.name, "the provider took the message but gave no message id");
                Ok(receipt)
            }
            Sent::Refused => Err(tag(self.failure(&answer, &key))),
            Sent::Foreign => Err(tag(self.unexpected(&answer))),
            #[cfg(feature = "graph")]
            Sent::DeliveredWithoutId(why) => Ok(receipt.with_response(why)),
        }
    }

    /// Under a login, a `401` (`answer`, to a request with `token`) forgets the token and
    /// makes the send once more with a new one: its answer, and the key it carried.
    #[cfg(feature = "graph")]
    async fn again_if_refused(
        &self,
        answer: Answer,
        key: ApiKey,
        token: Option<Token>,
        envelope: &Envelope,
        raw: &[u8],
    ) -> Result<(Answer, ApiKey), SendError> {
        let (401, Some(login), Some(token)) = (answer.status, &self.login, token) else {
            return Ok((answer, key));
        };
        // Refused before anything was sent: a token revoked, or expired early.
        crate::deadline::not_reached();
        self.within_timeout(login.refused(&token)).await?;
        tracing::debug!(transport = %self.name, "http.token_refused: once more with a new token");
        let call = self.provider.send_call(envelope, raw)?;
        let (key, _) = self.key().await?;
        crate::deadline::may_have_reached();
        Ok((self.call(call, &key).await?, key))
    }

    /// Without logins, the answer as it is.
    #[cfg(not(feature = "graph"))]
    #[allow(clippy::unused_async)] // the same call as with logins
    async fn again_if_refused(
        &self,
        answer: Answer,
        key: ApiKey,
        _token: Option<Token>,
        _envelope: &Envelope,
        _raw: &[u8],
    ) -> Result<(Answer, ApiKey), SendError> {
        Ok((answer, key))
    }

    /// An error answer as a [`SendError`], sorted by the provider's table without `key` in
    /// sight, and left out where the key got through anyway (in a form no redaction knew).
    fn failure(&self, answer: &Answer, key: &ApiKey) -> SendError {
        let body = key.redact(&String::from_utf8_lossy(&answer.body));
        let error = self
            .provider
            .classify(answer.status, &answer.headers, body.as_bytes());
        let key = key.expose();
        if key.is_empty() || !format!("{error:?}").contains(key) {
            return error;
        }
        let mut safe = SendError::new(
            error.category(),
            format!("{}.{}", P::NAME, answer.status),
            format!(
                "HTTP {} (the provider's message held the API key and was left out)",
                answer.status
            ),
        );
        if let Some(after) = error.retry_after() {
            safe = safe.with_retry_after(after);
        }
        if error.is_maybe_delivered() {
            safe = safe.maybe_delivered();
        }
        if error.is_about_the_message() {
            safe = safe.about_the_message();
        }
        safe
    }

    /// A 2xx whose body is not the provider's answer: the provider may have taken the
    /// message, or something else answered.
    fn unexpected(&self, answer: &Answer) -> SendError {
        SendError::new(
            crate::Category::ServerError,
            format!("{}.unexpected_answer", P::NAME),
            format!(
                "HTTP {}, but the body is not {}'s answer to a send (a proxy or a wrong endpoint?); it may have taken the message",
                answer.status,
                P::NAME
            ),
        )
        .maybe_delivered()
    }
}

#[async_trait::async_trait]
impl<P: Provider> Transport for HttpTransport<P> {
    fn name(&self) -> &str {
        &self.name
    }

    async fn send_raw(&self, envelope: &Envelope, raw: &[u8]) -> Result<Receipt, SendError> {
        // One key for this send's requests (a 401's second try included), unless a layer
        // outside opened the handover already (DESIGN §21).
        let result = crate::idempotency::handover(self.send_once(envelope, raw)).await;
        // Answered: a deadline's cut from now on (in a layer above, still at work) does not
        // take this try for one in flight (DESIGN §19).
        crate::deadline::try_answered(&result);
        result
    }

    fn send_many<'a>(&'a self, messages: MessageStream<'a>) -> ReceiptStream<'a> {
        crate::transport::send_concurrently(self, messages, self.concurrency)
    }

    async fn verify(&self) -> Result<(), SendError> {
        let tag = |error: SendError| error.with_transport(&self.name);
        let (key, token) = self.key().await.map_err(tag)?;
        if token.is_some()
            && let Some(verdict) = self.provider.verify_token(key.expose())
        {
            return verdict.map_err(tag);
        }
        let answer = self
            .call(self.provider.verify_call(), &key)
            .await
            .map_err(tag)?;
        self.provider
            .verified(&answer, || self.failure(&answer, &key))
            .map_err(tag)
    }
}

impl<P: Provider> fmt::Debug for HttpTransport<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct(P::TYPE_NAME)
            .field("name", &self.name)
            .field("endpoint", &self.endpoint)
            .field("timeout", &self.client.timeout())
            .field("concurrency", &self.concurrency)
            .field("insecure_http", &self.insecure_http)
            .field("key", &self.key)
            .field("provider", &self.provider)
            .finish()
    }
}

#[cfg(test)]
#[cfg(feature = "postmark")]
mod tests {
    use crate::PostmarkTransport;

    use super::*;

    #[test]
    fn a_transport_keeps_its_timeout_and_defaults_to_30_seconds() {
        assert_eq!(PostmarkTransport::new("t").timeout(), DEFAULT_TIMEOUT);
        let short = PostmarkTransport::new("t").with_timeout(Duration::from_millis(1500));
        assert_eq!(short.timeout(), Duration::from_millis(1500));
    }

    #[test]
    fn debug_shows_the_settings_and_stars_for_the_key() {
        let postmark = PostmarkTransport::new("secret-token")
            .with_endpoint("http://127.0.0.1:9//")
            .with_name("pm")
            .with_concurrency(0);
        let text = format!("{postmark:?}");
        assert!(text.starts_with("PostmarkTransport {"), "{text}");
        assert!(text.contains("name: \"pm\""), "{text}");
        assert!(text.contains("endpoint: \"http://127.0.0.1:9\""), "{text}");
        assert!(text.contains("concurrency: 1"), "{text}");
        assert!(text.contains("key: ***"), "{text}");
        assert!(!text.contains("secret-token"), "{text}");
    }
}
