//! A Graph member from a DSN (issue 65): `graph://CLIENT_ID:SECRET@TENANT?sender=ADDRESS`,
//! with `graph.endpoint` and `oauth2.token_url`, each setting checked as every other key.
#![cfg(all(feature = "graph", feature = "config"))]

mod support;

use mail_breaker::Transport;
use mail_breaker::config::{Mailer, MailerConfig};
use support::http_api::{ApiServer, Reply};

fn dsn_error(dsn: &str) -> (String, String) {
    let error = MailerConfig::from_dsn(dsn).unwrap_err();
    (error.setting().to_owned(), error.reason().to_owned())
}

const MEMBER: &str = "graph://app-id:s3cret-VALUE@contoso.onmicrosoft.com";

#[tokio::test]
async fn a_graph_member_of_a_dsn_sends_as_its_sender_with_a_token_for_its_application() {
    let tokens =
        ApiServer::start(|_| Reply::json(200, r#"{"access_token":"token-1","expires_in":3599}"#))
            .await;
    let graph = ApiServer::start(|_| Reply::text(202, "")).await;
    let dsn = format!(
        "{MEMBER}?sender=app%40contoso.com&graph.endpoint={}&oauth2.token_url={}/token",
        graph.endpoint(),
        tokens.endpoint()
    );
    let mailer = Mailer::from_dsn(&dsn)
        .unwrap()
        .build_without_worker()
        .await
        .unwrap();
    let message = mail_breaker::Message::builder()
        .from("app@contoso.com".parse().unwrap())
        .to("ann@example.org".parse().unwrap())
        .subject("hi")
        .body(String::from("hello"))
        .unwrap();
    let receipt = mailer.send(&message).await.unwrap();
    assert_eq!(receipt.transport(), "graph");
    assert_eq!(graph.last().path, "/v1.0/users/app@contoso.com/sendMail");
    assert_eq!(graph.last().header("authorization"), Some("Bearer token-1"));
    let asked = tokens.last().text();
    for field in [
        "client_id=app-id",
        "client_secret=s3cret-VALUE",
        "scope=https%3A%2F%2Fgraph.microsoft.com%2F.default",
    ] {
        assert!(asked.contains(field), "{field} in {asked}");
    }
}

#[tokio::test]
async fn a_graph_member_without_a_rate_keeps_exchanges_thirty_messages_a_minute() {
    let mailer = Mailer::from_dsn(&format!("{MEMBER}?sender=app%40contoso.com"))
        .unwrap()
        .build_without_worker()
        .await
        .unwrap();
    let rates: Vec<f64> = mailer
        .limiters()
        .map(|limiter| limiter.configured_per_second())
        .collect();
    assert_eq!(rates, [0.5]);
    let own = Mailer::from_dsn(&format!("{MEMBER}?sender=app%40contoso.com&rate=2/s"))
        .unwrap()
        .build_without_worker()
        .await
        .unwrap();
    let rates: Vec<f64> = own
        .limiters()
        .map(|limiter| limiter.configured_per_second())
        .collect();
    assert_eq!(rates, [2.0], "a rate given is kept");
}

#[test]
fn each_wrong_setting_of_a_graph_member_is_an_error_naming_it_and_never_its_secret() {
    let cases = [
        (MEMBER.to_owned(), "member[0].url.sender"),
        (
            format!("{MEMBER}?sender=not-an-address"),
            "member[0].url.sender",
        ),
        (
            format!("{MEMBER}?sender=a%40contoso.com&graph.endpoint=http://graph.example.com"),
            "member[0].url.graph.endpoint",
        ),
        (
            format!("{MEMBER}?sender=a%40contoso.com&oauth2.token_url=http://login.example.com/t"),
            "member[0].url.oauth2.token_url",
        ),
        (
            format!("{MEMBER}?sender=a%40contoso.com&sender=b%40contoso.com"),
            "member[0].url.sender",
        ),
        (
            format!("{MEMBER}?sender=a%40contoso.com&region=eu"),
            "member[0].url",
        ),
        (
            "graph://app-id@contoso.onmicrosoft.com?sender=a%40contoso.com".to_owned(),
            "member[0].url",
        ),
    ];
    for (dsn, setting) in cases {
        let (path, reason) = dsn_error(&dsn);
        assert_eq!(path, setting, "{dsn}: {reason}");
        assert!(!reason.contains("s3cret"), "{reason}");
    }
}

#[test]
fn a_graph_member_of_a_toml_document_reads_as_its_dsn_does() {
    let toml = r#"
        [[member]]
        url = "graph://app-id:s3cret@contoso.onmicrosoft.com?sender=app%40contoso.com"
        timeout = "5s"
    "#;
    let from_toml = MailerConfig::from_toml(toml).unwrap();
    let from_dsn = MailerConfig::from_dsn(
        "graph://app-id:s3cret@contoso.onmicrosoft.com?sender=app%40contoso.com&timeout=5s",
    )
    .unwrap();
    assert_eq!(from_toml, from_dsn);
    assert!(!format!("{from_toml:?}").contains("s3cret"));
}
