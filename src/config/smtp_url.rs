//! An `smtp://` or `smtps://` member's URL, every option of its query read here: known, or a
//! [`ConfigError`] naming it (`member[0].url.TLS`), never ignored.
//!
//! | option | values | default |
//! |---|---|---|
//! | `tls` | `required` (STARTTLS, else no send), `opportunistic`, `none` (clear text, said in words) | `required` when the URL holds credentials or `auth`, else `none`; `smtps://` is implicit TLS and takes no `tls` |
//! | `auth_without_tls` | `true`, `false`: credentials on a clear-text connection (`tls=none`) | `false`: `tls=none` with credentials is an error naming it |
//! | `auth` | `xoauth2`, `oauthbearer`: OAuth 2.0 (DESIGN §16), the URL's user the mailbox | a password, if the URL holds one |
//! | `oauth2.token_url`, `oauth2.client_id`, `oauth2.client_secret` | the token endpoint and the application | required with `auth` (`client_secret` for a confidential client) |
//! | `oauth2.scope` | the client-credentials flow's scope (`https://outlook.office365.com/.default`) | |
//! | `oauth2.refresh_token` | the refresh-token flow's token, instead of `scope` | |

use std::fmt;

use super::ConfigError;
use super::provider::Secret;

/// The options an SMTP URL's query may hold.
const OPTIONS: [&str; 8] = [
    "tls",
    "auth_without_tls",
    "auth",
    "oauth2.token_url",
    "oauth2.client_id",
    "oauth2.client_secret",
    "oauth2.scope",
    "oauth2.refresh_token",
];

/// The options whose values are secrets.
const SECRET_OPTIONS: [&str; 2] = ["oauth2.client_secret", "oauth2.refresh_token"];

/// How the member's connections use TLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TlsChoice {
    /// `smtps://`: TLS from the first octet.
    Implicit,
    /// STARTTLS, else no send.
    Required,
    /// STARTTLS where the server offers it.
    Opportunistic,
    /// Clear text, said in words (`tls=none`) or a URL without credentials.
    None,
}

/// An OAuth 2.0 login read from the URL: the mechanism and where the tokens come from.
#[derive(Clone, PartialEq)]
pub(crate) struct OAuth2Url {
    pub(crate) mechanism: &'static str,
    pub(crate) user: String,
    pub(crate) token_url: String,
    pub(crate) client_id: String,
    pub(crate) client_secret: Option<Secret>,
    /// The client-credentials flow's scope, or
    pub(crate) scope: Option<String>,
    /// the refresh-token flow's token.
    pub(crate) refresh_token: Option<Secret>,
}

impl fmt::Debug for OAuth2Url {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OAuth2Url")
            .field("mechanism", &self.mechanism)
            .field("token_url", &self.token_url)
            .field("client_id", &self.client_id)
            .field("client_secret", &self.client_secret)
            .field("scope", &self.scope)
            .field("refresh_token", &self.refresh_token)
            .finish_non_exhaustive()
    }
}

/// An SMTP URL read: what [`SmtpTransport::from_url`](crate::SmtpTransport::from_url) reads
/// (without the options), and the options it does not.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SmtpUrl {
    /// The URL in `from_url`'s forms: `tls` as read here, no other option.
    base: Secret,
    pub(crate) tls: TlsChoice,
    pub(crate) auth_without_tls: bool,
    pub(crate) oauth2: Option<OAuth2Url>,
}

