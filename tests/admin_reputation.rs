//! The operator page's reputation cards and suppression list (issue 64), called in process
//! with tower's `oneshot` as `tests/admin.rs` does: a card per member with a reputation
//! breaker (tier, rates, volume, thresholds, and the SES account's enforcement status read
//! from an in-test SESv2 endpoint), its reset behind the page's checks, and the suppression
//! list searched and an address removed, each as HTML and as JSON under `/api/`.
#![cfg(all(
    feature = "admin",
    feature = "webhooks",
    feature = "ses",
    feature = "smtp"
))]

mod support;

use std::path::Path;
use std::sync::{Arc, Once};

use axum::Router;
use axum::body::Body;
use axum::http::{Request, Response, StatusCode, header};
use http_body_util::BodyExt;
use mail_breaker::admin::Admin;
use mail_breaker::reputation::Tier;
use mail_breaker::suppression::Reason;
use mail_breaker::{Mailer, Message, Transport};
use serde_json::Value;
use support::servers::free_port;
use support::ses_faults::{Fault, FaultServer};
use tower::ServiceExt;

/// SES takes its keys from the environment: the same for every test of this file.
fn aws_keys() {
    static KEYS: Once = Once::new();
    KEYS.call_once(|| {
        // SAFETY: set once, before any test of this file reads the environment, with the
        // same values for all.
        unsafe {
            std::env::set_var("AWS_ACCESS_KEY_ID", "AKIDTESTONLY");
            std::env::set_var("AWS_SECRET_ACCESS_KEY", "test-secret-never-shown");
        }
    });
}

/// What `GetAccount` answers for an account in `enforcement`.
fn account(enforcement: &str) -> Fault {
    let sending = enforcement != "SHUTDOWN";
    Fault::json(
        200,
        &format!(
            r#"{{"EnforcementStatus":"{enforcement}","ProductionAccessEnabled":true,"SendingEnabled":{sending}}}"#
        ),
    )
}

/// The reputation keys of the tests' SES member: 10 sends make a volume, warn at 5 % of
/// hard bounces, open at 30 %.
const REPUTATION: &str = "reputation.hard_bounces.min_sends=10&reputation.complaints.min_sends=10\
     &reputation.window_sends=20&reputation.buckets=2\
     &reputation.hard_bounces.warn=5%25&reputation.hard_bounces.throttle=20%25\
     &reputation.hard_bounces.open=30%25";

/// A mailer of one SES member named `ses` at `server`, with a reputation breaker.
async fn ses_mailer(server: &FaultServer) -> Arc<Mailer> {
    aws_keys();
    let dsn = format!(
        "ses://us-east-1?endpoint={}&name=ses&{REPUTATION}",
        server.endpoint()
    );
    Arc::new(Mailer::from_dsn(&dsn).unwrap().build().await.unwrap())
}

fn message(n: usize) -> Message {
    Message::builder()
        .from("app@example.com".parse().unwrap())
        .to(format!("user{n}@example.org").parse().unwrap())
        .subject("hello")
        .body(String::from("hello"))
        .unwrap()
}

/// `sends` messages through the mailer (SES answers each with the account's JSON, which
/// reads as a send without a message id), then `bounces` permanent bounces for its member.
async fn sends_and_bounces(mailer: &Mailer, sends: usize, bounces: usize) {
    for n in 0..sends {
        mailer.send(&message(n)).await.unwrap();
    }
    mailer
        .reputation("ses")
        .unwrap()
        .record(&support::hard_bounces("ses", bounces))
        .await
        .unwrap();
}

fn get(path: &str) -> Request<Body> {
    Request::get(path).body(Body::empty()).unwrap()
}

fn post(path: &str, form: &str, headers: &[(&str, &str)]) -> Request<Body> {
    let mut request = Request::post(path)
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .header(header::HOST, "127.0.0.1:8025");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request.body(Body::from(form.to_owned())).unwrap()
}

async fn call(router: &Router, request: Request<Body>) -> Response<Body> {
    router.clone().oneshot(request).await.unwrap()
}

