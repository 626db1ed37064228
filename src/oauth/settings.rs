//! The settings of the built-in token sources (feature `oauth2`), as a user writes them:
//! [`ClientCredentials`] and [`RefreshToken`], and [`InsecureHttp`] for a token endpoint
//! reached over clear `http://`. Each `build` checks them and makes a [`TokenEndpoint`].

use std::fmt;
use std::sync::Mutex;

use super::endpoint::{Grant, TokenEndpoint};
use crate::ConfigError;

/// Microsoft 365's client-credentials flow (RFC 6749 §4.4): the application's own identity,
/// with `scope` `https://outlook.office365.com/.default`. [`build`](Self::build) makes the
/// [`TokenSource`](super::TokenSource). Its `Debug` never shows the secret.
///
/// ```
/// use mail_breaker::oauth::ClientCredentials;
///
/// let tokens = ClientCredentials {
///     token_url: "https://login.microsoftonline.com/TENANT/oauth2/v2.0/token".to_owned(),
///     client_id: "00000000-0000-0000-0000-000000000000".to_owned(),
///     client_secret: "s3cret".to_owned(),
///     scope: "https://outlook.office365.com/.default".to_owned(),
/// }
/// .build()?;
/// assert!(!format!("{tokens:?}").contains("s3cret"));
/// # Ok::<(), mail_breaker::ConfigError>(())
/// ```
#[derive(Clone)]
pub struct ClientCredentials {
    /// The token endpoint: `https://`, or `http://` to a loopback host (a test server);
    /// `http://` to another host only through `allow_insecure_http()`.
    pub token_url: String,
    /// The application's (client's) id.
    pub client_id: String,
    /// The application's secret.
    pub client_secret: String,
    /// What the token is for: `https://outlook.office365.com/.default` for Microsoft 365.
    pub scope: String,
}

/// The refresh-token flow (RFC 6749 §6): a user's consent kept as a refresh token, for
/// Gmail and Google Workspace accounts and Microsoft's delegated flow. A new refresh token
/// the server returns (rotation) is kept and used from then on. [`build`](Self::build) makes
/// the [`TokenSource`](super::TokenSource). Its `Debug` never shows the secret or the refresh
/// token.
///
/// ```
/// use mail_breaker::oauth::RefreshToken;
///
/// let tokens = RefreshToken {
///     token_url: "https://oauth2.googleapis.com/token".to_owned(),
///     client_id: "1234.apps.googleusercontent.com".to_owned(),
///     client_secret: "s3cret".to_owned(),
///     refresh_token: "1//0refresh".to_owned(),
/// }
/// .build()?;
/// assert!(!format!("{tokens:?}").contains("1//0refresh"));
/// # Ok::<(), mail_breaker::ConfigError>(())
/// ```
#[derive(Clone)]
pub struct RefreshToken {
    /// The token endpoint: `https://`, or `http://` to a loopback host (a test server);
    /// `http://` to another host only through `allow_insecure_http()`.
    pub token_url: String,
    /// The application's (client's) id.
    pub client_id: String,
    /// The application's secret; empty for a public client, which has none.
    pub client_secret: String,
    /// The refresh token the user's consent gave.
    pub refresh_token: String,
}

impl fmt::Debug for ClientCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientCredentials")
            .field("token_url", &self.token_url)
            .field("client_id", &self.client_id)
            .field("client_secret", &"***")
            .field("scope", &self.scope)
            .finish()
    }
}

impl fmt::Debug for RefreshToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RefreshToken")
            .field("token_url", &self.token_url)
            .field("client_id", &self.client_id)
            .field("client_secret", &"***")
            .field("refresh_token", &"***")
            .finish()
    }
}

impl ClientCredentials {
    /// The settings for Microsoft Graph ([`GraphTransport`](crate::GraphTransport)):
    /// Microsoft's token endpoint of `tenant` (its id, or a domain such as
    /// `contoso.onmicrosoft.com`) and the scope `https://graph.microsoft.com/.default`.
    ///
    /// ```
    /// use mail_breaker::oauth::ClientCredentials;
    ///
    /// let settings = ClientCredentials::for_graph("contoso.onmicrosoft.com", "app-id", "s3cret");
    /// assert_eq!(
    ///     settings.token_url,
    ///     "https://login.microsoftonline.com/contoso.onmicrosoft.com/oauth2/v2.0/token"
    /// );
    /// assert_eq!(settings.scope, "https://graph.microsoft.com/.default");
    /// ```
    #[cfg(feature = "graph")]
    pub fn for_graph(
        tenant: &str,
        client_id: impl Into<String>,
        client_secret: impl Into<String>,
    ) -> ClientCredentials {
        let tenant: String =
            percent_encoding::utf8_percent_encode(tenant, percent_encoding::NON_ALPHANUMERIC)
                .to_string()
                .replace("%2E", ".")
                .replace("%2D", "-");
        ClientCredentials {
            token_url: format!("https://login.microsoftonline.com/{tenant}/oauth2/v2.0/token"),
            client_id: client_id.into(),
            client_secret: client_secret.into(),
            scope: crate::adapters::http::graph::GRAPH_SCOPE.to_owned(),
        }
    }

