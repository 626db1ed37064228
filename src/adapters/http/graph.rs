//! [`GraphTransport`]: Microsoft Graph's `sendMail` with the MIME message as it is, tokens
//! from OAuth 2.0's client-credentials flow, its errors sorted by [`classify_graph_error`].

use std::collections::HashSet;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;

use super::client::Answer;
use super::frame::{Call, CallBody, Provider, Sent};
use super::{ApiKey, HeaderMap, HttpTransport};
use crate::oauth::{OAuthLogin, TokenSource};
use crate::{Category, Envelope, SendError};

mod classify;

pub use classify::classify_graph_error;

/// The scope a Graph token is asked for: the application permissions an administrator
/// granted (`Mail.Send`).
pub const GRAPH_SCOPE: &str = "https://graph.microsoft.com/.default";

/// The largest request body Graph takes: 4 MB, after base64 (about 3 MB of MIME).
pub const MAX_REQUEST_BYTES: usize = 4 * 1024 * 1024;

/// How many requests a transport makes at once by default: Exchange Online's four
/// concurrent requests per mailbox.
pub const DEFAULT_CONCURRENCY: usize = 4;

/// What the receipt of a delivery says in place of the message id Graph does not give.
const NO_MESSAGE_ID: &str = "202 Accepted: Graph gives no message id";

/// Sends through Microsoft Graph's `sendMail` as one mailbox (the *sender*), for Microsoft
/// 365 tenants where SMTP AUTH is off (security defaults) or retired.
///
/// - **The request** is `POST /v1.0/users/{sender}/sendMail`, its body the formatted
///   message base64-encoded, as `text/plain`. `202 Accepted` is a delivery; Graph gives no
///   message id, and the receipt's [`response`](crate::Receipt::response) says so. Exchange
///   keeps a copy in the sender's Sent Items.
/// - **Graph has no envelope**: it delivers to the message's `To`, `Cc` and `Bcc`. The copy
///   sent gains a `Bcc:` naming every envelope recipient the headers do not (lettre and the
///   `mail-breaker` command strip `Bcc:` before a transport sees the message); a message
///   whose headers name someone the envelope does not (a resend to the deferred recipients
///   alone, or a message naming an address a suppression list took out of the envelope) is
///   [`Unsupported`](Category::Unsupported) (`graph.envelope_differs`), so a pool hands it
///   to a member that has an envelope; so is a `To`, `Cc` or `Bcc` entry without a readable
///   address (`graph.unreadable_recipient`). A message's own `Bcc:` is merged into the one
///   `Bcc:` field sent.
/// - **A message over 4 MB once base64-encoded** (about 3 MB of MIME) is `Unsupported`
///   (`graph.too_large`): Graph's upload sessions take a draft in its JSON form, which
///   loses every MIME header but `x-` ones, so this transport leaves such mail to another
///   member.
/// - **Tokens** come from the [`TokenSource`] (a
///   [`ClientCredentials`](crate::oauth::ClientCredentials) source with scope
///   [`GRAPH_SCOPE`], see [`ClientCredentials::for_graph`](crate::oauth::ClientCredentials::for_graph)),
///   kept until a minute before they expire, fetched once for all sends at once, a failed
///   fetch answered again for a few seconds (as SMTP's OAuth login does). A `401` forgets
///   the token and the request is made once more with a new one; a second `401` is
///   [`Authentication`](Category::Authentication).
/// - **Errors** are sorted by [`classify_graph_error`]; a request that got no answer as the
///   [module table](crate::adapters::http) says.
/// - **verify** fetches a token and checks that its `roles` claim holds `Mail.Send`; it reads
///   nothing from the mailbox (an application that may only send may not read its settings).
/// - **Limits**: four requests at once by default ([`DEFAULT_CONCURRENCY`]); Exchange Online
///   takes 30 messages a minute and 10,000 recipients a day per mailbox, which a
///   [`RateLimitTransport`](crate::RateLimitTransport) around it keeps (0.5 a second, a burst
///   of 1).
///
/// # Example
/// ```no_run
/// use mail_breaker::oauth::ClientCredentials;
/// use mail_breaker::{GraphTransport, Transport};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let tokens = ClientCredentials::for_graph("contoso.onmicrosoft.com", "app-id", "s3cret").build()?;
/// let graph = GraphTransport::new("app@contoso.com", tokens);
/// assert_eq!(graph.name(), "graph");
/// graph.verify().await?;
/// # Ok(())
/// # }
/// ```
pub type GraphTransport = HttpTransport<Graph>;

