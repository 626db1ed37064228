//! The operator page in a real browser: Debian's Chromium, headless, over the DevTools
//! protocol, against the router served in the test over a mailer that sends to smtp-sink.
//! Without Chromium or smtp-sink a test prints SKIPPED and why; under `CI=true` it fails.
//!
//! `MAIL_BREAKER_SCREENSHOTS=docs` writes the page's screenshots to `docs/` (the README's);
//! otherwise they go to the target folder.
#![cfg(all(feature = "admin", feature = "smtp"))]

mod support;

#[path = "support/chromium.rs"]
mod chromium;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use chromium::{Chromium, Page};
use mail_breaker::admin::Admin;
use mail_breaker::outbox::Outbox;
use mail_breaker::{Category, Mailer, Message, SendError, State, Transport};
use serde_json::{Value, json};
use support::scripted::{Reply, Scripted};
use support::smtp_sink::SmtpSink;

/// One browser at a time: the machine's cores are shared.
static ONE_BROWSER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// How long the page may take to show a change: its refresh (5 s) and a little more.
const WITHIN_REFRESH: Duration = Duration::from_secs(8);

/// Serves `admin` on a free loopback port; its address.
async fn serve(admin: Admin) -> (String, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/", listener.local_addr().unwrap());
    let server = tokio::spawn(async move {
        let _ = admin.serve(listener).await;
    });
    (url, server)
}

fn message(subject: &str) -> Message {
    Message::builder()
        .from("app@example.com".parse().unwrap())
        .to("user@example.org".parse().unwrap())
        .subject(subject)
        .body(String::from("hello"))
        .unwrap()
}

/// Where a screenshot named `name` goes.
fn screenshot_path(name: &str) -> PathBuf {
    if std::env::var("MAIL_BREAKER_SCREENSHOTS").is_ok_and(|to| to == "docs") {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("docs")
            .join(name)
    } else {
        Path::new(env!("CARGO_TARGET_TMPDIR")).join(name)
    }
}

/// The word the page shows for the first breaker's state.
const FIRST_STATE: &str = "document.querySelector('[data-member] .state')?.textContent";

async fn expect(page: &Page<'_>, expression: &str, expected: Value, what: &str) {
    if let Err(last) = page.wait_for(expression, &expected, WITHIN_REFRESH).await {
        let shown = page
            .eval("location.href + ' ' + document.body.innerText")
            .await;
        panic!("{what}: expected {expected}, the page showed {last:?}: {shown:?}");
    }
}

