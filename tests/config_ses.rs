//! A `ses://` member of a DSN sends through the AWS SDK to moto's SES server, with the keys
//! of the environment. Alone in its binary: it sets the environment's AWS keys before
//! anything else runs.
#![cfg(all(feature = "config", feature = "ses"))]

mod support;

use aws_sdk_sesv2::config::{BehaviorVersion, Credentials, Region};
use mail_breaker::Transport;
use mail_breaker::config::Mailer;
use support::moto::Moto;

const SECRET_KEY: &str = "config-ses-secret-never-shown";

#[tokio::test(flavor = "current_thread")]
async fn an_ses_member_sends_through_the_sdk_with_the_environments_keys() {
    // SAFETY: this binary's only test, in a single-threaded runtime, sets them before any
    // other thread could read the environment.
    unsafe {
        std::env::set_var("AWS_ACCESS_KEY_ID", "AKIDCONFIGTEST");
        std::env::set_var("AWS_SECRET_ACCESS_KEY", SECRET_KEY);
    }
    let Some(moto) = Moto::start("config_ses").await else {
        return;
    };
    let sdk = aws_sdk_sesv2::Client::from_conf(
        aws_sdk_sesv2::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new("us-east-1"))
            .credentials_provider(Credentials::new(
                "AKIDCONFIGTEST",
                SECRET_KEY,
                None,
                None,
                "test",
            ))
            .endpoint_url(moto.endpoint())
            .build(),
    );
    sdk.create_email_identity()
        .email_identity("app@example.com")
        .send()
        .await
        .expect("moto creates the identity");
    let dsn = format!("ses://us-east-1?endpoint={}", moto.endpoint());
    let mailer = Mailer::from_dsn(&dsn).unwrap().build().await.unwrap();
    let receipt = mailer.send(&support::message()).await.unwrap();
    assert!(receipt.message_id().is_some(), "{receipt:?}");
    assert!(moto.state_dump().await.contains("user@example.org"));
    assert!(!format!("{mailer:?}").contains(SECRET_KEY));
}
