//! OAuth 2.0 in a DSN (DESIGN §16): `auth=xoauth2` or `auth=oauthbearer` with `oauth2.*`
//! builds a member that logs in with a token from its endpoint (a real aiosmtpd checking
//! the token, a token endpoint served in the test); each `oauth2.*` option is checked and
//! no secret is shown.
//!
//! Without python3, aiosmtpd or openssl the server tests print `SKIPPED` and pass; under
//! `CI=true` they fail. `cargo test --features oauth2 --test oauth_dsn`.
#![cfg(all(feature = "config", feature = "oauth2"))]

mod support;

use mail_breaker::Transport;
use mail_breaker::config::{Mailer, MailerConfig};
use support::aiosmtpd_oauth::{GOOD_TOKEN, OAuthSmtpd, Offered};
use support::http_api::{ApiServer, Reply};
use support::message;

/// The path and reason of the error for `dsn`.
fn dsn_error(dsn: &str) -> (String, String) {
    let error = MailerConfig::from_dsn(dsn).unwrap_err();
    (error.setting().to_owned(), error.reason().to_owned())
}

async fn token_endpoint() -> ApiServer {
    ApiServer::start(|_| {
        Reply::json(
            200,
            &format!(r#"{{"access_token":"{GOOD_TOKEN}","expires_in":3600}}"#),
        )
    })
    .await
}

/// A member of `mailer@example.com` on `server` in clear text (the DSN cannot trust the
/// test CA), logging in with `auth` and `flow`'s `oauth2.*` options.
fn dsn(server: &OAuthSmtpd, endpoint: &ApiServer, auth: &str, flow: &str) -> String {
    format!(
        "smtp://mailer%40example.com@127.0.0.1:{}?tls=none&auth_without_tls=true&auth={auth}\
         &oauth2.token_url={}/token&oauth2.client_id=app-id{flow}&timeout=5s",
        server.port(),
        endpoint.endpoint()
    )
}

fn field(body: &[u8], name: &str) -> Option<String> {
    url::form_urlencoded::parse(body)
        .find(|(key, _)| key == name)
        .map(|(_, value)| value.into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dsns_client_credentials_member_logs_in_with_xoauth2_and_delivers() {
    let test = "a_dsns_client_credentials_member_logs_in_with_xoauth2_and_delivers";
    let Some(server) = OAuthSmtpd::start_clear(test, Offered::Both) else {
        return;
    };
    let endpoint = token_endpoint().await;
    // SAFETY: no other test of this binary reads or writes this variable.
    unsafe { std::env::set_var("MAIL_BREAKER_OAUTH_DSN_SECRET", "s3cret%41+&") };
    let flow = "&oauth2.client_secret=${MAIL_BREAKER_OAUTH_DSN_SECRET}\
                &oauth2.scope=https://outlook.office365.com/.default";
    let mailer = Mailer::from_dsn(&dsn(&server, &endpoint, "xoauth2", flow))
        .unwrap()
        .build()
        .await
        .unwrap();

    let receipt = mailer
        .send(&message())
        .await
        .unwrap_or_else(|error| panic!("{error:?}; server log: {}", server.log()));

    assert_eq!(receipt.message_id(), Some("OAUTH1"));
    assert_eq!(server.tokens_seen(), vec![format!("XOAUTH2 {GOOD_TOKEN}")]);
    let request = endpoint.last();
    assert_eq!(
        field(&request.body, "grant_type").as_deref(),
        Some("client_credentials")
    );
    assert_eq!(
        field(&request.body, "scope").as_deref(),
        Some("https://outlook.office365.com/.default")
    );
    // The secret as the environment holds it, never percent-decoded.
    assert_eq!(
        field(&request.body, "client_secret").as_deref(),
        Some("s3cret%41+&")
    );
    assert!(!format!("{mailer:?}").contains("s3cret"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dsns_refresh_token_member_logs_in_with_oauthbearer_and_delivers() {
    let test = "a_dsns_refresh_token_member_logs_in_with_oauthbearer_and_delivers";
    let Some(server) = OAuthSmtpd::start_clear(test, Offered::Both) else {
        return;
    };
    let endpoint = token_endpoint().await;
    let flow = "&oauth2.client_secret=s3cret&oauth2.refresh_token=1%2F%2Frefresh";
    let config = MailerConfig::from_dsn(&dsn(&server, &endpoint, "oauthbearer", flow)).unwrap();
    assert!(!format!("{config:?}").contains("refresh"), "{config:?}");
    let mailer = config.build().await.unwrap();

    mailer
        .send(&message())
        .await
        .unwrap_or_else(|error| panic!("{error:?}; server log: {}", server.log()));

    assert_eq!(
        server.tokens_seen(),
        vec![format!("OAUTHBEARER {GOOD_TOKEN}")]
    );
    let request = endpoint.last();
    assert_eq!(
        field(&request.body, "refresh_token").as_deref(),
        Some("1//refresh")
    );
}

#[test]
fn an_oauth2_option_that_cannot_work_is_an_error_naming_it() {
    let base = "smtp://me%40example.com@smtp.office365.com:587";
    let flow = "oauth2.token_url=https://login.example.com/token&oauth2.client_id=id";
    for (dsn, setting) in [
        (
            format!("{base}?auth=xoauth2&oauth2.client_id=id&oauth2.scope=s"),
            "member[0].url.oauth2.token_url",
        ),
        (
            format!("{base}?auth=xoauth2&oauth2.token_url=https://l.example.com/t&oauth2.scope=s"),
            "member[0].url.oauth2.client_id",
        ),
        (
            format!("{base}?auth=xoauth2&{flow}&oauth2.token_url=x"),
            "member[0].url.oauth2.token_url",
        ),
        (
            format!(
                "{base}?auth=xoauth2&oauth2.token_url=not-a-url&oauth2.client_id=id&oauth2.scope=s"
            ),
            "member[0].url.oauth2.token_url",
        ),
        (
            format!("{base}?auth=xoauth2&{flow}"),
            "member[0].url.oauth2.scope",
        ),
        (
            format!("{base}?auth=xoauth2&{flow}&oauth2.scope=s&oauth2.refresh_token=r"),
            "member[0].url.oauth2.refresh_token",
        ),
        (
            format!("{base}?oauth2.scope=s"),
            "member[0].url.oauth2.scope",
        ),
        (format!("{base}?auth=cram-md5"), "member[0].url.auth"),
        (
            format!("smtp://me:pw@smtp.office365.com:587?auth=xoauth2&{flow}&oauth2.scope=s"),
            "member[0].url.auth",
        ),
        (
            format!("smtp://smtp.office365.com:587?auth=xoauth2&{flow}&oauth2.scope=s"),
            "member[0].url",
        ),
    ] {
        let (path, reason) = dsn_error(&dsn);
        assert_eq!(path, setting, "{dsn}: {reason}");
    }
}

#[test]
fn an_oauth2_member_without_a_tls_option_requires_starttls_and_none_needs_auth_without_tls() {
    let dsn = "smtp://me%40example.com@smtp.office365.com?auth=xoauth2\
               &oauth2.token_url=https://login.example.com/token&oauth2.client_id=id\
               &oauth2.client_secret=SECRET-1&oauth2.scope=s";
    MailerConfig::from_dsn(dsn).unwrap();
    let (path, reason) = dsn_error(&format!("{dsn}&tls=none"));
    assert_eq!(path, "member[0].url.auth_without_tls");
    assert!(!reason.contains("SECRET-1"), "{reason}");
}

#[test]
fn an_http_token_url_to_a_host_not_on_loopback_in_a_dsn_is_an_error_naming_oauth2_token_url() {
    let base = "smtp://me%40example.com@smtp.office365.com:587?auth=xoauth2\
                &oauth2.client_id=id&oauth2.client_secret=SECRET-1&oauth2.scope=s";
    let (path, reason) = dsn_error(&format!(
        "{base}&oauth2.token_url=http://login.example.com/token"
    ));
    assert_eq!(path, "member[0].url.oauth2.token_url", "{reason}");
    assert!(reason.contains("https://"), "{reason}");
    assert!(!reason.contains("SECRET-1"), "{reason}");
    MailerConfig::from_dsn(&format!(
        "{base}&oauth2.token_url=http://127.0.0.1:8080/token"
    ))
    .unwrap();
}

/// Review 6: a secret written with a bare `&` was split there, and the error named its
/// tail as an unknown option.
#[test]
fn a_secret_written_with_a_bare_ampersand_never_shows_in_the_error() {
    for secret_option in ["oauth2.client_secret", "oauth2.refresh_token"] {
        let dsn = format!(
            "smtp://me%40example.com@smtp.office365.com?auth=xoauth2\
             &oauth2.token_url=https://login.example.com/token&oauth2.client_id=id\
             &oauth2.scope=s&{secret_option}=SECRET-1&TAIL-2=x"
        );
        let (path, reason) = dsn_error(&dsn);
        for shown in [&path, &reason] {
            assert!(
                !shown.contains("TAIL-2"),
                "{secret_option}: {path}: {reason}"
            );
        }
        assert!(reason.contains("%26"), "says how to write it: {reason}");
    }
}
