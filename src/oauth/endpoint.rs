//! The built-in token sources (feature `oauth2`): a provider's token endpoint (RFC 6749),
//! asked over HTTPS with the client-credentials grant (§4.4) or the refresh-token grant
//! (§6); each token kept until a minute before it expires.

use std::fmt;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use super::settings::required;
use super::{AccessToken, TokenCache, TokenSource};
use crate::adapters::http_policy;
use crate::{Category, ConfigError, SendError};

/// How long one request to the token endpoint may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// The most of an error's description quoted in a [`SendError`].
const QUOTED: usize = 200;
/// The longest answer read: a token answer is a small JSON object (Microsoft's tokens are a
/// few KiB); anything longer is not a token endpoint's, and is refused unread.
const MAX_ANSWER_BYTES: usize = 64 * 1024;

/// What the endpoint is asked for.
pub(super) enum Grant {
    ClientCredentials {
        scope: String,
    },
    /// The refresh token, replaced when the server returns a new one.
    RefreshToken(Mutex<String>),
}

/// A provider's token endpoint as a [`TokenSource`]: made by
/// [`ClientCredentials::build`](super::ClientCredentials::build) or
/// [`RefreshToken::build`](super::RefreshToken::build). Each token is kept until a minute
/// before it expires (or until a server refuses it), for all who ask.
///
/// Its HTTP client keeps the crate's one policy: no redirect is followed (a 3xx is a
/// `Configuration` error, and the form with its secrets goes nowhere else), an answer over
/// 64 KiB is refused unread (`oauth2.answer_too_large`), and `http://` is taken only to a
/// loopback host or through `allow_insecure_http()`.
///
/// Its errors: `Authentication` (`oauth2.invalid_grant`, `oauth2.invalid_client`, ...) when
/// the endpoint refuses the client or the grant (`400` with such an error, `401`, `403`);
/// `Configuration` (`oauth2.invalid_scope`, `oauth2.endpoint`) for a request it cannot
/// read or a URL that is not a token endpoint; `RateLimited` for `429`,
/// `ServiceUnavailable` for `5xx`, and `Timeout` or `Network` when it cannot be reached.
pub struct TokenEndpoint {
    url: reqwest::Url,
    client_id: String,
    client_secret: String,
    grant: Grant,
    http: reqwest::Client,
    cache: TokenCache,
}

impl fmt::Debug for TokenEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let grant = match self.grant {
            Grant::ClientCredentials { .. } => "client_credentials",
            Grant::RefreshToken(_) => "refresh_token",
        };
        f.debug_struct("TokenEndpoint")
            .field("url", &self.url.as_str())
            .field("client_id", &self.client_id)
            .field("grant", &grant)
            .finish_non_exhaustive()
    }
}

/// A token endpoint's answer (RFC 6749 §5.1, §5.2).
#[derive(serde::Deserialize)]
struct Answer {
    access_token: Option<String>,
    /// Seconds; some endpoints write it as text.
    expires_in: Option<serde_json::Value>,
    refresh_token: Option<String>,
    error: Option<String>,
    error_description: Option<String>,
}

impl TokenEndpoint {
    pub(super) fn new(
        token_url: &str,
        insecure_allowed: bool,
        client_id: String,
        client_secret: String,
        grant: Grant,
    ) -> Result<TokenEndpoint, ConfigError> {
        let url = reqwest::Url::parse(token_url)
            .ok()
            .filter(|url| matches!(url.scheme(), "https" | "http") && url.host_str().is_some())
            .ok_or_else(|| {
                ConfigError::new("token_url", "expected the token endpoint's https:// URL")
            })?;
        if let Some(why) = http_policy::clear_http_refused(&url, insecure_allowed) {
            return Err(ConfigError::new("token_url", why));
        }
        if http_policy::clear_http_refused(&url, false).is_some() {
            http_policy::warn_insecure_http("oauth2", url.as_str());
        }
        required("client_id", &client_id)?;
        let http = http_policy::client(REQUEST_TIMEOUT).map_err(|error| {
            ConfigError::new(
                "token_url",
                format!("no HTTP client could be made: {error}"),
            )
        })?;
        Ok(TokenEndpoint {
            url,
            client_id,
            client_secret,
            grant,
            http,
            cache: TokenCache::default(),
        })
    }

    /// The request's form: the grant, and the client's identity in the body (RFC 6749
    /// §2.3.1), which Microsoft and Google both read.
    fn form(&self) -> String {
        let mut form = url::form_urlencoded::Serializer::new(String::new());
        match &self.grant {
            Grant::ClientCredentials { scope } => {
                form.append_pair("grant_type", "client_credentials");
                form.append_pair("scope", scope);
            }
            Grant::RefreshToken(token) => {
                form.append_pair("grant_type", "refresh_token");
                let token = token.lock().unwrap_or_else(PoisonError::into_inner);
                form.append_pair("refresh_token", &token);
            }
        }
        form.append_pair("client_id", &self.client_id);
        if !self.client_secret.is_empty() {
            form.append_pair("client_secret", &self.client_secret);
        }
        form.finish()
    }