async fn text(response: Response<Body>) -> String {
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

async fn json(router: &Router, path: &str) -> Value {
    let response = call(router, get(path)).await;
    assert_eq!(response.status(), StatusCode::OK, "{path}");
    serde_json::from_str(&text(response).await).unwrap()
}

async fn page(router: &Router, path: &str) -> String {
    let response = call(router, get(path)).await;
    assert_eq!(response.status(), StatusCode::OK, "{path}");
    text(response).await
}

/// The part of `page` from the card of the member `member` to the end of that card.
fn card<'a>(page: &'a str, member: &str) -> &'a str {
    let start = page
        .find(&format!(r#"data-reputation="{member}""#))
        .unwrap_or_else(|| panic!("no reputation card for {member}: {page}"));
    let rest = &page[start..];
    &rest[..rest.find("</section>").unwrap_or(rest.len())]
}

const SAME_SITE: [(&str, &str); 1] = [("origin", "http://127.0.0.1:8025")];

// ---- the reputation cards ----

#[tokio::test]
async fn a_member_with_a_reputation_breaker_has_a_card_with_its_tier_rates_volume_and_thresholds() {
    let server = FaultServer::start(account("HEALTHY")).await;
    let mailer = ses_mailer(&server).await;
    sends_and_bounces(&mailer, 10, 1).await;
    let router = Admin::new(Arc::clone(&mailer)).router();

    let read = json(&router, "/api/reputation").await;
    let ses = &read[0];
    assert_eq!(ses["member"], "ses", "{read}");
    assert_eq!(ses["tier"], "warn", "{read}");
    assert_eq!(ses["sends"], 10, "{read}");
    assert_eq!(ses["hard_bounces"], 1, "{read}");
    assert_eq!(ses["complaints"], 0, "{read}");
    assert_eq!(ses["hard_bounce_rate"], 0.1, "{read}");
    assert_eq!(ses["complaint_rate"], 0.0, "{read}");
    assert_eq!(ses["thresholds"]["hard_bounces"]["open_percent"], 30.0);
    assert_eq!(ses["thresholds"]["hard_bounces"]["minimum_sends"], 10);
    assert_eq!(ses["thresholds"]["complaints"]["open_percent"], 0.08);
    assert_eq!(ses["failover"], false);

    let shown = page(&router, "/").await;
    assert!(
        shown.contains(r#"class="card half_open" data-reputation="ses""#),
        "warn is coloured as a breaker half open: {shown}"
    );
    let card = card(&shown, "ses");
    assert!(card.contains(r#"data-tier="warn""#), "{card}");
    assert!(card.contains("10.00 %"), "the hard-bounce rate: {card}");
    assert!(card.contains(">10<"), "the sends counted: {card}");
    assert!(card.contains("30 %"), "where it opens: {card}");
}

#[tokio::test]
async fn the_ses_account_s_enforcement_status_healthy_probation_or_shutdown_is_shown_beside_its_card()
 {
    for status in ["HEALTHY", "PROBATION", "SHUTDOWN"] {
        let server = FaultServer::start(account(status)).await;
        let mailer = ses_mailer(&server).await;
        let router = Admin::new(Arc::clone(&mailer)).router();
        let read = json(&router, "/api/reputation").await;
        assert_eq!(read[0]["ses"]["enforcement"], status, "{read}");
        assert_eq!(
            read[0]["ses"]["sending_enabled"],
            status != "SHUTDOWN",
            "{read}"
        );
        assert_eq!(read[0]["ses"]["error"], Value::Null, "{read}");
        let shown = page(&router, "/").await;
        let card = card(&shown, "ses");
        assert!(
            card.contains(&format!(r#"data-enforcement="{status}""#)),
            "{status}: {card}"
        );
    }
}

#[tokio::test]
async fn pages_read_within_a_minute_ask_ses_for_the_account_once() {
    let server = FaultServer::start(account("HEALTHY")).await;
    let mailer = ses_mailer(&server).await;
    let router = Admin::new(Arc::clone(&mailer)).router();
    for _ in 0..3 {
        page(&router, "/").await;
        json(&router, "/api/reputation").await;
    }
    assert_eq!(server.requests(), 1, "one GetAccount for six reads");
}

#[tokio::test]
async fn an_ses_account_that_cannot_be_read_is_shown_as_unknown_with_its_reason() {
    let server = FaultServer::start(Fault::ses_error(
        403,
        "AccessDeniedException",
        "not allowed to GetAccount",
    ))
    .await;
    let mailer = ses_mailer(&server).await;
    let router = Admin::new(Arc::clone(&mailer)).router();
    let read = json(&router, "/api/reputation").await;
    assert_eq!(read[0]["ses"]["enforcement"], "unknown", "{read}");
    let why = read[0]["ses"]["error"].as_str().unwrap_or_default();
    assert!(why.contains("AccessDenied"), "{read}");
    let shown = page(&router, "/").await;
    let card = card(&shown, "ses");
    assert!(card.contains(r#"data-enforcement="unknown""#), "{card}");
    assert!(card.contains("AccessDenied"), "the reason is shown: {card}");
}

#[tokio::test]
async fn a_member_that_is_not_ses_has_a_card_without_an_account_status() {
    let dsn = format!("smtp://127.0.0.1:{}?name=relay&{REPUTATION}", free_port());
    let mailer = Arc::new(Mailer::from_dsn(&dsn).unwrap().build().await.unwrap());
    let router = Admin::new(mailer).router();
    let read = json(&router, "/api/reputation").await;
    assert_eq!(read[0]["member"], "relay", "{read}");
    assert_eq!(read[0]["tier"], "healthy", "{read}");
    assert_eq!(read[0]["ses"], Value::Null, "{read}");
    let shown = page(&router, "/").await;
    assert!(!card(&shown, "relay").contains("data-enforcement"));
    assert!(
        shown.contains(r#"class="card closed" data-reputation="relay""#),
        "healthy is coloured as a closed breaker: {shown}"
    );
}

#[tokio::test]
async fn a_mailer_without_reputation_breakers_shows_no_reputation_card() {
    let dsn = format!("smtp://127.0.0.1:{}?name=relay", free_port());
    let mailer = Arc::new(Mailer::from_dsn(&dsn).unwrap().build().await.unwrap());
    let router = Admin::new(mailer).router();
    assert_eq!(
        json(&router, "/api/reputation").await,
        serde_json::json!([])
    );
    assert!(!page(&router, "/").await.contains("data-reputation"));
}

#[tokio::test]
async fn a_post_with_the_token_resets_an_open_reputation_breaker_and_clears_its_counts() {
    let server = FaultServer::start(account("HEALTHY")).await;
    let mailer = ses_mailer(&server).await;
    sends_and_bounces(&mailer, 10, 3).await;
    let breaker = mailer.reputation("ses").unwrap();
    assert_eq!(breaker.standing().await.unwrap().tier, Tier::Open);
    let admin = Admin::new(Arc::clone(&mailer));
    let router = admin.router();
    let shown = page(&router, "/").await;
    assert!(
        shown.contains(r#"class="card open" data-reputation="ses""#),
        "{shown}"
    );
    assert!(
        card(&shown, "ses").contains(r#"action="/reputation/ses/reset""#),
        "an open breaker offers its reset: {shown}"
    );
    let form = format!("token={}", admin.token());
    let response = call(&router, post("/reputation/ses/reset", &form, &SAME_SITE)).await;
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    assert_eq!(response.headers()[header::LOCATION], "/");
    let standing = breaker.standing().await.unwrap();
    assert_eq!(standing.tier, Tier::Healthy);
    assert_eq!(standing.window.sends, 0);
}

#[tokio::test]
async fn a_reputation_reset_without_the_token_or_from_another_site_is_refused_and_changes_nothing()
{
    let server = FaultServer::start(account("HEALTHY")).await;
    let mailer = ses_mailer(&server).await;
    sends_and_bounces(&mailer, 10, 3).await;
    let admin = Admin::new(Arc::clone(&mailer));
    let router = admin.router();
    let with_token = format!("token={}", admin.token());
    for (form, headers) in [
        ("token=wrong-token-0123456789".to_owned(), SAME_SITE),
        (with_token, [("origin", "https://evil.example")]),
    ] {
        let response = call(&router, post("/reputation/ses/reset", &form, &headers)).await;
        assert_eq!(
            response.status(),
            StatusCode::FORBIDDEN,
            "{form} {headers:?}"
        );
    }
    let breaker = mailer.reputation("ses").unwrap();
    assert_eq!(breaker.standing().await.unwrap().tier, Tier::Open);
}

#[tokio::test]
async fn a_reputation_reset_of_a_member_without_one_is_404() {
    let server = FaultServer::start(account("HEALTHY")).await;
    let mailer = ses_mailer(&server).await;
    let admin = Admin::new(mailer);
    let form = format!("token={}", admin.token());
    let response = call(
        &admin.router(),
        post("/reputation/nobody/reset", &form, &SAME_SITE),
    )
    .await;
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn a_read_only_page_offers_no_reputation_reset_and_refuses_its_post() {
    let server = FaultServer::start(account("HEALTHY")).await;
    let mailer = ses_mailer(&server).await;
    sends_and_bounces(&mailer, 10, 3).await;
    let admin = Admin::new(Arc::clone(&mailer)).read_only();
    let router = admin.router();
    assert!(!page(&router, "/").await.contains("/reputation/ses/reset"));
    let form = format!("token={}", admin.token());
    let response = call(&router, post("/reputation/ses/reset", &form, &SAME_SITE)).await;
    assert_eq!(response.status(), StatusCode::METHOD_NOT_ALLOWED);
    let breaker = mailer.reputation("ses").unwrap();
    assert_eq!(breaker.standing().await.unwrap().tier, Tier::Open);
}

// ---- the suppression list ----

/// A mailer with an outbox in `dir` and its suppression list holding `addresses`.
async fn suppressing(dir: &Path, addresses: &[&str]) -> Arc<Mailer> {
    let dsn = format!(
        "smtp://127.0.0.1:{}?name=relay&outbox=sqlite://{}&outbox.poll=1h&suppression=true",
        free_port(),
        dir.join("outbox.db").display()
    );
    let mailer = Mailer::from_dsn(&dsn).unwrap().build().await.unwrap();
    let list = mailer.suppression().expect("a suppression list");
    for address in addresses {
        list.add(address, Reason::Bounced).await.unwrap();
    }
    Arc::new(mailer)
}

fn folder(test: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("mail-breaker-admin-reputation-{test}-"))
        .tempdir()
        .unwrap()
}

#[tokio::test]
async fn the_suppression_list_is_searched_by_a_part_of_the_address_as_html_and_json() {
    let dir = folder("search");
    let mailer = suppressing(
        dir.path(),
        &["ann@shop.example", "bob@example.org", "carol@shop.example"],
    )
    .await;
    let router = Admin::new(mailer).router();
    let found = json(&router, "/api/suppressions?q=SHOP").await;
    let addresses: Vec<&str> = found
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|entry| entry["address"].as_str())
        .collect();
    assert_eq!(addresses, ["ann@shop.example", "carol@shop.example"]);
    assert_eq!(found[0]["reason"], "bounced");
    let all = json(&router, "/api/suppressions").await;
    assert_eq!(all.as_array().unwrap().len(), 3, "no text: every address");

    let shown = page(&router, "/?suppressed=shop").await;
    let table = &shown[shown.find(r#"id="suppressions""#).expect("a table")..];
    assert!(table.contains("ann@shop.example"), "{table}");
    assert!(table.contains("carol@shop.example"), "{table}");
    assert!(!table.contains("bob@example.org"), "{table}");
    assert!(
        shown.contains(r#"name="suppressed" value="shop""#),
        "the search box keeps the text: {shown}"
    );
}

#[tokio::test]
async fn a_suppression_search_gives_at_most_its_limit_and_refuses_a_limit_past_the_most() {
    let dir = folder("bounded");
    let addresses: Vec<String> = (0..5).map(|n| format!("user{n}@example.org")).collect();
    let borrowed: Vec<&str> = addresses.iter().map(String::as_str).collect();
    let mailer = suppressing(dir.path(), &borrowed).await;
    let router = Admin::new(mailer).router();
    let found = json(&router, "/api/suppressions?q=user&limit=2").await;
    assert_eq!(found.as_array().unwrap().len(), 2, "{found}");
    for query in ["limit=1001", "limit=ten", "limit=-1"] {
        let response = call(&router, get(&format!("/api/suppressions?{query}"))).await;
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{query}");
    }
}

#[tokio::test]
async fn a_post_with_the_token_removes_an_address_from_the_suppression_list() {
    let dir = folder("remove");
    let mailer = suppressing(dir.path(), &["gone/odd@example.org", "kept@example.org"]).await;
    let admin = Admin::new(Arc::clone(&mailer));
    let router = admin.router();
    let shown = page(&router, "/").await;
    let path = "/suppressions/gone%2Fodd%40example%2Eorg/remove";
    assert!(
        shown.contains(path),
        "each address has its remove form: {shown}"
    );
    let form = format!("token={}", admin.token());
    let response = call(&router, post(path, &form, &SAME_SITE)).await;
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    let list = mailer.suppression().unwrap();
    assert!(!list.contains("gone/odd@example.org").await.unwrap());
    assert!(list.contains("kept@example.org").await.unwrap());
    let again = call(&router, post(path, &form, &SAME_SITE)).await;
    assert_eq!(
        again.status(),
        StatusCode::NOT_FOUND,
        "no longer on the list"
    );
}

#[tokio::test]
async fn a_removal_without_the_token_or_from_another_site_is_refused_and_the_address_stays() {
    let dir = folder("remove-refused");
    let mailer = suppressing(dir.path(), &["kept@example.org"]).await;
    let admin = Admin::new(Arc::clone(&mailer));
    let router = admin.router();
    let path = "/suppressions/kept%40example.org/remove";
    let with_token = format!("token={}", admin.token());
    for (form, headers) in [
        ("token=wrong-token-0123456789".to_owned(), SAME_SITE),
        (with_token, [("origin", "https://evil.example")]),
    ] {
        let response = call(&router, post(path, &form, &headers)).await;
        assert_eq!(response.status(), StatusCode::FORBIDDEN, "{form}");
    }
    let read_only = Admin::new(Arc::clone(&mailer)).read_only();
    let form = format!("token={}", read_only.token());
    let response = call(&read_only.router(), post(path, &form, &SAME_SITE)).await;
    assert_eq!(response.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert!(!page(&read_only.router(), "/").await.contains("/remove"));
    let list = mailer.suppression().unwrap();
    assert!(list.contains("kept@example.org").await.unwrap());
}

#[tokio::test]
async fn a_suppressed_address_holding_markup_is_shown_as_text() {
    let dir = folder("markup");
    let mailer = suppressing(dir.path(), &["<script>x</script>@example.org"]).await;
    let shown = page(&Admin::new(mailer).router(), "/").await;
    assert!(!shown.contains("<script>x"), "{shown}");
    assert!(shown.contains("&lt;script&gt;x"), "{shown}");
}

#[tokio::test]
async fn a_mailer_without_a_suppression_list_shows_no_list_and_its_api_answers_null() {
    let dsn = format!("smtp://127.0.0.1:{}?name=relay", free_port());
    let mailer = Arc::new(Mailer::from_dsn(&dsn).unwrap().build().await.unwrap());
    let router = Admin::new(mailer).router();
    assert_eq!(json(&router, "/api/suppressions").await, Value::Null);
    assert!(!page(&router, "/").await.contains(r#"id="suppressions""#));
}

#[tokio::test]
async fn a_suppression_list_whose_store_fails_is_503_with_why_and_the_page_says_so() {
    let dir = folder("store-fails");
    let mailer = suppressing(dir.path(), &["kept@example.org"]).await;
    // The list's table gone under the mailer: every read of it fails.
    let file = dir.path().join("outbox.db");
    let db = sqlx::SqlitePool::connect(&format!("sqlite://{}", file.display()))
        .await
        .unwrap();
    sqlx::query("DROP TABLE mail_breaker_suppression")
        .execute(&db)
        .await
        .unwrap();
    let router = Admin::new(mailer).router();
    let response = call(&router, get("/api/suppressions")).await;
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    let body: Value = serde_json::from_str(&text(response).await).unwrap();
    assert_eq!(body["error"]["code"], "suppression.store", "{body}");
    assert!(
        page(&router, "/")
            .await
            .contains("The suppression list did not answer"),
        "the page shows the rest, and says why the list is missing"
    );
}
