//! Issue 45, point 13: Amazon SES counts each recipient against its maximum send rate, so an
//! `ses://` member with a `rate` in a DSN charges one slot per recipient, against moto's SES.
#![cfg(all(feature = "config", feature = "ses"))]

mod support;

use aws_sdk_sesv2::config::{BehaviorVersion, Credentials, Region};
use mail_breaker::config::Mailer;
use mail_breaker::{SendError, Transport};
use support::moto::Moto;

/// Whether `error`, or one of the errors it sums up, has `code`.
fn says(error: &SendError, code: &str) -> bool {
    error.code() == code || error.causes().iter().any(|cause| says(cause, code))
}

#[tokio::test(flavor = "current_thread")]
async fn an_ses_member_with_a_rate_in_a_dsn_charges_one_slot_per_recipient() {
    // SAFETY: the only test of this binary, set before anything reads the environment.
    unsafe {
        std::env::set_var("AWS_ACCESS_KEY_ID", "AKIDRATETEST");
        std::env::set_var("AWS_SECRET_ACCESS_KEY", "rate-ses-secret");
    }
    let Some(moto) = Moto::start("rate_config_ses").await else {
        return;
    };
    let sdk = aws_sdk_sesv2::Client::from_conf(
        aws_sdk_sesv2::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new("us-east-1"))
            .credentials_provider(Credentials::new(
                "AKIDRATETEST",
                "rate-ses-secret",
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
    let dsn = format!(
        "ses://us-east-1?endpoint={}&rate=1/s&rate.burst=3&rate.max_wait=0s",
        moto.endpoint()
    );
    let mailer = Mailer::from_dsn(&dsn).unwrap().build().await.unwrap();
    let to_three = lettre::Message::builder()
        .from("app@example.com".parse().unwrap())
        .to("a@example.org".parse().unwrap())
        .to("b@example.org".parse().unwrap())
        .to("c@example.org".parse().unwrap())
        .subject("three")
        .body(String::from("hi"))
        .unwrap();

    mailer.send(&to_three).await.unwrap();
    let second = mailer.send(&support::message()).await.unwrap_err();

    assert!(
        says(&second, "rate.limited"),
        "three recipients spent the burst of 3: {second:?}"
    );
}
