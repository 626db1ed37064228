//! A member's provider, read from its URL: `smtp://`, `smtps://`, `ses://`, `postmark://`,
//! `resend://`, `sendgrid://`, `mailgun://` and `graph://`.

use std::fmt;

use super::ConfigError;

/// Text that must never be shown: `***` in every `Debug`.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Secret(pub(crate) String);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// Where a member sends, and with which key.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Provider {
    /// An SMTP server, in the URL forms of [`SmtpTransport::from_url`](crate::SmtpTransport::from_url)
    /// (the URL holds the credentials).
    Smtp { url: Secret },
    /// Amazon SES in `region`, with the AWS credentials of the environment; `endpoint` for a
    /// local stand-in.
    Ses {
        region: String,
        endpoint: Option<String>,
    },
    /// An HTTP e-mail API.
    Api {
        api: Api,
        key: Secret,
        /// Mailgun's sending domain.
        domain: Option<String>,
        /// The API's EU region (SendGrid, Mailgun).
        eu: bool,
        /// Another host than the API's own (`https://`, or `http://` for a loopback host).
        endpoint: Option<String>,
    },
    /// Microsoft Graph's `sendMail` as `sender`, with the application `client_id` and its
    /// `secret` in `tenant`.
    Graph {
        client_id: String,
        secret: Secret,
        tenant: String,
        sender: String,
        /// Another Graph than `https://graph.microsoft.com` (a national cloud, a test server).
        endpoint: Option<String>,
        /// Another token endpoint than Microsoft's for `tenant`.
        token_url: Option<String>,
    },
}

/// The HTTP e-mail APIs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Api {
    Postmark,
    Resend,
    SendGrid,
    Mailgun,
}

impl Api {
    fn name(self) -> &'static str {
        match self {
            Api::Postmark => "postmark",
            Api::Resend => "resend",
            Api::SendGrid => "sendgrid",
            Api::Mailgun => "mailgun",
        }
    }

    fn built(self) -> bool {
        match self {
            Api::Postmark => cfg!(feature = "postmark"),
            Api::Resend => cfg!(feature = "resend"),
            Api::SendGrid => cfg!(feature = "sendgrid"),
            Api::Mailgun => cfg!(feature = "mailgun"),
        }
    }
}

/// The provider of the URL `text` at `path`. No error repeats the URL: it may hold a key.
pub(crate) fn read(text: &str, path: &str) -> Result<Provider, ConfigError> {
    let bad = |why: String| ConfigError::new(path.to_owned(), why);
    let url = url::Url::parse(text).map_err(|error| bad(format!("not a URL: {error}")))?;
    let scheme = url.scheme();
    let not_built = |feature: &str| {
        bad(format!(
            "a {scheme}:// member needs the crate's `{feature}` feature, which this build does \
             not have"
        ))
    };
    match scheme {
        "smtp" | "smtps" => {
            if !cfg!(feature = "smtp") {
                return Err(not_built("smtp"));
            }
            #[cfg(feature = "smtp")]
            let _checked = super::smtp_url::read(text).map_err(|error| error.within(path))?;
            Ok(Provider::Smtp {
                url: Secret(text.to_owned()),
            })
        }
        "ses" => {
            if !cfg!(feature = "ses") {
                return Err(not_built("ses"));
            }
            let region = url
                .host_str()
                .filter(|region| !region.is_empty())
                .ok_or_else(|| bad("names no region: ses://eu-west-1".to_owned()))?;
            let mut endpoint = None;
            for (key, value) in url.query_pairs() {
                match &*key {
                    "endpoint" => endpoint = Some(value.into_owned()),
                    other => return Err(unknown_option(path, "ses", other, &["endpoint"])),
                }
            }
            Ok(Provider::Ses {
                region: region.to_owned(),
                endpoint,
            })
        }
        "graph" => {
            if !cfg!(feature = "graph") {
                return Err(not_built("graph"));
            }
            graph_member(&url, path)
        }
        "postmark" | "resend" | "sendgrid" | "mailgun" => {
            let api = match scheme {
                "postmark" => Api::Postmark,
                "resend" => Api::Resend,
                "sendgrid" => Api::SendGrid,
                _ => Api::Mailgun,
            };
            if !api.built() {
                return Err(not_built(api.name()));
            }
            api_member(&url, api, path)
        }
        _ => Err(bad(
            "is not a provider's URL: expected smtp://, smtps://, ses://, postmark://, \
             resend://, sendgrid://, mailgun:// or graph://"
                .to_owned(),
        )),
    }
}