/// Graph's part of a [`GraphTransport`]: the sender mailbox.
///
/// ```
/// # fn run(tokens: mail_breaker::oauth::TokenEndpoint) {
/// let graph = mail_breaker::GraphTransport::new("app@contoso.com", tokens);
/// assert!(format!("{graph:?}").contains("app@contoso.com"));
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Graph {
    sender: String,
}

impl Graph {
    /// The mailbox the transport sends as.
    pub fn sender(&self) -> &str {
        &self.sender
    }
}

impl HttpTransport<Graph> {
    /// A transport sending as the mailbox `sender` with tokens from `tokens`, to Graph's
    /// endpoint, with a 30-second timeout and [`DEFAULT_CONCURRENCY`], named `graph`.
    ///
    /// ```
    /// # fn run(tokens: mail_breaker::oauth::TokenEndpoint) {
    /// let graph = mail_breaker::GraphTransport::new("app@contoso.com", tokens);
    /// assert_eq!(graph.sender(), "app@contoso.com");
    /// # }
    /// ```
    pub fn new(sender: impl Into<String>, tokens: impl TokenSource + 'static) -> Self {
        let sender = sender.into();
        let login = OAuthLogin::new(sender.clone(), Box::new(tokens), None);
        HttpTransport::with_provider(Graph { sender }, ApiKey::new(""), Graph::NAME.to_owned())
            .with_login(login)
            .with_concurrency(DEFAULT_CONCURRENCY)
    }

    /// The mailbox the transport sends as.
    ///
    /// ```
    /// # fn run(tokens: mail_breaker::oauth::TokenEndpoint) {
    /// let graph = mail_breaker::GraphTransport::new("app@contoso.com", tokens);
    /// assert_eq!(graph.sender(), "app@contoso.com");
    /// # }
    /// ```
    pub fn sender(&self) -> &str {
        self.provider().sender()
    }
}

impl Provider for Graph {
    const NAME: &'static str = "graph";
    const TYPE_NAME: &'static str = "GraphTransport";
    const DEFAULT_ENDPOINT: &'static str = "https://graph.microsoft.com";

    fn authorize(&self, request: reqwest::RequestBuilder, key: &ApiKey) -> reqwest::RequestBuilder {
        request.bearer_auth(key.expose())
    }

    fn send_call(&self, envelope: &Envelope, raw: &[u8]) -> Result<Call, SendError> {
        let copy = with_envelope_as_bcc(envelope, raw)?;
        if encoded_len(copy.len()) > MAX_REQUEST_BYTES {
            return Err(SendError::new(
                Category::Unsupported,
                "graph.too_large",
                format!(
                    "the message ({} bytes) is over Graph's 4 MB once base64-encoded; a \
                     transport that takes larger messages can carry it",
                    copy.len()
                ),
            ));
        }
        let path = format!("/v1.0/users/{}/sendMail", path_segment(&self.sender));
        Ok(Call {
            body: CallBody::Text(BASE64.encode(copy).into_bytes()),
            template: Some("/v1.0/users/{sender}/sendMail"),
            ..Call::new(reqwest::Method::POST, path)
        })
    }

    fn sent(&self, answer: &Answer) -> Sent {
        if answer.status == 202 {
            Sent::DeliveredWithoutId(NO_MESSAGE_ID)
        } else {
            Sent::Foreign
        }
    }

    fn classify(&self, status: u16, headers: &HeaderMap, body: &[u8]) -> SendError {
        classify_graph_error(status, headers, body)
    }

    /// Not made: [`verify_token`](Self::verify_token) decides.
    fn verify_call(&self) -> Call {
        Call {
            template: Some("/v1.0/users/{sender}"),
            ..Call::new(
                reqwest::Method::GET,
                format!("/v1.0/users/{}", path_segment(&self.sender)),
            )
        }
    }

    fn verify_token(&self, token: &str) -> Option<Result<(), SendError>> {
        Some(holds_mail_send(token))
    }
}

/// The length of `bytes` bytes in padded base64: four characters for each three begun.
fn encoded_len(bytes: usize) -> usize {
    bytes.div_ceil(3).saturating_mul(4)
}