/// Reads an SMTP URL. An error's setting is `url`, or the option's name (`tls`): read
/// within the member's `url` it is `member[0].url.tls`. No error repeats a value.
pub(crate) fn read(text: &str) -> Result<SmtpUrl, ConfigError> {
    let bad = |why: &str| ConfigError::new("url", why.to_owned());
    let mut url = url::Url::parse(text).map_err(|error| bad(&format!("not a URL: {error}")))?;
    let mut given: Vec<(String, String)> = Vec::new();
    // A secret written with a bare `&` is split there: what follows reads as an option, and
    // naming it would show the secret's tail.
    let holds_secret = url
        .query_pairs()
        .any(|(key, _)| SECRET_OPTIONS.contains(&&*key));
    for (key, value) in url.query_pairs() {
        if !OPTIONS.contains(&&*key) {
            return Err(unknown(&key, holds_secret));
        }
        if given.iter().any(|(other, _)| *other == key) {
            return Err(ConfigError::new(
                key.into_owned(),
                "is given twice; give it once",
            ));
        }
        given.push((key.into_owned(), value.into_owned()));
    }
    let option = |name: &str| find(&given, name);
    let implicit = match url.scheme() {
        "smtp" => false,
        "smtps" => true,
        _ => return Err(bad("expected an smtp:// or smtps:// URL")),
    };
    let auth_without_tls = match option("auth_without_tls") {
        None | Some("false") => false,
        Some("true") => true,
        Some(_) => {
            return Err(ConfigError::new(
                "auth_without_tls",
                "expected true or false",
            ));
        }
    };
    let oauth2 = oauth2(&url, &given)?;
    let authenticates = url.password().is_some() || oauth2.is_some();
    let tls = match (implicit, option("tls")) {
        (true, None) => TlsChoice::Implicit,
        (true, Some(_)) => {
            return Err(ConfigError::new(
                "tls",
                "an smtps:// URL is TLS from the first octet and takes no tls option \
                 (smtp://...?tls=required is STARTTLS)",
            ));
        }
        (false, Some("required")) => TlsChoice::Required,
        (false, Some("opportunistic")) => TlsChoice::Opportunistic,
        (false, Some("none")) => TlsChoice::None,
        (false, Some(_)) => {
            return Err(ConfigError::new(
                "tls",
                "expected required, opportunistic or none",
            ));
        }
        // Credentials never go in clear text unless the URL says so in words.
        (false, None) if authenticates => TlsChoice::Required,
        (false, None) => TlsChoice::None,
    };
    if tls == TlsChoice::None && authenticates && !auth_without_tls {
        return Err(ConfigError::new(
            "auth_without_tls",
            "tls=none sends the credentials in clear text: add auth_without_tls=true for a \
             trusted local relay, or use tls=required",
        ));
    }
    let lettre_tls = match tls {
        TlsChoice::Required => Some("tls=required"),
        TlsChoice::Opportunistic => Some("tls=opportunistic"),
        TlsChoice::Implicit | TlsChoice::None => None,
    };
    url.set_query(lettre_tls);
    // Checks the rest (host, credentials, EHLO name) as the transport reads it.
    let _checked = crate::SmtpTransport::from_url(url.as_str())?;
    Ok(SmtpUrl {
        base: Secret(url.into()),
        tls,
        auth_without_tls,
        oauth2,
    })
}

/// The OAuth 2.0 login `auth` asks for, read from the `oauth2.*` options.
fn oauth2(url: &url::Url, given: &[(String, String)]) -> Result<Option<OAuth2Url>, ConfigError> {
    let option = |name: &str| find(given, name);
    let Some(auth) = option("auth") else {
        if let Some(name) = OPTIONS
            .iter()
            .find(|name| name.starts_with("oauth2.") && option(name).is_some())
        {
            return Err(ConfigError::new(
                *name,
                "is read only with auth=xoauth2 or auth=oauthbearer",
            ));
        }
        return Ok(None);
    };
    let mechanism = match auth {
        "xoauth2" => "XOAUTH2",
        "oauthbearer" => "OAUTHBEARER",
        _ => return Err(ConfigError::new("auth", "expected xoauth2 or oauthbearer")),
    };
    if !cfg!(feature = "oauth2") {
        return Err(ConfigError::new(
            "auth",
            "OAuth 2.0 needs the crate's `oauth2` feature, which this build does not have",
        ));
    }
    if url.password().is_some() {
        return Err(ConfigError::new(
            "auth",
            "OAuth 2.0 logs in with a token, not a password: the URL's user is the mailbox, \
             without a password",
        ));
    }
    let user = percent_encoding::percent_decode_str(url.username())
        .decode_utf8()
        .map_err(|_| ConfigError::new("url", "a user that is not UTF-8 once decoded"))?
        .into_owned();
    if user.is_empty() {
        return Err(ConfigError::new(
            "url",
            "OAuth 2.0 needs the mailbox as the URL's user: smtp://user%40example.com@host",
        ));
    }
    let required = |name: &'static str| {
        option(name)
            .filter(|value| !value.trim().is_empty())
            .map(str::to_owned)
            .ok_or_else(|| ConfigError::new(name, format!("is required with auth={auth}")))
    };
    let token_url = required("oauth2.token_url")?;
    let Some(parsed) = url::Url::parse(&token_url)
        .ok()
        .filter(|parsed| matches!(parsed.scheme(), "https" | "http"))
    else {
        return Err(ConfigError::new(
            "oauth2.token_url",
            "expected the token endpoint's https:// URL",
        ));
    };
    // The crate's HTTP policy: the form carries the client secret and refresh token, so
    // http:// only to this machine (a DSN has no allow_insecure_http).
    #[cfg(feature = "oauth2")]
    if parsed.scheme() == "http" && !crate::adapters::http_policy::is_loopback(&parsed) {
        return Err(ConfigError::new(
            "oauth2.token_url",
            "http:// to a host other than this machine would send the client's secrets in \
             clear text: expected the token endpoint's https:// URL",
        ));
    }
    #[cfg(not(feature = "oauth2"))]
    let _ = parsed;
    let client_id = required("oauth2.client_id")?;
    let client_secret = option("oauth2.client_secret").map(|secret| Secret(secret.to_owned()));
    let scope = option("oauth2.scope").map(str::to_owned);
    let refresh_token = option("oauth2.refresh_token").map(|token| Secret(token.to_owned()));
    match (&scope, &refresh_token) {
        (Some(_), Some(_)) => Err(ConfigError::new(
            "oauth2.refresh_token",
            "the client-credentials flow (oauth2.scope) or the refresh-token flow \
             (oauth2.refresh_token), not both",
        )),
        (None, None) => Err(ConfigError::new(
            "oauth2.scope",
            "is required for the client-credentials flow (or oauth2.refresh_token for the \
             refresh-token flow)",
        )),
        _ => Ok(Some(OAuth2Url {
            mechanism,
            user,
            token_url,
            client_id,
            client_secret,
            scope,
            refresh_token,
        })),
    }
}