/// `postmark://KEY@default`, `sendgrid://KEY@default?region=eu`,
/// `mailgun://KEY:DOMAIN@default?region=eu`; a host other than `default` is the endpoint.
fn api_member(url: &url::Url, api: Api, path: &str) -> Result<Provider, ConfigError> {
    let bad = |why: String| ConfigError::new(path.to_owned(), why);
    let decode = |text: &str| {
        percent_encoding::percent_decode_str(text)
            .decode_utf8()
            .map(|text| text.into_owned())
            .map_err(|_| bad("a key that is not UTF-8 once decoded".to_owned()))
    };
    let key = decode(url.username())?;
    if key.is_empty() {
        return Err(bad(format!(
            "names no API key: {}://KEY@default",
            api.name()
        )));
    }
    let domain = match (api, url.password()) {
        // The URL's parser drops an empty password: `KEY:@default` has none, as `KEY@default`.
        (Api::Mailgun, Some(domain)) => Some(decode(domain)?),
        (Api::Mailgun, _) => {
            return Err(bad(
                "names no sending domain: mailgun://KEY:DOMAIN@default".to_owned()
            ));
        }
        (_, Some(_)) => {
            return Err(bad(format!(
                "has a password, which {} does not take: {}://KEY@default",
                api.name(),
                api.name()
            )));
        }
        (_, None) => None,
    };
    let mut eu = false;
    for (option, value) in url.query_pairs() {
        match (&*option, api) {
            ("region", Api::SendGrid | Api::Mailgun) => match &*value {
                "eu" => eu = true,
                "us" => eu = false,
                _ => return Err(bad("region: expected eu or us".to_owned())),
            },
            (other, Api::SendGrid | Api::Mailgun) => {
                return Err(unknown_option(path, api.name(), other, &["region"]));
            }
            (other, _) => return Err(unknown_option(path, api.name(), other, &[])),
        }
    }
    let host = url.host_str().unwrap_or_default();
    let endpoint = if host == "default" {
        None
    } else if host.is_empty() {
        return Err(bad(format!(
            "names no host: {}://KEY@default, or another host",
            api.name()
        )));
    } else {
        let loopback = matches!(host, "localhost" | "127.0.0.1" | "[::1]");
        let scheme = if loopback { "http" } else { "https" };
        Some(match url.port() {
            Some(port) => format!("{scheme}://{host}:{port}"),
            None => format!("{scheme}://{host}"),
        })
    };
    Ok(Provider::Api {
        api,
        key: Secret(key),
        domain,
        eu,
        endpoint,
    })
}

/// `graph://CLIENT_ID:SECRET@TENANT?sender=app@contoso.com`, with `graph.endpoint` and
/// `oauth2.token_url` for a national cloud or a test server. An error names the setting
/// (`url.sender`, `url.graph.endpoint`), never the secret.
fn graph_member(url: &url::Url, path: &str) -> Result<Provider, ConfigError> {
    let bad = |setting: &str, why: String| {
        let at = if setting.is_empty() {
            path.to_owned()
        } else {
            format!("{path}.{setting}")
        };
        ConfigError::new(at, why)
    };
    let decode = |text: &str, what: &str| {
        percent_encoding::percent_decode_str(text)
            .decode_utf8()
            .map(|text| text.into_owned())
            .map_err(|_| bad("", format!("{what} that is not UTF-8 once decoded")))
    };
    let client_id = decode(url.username(), "an application id")?;
    let secret = decode(url.password().unwrap_or_default(), "a secret")?;
    if client_id.is_empty() || secret.is_empty() {
        return Err(bad(
            "",
            "names no application and secret: graph://CLIENT_ID:SECRET@TENANT?sender=ADDRESS"
                .to_owned(),
        ));
    }
    let tenant = url.host_str().unwrap_or_default();
    if tenant.is_empty() {
        return Err(bad(
            "",
            "names no tenant: graph://CLIENT_ID:SECRET@TENANT?sender=ADDRESS, the tenant's id \
             or a domain such as contoso.onmicrosoft.com"
                .to_owned(),
        ));
    }
    let (mut sender, mut endpoint, mut token_url) = (None, None, None);
    for (option, value) in url.query_pairs() {
        let slot = match &*option {
            "sender" => &mut sender,
            "graph.endpoint" => &mut endpoint,
            "oauth2.token_url" => &mut token_url,
            other => {
                return Err(unknown_option(
                    path,
                    "graph",
                    other,
                    &["sender", "graph.endpoint", "oauth2.token_url"],
                ));
            }
        };
        if slot.replace(value.into_owned()).is_some() {
            return Err(bad(&option, "is given twice; give it once".to_owned()));
        }
    }
    let Some(sender) = sender else {
        return Err(bad(
            "sender",
            "is required: the mailbox Graph sends as, graph://CLIENT_ID:SECRET@TENANT?sender=ADDRESS"
                .to_owned(),
        ));
    };
    if sender.parse::<lettre::Address>().is_err() {
        return Err(bad("sender", "is not an e-mail address".to_owned()));
    }
    for (setting, value) in [
        ("graph.endpoint", &endpoint),
        ("oauth2.token_url", &token_url),
    ] {
        if let Some(value) = value {
            secure_url(value).map_err(|why| bad(setting, why))?;
        }
    }
    Ok(Provider::Graph {
        client_id,
        secret: Secret(secret),
        tenant: tenant.to_owned(),
        sender,
        endpoint,
        token_url,
    })
}

/// `Ok` for an `https://` URL, or `http://` to this machine; why not otherwise (a secret
/// would cross the network in clear text).
fn secure_url(text: &str) -> Result<(), String> {
    let url = url::Url::parse(text).map_err(|error| format!("not a URL: {error}"))?;
    let loopback = url.host_str().is_some_and(|host| {
        let address = host.trim_start_matches('[').trim_end_matches(']');
        host.eq_ignore_ascii_case("localhost")
            || address
                .parse::<std::net::IpAddr>()
                .is_ok_and(|address| address.is_loopback())
    });
    match url.scheme() {
        "https" => Ok(()),
        "http" if loopback => Ok(()),
        _ => Err(
            "expected https:// (http:// only to this machine): a token would cross the network \
             in clear text"
                .to_owned(),
        ),
    }
}

fn unknown_option(path: &str, provider: &str, option: &str, known: &[&str]) -> ConfigError {
    let expected = if known.is_empty() {
        format!("{provider} takes no options")
    } else {
        format!("{provider} takes {}", known.join(", "))
    };
    // An option that holds a URL (a space between two members lost) may carry a key.
    let option = if super::read::may_hold_a_secret(option) {
        "holding a URL or an address".to_owned()
    } else {
        format!("`{}`", option.chars().take(40).collect::<String>())
    };
    ConfigError::new(
        path.to_owned(),
        format!("the option {option} is not one of this provider's: {expected}"),
    )
}