/// Sends until the member's breaker opens (the server is down: each send fails at once).
async fn send_until_open(mailer: &Mailer, member: &str) {
    for _ in 0..10 {
        let _ = mailer.send(&message("while down")).await;
        if mailer.breaker(member).unwrap().state() == State::Open {
            return;
        }
    }
    panic!("the breaker of {member} did not open");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_shows_a_breaker_open_within_its_refresh_and_its_buttons_reset_and_isolate_it() {
    const TEST: &str = "the_page_shows_a_breaker_open_within_its_refresh";
    let _one = ONE_BROWSER.lock().await;
    let Some(mut sink) = SmtpSink::start(TEST, &[]) else {
        return;
    };
    let Some(browser) = Chromium::start(TEST).await else {
        return;
    };
    let member = format!("smtp://127.0.0.1:{}", sink.port());
    let dsn = format!("{member}?breaker.threshold=2&breaker.reset=1h&timeout=500ms");
    let mailer = Arc::new(Mailer::from_dsn(&dsn).unwrap().build().await.unwrap());
    mailer.send(&message("before")).await.unwrap();
    let (url, server) = serve(Admin::new(Arc::clone(&mailer))).await;

    let page = browser.page(1000, 800).await;
    page.goto(&url).await;
    expect(
        &page,
        FIRST_STATE,
        json!("closed"),
        "a breaker that delivered",
    )
    .await;

    sink.stop();
    send_until_open(&mailer, &member).await;
    expect(
        &page,
        FIRST_STATE,
        json!("open"),
        "after the server stopped",
    )
    .await;
    let shown = page
        .eval("document.querySelector('[data-member]').dataset.member")
        .await;
    assert_eq!(shown, Some(json!(member)));

    page.click("[data-member] form[action$='/reset'] button")
        .await;
    expect(&page, FIRST_STATE, json!("closed"), "after Reset").await;
    assert_eq!(mailer.breaker(&member).unwrap().state(), State::Closed);

    page.click("[data-member] form[action$='/isolate'] button")
        .await;
    expect(&page, FIRST_STATE, json!("isolated"), "after Isolate").await;
    assert!(
        mailer
            .breaker(&member)
            .unwrap()
            .snapshot()
            .await
            .is_isolated()
    );

    let shot = Path::new(env!("CARGO_TARGET_TMPDIR")).join("admin-isolated.png");
    page.screenshot(&shot).await;
    server.abort();
}

/// A dead letter as a provider's refusal leaves it, put in the outbox file before the
/// mailer opens it.
async fn dead_letter(file: &Path, subject: &str) {
    let outbox = Outbox::sqlite(file).await.unwrap();
    outbox.enqueue(&message(subject)).await.unwrap();
    let refusal = SendError::new(
        Category::Rejected,
        "smtp.550",
        "550 5.1.1 <user@example.org>: Recipient address rejected: User unknown in local recipient table",
    );
    let refusing = Scripted::answering("smtp://mx.example.org:25", Reply::Err(refusal));
    outbox.worker(refusing).drain().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_with_an_open_breaker_queued_mail_and_a_dead_letter_reads_in_light_and_dark() {
    const TEST: &str = "a_page_with_an_open_breaker_queued_mail_and_a_dead_letter";
    let _one = ONE_BROWSER.lock().await;
    let Some(mut sink) = SmtpSink::start(TEST, &[]) else {
        return;
    };
    let Some(browser) = Chromium::start(TEST).await else {
        return;
    };
    let dir =
        std::env::temp_dir().join(format!("mail-breaker-admin-browser-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("outbox.db");
    dead_letter(&file, "Your invoice #1042 <for March>").await;
    let port = sink.port();
    let dsn = format!(
        "failover(smtp://127.0.0.1:{port}?name=primary&breaker.threshold=2&breaker.reset=10m\
         &timeout=500ms&rate=14/s&rate.adaptive=true \
         smtp://127.0.0.1:{port}?name=backup&rate=5/s)?outbox=sqlite://{}&outbox.poll=1h",
        file.display()
    );
    let mailer = Arc::new(Mailer::from_dsn(&dsn).unwrap().build().await.unwrap());
    mailer.send(&message("welcome")).await.unwrap();
    let admin = Admin::new(Arc::clone(&mailer))
        .chart_every(Duration::from_millis(200))
        .unwrap();
    let (url, server) = serve(admin).await;

    mailer.breaker("backup").unwrap().isolate().await;
    sink.stop();
    send_until_open(&mailer, "primary").await;
    for n in 0..6 {
        let receipt = mailer.send(&message(&format!("order {n}"))).await.unwrap();
        assert!(receipt.is_queued(), "{receipt:?}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let outbox = mailer.outbox().unwrap();
    let stats = outbox.stats().await.unwrap();
    assert!(stats.queued >= 6 && stats.dead == 1, "{stats:?}");

    let page = browser.page(1100, 900).await;
    page.goto(&url).await;
    expect(&page, FIRST_STATE, json!("open"), "the primary, down").await;
    let queued = page
        .eval("document.querySelector('#outbox .queued').textContent")
        .await;
    assert_eq!(queued, Some(json!(stats.queued.to_string())));
    let subject = page
        .eval("document.querySelector('#dead .subject').textContent")
        .await;
    assert_eq!(subject, Some(json!("Your invoice #1042 <for March>")));
    page.screenshot(&screenshot_path("admin.png")).await;

    let phone = browser.page(390, 844).await;
    phone.prefer_dark(true).await;
    phone.goto(&url).await;
    expect(
        &phone,
        FIRST_STATE,
        json!("open"),
        "on a phone, in the dark",
    )
    .await;
    let fits = phone
        .eval("document.documentElement.scrollWidth <= window.innerWidth")
        .await;
    assert_eq!(
        fits,
        Some(json!(true)),
        "nothing wider than a phone's screen"
    );
    phone
        .screenshot(&screenshot_path("admin-phone-dark.png"))
        .await;
    server.abort();
    drop(mailer);
    let _ = std::fs::remove_dir_all(&dir);
}

/// An SES member at an in-test SESv2 endpoint whose account is on probation, its reputation
/// breaker opened by its bounces, and a suppression list: the page shows the card, its SES
/// status and the list, and its Reset button closes the breaker.
#[cfg(all(feature = "webhooks", feature = "ses"))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_shows_an_open_reputation_breaker_beside_its_ses_status_and_its_reset_closes_it() {
    use mail_breaker::events::{BounceKind, DeliveryEvent, EventKind, Provider};
    use mail_breaker::reputation::Tier;
    use mail_breaker::suppression::Reason;
    use support::ses_faults::{Fault, FaultServer};

    const TEST: &str = "the_page_shows_an_open_reputation_breaker";
    let _one = ONE_BROWSER.lock().await;
    let Some(browser) = Chromium::start(TEST).await else {
        return;
    };
    // SAFETY: this file's only test that reads these; the values are the same for any other.
    unsafe {
        std::env::set_var("AWS_ACCESS_KEY_ID", "AKIDTESTONLY");
        std::env::set_var("AWS_SECRET_ACCESS_KEY", "test-secret-never-shown");
    }
    let ses = FaultServer::start(Fault::json(
        200,
        r#"{"EnforcementStatus":"PROBATION","ProductionAccessEnabled":true,"SendingEnabled":true}"#,
    ))
    .await;
    let dir = tempfile::Builder::new()
        .prefix("mail-breaker-admin-browser-reputation-")
        .tempdir()
        .unwrap();
    let dsn = format!(
        "ses://us-east-1?endpoint={}&name=ses&reputation.hard_bounces.min_sends=10\
         &reputation.complaints.min_sends=10&reputation.window_sends=20&reputation.buckets=2\
         &reputation.hard_bounces.open=30%25&outbox=sqlite://{}&outbox.poll=1h&suppression=true",
        ses.endpoint(),
        dir.path().join("outbox.db").display()
    );
    let mailer = Arc::new(Mailer::from_dsn(&dsn).unwrap().build().await.unwrap());
    for n in 0..10 {
        mailer.send(&message(&format!("order {n}"))).await.unwrap();
    }
    let bounces: Vec<DeliveryEvent> = (0..3)
        .map(|n| {
            let bounce = EventKind::Bounced {
                bounce: BounceKind::Permanent,
                subtype: None,
            };
            let to = format!("gone{n}@example.org");
            let mut event = DeliveryEvent::new(
                Provider::Ses,
                format!("b-{n}"),
                bounce,
                to,
                std::time::SystemTime::now(),
            );
            event.member = Some("ses".into());
            event
        })
        .collect();
    let breaker = mailer.reputation("ses").unwrap();
    breaker.record(&bounces).await.unwrap();
    let list = mailer.suppression().unwrap();
    list.add("gone0@example.org", Reason::Bounced)
        .await
        .unwrap();
    let (url, server) = serve(Admin::new(Arc::clone(&mailer))).await;

    let page = browser.page(1000, 900).await;
    page.goto(&url).await;
    const TIER: &str = "document.querySelector('[data-reputation] [data-tier]')?.dataset.tier";
    expect(&page, TIER, json!("open"), "the member's bounces opened it").await;
    let status = page
        .eval("document.querySelector('[data-reputation] [data-enforcement]')?.dataset.enforcement")
        .await;
    assert_eq!(status, Some(json!("PROBATION")));
    let listed = page
        .eval("document.querySelector('#suppressions td')?.textContent")
        .await;
    assert_eq!(listed, Some(json!("gone0@example.org")));

    page.click("[data-reputation] form[action$='/reset'] button")
        .await;
    expect(&page, TIER, json!("healthy"), "after Reset reputation").await;
    assert_eq!(breaker.standing().await.unwrap().tier, Tier::Healthy);
    server.abort();
}