    /// The token source: a [`ConfigError`] naming `token_url`, `client_id`,
    /// `client_secret` or `scope` when one cannot work, and `token_url` when it is
    /// `http://` to a host other than this machine (see
    /// [`allow_insecure_http`](Self::allow_insecure_http)).
    pub fn build(self) -> Result<TokenEndpoint, ConfigError> {
        self.build_with(false)
    }

    /// Takes a `token_url` of `http://` to any host, which sends the client secret in
    /// clear text: for a token endpoint on a network the operator trusts. Logged (WARN) when
    /// the source is built.
    ///
    /// ```
    /// use mail_breaker::oauth::ClientCredentials;
    ///
    /// let settings = ClientCredentials {
    ///     token_url: "http://tokens.internal/token".to_owned(),
    ///     client_id: "app-id".to_owned(),
    ///     client_secret: "s3cret".to_owned(),
    ///     scope: "smtp".to_owned(),
    /// };
    /// assert_eq!(settings.clone().build().unwrap_err().setting(), "token_url");
    /// let tokens = settings.allow_insecure_http().build()?;
    /// # let _ = tokens;
    /// # Ok::<(), mail_breaker::ConfigError>(())
    /// ```
    pub fn allow_insecure_http(self) -> InsecureHttp<ClientCredentials> {
        InsecureHttp(self)
    }

    fn build_with(self, insecure_allowed: bool) -> Result<TokenEndpoint, ConfigError> {
        required("client_secret", &self.client_secret)?;
        required("scope", &self.scope)?;
        TokenEndpoint::new(
            &self.token_url,
            insecure_allowed,
            self.client_id,
            self.client_secret,
            Grant::ClientCredentials { scope: self.scope },
        )
    }
}

impl RefreshToken {
    /// The token source: a [`ConfigError`] naming `token_url`, `client_id` or
    /// `refresh_token` when one cannot work, and `token_url` when it is `http://` to a
    /// host other than this machine (see [`allow_insecure_http`](Self::allow_insecure_http)).
    pub fn build(self) -> Result<TokenEndpoint, ConfigError> {
        self.build_with(false)
    }

    /// Takes a `token_url` of `http://` to any host, which sends the refresh token and the
    /// client secret in clear text: for a token endpoint on a network the operator trusts.
    /// Logged (WARN) when the source is built.
    ///
    /// ```
    /// use mail_breaker::oauth::RefreshToken;
    ///
    /// let tokens = RefreshToken {
    ///     token_url: "http://tokens.internal/token".to_owned(),
    ///     client_id: "app-id".to_owned(),
    ///     client_secret: String::new(),
    ///     refresh_token: "1//0refresh".to_owned(),
    /// }
    /// .allow_insecure_http()
    /// .build()?;
    /// # let _ = tokens;
    /// # Ok::<(), mail_breaker::ConfigError>(())
    /// ```
    pub fn allow_insecure_http(self) -> InsecureHttp<RefreshToken> {
        InsecureHttp(self)
    }

    fn build_with(self, insecure_allowed: bool) -> Result<TokenEndpoint, ConfigError> {
        required("refresh_token", &self.refresh_token)?;
        TokenEndpoint::new(
            &self.token_url,
            insecure_allowed,
            self.client_id,
            self.client_secret,
            Grant::RefreshToken(Mutex::new(self.refresh_token)),
        )
    }
}

/// A token source's settings whose `token_url` may be `http://` to any host: made by
/// [`ClientCredentials::allow_insecure_http`] or [`RefreshToken::allow_insecure_http`], built
/// by its `build`. Its `Debug` is the settings', which never shows a secret.
#[derive(Clone, Debug)]
pub struct InsecureHttp<S>(S);

impl InsecureHttp<ClientCredentials> {
    /// The token source, as [`ClientCredentials::build`] makes it but taking `http://` to
    /// any host.
    ///
    /// ```
    /// # use mail_breaker::oauth::ClientCredentials;
    /// let tokens = ClientCredentials {
    ///     token_url: "http://tokens.internal/token".to_owned(),
    ///     client_id: "app-id".to_owned(),
    ///     client_secret: "s3cret".to_owned(),
    ///     scope: "smtp".to_owned(),
    /// }
    /// .allow_insecure_http()
    /// .build()?;
    /// # let _ = tokens;
    /// # Ok::<(), mail_breaker::ConfigError>(())
    /// ```
    pub fn build(self) -> Result<TokenEndpoint, ConfigError> {
        self.0.build_with(true)
    }
}

impl InsecureHttp<RefreshToken> {
    /// The token source, as [`RefreshToken::build`] makes it but taking `http://` to any
    /// host.
    ///
    /// ```
    /// # use mail_breaker::oauth::RefreshToken;
    /// let tokens = RefreshToken {
    ///     token_url: "http://tokens.internal/token".to_owned(),
    ///     client_id: "app-id".to_owned(),
    ///     client_secret: "s3cret".to_owned(),
    ///     refresh_token: "1//0refresh".to_owned(),
    /// }
    /// .allow_insecure_http()
    /// .build()?;
    /// # let _ = tokens;
    /// # Ok::<(), mail_breaker::ConfigError>(())
    /// ```
    pub fn build(self) -> Result<TokenEndpoint, ConfigError> {
        self.0.build_with(true)
    }
}

pub(super) fn required(setting: &'static str, value: &str) -> Result<(), ConfigError> {
    if value.trim().is_empty() {
        return Err(ConfigError::new(setting, "must not be empty"));
    }
    Ok(())
}