/// The sender as one path segment: every byte but RFC 3986's unreserved ones and `@`
/// percent-encoded, so that no `/`, `?` or `#` in it changes the request's path.
fn path_segment(sender: &str) -> String {
    if sender.bytes().all(|byte| byte == b'.') {
        // `.` and `..` would climb the path.
        return sender.replace('.', "%2E");
    }
    const SEGMENT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
        .remove(b'-')
        .remove(b'.')
        .remove(b'_')
        .remove(b'~')
        .remove(b'@');
    percent_encoding::utf8_percent_encode(sender, SEGMENT).to_string()
}

/// The copy of `raw` Graph is sent: with a `Bcc:` naming every envelope recipient its `To`,
/// `Cc` and `Bcc` headers do not; `Unsupported` when those headers name someone the
/// envelope does not, to whom Graph would deliver.
fn with_envelope_as_bcc(envelope: &Envelope, raw: &[u8]) -> Result<Vec<u8>, SendError> {
    let Named { named, bcc } = header_recipients(raw)?;
    let in_envelope: HashSet<String> = envelope
        .to()
        .iter()
        .map(|address| address.to_string().to_lowercase())
        .collect();
    if let Some(stranger) = named.iter().find(|address| !in_envelope.contains(*address)) {
        return Err(SendError::new(
            Category::Unsupported,
            "graph.envelope_differs",
            format!(
                "the headers name {}, who is not in the envelope: Graph delivers to the \
                 headers, so a transport with an envelope must send this one",
                crate::adapters::answer::safe_message(stranger, Category::Unsupported)
            ),
        ));
    }
    let named: HashSet<&str> = named.iter().map(String::as_str).collect();
    let blind: Vec<String> = envelope
        .to()
        .iter()
        .map(ToString::to_string)
        .filter(|address| !named.contains(address.to_lowercase().as_str()))
        .collect();
    if blind.is_empty() {
        return Ok(raw.to_vec());
    }
    // One `Bcc:` field (RFC 5322 allows one): the message's own blind copies and the
    // envelope's, one address a line so that no line grows long, in the message's own line
    // ending.
    let end = if raw.windows(2).any(|pair| pair == b"\r\n") {
        "\r\n"
    } else {
        "\n"
    };
    let all: Vec<&str> = bcc
        .iter()
        .map(String::as_str)
        .chain(blind.iter().map(String::as_str))
        .collect();
    let field = format!("Bcc: {}{end}", all.join(&format!(",{end} ")));
    let rest = without_bcc_fields(raw);
    let mut copy = Vec::with_capacity(field.len() + rest.len());
    copy.extend_from_slice(field.as_bytes());
    copy.extend_from_slice(&rest);
    Ok(copy)
}

/// `raw` without its `Bcc:` fields (each with its folded lines), the rest as it was.
fn without_bcc_fields(raw: &[u8]) -> Vec<u8> {
    let mut kept = Vec::with_capacity(raw.len());
    let mut in_bcc = false;
    let mut at = 0;
    while at < raw.len() {
        let line_end = raw[at..]
            .iter()
            .position(|&byte| byte == b'\n')
            .map_or(raw.len(), |position| at + position + 1);
        let line = &raw[at..line_end];
        if line == b"\r\n" || line == b"\n" {
            // The end of the header: the body goes as it is.
            kept.extend_from_slice(&raw[at..]);
            return kept;
        }
        let folded = line
            .first()
            .is_some_and(|byte| *byte == b' ' || *byte == b'\t');
        if !folded {
            in_bcc = line.len() >= 4 && line[..4].eq_ignore_ascii_case(b"bcc:");
        }
        if !in_bcc {
            kept.extend_from_slice(line);
        }
        at = line_end;
    }
    kept
}

/// Whom a message's headers name.
struct Named {
    /// Every address of `To`, `Cc` and `Bcc`, in lower case, each once.
    named: Vec<String>,
    /// The addresses of its own `Bcc:`, as written.
    bcc: Vec<String>,
}