/// The value of the option `name`, if given.
fn find<'a>(given: &'a [(String, String)], name: &str) -> Option<&'a str> {
    given
        .iter()
        .find(|(key, _)| key == name)
        .map(|(_, value)| value.as_str())
}

/// An option an SMTP URL does not have, named (or, when it holds a URL or an address, which
/// may carry a password, or the URL holds a secret it may be the tail of, named only as the
/// URL).
fn unknown(option: &str, holds_secret: bool) -> ConfigError {
    let expected = format!(
        "not an option of an smtp:// URL; expected one of {}",
        OPTIONS.join(", ")
    );
    if holds_secret {
        return ConfigError::new(
            "url",
            format!(
                "an option {expected} (an `&` inside a value, such as a secret's, is written \
                 %26)"
            ),
        );
    }
    if option.is_empty() || super::read::may_hold_a_secret(option) {
        return ConfigError::new("url", format!("an option {expected}"));
    }
    ConfigError::new(option.chars().take(40).collect::<String>(), expected)
}

impl SmtpUrl {
    /// The transport's builder this URL describes.
    pub(crate) fn builder(&self) -> Result<crate::SmtpBuilder, ConfigError> {
        let mut builder = crate::SmtpTransport::from_url(&self.base.0)?;
        if self.auth_without_tls {
            builder = builder.auth_without_tls();
        }
        if let Some(oauth2) = &self.oauth2 {
            builder = with_oauth2(builder, oauth2)?;
        }
        Ok(builder)
    }
}

#[cfg(feature = "oauth2")]
fn with_oauth2(
    builder: crate::SmtpBuilder,
    oauth2: &OAuth2Url,
) -> Result<crate::SmtpBuilder, ConfigError> {
    use crate::oauth::{ClientCredentials, OAuthMechanism, RefreshToken};
    let mechanism = match oauth2.mechanism {
        "OAUTHBEARER" => OAuthMechanism::OAuthBearer,
        _ => OAuthMechanism::XOAuth2,
    };
    let secret = oauth2
        .client_secret
        .as_ref()
        .map(|secret| secret.0.clone())
        .unwrap_or_default();
    let builder = match (&oauth2.scope, &oauth2.refresh_token) {
        (_, Some(refresh_token)) => builder.oauth2(
            oauth2.user.clone(),
            RefreshToken {
                token_url: oauth2.token_url.clone(),
                client_id: oauth2.client_id.clone(),
                client_secret: secret,
                refresh_token: refresh_token.0.clone(),
            }
            .build()
            .map_err(|error| error.within("oauth2"))?,
        ),
        (scope, None) => builder.oauth2(
            oauth2.user.clone(),
            ClientCredentials {
                token_url: oauth2.token_url.clone(),
                client_id: oauth2.client_id.clone(),
                client_secret: secret,
                scope: scope.clone().unwrap_or_default(),
            }
            .build()
            .map_err(|error| error.within("oauth2"))?,
        ),
    };
    Ok(builder.oauth2_mechanism(mechanism))
}

#[cfg(not(feature = "oauth2"))]
fn with_oauth2(
    _builder: crate::SmtpBuilder,
    _oauth2: &OAuth2Url,
) -> Result<crate::SmtpBuilder, ConfigError> {
    Err(ConfigError::new(
        "auth",
        "OAuth 2.0 needs the crate's `oauth2` feature, which this build does not have",
    ))
}
