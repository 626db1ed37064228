//! Reputation, end to end: a provider reports a hard bounce to the webhook receivers, served
//! beside the operator page, and the next message to that address is refused before it
//! reaches the provider, while its other recipients get it.
//!
//! Runs with nothing installed: an SMTP server of its own on a free loopback port stands in
//! for the provider, and an SQLite outbox in a temporary folder keeps the suppression list.
//!
//! ```text
//! cargo run --example reputation --features admin,webhooks
//! cargo run --example reputation --features admin,webhooks -- --serve   # then open the page
//! ```
//!
//! The report is Postmark's (its receiver authenticates by basic credentials, so this file
//! needs no signing code); SES, SendGrid, Mailgun and Resend are configured alike
//! (`webhooks.ses.topics`, `webhooks.sendgrid.public_key`, ...).

mod support;

use std::sync::Arc;

use mail_breaker::admin::Admin;
use mail_breaker::{Mailer, Message, Transport};
use support::EmbeddedSmtp;

const POSTMARK_USER: &str = "postmark";
const POSTMARK_PASSWORD: &str = "a long random password";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let provider = EmbeddedSmtp::start();
    let folder = tempfile::tempdir()?;
    // One member with a reputation breaker, an outbox whose database keeps the suppression
    // list, and the receivers' secrets; the events are the member's ("relay").
    let dsn = format!(
        "smtp://127.0.0.1:{port}?name=relay&reputation.failover=false\
         &outbox=sqlite://{folder}/outbox.db&suppression=true\
         &webhooks.postmark.user={POSTMARK_USER}\
         &webhooks.postmark.password={password}\
         &webhooks.postmark.member=relay",
        port = provider.port(),
        folder = folder.path().display(),
        password = POSTMARK_PASSWORD.replace(' ', "%20"),
    );
    let mailer = Arc::new(Mailer::from_dsn(&dsn)?.build().await?);

    // The page at `/`, the receivers at `/webhooks/{provider}`: each route authenticates
    // itself, outside the page's token and origin checks.
    let receivers = mailer.webhooks().ok_or("the DSN names receivers")?;
    let admin = Admin::new(Arc::clone(&mailer));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?;
    let beside = axum::Router::new().nest("/webhooks", receivers.router());
    let server = tokio::spawn(async move { admin.serve_beside(listener, beside).await });
    println!("the page:      http://{address}/");
    println!("the receivers: http://{address}/webhooks/postmark (ses, sendgrid, mailgun, resend)");

    // What Postmark posts when a message to b@example.com bounces for good.
    let bounce = serde_json::json!({
        "RecordType": "Bounce",
        "ID": 4323372036_i64,
        "Type": "HardBounce",
        "TypeCode": 1,
        "MessageID": "883953f4-6105-42a2-a16a-77a8eac79483",
        "Email": "b@example.com",
        "BouncedAt": "2026-12-07T10:00:00Z",
        "Description": "The server was unable to deliver your message (ex: unknown user, mailbox not found).",
        "Details": "smtp;550 5.1.1 The email account that you tried to reach does not exist.",
        "MessageStream": "outbound"
    });
    let answer = reqwest::Client::new()
        .post(format!("http://{address}/webhooks/postmark"))
        .basic_auth(POSTMARK_USER, Some(POSTMARK_PASSWORD))
        .header("content-type", "application/json")
        .body(bounce.to_string())
        .send()
        .await?;
    println!("Postmark's bounce for b@example.com: {}", answer.status());

    // The next message to a@ and b@: a@ gets it, b@ is answered without the provider.
    let message = Message::builder()
        .from("app@example.com".parse()?)
        .to("a@example.com".parse()?)
        .to("b@example.com".parse()?)
        .subject("Your receipt")
        .body(String::from("Thank you."))?;
    let receipt = mailer.send(&message).await?;
    println!(
        "sent through {}: the provider accepted {} message(s)",
        receipt.transport(),
        provider.accepted()
    );
    for (to, why) in receipt.rejected_recipients() {
        println!("  {to}: {} ({})", why.code(), why.message());
    }

    if let Some(breaker) = mailer.reputation("relay") {
        let standing = breaker.standing().await?;
        println!(
            "relay's reputation: {:?}, {} send(s), {} hard bounce(s), {} complaint(s) in its window",
            standing.tier,
            standing.window.sends,
            standing.window.hard_bounces,
            standing.window.complaints
        );
    }

    if std::env::args().any(|argument| argument == "--serve") {
        println!("serving until Ctrl-C");
        tokio::select! {
            served = server => served??,
            _ = tokio::signal::ctrl_c() => {}
        }
    }
    Ok(())
}
