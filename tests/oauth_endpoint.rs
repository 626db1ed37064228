//! The built-in OAuth 2.0 token sources (feature `oauth2`, DESIGN §16) against a token
//! endpoint served in the test (`support::http_api`): `ClientCredentials` asks for its scope
//! with the client's identity, `RefreshToken` with its refresh token and keeps a rotated one;
//! a token is kept until a minute before it expires, and fetched afresh after a refusal; the
//! endpoint's refusals are `Authentication` or `Configuration` by status, and no error shows
//! a secret.
#![cfg(feature = "oauth2")]

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use mail_breaker::Category;
use mail_breaker::oauth::{ClientCredentials, RefreshToken, TokenEndpoint, TokenSource};
use support::http_api::{ApiServer, Recorded, Reply};

const SECRET: &str = "client-s3cret";
const REFRESH: &str = "1//refresh-one";

/// The fields of a form-encoded body.
fn form(request: &Recorded) -> Vec<(String, String)> {
    url::form_urlencoded::parse(&request.body)
        .map(|(key, value)| (key.into_owned(), value.into_owned()))
        .collect()
}

fn field(request: &Recorded, name: &str) -> Option<String> {
    form(request)
        .into_iter()
        .find(|(key, _)| key == name)
        .map(|(_, value)| value)
}

/// A token `at-N` (N counting requests from 1) that expires in `expires_in` seconds.
async fn endpoint(expires_in: u64) -> ApiServer {
    let count = Arc::new(AtomicUsize::new(0));
    ApiServer::start(move |_| {
        let n = count.fetch_add(1, Ordering::SeqCst) + 1;
        Reply::json(
            200,
            &format!(
                r#"{{"access_token":"at-{n}","token_type":"Bearer","expires_in":{expires_in}}}"#
            ),
        )
    })
    .await
}

fn client_credentials(server: &ApiServer) -> TokenEndpoint {
    ClientCredentials {
        token_url: format!("{}/tenant/oauth2/v2.0/token", server.endpoint()),
        client_id: "app-id".to_owned(),
        client_secret: SECRET.to_owned(),
        scope: "https://outlook.office365.com/.default".to_owned(),
    }
    .build()
    .expect("valid settings")
}

fn refresh_token(server: &ApiServer) -> TokenEndpoint {
    RefreshToken {
        token_url: format!("{}/token", server.endpoint()),
        client_id: "app-id".to_owned(),
        client_secret: SECRET.to_owned(),
        refresh_token: REFRESH.to_owned(),
    }
    .build()
    .expect("valid settings")
}

#[tokio::test]
async fn client_credentials_asks_for_its_scope_with_the_clients_identity() {
    let server = endpoint(3600).await;
    let token = client_credentials(&server).token().await.unwrap();

    assert_eq!(token.secret(), "at-1");
    let request = server.last();
    assert_eq!(request.method, "POST");
    assert_eq!(request.path, "/tenant/oauth2/v2.0/token");
    assert_eq!(
        request.header("content-type"),
        Some("application/x-www-form-urlencoded")
    );
    let mut fields = form(&request);
    fields.sort();
    assert_eq!(
        fields,
        [
            ("client_id", "app-id"),
            ("client_secret", SECRET),
            ("grant_type", "client_credentials"),
            ("scope", "https://outlook.office365.com/.default"),
        ]
        .map(|(key, value)| (key.to_owned(), value.to_owned()))
    );
}

#[tokio::test]
async fn a_token_is_kept_while_it_has_more_than_a_minute_left() {
    let server = endpoint(3600).await;
    let source = client_credentials(&server);
    for _ in 0..3 {
        assert_eq!(source.token().await.unwrap().secret(), "at-1");
    }
    assert_eq!(server.request_count(), 1);
}