/// The addresses the formatted message `raw` names in its `To`, `Cc` and `Bcc` headers;
/// `Unsupported` for an entry that holds no readable address (Graph might read it as one),
/// `InvalidMessage` for a message without headers.
fn header_recipients(raw: &[u8]) -> Result<Named, SendError> {
    let message = mail_parser::MessageParser::default()
        .parse_headers(raw)
        .ok_or_else(|| {
            SendError::fixed(
                Category::InvalidMessage,
                "graph.message",
                "the message has no headers to read",
            )
        })?;
    let unreadable = || {
        SendError::fixed(
            Category::Unsupported,
            "graph.unreadable_recipient",
            "a To, Cc or Bcc entry holds no address this transport can read, and Graph \
             delivers to what it reads there: a transport with an envelope must send this one",
        )
    };
    let addresses = |list: Vec<&mail_parser::Address<'_>>| -> Result<Vec<String>, SendError> {
        list.into_iter()
            .flat_map(|address| address.iter())
            .map(|addr| {
                addr.address()
                    .filter(|address| address.contains('@'))
                    .map(str::to_owned)
                    .ok_or_else(unreadable)
            })
            .collect()
    };
    let mut listed = addresses(message.all_to().chain(message.all_cc()).collect())?;
    let bcc = addresses(message.all_bcc().collect())?;
    listed.extend(bcc.iter().cloned());
    let mut seen = HashSet::new();
    let named = listed
        .into_iter()
        .map(|address| address.to_lowercase())
        .filter(|address| seen.insert(address.clone()))
        .collect();
    Ok(Named { named, bcc })
}

/// Whether `token` (a JWT) grants `Mail.Send` in its `roles` claim: the application
/// permission an administrator consented to. A token that is not a JWT cannot be read, and
/// passes (Graph decides at the first send).
fn holds_mail_send(token: &str) -> Result<(), SendError> {
    let Some(claims) = jwt_claims(token) else {
        tracing::debug!("graph.verify: the token is not a JWT; its roles cannot be read");
        return Ok(());
    };
    let roles: Vec<&str> = claims
        .get("roles")
        .and_then(serde_json::Value::as_array)
        .map(|roles| roles.iter().filter_map(serde_json::Value::as_str).collect())
        .unwrap_or_default();
    if roles.contains(&"Mail.Send") {
        return Ok(());
    }
    Err(SendError::new(
        Category::Configuration,
        "graph.no_mail_send",
        format!(
            "the token's roles ({}) do not hold Mail.Send: grant the application Microsoft \
             Graph's Mail.Send application permission, with an administrator's consent",
            if roles.is_empty() {
                "none".to_owned()
            } else {
                roles.join(", ")
            }
        ),
    ))
}

