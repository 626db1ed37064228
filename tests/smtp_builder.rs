//! The SMTP transport's constructors and builder (DESIGN §7.1): names, defaults, URL forms, and
//! a `ConfigError` naming each setting that cannot work. No server is needed.
#![cfg(feature = "smtp")]

use std::time::Duration;

use mail_breaker::{SmtpTransport, Transport};

#[test]
fn each_constructor_names_the_transport_by_scheme_host_and_default_port() {
    let name = |builder: mail_breaker::SmtpBuilder| {
        builder.build().expect("valid settings").name().to_owned()
    };
    let relay = SmtpTransport::relay("mx.example.com").expect("a TLS name");
    let starttls = SmtpTransport::starttls_relay("mx.example.com").expect("a TLS name");

    assert_eq!(name(relay), "smtps://mx.example.com:465");
    assert_eq!(name(starttls), "smtp://mx.example.com:587");
    assert_eq!(
        name(SmtpTransport::builder_dangerous("mx.example.com")),
        "smtp://mx.example.com:25"
    );
    assert_eq!(
        SmtpTransport::unencrypted("127.0.0.1", 2525).name(),
        "smtp://127.0.0.1:2525"
    );
    assert_eq!(
        name(SmtpTransport::builder_dangerous("mx.example.com").name("primary")),
        "primary"
    );
}

#[test]
fn from_url_reads_lettres_forms_and_their_default_ports() {
    let name = |url: &str| {
        SmtpTransport::from_url(url)
            .expect("a valid URL")
            .build()
            .expect("valid settings")
            .name()
            .to_owned()
    };

    assert_eq!(name("smtp://mx.example.com"), "smtp://mx.example.com:25");
    assert_eq!(
        name("smtp://mx.example.com?tls=required"),
        "smtp://mx.example.com:587"
    );
    assert_eq!(
        name("smtp://mx.example.com?tls=opportunistic"),
        "smtp://mx.example.com:587"
    );
    assert_eq!(name("smtps://mx.example.com"), "smtps://mx.example.com:465");
    assert_eq!(
        name("smtp://mx.example.com?tls=none"),
        "smtp://mx.example.com:25"
    );
    assert_eq!(
        name("smtp://user:p%40ss@mx.example.com:2525/client.example.com"),
        "smtp://mx.example.com:2525"
    );
}

#[test]
fn from_url_refuses_what_it_cannot_read_naming_url() {
    for url in [
        "http://mx.example.com",
        "smtp://mx.example.com?tls=sometimes",
        "smtp://",
        "not a url",
    ] {
        let error = SmtpTransport::from_url(url).expect_err(url);
        assert_eq!(error.setting(), "url", "{url}: {error}");
    }
}

#[test]
fn from_url_refuses_an_option_it_does_not_read_rather_than_ignore_it() {
    // Each of these, ignored, would build a clear-text transport from a URL that asks for TLS.
    for url in [
        "smtp://mx.example.com?TLS=required",
        "smtp://mx.example.com?require_tls=true",
        "smtp://mx.example.com?tls=required&starttls=always",
        "smtp://mx.example.com?tls=none&tls=required",
        "smtps://mx.example.com?verify=false",
    ] {
        let error = SmtpTransport::from_url(url).expect_err(url);
        assert_eq!(error.setting(), "url", "{url}: {error}");
    }
    // An option that is not a plain word may be a password typed in the wrong place.
    let error = SmtpTransport::from_url("smtp://mx.example.com?user%3Ahunter2=1").unwrap_err();
    assert!(!error.to_string().contains("hunter2"), "{error}");
    let error = SmtpTransport::from_url("smtp://mx.example.com?require_tls=true").unwrap_err();
    assert!(error.to_string().contains("`require_tls`"), "{error}");
}

#[test]
fn settings_that_cannot_work_are_config_errors_naming_the_setting() {
    let builder = || SmtpTransport::builder_dangerous("127.0.0.1");
    let cases = [
        (builder().max_connections(0).build(), "max_connections"),
        (
            builder().max_connections(usize::MAX).build(),
            "max_connections",
        ),
        (
            builder().max_messages_per_connection(0).build(),
            "max_messages_per_connection",
        ),
        (builder().timeout(Duration::ZERO).build(), "timeout"),
        (
            builder().idle_timeout(Duration::ZERO).build(),
            "idle_timeout",
        ),
    ];
    for (result, setting) in cases {
        let error = result.expect_err(setting);
        assert_eq!(error.setting(), setting, "{error}");
    }
}

#[test]
fn building_needs_no_tokio_runtime_and_opens_no_connection() {
    // Nothing listens on port 1: building succeeds all the same.
    let smtp = SmtpTransport::builder_dangerous("127.0.0.1")
        .port(1)
        .timeout(Duration::MAX)
        .build();
    assert!(smtp.is_ok());
}

/// Gives one token; never asked here, since nothing is sent.
struct Fixed;

#[async_trait::async_trait]
impl mail_breaker::oauth::TokenSource for Fixed {
    async fn token(&self) -> Result<mail_breaker::oauth::AccessToken, mail_breaker::SendError> {
        Ok(mail_breaker::oauth::AccessToken::new("ya29.secret-token"))
    }
}

#[test]
fn debug_shows_the_server_and_how_it_logs_in_and_never_a_password() {
    let with_password = SmtpTransport::starttls_relay("relay.example.com")
        .expect("a TLS name")
        .credentials(lettre::transport::smtp::authentication::Credentials::new(
            "app".to_owned(),
            "hunter2".to_owned(),
        ));
    let builder = format!("{with_password:?}");
    assert!(
        builder.contains(r#"host: "relay.example.com""#),
        "{builder}"
    );
    assert!(builder.contains("authenticates: true"), "{builder}");
    assert!(!builder.contains("hunter2"), "{builder}");
    let transport = format!("{:?}", with_password.build().expect("valid settings"));
    assert!(
        transport.contains(r#"host: "relay.example.com""#),
        "{transport}"
    );
    assert!(transport.contains("authenticates: true"), "{transport}");
    assert!(!transport.contains("hunter2"), "{transport}");

    let with_oauth2 = SmtpTransport::starttls_relay("relay.example.com")
        .expect("a TLS name")
        .oauth2("app@example.com", Fixed);
    let builder = format!("{with_oauth2:?}");
    assert!(builder.contains("oauth2: true"), "{builder}");
    let transport = format!("{:?}", with_oauth2.build().expect("valid settings"));
    assert!(transport.contains("oauth2: Some(OAuthLogin"), "{transport}");
    assert!(!transport.contains("secret-token"), "{transport}");
}