    /// Asks the endpoint for a new token.
    async fn fetch(&self) -> Result<AccessToken, SendError> {
        let mut sent = self
            .http
            .post(self.url.clone())
            .header("Content-Type", "application/x-www-form-urlencoded")
            .header("Accept", "application/json")
            .body(self.form())
            .send()
            .await
            .map_err(|error| unreachable_endpoint(&error))?;
        let status = sent.status().as_u16();
        let body = http_policy::read(&mut sent, MAX_ANSWER_BYTES).await;
        if let Some(error) = body.cut_off {
            return Err(unreachable_endpoint(&error));
        }
        if body.over {
            return Err(SendError::fixed(
                Category::Configuration,
                "oauth2.answer_too_large",
                "the token endpoint's answer is over 64 KiB, which no token answer is; it \
                 was left unread: is token_url the provider's token endpoint?",
            ));
        }
        let answer: Option<Answer> = serde_json::from_slice(&body.bytes).ok();
        if (200..300).contains(&status) {
            return self.token_from(answer);
        }
        Err(self.refusal(status, answer))
    }

    /// The token of a success, keeping a new refresh token.
    fn token_from(&self, answer: Option<Answer>) -> Result<AccessToken, SendError> {
        let Some(answer) = answer else {
            return Err(SendError::fixed(
                Category::Configuration,
                "oauth2.endpoint",
                "the token endpoint's answer is not a token (JSON with access_token): is \
                 token_url the provider's token endpoint?",
            ));
        };
        let Some(secret) = answer.access_token.filter(|token| !token.is_empty()) else {
            return Err(SendError::fixed(
                Category::Configuration,
                "oauth2.endpoint",
                "the token endpoint's answer holds no access_token",
            ));
        };
        if let (Grant::RefreshToken(kept), Some(new)) = (&self.grant, answer.refresh_token)
            && !new.is_empty()
        {
            *kept.lock().unwrap_or_else(PoisonError::into_inner) = new;
        }
        let lifetime = answer.expires_in.and_then(|value| match value {
            serde_json::Value::Number(number) => number.as_u64(),
            serde_json::Value::String(text) => text.trim().parse().ok(),
            _ => None,
        });
        let token = AccessToken::new(secret);
        Ok(match lifetime {
            Some(seconds) => token.expires_in(Duration::from_secs(seconds)),
            None => token,
        })
    }

    /// The error of a refusal, by status and the endpoint's `error` (RFC 6749 §5.2).
    fn refusal(&self, status: u16, answer: Option<Answer>) -> SendError {
        let (error, description) = answer
            .map(|answer| (answer.error, answer.error_description))
            .unwrap_or_default();
        let error = error.filter(|code| {
            !code.is_empty()
                && code.len() <= 40
                && code.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
        });
        let category = match (status, error.as_deref()) {
            (429, _) => Category::RateLimited,
            (500..=599, _) => Category::ServiceUnavailable,
            (401 | 403, _) => Category::Authentication,
            (
                400,
                Some("invalid_grant" | "invalid_client" | "unauthorized_client" | "access_denied"),
            ) => Category::Authentication,
            _ => Category::Configuration,
        };
        let code = match &error {
            Some(error) => format!("oauth2.{error}"),
            None => "oauth2.endpoint".to_owned(),
        };
        let mut message = format!("the token endpoint answered {status}");
        if let Some(error) = &error {
            message.push_str(&format!(" {error}"));
        }
        if (300..400).contains(&status) {
            // Following it would post the client's secrets wherever it points.
            message.push_str(
                " (a redirect, not followed: token_url must be the token endpoint itself)",
            );
        }
        if let Some(description) = description {
            let description: String = self.redact(&description).chars().take(QUOTED).collect();
            message.push_str(&format!(": {description}"));
        }
        SendError::new(category, code, message)
    }

    /// `text` with every secret this source holds as `***`.
    fn redact(&self, text: &str) -> String {
        let mut text = text.to_owned();
        let mut secrets = vec![self.client_secret.clone()];
        if let Grant::RefreshToken(token) = &self.grant {
            secrets.push(token.lock().unwrap_or_else(PoisonError::into_inner).clone());
        }
        for secret in secrets.iter().filter(|secret| secret.len() >= 4) {
            text = text.replace(secret.as_str(), "***");
        }
        text
    }
}

/// The endpoint could not be reached, or did not answer in time. The error's text never
/// holds the request (reqwest's names only the URL, which holds no secret).
fn unreachable_endpoint(error: &reqwest::Error) -> SendError {
    let (category, code) = if error.is_timeout() {
        (Category::Timeout, "oauth2.timeout")
    } else {
        (Category::Network, "oauth2.network")
    };
    SendError::new(
        category,
        code,
        format!("the token endpoint could not be reached: {error}"),
    )
}

#[async_trait::async_trait]
impl TokenSource for TokenEndpoint {
    async fn token(&self) -> Result<AccessToken, SendError> {
        self.cache.get(self.fetch()).await
    }

    async fn refused(&self, token: &AccessToken) {
        self.cache.forget(token).await;
    }
}