/// The claims of a JWT (its second part, base64url JSON), or `None` when `token` is not one.
fn jwt_claims(token: &str) -> Option<serde_json::Map<String, serde_json::Value>> {
    let mut parts = token.split('.');
    let (_header, payload, _signature) = (parts.next()?, parts.next()?, parts.next()?);
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    serde_json::from_slice(&bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn envelope(to: &[&str]) -> Envelope {
        Envelope::new(
            Some("app@contoso.com".parse().unwrap()),
            to.iter().map(|to| to.parse().unwrap()).collect(),
        )
        .unwrap()
    }

    const RAW: &[u8] = b"From: app@contoso.com\r\nTo: Ann <ann@example.org>\r\nCc: bob@example.org\r\nSubject: hi\r\n\r\nhello\r\n";

    #[test]
    fn a_blind_copy_in_the_envelope_alone_is_named_in_a_bcc_field_of_the_copy_sent() {
        let copy = with_envelope_as_bcc(
            &envelope(&[
                "ann@example.org",
                "bob@example.org",
                "cat@example.org",
                "dan@example.org",
            ]),
            RAW,
        )
        .unwrap();
        let text = String::from_utf8(copy).unwrap();
        assert!(
            text.starts_with("Bcc: cat@example.org,\r\n dan@example.org\r\nFrom:"),
            "{text}"
        );
        assert!(text.ends_with("\r\n\r\nhello\r\n"));
    }

    #[test]
    fn the_bcc_field_ends_its_lines_as_the_message_does() {
        let lf = b"From: app@contoso.com\nTo: ann@example.org\nSubject: hi\n\nhello\n";
        let copy = with_envelope_as_bcc(
            &envelope(&["ann@example.org", "cat@example.org", "dan@example.org"]),
            lf,
        )
        .unwrap();
        let text = String::from_utf8(copy).unwrap();
        assert!(
            text.starts_with("Bcc: cat@example.org,\n dan@example.org\nFrom:"),
            "{text:?}"
        );
    }

    #[test]
    fn a_body_line_that_reads_like_a_bcc_field_is_kept() {
        let raw = b"To: a@example.org\r\nBcc: b@example.org\r\n\r\nBcc: this is the body\r\n";
        assert_eq!(
            without_bcc_fields(raw),
            b"To: a@example.org\r\n\r\nBcc: this is the body\r\n"
        );
    }

    #[test]
    fn a_message_that_is_all_header_loses_its_bcc_field_and_keeps_the_rest() {
        let kept = without_bcc_fields(
            b"To: a@example.org\r\nBcc: b@example.org,\r\n c@example.org\r\nSubject: x\r\n",
        );
        assert_eq!(kept, b"To: a@example.org\r\nSubject: x\r\n");
    }

    #[test]
    fn a_message_whose_headers_name_every_envelope_recipient_goes_as_it_is() {
        let copy = with_envelope_as_bcc(&envelope(&["Ann@Example.org", "bob@example.org"]), RAW);
        assert_eq!(copy.unwrap(), RAW);
    }

    #[test]
    fn headers_naming_someone_the_envelope_does_not_are_unsupported() {
        let error = with_envelope_as_bcc(&envelope(&["bob@example.org"]), RAW).unwrap_err();
        assert_eq!(error.category(), Category::Unsupported);
        assert_eq!(error.code(), "graph.envelope_differs");
    }

    #[test]
    fn a_message_over_four_megabytes_once_encoded_is_unsupported_and_one_under_goes() {
        let graph = Graph {
            sender: "app@contoso.com".to_owned(),
        };
        let to = envelope(&["ann@example.org", "bob@example.org"]);
        let head = RAW.len();
        // 3 MiB of MIME is exactly 4 MiB of base64.
        let fits = [RAW, &vec![b'x'; 3 * 1024 * 1024 - head]].concat();
        assert!(graph.send_call(&to, &fits).is_ok());
        let over = [RAW, &vec![b'x'; 3 * 1024 * 1024 - head + 1]].concat();
        let error = graph.send_call(&to, &over).err().unwrap();
        assert_eq!(error.category(), Category::Unsupported);
        assert_eq!(error.code(), "graph.too_large");
    }

    /// A token source that is never asked: these tests send nothing.
    struct NoTokens;

    #[async_trait::async_trait]
    impl TokenSource for NoTokens {
        async fn token(&self) -> Result<crate::oauth::AccessToken, SendError> {
            Err(SendError::fixed(
                Category::Configuration,
                "test.no_tokens",
                "none",
            ))
        }
    }

    #[test]
    fn a_transport_sends_as_the_sender_it_was_made_with() {
        let graph = GraphTransport::new("app@contoso.com", NoTokens);
        assert_eq!(graph.sender(), "app@contoso.com");
        assert_eq!(graph.provider().sender(), "app@contoso.com");
    }

    #[test]
    fn the_sender_is_one_path_segment() {
        assert_eq!(path_segment("app@contoso.com"), "app@contoso.com");
        assert_eq!(path_segment("a/b?c#d@x"), "a%2Fb%3Fc%23d@x");
        // A segment of dots alone would climb the path.
        assert_eq!(path_segment(".."), "%2E%2E");
        assert_eq!(path_segment("."), "%2E");
    }

    fn jwt(claims: &str) -> String {
        let part = |text: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(text);
        format!("{}.{}.sig", part(r#"{"alg":"RS256"}"#), part(claims))
    }

    #[test]
    fn verify_passes_a_token_whose_roles_hold_mail_send_and_refuses_one_without() {
        assert!(holds_mail_send(&jwt(r#"{"roles":["Mail.Read","Mail.Send"]}"#)).is_ok());
        let error = holds_mail_send(&jwt(r#"{"roles":["Mail.Read"]}"#)).unwrap_err();
        assert_eq!(error.category(), Category::Configuration);
        assert_eq!(error.code(), "graph.no_mail_send");
        assert!(error.message().contains("Mail.Read"), "{}", error.message());
        let none = holds_mail_send(&jwt(r#"{"aud":"x"}"#)).unwrap_err();
        assert!(none.message().contains("(none)"), "{}", none.message());
        assert!(holds_mail_send("opaque-token").is_ok(), "cannot be read");
    }
}