#[tokio::test]
async fn a_token_with_a_minute_or_less_left_is_fetched_afresh_before_it_expires() {
    let server = endpoint(60).await;
    let source = client_credentials(&server);
    assert_eq!(source.token().await.unwrap().secret(), "at-1");
    assert_eq!(source.token().await.unwrap().secret(), "at-2");

    let server = endpoint(61).await;
    let source = client_credentials(&server);
    assert_eq!(source.token().await.unwrap().secret(), "at-1");
    assert_eq!(source.token().await.unwrap().secret(), "at-1");
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    assert_eq!(source.token().await.unwrap().secret(), "at-2");
}

#[tokio::test]
async fn a_token_a_server_refused_is_fetched_afresh() {
    let server = endpoint(3600).await;
    let source = client_credentials(&server);
    let refused = source.token().await.unwrap();
    source.refused(&refused).await;
    assert_eq!(source.token().await.unwrap().secret(), "at-2");
}

#[tokio::test]
async fn refresh_token_asks_with_its_refresh_token_and_keeps_a_rotated_one() {
    let count = Arc::new(AtomicUsize::new(0));
    let server = ApiServer::start(move |_| {
        let n = count.fetch_add(1, Ordering::SeqCst) + 1;
        // The first answer rotates the refresh token; the second gives none (keep it).
        let rotated = if n == 1 {
            r#","refresh_token":"1//refresh-two""#
        } else {
            ""
        };
        Reply::json(
            200,
            &format!(r#"{{"access_token":"at-{n}","expires_in":30{rotated}}}"#),
        )
    })
    .await;
    let source = refresh_token(&server);
    for n in 1..=3 {
        assert_eq!(source.token().await.unwrap().secret(), format!("at-{n}"));
    }

    let requests = server.requests();
    assert_eq!(
        field(&requests[0], "grant_type").as_deref(),
        Some("refresh_token")
    );
    assert_eq!(
        field(&requests[0], "refresh_token").as_deref(),
        Some(REFRESH)
    );
    assert_eq!(field(&requests[0], "client_id").as_deref(), Some("app-id"));
    assert_eq!(
        field(&requests[0], "client_secret").as_deref(),
        Some(SECRET)
    );
    assert_eq!(
        field(&requests[1], "refresh_token").as_deref(),
        Some("1//refresh-two")
    );
    assert_eq!(
        field(&requests[2], "refresh_token").as_deref(),
        Some("1//refresh-two")
    );
}

#[tokio::test]
async fn the_endpoints_refusals_are_authentication_or_configuration_by_status() {
    for (status, body, category, code) in [
        (
            400,
            r#"{"error":"invalid_grant","error_description":"Token has been expired or revoked."}"#,
            Category::Authentication,
            "oauth2.invalid_grant",
        ),
        (
            401,
            r#"{"error":"invalid_client"}"#,
            Category::Authentication,
            "oauth2.invalid_client",
        ),
        (
            400,
            r#"{"error":"unauthorized_client"}"#,
            Category::Authentication,
            "oauth2.unauthorized_client",
        ),
        (
            403,
            "forbidden",
            Category::Authentication,
            "oauth2.endpoint",
        ),
        (
            400,
            r#"{"error":"invalid_scope"}"#,
            Category::Configuration,
            "oauth2.invalid_scope",
        ),
        (
            400,
            r#"{"error":"unsupported_grant_type"}"#,
            Category::Configuration,
            "oauth2.unsupported_grant_type",
        ),
        (
            404,
            "<html>not here</html>",
            Category::Configuration,
            "oauth2.endpoint",
        ),
        (
            200,
            "<html>a login page</html>",
            Category::Configuration,
            "oauth2.endpoint",
        ),
        (
            200,
            r#"{"token_type":"Bearer"}"#,
            Category::Configuration,
            "oauth2.endpoint",
        ),
        (429, "{}", Category::RateLimited, "oauth2.endpoint"),
        (503, "{}", Category::ServiceUnavailable, "oauth2.endpoint"),
    ] {
        let server = ApiServer::start(move |_| Reply::json(status, body)).await;
        for source in [client_credentials(&server), refresh_token(&server)] {
            let error = source.token().await.expect_err(body);
            assert_eq!(error.category(), category, "{status} {body}: {error}");
            assert_eq!(error.code(), code, "{status} {body}: {error}");
        }
    }
}

#[tokio::test]
async fn no_error_shows_the_client_secret_or_the_refresh_token_even_one_the_endpoint_echoes() {
    let echo = format!(
        r#"{{"error":"invalid_client","error_description":"bad secret {SECRET} for {REFRESH}"}}"#
    );
    let server = ApiServer::start(move |_| Reply::json(401, &echo)).await;
    for (source, secrets) in [
        (client_credentials(&server), vec![SECRET]),
        (refresh_token(&server), vec![SECRET, REFRESH]),
    ] {
        let error = source.token().await.expect_err("refused");
        let shown = format!("{error} {error:?} {source:?}");
        for secret in secrets {
            assert!(!shown.contains(secret), "{shown}");
        }
    }
}

#[tokio::test]
async fn an_endpoint_that_cannot_be_reached_is_a_network_error() {
    let port = support::servers::free_port();
    let source = ClientCredentials {
        token_url: format!("http://127.0.0.1:{port}/token"),
        client_id: "app-id".to_owned(),
        client_secret: SECRET.to_owned(),
        scope: "s".to_owned(),
    }
    .build()
    .unwrap();
    let error = source.token().await.expect_err("nothing listens");
    assert_eq!(error.category(), Category::Network, "{error}");
}

#[test]
fn a_source_that_cannot_work_is_a_config_error_naming_its_setting() {
    let good = ClientCredentials {
        token_url: "https://login.example.com/token".to_owned(),
        client_id: "app-id".to_owned(),
        client_secret: SECRET.to_owned(),
        scope: "s".to_owned(),
    };
    for (broken, setting) in [
        (
            ClientCredentials {
                token_url: "login.example.com/token".to_owned(),
                ..good.clone()
            },
            "token_url",
        ),
        (
            ClientCredentials {
                token_url: "ftp://login.example.com/token".to_owned(),
                ..good.clone()
            },
            "token_url",
        ),
        (
            ClientCredentials {
                client_id: String::new(),
                ..good.clone()
            },
            "client_id",
        ),
        (
            ClientCredentials {
                scope: " ".to_owned(),
                ..good.clone()
            },
            "scope",
        ),
    ] {
        assert_eq!(broken.build().unwrap_err().setting(), setting);
    }
    let error = RefreshToken {
        token_url: "https://oauth2.googleapis.com/token".to_owned(),
        client_id: "id".to_owned(),
        client_secret: String::new(),
        refresh_token: String::new(),
    }
    .build()
    .unwrap_err();
    assert_eq!(error.setting(), "refresh_token");
}

#[tokio::test]
async fn an_expiry_the_endpoint_writes_as_text_is_read_as_seconds() {
    let count = Arc::new(AtomicUsize::new(0));
    let server = ApiServer::start(move |_| {
        let n = count.fetch_add(1, Ordering::SeqCst) + 1;
        Reply::json(
            200,
            &format!(r#"{{"access_token":"at-{n}","expires_in":"60"}}"#),
        )
    })
    .await;
    let source = client_credentials(&server);
    assert_eq!(source.token().await.unwrap().secret(), "at-1");
    // Sixty seconds is no more than a minute left: fetched afresh at once.
    assert_eq!(source.token().await.unwrap().secret(), "at-2");
}

#[tokio::test]
async fn an_error_code_not_written_as_rfc_6749_writes_one_is_not_taken_as_the_code() {
    for error in ["Invalid Request", "invalid-request", &"a".repeat(41)] {
        let body = format!(r#"{{"error":"{error}"}}"#);
        let server = ApiServer::start(move |_| Reply::json(400, &body)).await;
        let failed = client_credentials(&server).token().await.expect_err(error);
        assert_eq!(
            failed.category(),
            Category::Configuration,
            "{error}: {failed}"
        );
        assert_eq!(failed.code(), "oauth2.endpoint", "{error}: {failed}");
    }
}

#[tokio::test]
async fn the_endpoints_description_is_quoted_in_the_error_with_each_secret_starred() {
    let echo = format!(
        r#"{{"error":"invalid_client","error_description":"bad secret {SECRET} for {REFRESH}"}}"#
    );
    let server = ApiServer::start(move |_| Reply::json(401, &echo)).await;
    let error = refresh_token(&server).token().await.expect_err("refused");
    assert!(
        error.to_string().contains("bad secret *** for ***"),
        "{error}"
    );
}

#[test]
fn a_sources_debug_shows_its_endpoint_and_client_but_never_a_secret() {
    let credentials = ClientCredentials {
        token_url: "https://login.example.com/token".to_owned(),
        client_id: "app-id".to_owned(),
        client_secret: SECRET.to_owned(),
        scope: "https://outlook.office365.com/.default".to_owned(),
    };
    let refresh = RefreshToken {
        token_url: "https://login.example.com/token".to_owned(),
        client_id: "app-id".to_owned(),
        client_secret: SECRET.to_owned(),
        refresh_token: REFRESH.to_owned(),
    };
    for shown in [
        format!("{credentials:?}"),
        format!("{:?}", credentials.clone().build().unwrap()),
        format!("{refresh:?}"),
        format!("{:?}", refresh.clone().build().unwrap()),
    ] {
        assert!(shown.contains("https://login.example.com/token"), "{shown}");
        assert!(shown.contains("app-id"), "{shown}");
        assert!(
            !shown.contains(SECRET) && !shown.contains(REFRESH),
            "{shown}"
        );
    }
    assert!(format!("{credentials:?}").contains("outlook.office365.com/.default"));
}

/// A token endpoint that answers every request with a `status` redirect to `target`.
async fn redirecting(status: u16, target: &str) -> ApiServer {
    let location = target.to_owned();
    ApiServer::start(move |_| Reply::text(status, "").with_header("Location", &location)).await
}

#[tokio::test]
async fn a_307_or_308_redirect_is_not_followed_and_the_secret_never_reaches_its_target() {
    for status in [301, 302, 303, 307, 308] {
        let target = endpoint(3600).await;
        // Another host than the endpoint's (localhost, not 127.0.0.1): where a redirect
        // followed would carry the form, the client secret and refresh token in it.
        let elsewhere = target.endpoint().replace("127.0.0.1", "localhost");
        let server = redirecting(status, &format!("{elsewhere}/stolen")).await;
        for source in [client_credentials(&server), refresh_token(&server)] {
            let error = source.token().await.expect_err("a redirect is no token");
            assert_eq!(
                error.category(),
                Category::Configuration,
                "{status}: {error}"
            );
            assert_eq!(error.code(), "oauth2.endpoint", "{status}: {error}");
            assert!(error.to_string().contains(&status.to_string()), "{error}");
            assert!(
                error.to_string().contains("redirect, not followed"),
                "{error}"
            );
        }
        assert_eq!(server.request_count(), 2, "{status}");
        assert_eq!(
            target.request_count(),
            0,
            "{status}: the redirect's target got {:?}",
            target
                .requests()
                .iter()
                .map(|r| r.text())
                .collect::<Vec<_>>()
        );
    }
}

/// A token answer of exactly `length` octets of JSON, its token `at-1`.
fn token_answer_of(length: usize) -> String {
    let head = r#"{"access_token":"at-1","expires_in":3600,"padding":""#;
    let tail = r#""}"#;
    format!(
        "{head}{}{tail}",
        "x".repeat(length - head.len() - tail.len())
    )
}

#[tokio::test]
async fn a_token_answer_over_64_kib_is_refused_with_an_error_saying_so() {
    let body = token_answer_of(64 * 1024 + 1);
    let server = ApiServer::start(move |_| Reply::json(200, &body)).await;
    let error = client_credentials(&server)
        .token()
        .await
        .expect_err("an answer over 64 KiB is no token");
    assert_eq!(error.category(), Category::Configuration, "{error}");
    assert_eq!(error.code(), "oauth2.answer_too_large", "{error}");
    assert!(error.to_string().contains("64 KiB"), "{error}");
}

#[tokio::test]
async fn a_token_answer_of_64_kib_is_read_whole() {
    let body = token_answer_of(64 * 1024);
    let server = ApiServer::start(move |_| Reply::json(200, &body)).await;
    let token = client_credentials(&server).token().await.unwrap();
    assert_eq!(token.secret(), "at-1");
}

#[tokio::test]
async fn an_error_answer_over_64_kib_is_refused_with_an_error_saying_so() {
    let body = format!(
        r#"{{"error":"invalid_client","x":"{}"}}"#,
        "x".repeat(70_000)
    );
    let server = ApiServer::start(move |_| Reply::json(401, &body)).await;
    let error = refresh_token(&server).token().await.expect_err("refused");
    assert_eq!(error.code(), "oauth2.answer_too_large", "{error}");
}

fn credentials_at(token_url: &str) -> ClientCredentials {
    ClientCredentials {
        token_url: token_url.to_owned(),
        client_id: "app-id".to_owned(),
        client_secret: SECRET.to_owned(),
        scope: "s".to_owned(),
    }
}

fn refresh_at(token_url: &str) -> RefreshToken {
    RefreshToken {
        token_url: token_url.to_owned(),
        client_id: "app-id".to_owned(),
        client_secret: SECRET.to_owned(),
        refresh_token: REFRESH.to_owned(),
    }
}

#[test]
fn an_http_token_url_to_a_host_not_on_loopback_is_a_config_error_naming_token_url() {
    for url in [
        "http://login.example.com/token",
        "http://10.0.0.1/token",
        "http://[2001:db8::1]/token",
        "http://localhost.example.com/token",
        "HTTP://login.example.com/token",
    ] {
        for error in [
            credentials_at(url).build().unwrap_err(),
            refresh_at(url).build().unwrap_err(),
        ] {
            assert_eq!(error.setting(), "token_url", "{url}: {error}");
            assert!(error.reason().contains("https://"), "{url}: {error}");
            assert!(
                error.reason().contains("allow_insecure_http"),
                "{url}: {error}"
            );
        }
    }
}

#[test]
fn an_http_token_url_on_loopback_or_any_https_one_is_taken() {
    for url in [
        "http://127.0.0.1:8080/token",
        "http://127.1.2.3/token",
        "http://[::1]:8080/token",
        "http://localhost:8080/token",
        "http://LOCALHOST/token",
        "https://login.example.com/token",
    ] {
        credentials_at(url).build().unwrap();
        refresh_at(url).build().unwrap();
    }
}

#[test]
fn allow_insecure_http_takes_an_http_token_url_to_any_host() {
    let url = "http://login.example.com/token";
    let credentials = credentials_at(url).allow_insecure_http().build().unwrap();
    let refresh = refresh_at(url).allow_insecure_http().build().unwrap();
    assert!(format!("{credentials:?}").contains(url));
    assert!(format!("{refresh:?}").contains(url));
    // It lifts the scheme's rule only: a URL that is not a token endpoint's stays refused.
    for broken in ["ftp://login.example.com/token", "login.example.com/token"] {
        let error = credentials_at(broken).allow_insecure_http().build();
        assert_eq!(error.unwrap_err().setting(), "token_url", "{broken}");
        let error = refresh_at(broken).allow_insecure_http().build();
        assert_eq!(error.unwrap_err().setting(), "token_url", "{broken}");
    }
}
