//! The operator page's router (feature `admin`), called in process with tower's `oneshot`:
//! what each route answers, that `/api/` agrees with the mailer's own snapshots, that an
//! action needs the page's token and this site's origin, that a read-only page takes no
//! action, and that a subject holding markup is shown as text.
#![cfg(all(feature = "admin", feature = "smtp"))]

mod support;

#[path = "../examples/support/mod.rs"]
mod embedded;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, Response, StatusCode, header};
use http_body_util::BodyExt;
use mail_breaker::admin::{self, Admin, Credential};
use mail_breaker::outbox::Outbox;
use mail_breaker::{Category, Mailer, Message, State, Transport};
use serde_json::Value;
use support::raw_smtp::{Answer, RawSmtp};
use support::scripted::{Reply, Scripted};
use support::servers::free_port;
use tower::ServiceExt;

/// The first member's name, as the DSN gives it (its URL), and the second's.
struct Members {
    first: String,
    second: &'static str,
}

/// A folder of its own for a test's outbox, removed when the test ends.
fn folder(test: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("mail-breaker-admin-{test}-"))
        .tempdir()
        .unwrap()
}

/// A mailer of two members on ports where nothing listens (the router tests send nothing),
/// the first with an adaptive rate limit, and an outbox in `dir`.
async fn mailer(dir: &Path) -> (Arc<Mailer>, Members) {
    let first = format!("smtp://127.0.0.1:{}", free_port());
    let dsn = format!(
        "failover({first}?rate=20/s&rate.adaptive=true smtp://127.0.0.1:{}?name=backup)\
         ?outbox=sqlite://{}&outbox.poll=1h",
        free_port(),
        dir.join("outbox.db").display()
    );
    let mailer = Mailer::from_dsn(&dsn).unwrap().build().await.unwrap();
    (
        Arc::new(mailer),
        Members {
            first,
            second: "backup",
        },
    )
}

/// Puts a message with `subject` among the dead letters of the outbox in `dir`, as a
/// provider that refused it leaves it, before the mailer opens the file.
async fn dead_letter(dir: &Path, subject: &str) {
    dead_message(dir, &message(subject)).await;
}

/// A message from app@example.com to user@example.org with `subject`.
fn message(subject: &str) -> Message {
    Message::builder()
        .from("app@example.com".parse().unwrap())
        .to("user@example.org".parse().unwrap())
        .subject(subject)
        .body(String::from("hello"))
        .unwrap()
}

/// Puts `message` among the dead letters of the outbox in `dir`, as [`dead_letter`] does.
async fn dead_message(dir: &Path, message: &Message) {
    let outbox = Outbox::sqlite(dir.join("outbox.db")).await.unwrap();
    let dead_before = outbox.stats().await.unwrap().dead;
    outbox.enqueue(message).await.unwrap();
    let refusing = Scripted::answering("refusing", Reply::fail(Category::Rejected));
    outbox.worker(refusing).drain().await.unwrap();
    assert_eq!(outbox.stats().await.unwrap().dead, dead_before + 1);
}

fn get(path: &str) -> Request<Body> {
    Request::get(path).body(Body::empty()).unwrap()
}

/// A form POST to `path` with `form` as its body and `headers`.
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

fn content_type(response: &Response<Body>) -> &str {
    response.headers()[header::CONTENT_TYPE].to_str().unwrap()
}

/// A member's name as a path takes it.
fn encoded(name: &str) -> String {
    percent_encoding::utf8_percent_encode(name, percent_encoding::NON_ALPHANUMERIC).to_string()
}

#[tokio::test]
async fn each_route_answers_ok_with_html_for_the_page_and_json_under_api() {
    let dir = folder("routes");
    let (mailer, _) = mailer(dir.path()).await;
    let router = admin::router(mailer);
    let page = call(&router, get("/")).await;
    assert_eq!(page.status(), StatusCode::OK);
    assert_eq!(content_type(&page), "text/html; charset=utf-8");
    for path in ["/api/breakers", "/api/limiters", "/api/outbox", "/api/dead"] {
        let response = call(&router, get(path)).await;
        assert_eq!(response.status(), StatusCode::OK, "{path}");
        assert_eq!(content_type(&response), "application/json", "{path}");
    }
}

#[tokio::test]
async fn the_page_refreshes_itself_and_loads_nothing_from_another_host() {
    let dir = folder("refresh");
    let (mailer, _) = mailer(dir.path()).await;
    let page = text(call(&admin::router(mailer), get("/")).await).await;
    assert!(
        page.contains(r#"<meta http-equiv="refresh" content="5">"#),
        "{page}"
    );
    assert!(!page.contains("<script"), "no script: {page}");
    assert!(!page.contains("src="), "no asset: {page}");
    assert!(
        !page.contains("://") || !page.contains("href=\"http"),
        "no link out: {page}"
    );
}

#[tokio::test]
async fn the_page_lets_a_browser_send_its_origin_with_each_form() {
    // Under `Referrer-Policy: no-referrer` a browser POSTs a form with `Origin: null`, which
    // the page must refuse: every action would be forbidden.
    let dir = folder("referrer");
    let (mailer, _) = mailer(dir.path()).await;
    let page = call(&admin::router(mailer), get("/")).await;
    assert_eq!(page.headers()[header::REFERRER_POLICY], "same-origin");
}

#[tokio::test]
async fn the_breakers_api_agrees_with_the_mailers_breakers() {
    let dir = folder("api-breakers");
    let (mailer, members) = mailer(dir.path()).await;
    mailer.breaker(members.second).unwrap().isolate().await;
    let read = json(&admin::router(Arc::clone(&mailer)), "/api/breakers").await;
    let read = read.as_array().unwrap();
    assert_eq!(read.len(), mailer.breakers().count());
    for ((name, breaker), shown) in mailer.breakers().zip(read) {
        let snapshot = breaker.snapshot().await;
        assert_eq!(shown["name"], name);
        assert_eq!(shown["key"], snapshot.key());
        assert_eq!(shown["failures"], snapshot.failures());
        assert_eq!(shown["calls"], snapshot.calls());
        let state = if snapshot.is_isolated() {
            "isolated"
        } else {
            snapshot.state().as_str()
        };
        assert_eq!(shown["state"], state);
    }
    assert_eq!(read[0]["state"], "closed");
    assert_eq!(read[1]["state"], "isolated");
    assert_eq!(read[1]["recent_changes"][0]["reason"], "isolated by hand");
    assert!(read[1]["opened_at_ms"].as_u64().is_some(), "{}", read[1]);
}

/// A mailer of one member whose breaker opens on one failure and probes after a second,
/// on a server that says 421 to the first `MAIL` and nothing to the others.
async fn opened_then_probing() -> (Arc<Mailer>, RawSmtp) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let mails = AtomicUsize::new(0);
    let server = RawSmtp::start(
        b"220 raw.test ready\r\n".to_vec(),
        move |command| match command {
            "MAIL" if mails.fetch_add(1, Ordering::SeqCst) == 0 => {
                Answer::SayAndHangUp(b"421 4.3.2 busy\r\n".to_vec())
            }
            "MAIL" => Answer::Silence,
            other => Answer::healthy(other),
        },
    )
    .await;
    let dsn = format!(
        "smtp://127.0.0.1:{}?breaker.threshold=1&breaker.reset=1s&timeout=10s",
        server.port()
    );
    let mailer = Mailer::from_dsn(&dsn).unwrap().build().await.unwrap();
    (Arc::new(mailer), server)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_breaker_shows_when_it_probes_next_and_an_isolated_one_does_not() {
    let (mailer, _server) = opened_then_probing().await;
    let message = message("s");
    mailer.send(&message).await.unwrap_err();
    let router = admin::router(Arc::clone(&mailer));
    let read = json(&router, "/api/breakers").await;
    assert_eq!(read[0]["state"], "open", "{read}");
    let next = read[0]["next_probe_ms"]
        .as_u64()
        .expect("an open breaker probes");
    assert!((1..=1_000).contains(&next), "{read}");
    mailer.breakers().next().unwrap().1.isolate().await;
    let read = json(&router, "/api/breakers").await;
    assert_eq!(read[0]["state"], "isolated", "{read}");
    assert!(read[0]["next_probe_ms"].is_null(), "{read}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probing_breaker_shows_when_it_opened_not_when_it_began_to_probe() {
    let (mailer, server) = opened_then_probing().await;
    let message = message("s");
    mailer.send(&message).await.unwrap_err();
    let opened_by = std::time::SystemTime::now();
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let probing = Arc::clone(&mailer);
    let probe = tokio::spawn(async move { probing.send(&message).await });
    while server.count("MAIL") < 2 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let read = json(&admin::router(Arc::clone(&mailer)), "/api/breakers").await;
    let (_, breaker) = mailer.breakers().next().unwrap();
    assert_eq!(read[0]["state"], breaker.snapshot().await.state().as_str());
    assert_ne!(read[0]["state"], "open", "{read}");
    let opened_by_ms = opened_by
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let opened_at = read[0]["opened_at_ms"].as_u64().expect("opened");
    assert!(
        opened_at <= opened_by_ms,
        "{opened_at} > {opened_by_ms}: {read}"
    );
    probe.abort();
}

#[tokio::test]
async fn the_limiters_api_gives_each_limiters_name_configured_rate_and_rate_now() {
    let dir = folder("api-limiters");
    let (mailer, members) = mailer(dir.path()).await;
    let read = json(&admin::router(Arc::clone(&mailer)), "/api/limiters").await;
    let limiters: Vec<_> = mailer.limiters().collect();
    assert_eq!(limiters.len(), 1, "only the first member has a rate");
    assert_eq!(limiters[0].name(), members.first);
    assert_eq!(read[0]["name"], limiters[0].name());
    assert_eq!(read[0]["configured_per_second"], 20.0);
    assert_eq!(read[0]["per_second"], limiters[0].per_second());
    assert_eq!(read[0]["adaptive"], true);
    assert_eq!(read[0]["backed_off_percent"], 0.0);
}

#[tokio::test]
async fn an_adaptive_limiter_a_provider_throttled_shows_how_far_it_backed_off() {
    // A provider that throttles every MAIL FROM as Gmail does: the adaptive limiter halves
    // its rate. (No real server here answers a rate limit on demand.)
    let server = RawSmtp::start(b"220 raw.test\r\n".to_vec(), |command| match command {
        "MAIL" => Answer::Say(b"450 4.7.28 rate limited, try again later\r\n".to_vec()),
        other => Answer::healthy(other),
    })
    .await;
    let dsn = format!(
        "smtp://127.0.0.1:{}?name=throttling&rate=20/s&rate.adaptive=true&timeout=500ms",
        server.port()
    );
    let mailer = Arc::new(Mailer::from_dsn(&dsn).unwrap().build().await.unwrap());
    let error = mailer
        .send(&support::message_to("user@example.org"))
        .await
        .unwrap_err();
    assert_eq!(error.category(), Category::RateLimited, "{error}");
    let router = admin::router(Arc::clone(&mailer));
    let read = json(&router, "/api/limiters").await;
    assert_eq!(read[0]["name"], "throttling");
    assert_eq!(read[0]["configured_per_second"], 20.0);
    let now = read[0]["per_second"].as_f64().unwrap();
    assert!((now - 10.0).abs() < 0.01, "halved: {read}");
    let backed_off = read[0]["backed_off_percent"].as_f64().unwrap();
    assert!((backed_off - 50.0).abs() < 0.1, "{read}");
    let page = text(call(&router, get("/")).await).await;
    assert!(page.contains("<td>50 %</td>"), "{page}");
}

#[tokio::test]
async fn the_outbox_and_dead_letter_apis_agree_with_the_outbox() {
    let dir = folder("api-outbox");
    dead_letter(dir.path(), "a refused welcome").await;
    let (mailer, _) = mailer(dir.path()).await;
    let router = admin::router(Arc::clone(&mailer));
    let outbox = mailer.outbox().unwrap();
    let stats = outbox.stats().await.unwrap();
    let read = json(&router, "/api/outbox").await;
    for (field, count) in [
        ("queued", stats.queued),
        ("due", stats.due),
        ("leased", stats.leased),
        ("dead", stats.dead),
    ] {
        assert_eq!(read[field], count, "{field}: {read}");
    }
    assert_eq!(read["last_hour"].as_array().unwrap().len(), 1, "{read}");
    let dead = json(&router, "/api/dead").await;
    let letters = outbox.dead_letters(10).await.unwrap();
    assert_eq!(dead.as_array().unwrap().len(), letters.len());
    assert_eq!(dead[0]["id"], i64::from(letters[0].id));
    assert_eq!(dead[0]["recipients"][0], "user@example.org");
    assert_eq!(dead[0]["subject"], "a refused welcome");
    assert_eq!(dead[0]["attempts"], 1);
    assert_eq!(dead[0]["code"], "test.rejected");
    assert_eq!(dead[0]["message"], "scripted failure");
}

#[tokio::test]
async fn a_post_without_the_token_is_forbidden_and_isolates_nothing() {
    let dir = folder("no-token");
    let (mailer, members) = mailer(dir.path()).await;
    let router = admin::router(Arc::clone(&mailer));
    let path = format!("/breakers/{}/isolate", encoded(&members.first));
    for form in ["", "token=", "token=not-the-token"] {
        let response = call(&router, post(&path, form, &[])).await;
        assert_eq!(response.status(), StatusCode::FORBIDDEN, "{form:?}");
        assert_eq!(
            text(response).await,
            "forbidden: the form's token is missing or wrong\n"
        );
    }
    let breaker = mailer.breaker(&members.first).unwrap();
    assert!(!breaker.snapshot().await.is_isolated());
    assert_eq!(breaker.state(), State::Closed);
}

#[tokio::test]
async fn a_post_from_another_sites_origin_is_forbidden_and_isolates_nothing_even_with_the_token() {
    let dir = folder("other-origin");
    let (mailer, members) = mailer(dir.path()).await;
    let admin = Admin::new(Arc::clone(&mailer));
    let router = admin.router();
    let path = format!("/breakers/{}/isolate", encoded(&members.first));
    let form = format!("token={}", admin.token());
    for headers in [
        [("origin", "https://attacker.example")],
        [("origin", "null")],
        [("sec-fetch-site", "cross-site")],
    ] {
        let response = call(&router, post(&path, &form, &headers)).await;
        assert_eq!(response.status(), StatusCode::FORBIDDEN, "{headers:?}");
        assert_eq!(
            text(response).await,
            "forbidden: the request came from another site\n"
        );
    }
    assert!(
        !mailer
            .breaker(&members.first)
            .unwrap()
            .snapshot()
            .await
            .is_isolated()
    );
}

#[tokio::test]
async fn a_post_with_the_token_isolates_the_member_its_percent_encoded_path_names() {
    let dir = folder("isolate");
    let (mailer, members) = mailer(dir.path()).await;
    let admin = Admin::new(Arc::clone(&mailer));
    let router = admin.router();
    let path = format!("/breakers/{}/isolate", encoded(&members.first));
    assert!(path.contains("smtp%3A%2F%2F127%2E0%2E0%2E1%3A"), "{path}");
    let form = format!("token={}", admin.token());
    let same_site = [("origin", "http://127.0.0.1:8025")];
    let response = call(&router, post(&path, &form, &same_site)).await;
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    // The mailer's breakers are in its memory: the page is told the change reached it alone.
    assert_eq!(
        response.headers()[header::LOCATION],
        "/?notice=isolated-here"
    );
    assert!(
        mailer
            .breaker(&members.first)
            .unwrap()
            .snapshot()
            .await
            .is_isolated()
    );
    assert_eq!(
        mailer.breaker(members.second).unwrap().state(),
        State::Closed
    );

    let reset = format!("/breakers/{}/reset", encoded(&members.first));
    let response = call(&router, post(&reset, &form, &[])).await;
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    let breaker = mailer.breaker(&members.first).unwrap();
    assert!(!breaker.snapshot().await.is_isolated());
    assert_eq!(breaker.state(), State::Closed);
}

#[tokio::test]
async fn an_isolate_or_reset_over_an_in_memory_store_is_said_to_reach_this_process_only() {
    let dir = folder("this-process");
    let (mailer, members) = mailer(dir.path()).await;
    let admin = Admin::new(Arc::clone(&mailer));
    let router = admin.router();
    let form = format!("token={}", admin.token());
    for action in ["isolate", "reset"] {
        let path = format!("/breakers/{}/{action}", encoded(&members.first));
        let response = call(&router, post(&path, &form, &[])).await;
        assert_eq!(response.status(), StatusCode::SEE_OTHER, "{action}");
        let back = response.headers()[header::LOCATION]
            .to_str()
            .unwrap()
            .to_owned();
        assert!(
            back.starts_with("/?"),
            "{action}: a notice after the redirect: {back}"
        );
        let page = text(call(&router, get(&back)).await).await;
        assert!(
            page.contains("in this process only"),
            "{action}: the page says the change reached this process alone: {page}"
        );
    }
    // The page read on its own says nothing of a change.
    let page = text(call(&router, get("/")).await).await;
    assert!(!page.contains("in this process only"));
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn an_isolate_or_reset_the_redis_store_cannot_take_is_503_with_why() {
    // Nothing listens on the Redis port: the store decides locally from the start.
    let dsn = format!(
        "smtp://127.0.0.1:{}?name=relay&redis=redis://127.0.0.1:{}/",
        free_port(),
        free_port()
    );
    let mailer = Arc::new(
        Mailer::from_dsn(&dsn)
            .unwrap()
            .build_without_worker()
            .await
            .unwrap(),
    );
    let admin = Admin::new(Arc::clone(&mailer));
    let router = admin.router();
    let form = format!("token={}", admin.token());
    for action in ["isolate", "reset"] {
        let response = call(
            &router,
            post(&format!("/breakers/relay/{action}"), &form, &[]),
        )
        .await;
        assert_eq!(
            response.status(),
            StatusCode::SERVICE_UNAVAILABLE,
            "{action}"
        );
        let body = text(response).await;
        assert!(
            body.contains("Redis") && body.contains("this process only"),
            "{action}: says why and what it did: {body}"
        );
    }
}

#[tokio::test]
async fn an_action_on_a_member_that_does_not_exist_is_not_found() {
    let dir = folder("no-member");
    let (mailer, _) = mailer(dir.path()).await;
    let admin = Admin::new(mailer);
    let form = format!("token={}", admin.token());
    let response = call(
        &admin.router(),
        post("/breakers/nobody/isolate", &form, &[]),
    )
    .await;
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn requeue_and_purge_with_the_token_act_on_the_dead_letter() {
    let dir = folder("requeue-purge");
    dead_letter(dir.path(), "first").await;
    dead_letter(dir.path(), "second").await;
    let (mailer, _) = mailer(dir.path()).await;
    let admin = Admin::new(Arc::clone(&mailer));
    let router = admin.router();
    let outbox = mailer.outbox().unwrap();
    let letters = outbox.dead_letters(10).await.unwrap();
    let form = format!("token={}", admin.token());

    let requeue = format!("/outbox/dead/{}/requeue", letters[0].id);
    assert_eq!(
        call(&router, post(&requeue, "", &[])).await.status(),
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        outbox.stats().await.unwrap().dead,
        2,
        "nothing changed without the token"
    );
    let response = call(&router, post(&requeue, &form, &[])).await;
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    let stats = outbox.stats().await.unwrap();
    assert_eq!((stats.queued, stats.dead), (1, 1));

    let purge = format!("/outbox/dead/{}/purge", letters[1].id);
    let response = call(&router, post(&purge, &form, &[])).await;
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    let stats = outbox.stats().await.unwrap();
    assert_eq!((stats.queued, stats.dead), (1, 0));

    let queued = format!("/outbox/dead/{}/purge", letters[0].id);
    let response = call(&router, post(&queued, &form, &[])).await;
    assert_eq!(
        response.status(),
        StatusCode::NOT_FOUND,
        "queued mail is not a dead letter"
    );
    assert_eq!(outbox.stats().await.unwrap().queued, 1);
}

/// Puts a message to `to` among the dead letters of the outbox in `dir` as the suppression
/// list leaves it: `to` is on the list, so no provider was asked.
#[cfg(feature = "webhooks")]
async fn suppressed_dead_letter(dir: &Path, to: &str) {
    use mail_breaker::suppression::{Reason, SuppressionList, SuppressionTransport};
    let outbox = Outbox::sqlite(dir.join("outbox.db")).await.unwrap();
    let list = SuppressionList::in_outbox(&outbox).unwrap();
    list.add(to, Reason::Complained).await.unwrap();
    let message = Message::builder()
        .from("app@example.com".parse().unwrap())
        .to(to.parse().unwrap())
        .subject("to a complainer")
        .body(String::from("hello"))
        .unwrap();
    outbox.enqueue(&message).await.unwrap();
    let provider = Scripted::new("provider");
    outbox
        .worker(SuppressionTransport::new(provider, list))
        .drain()
        .await
        .unwrap();
}

#[cfg(feature = "webhooks")]
#[tokio::test]
async fn the_page_offers_no_requeue_for_a_suppressed_recipients_dead_letter_and_refuses_one() {
    let dir = folder("requeue-suppressed");
    dead_letter(dir.path(), "refused").await;
    suppressed_dead_letter(dir.path(), "angry@example.org").await;
    let (mailer, _) = mailer(dir.path()).await;
    let admin = Admin::new(Arc::clone(&mailer));
    let router = admin.router();
    let outbox = mailer.outbox().unwrap();
    let letters = outbox.dead_letters(10).await.unwrap();
    let (suppressed, refused): (Vec<_>, Vec<_>) =
        letters.iter().partition(|letter| letter.is_suppressed());
    let (suppressed, refused) = (suppressed[0].id, refused[0].id);

    let page = text(call(&router, get("/")).await).await;
    assert!(
        page.contains(&format!("outbox/dead/{refused}/requeue")),
        "a refused letter can be requeued"
    );
    assert!(
        !page.contains(&format!("outbox/dead/{suppressed}/requeue")),
        "a suppressed recipient's letter offers no requeue"
    );
    assert!(page.contains(&format!("outbox/dead/{suppressed}/purge")));

    let form = format!("token={}", admin.token());
    let requeue = format!("/outbox/dead/{suppressed}/requeue");
    let response = call(&router, post(&requeue, &form, &[])).await;
    assert_eq!(response.status(), StatusCode::CONFLICT);
    assert_eq!(outbox.stats().await.unwrap().dead, 2, "it stays dead");
}

/// A mailer (no worker) whose outbox is on `postgres`, for the page's PostgreSQL tests.
#[cfg(feature = "postgres")]
async fn postgres_mailer(postgres: &support::postgres::PostgresServer) -> Arc<Mailer> {
    let dsn = format!(
        "smtp://127.0.0.1:{}?outbox={}&outbox.poll=1h",
        free_port(),
        postgres.url()
    );
    Arc::new(
        Mailer::from_dsn(&dsn)
            .unwrap()
            .build_without_worker()
            .await
            .unwrap(),
    )
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_action_or_a_read_the_outbox_cannot_answer_is_503_with_why() {
    let test = "admin_action_outbox_down";
    let Some(mut postgres) = support::postgres::PostgresServer::start(test) else {
        return;
    };
    let mailer = postgres_mailer(&postgres).await;
    let admin = Admin::new(mailer);
    let router = admin.router();
    let form = format!("token={}", admin.token());
    postgres.stop();
    for action in ["requeue", "purge"] {
        let response = call(
            &router,
            post(&format!("/outbox/dead/1/{action}"), &form, &[]),
        )
        .await;
        assert_eq!(
            response.status(),
            StatusCode::SERVICE_UNAVAILABLE,
            "{action}"
        );
        let body = text(response).await;
        assert!(
            body.starts_with("the outbox did not answer: "),
            "{action}: {body}"
        );
    }
    for path in ["/api/outbox", "/api/dead"] {
        let response = call(&router, get(path)).await;
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE, "{path}");
        let body: Value = serde_json::from_str(&text(response).await).unwrap();
        assert!(body["error"]["code"].is_string(), "{path}: {body}");
    }
}

#[tokio::test]
async fn a_read_only_page_answers_every_post_405_and_shows_no_form() {
    let dir = folder("read-only");
    dead_letter(dir.path(), "kept").await;
    let (mailer, members) = mailer(dir.path()).await;
    let admin = Admin::new(Arc::clone(&mailer)).read_only();
    let router = admin.router();
    let form = format!("token={}", admin.token());
    let member = encoded(&members.first);
    for path in [
        format!("/breakers/{member}/isolate"),
        format!("/breakers/{member}/reset"),
        "/outbox/dead/1/requeue".to_owned(),
        "/outbox/dead/1/purge".to_owned(),
        "/".to_owned(),
        "/api/breakers".to_owned(),
    ] {
        let response = call(&router, post(&path, &form, &[])).await;
        assert_eq!(response.status(), StatusCode::METHOD_NOT_ALLOWED, "{path}");
    }
    assert!(
        !mailer
            .breaker(&members.first)
            .unwrap()
            .snapshot()
            .await
            .is_isolated()
    );
    assert_eq!(mailer.outbox().unwrap().stats().await.unwrap().dead, 1);
    let page = text(call(&router, get("/")).await).await;
    assert!(page.contains("kept"), "the dead letter is shown: {page}");
    assert!(!page.contains("<form"), "{page}");
    assert!(!page.contains(admin.token()), "{page}");
}

#[tokio::test]
async fn a_dead_letters_subject_holding_a_script_is_shown_escaped() {
    let dir = folder("escaped");
    dead_letter(dir.path(), "<script>alert(1)</script>").await;
    let (mailer, _) = mailer(dir.path()).await;
    let page = text(call(&admin::router(mailer), get("/")).await).await;
    assert!(!page.contains("<script>"), "{page}");
    assert!(
        page.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
        "{page}"
    );
}

#[tokio::test]
async fn a_dead_letters_subject_after_long_headers_is_still_shown() {
    let dir = folder("long-headers");
    let long = format!("<{}@example.org>", "x".repeat(4_000));
    let message = Message::builder()
        .from("app@example.com".parse().unwrap())
        .to("user@example.org".parse().unwrap())
        .in_reply_to(long.clone())
        .references(long)
        .subject("after eight kilobytes of headers")
        .body(String::from("hello"))
        .unwrap();
    let raw = message.formatted();
    let subject_at = raw
        .windows(8)
        .position(|window| window == b"Subject:")
        .unwrap();
    assert!(
        subject_at > 8_000,
        "the subject comes after the long headers"
    );
    dead_message(dir.path(), &message).await;
    let (mailer, _) = mailer(dir.path()).await;
    let dead = json(&admin::router(mailer), "/api/dead").await;
    assert_eq!(
        dead[0]["subject"], "after eight kilobytes of headers",
        "{dead}"
    );
}

#[tokio::test]
async fn a_page_allowed_some_hosts_refuses_a_request_to_any_other_and_isolates_nothing() {
    let dir = folder("hosts");
    let (mailer, members) = mailer(dir.path()).await;
    let admin = Admin::new(Arc::clone(&mailer)).allow_hosts(["ops.example:443"]);
    let router = admin.router();
    let to = |host: &str, path: &str| {
        Request::get(path)
            .header(header::HOST, host)
            .body(Body::empty())
            .unwrap()
    };
    assert_eq!(
        call(&router, to("ops.example:443", "/")).await.status(),
        StatusCode::OK
    );
    for path in ["/", "/api/breakers"] {
        let response = call(&router, to("rebound.example:443", path)).await;
        assert_eq!(response.status(), StatusCode::FORBIDDEN, "{path}");
    }
    let path = format!("/breakers/{}/isolate", encoded(&members.first));
    let form = format!("token={}", admin.token());
    let response = call(&router, post(&path, &form, &[])).await; // Host: 127.0.0.1:8025
    assert_eq!(response.status(), StatusCode::FORBIDDEN);
    assert!(
        !mailer
            .breaker(&members.first)
            .unwrap()
            .snapshot()
            .await
            .is_isolated()
    );
}

/// The status line's code of a GET of `/` from the server at `port`, sent with `host`.
async fn status_for_host(port: u16, host: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let request = format!("GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.unwrap();
    let answer = String::from_utf8_lossy(&answer);
    answer.split(' ').nth(1).unwrap_or_default().to_owned()
}

#[tokio::test]
async fn served_on_loopback_the_page_answers_only_to_its_loopback_names() {
    let dir = folder("loopback");
    let (mailer, _) = mailer(dir.path()).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let admin = Admin::new(mailer);
    let server = tokio::spawn(async move { admin.serve(listener).await });
    assert_eq!(
        status_for_host(port, &format!("127.0.0.1:{port}")).await,
        "200"
    );
    assert_eq!(
        status_for_host(port, &format!("localhost:{port}")).await,
        "200"
    );
    assert_eq!(
        status_for_host(port, &format!("rebound.example:{port}")).await,
        "403"
    );
    server.abort();
}

#[tokio::test]
async fn served_on_loopback_with_hosts_allowed_the_page_answers_to_those_hosts_alone() {
    let dir = folder("loopback-allowed");
    let (mailer, _) = mailer(dir.path()).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let allowed = format!("mail-ops.internal:{port}");
    let admin = Admin::new(mailer).allow_hosts([allowed.clone()]);
    let server = tokio::spawn(async move { admin.serve(listener).await });
    assert_eq!(status_for_host(port, &allowed).await, "200");
    assert_eq!(
        status_for_host(port, &format!("127.0.0.1:{port}")).await,
        "403"
    );
    server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chart_reads_the_outbox_on_its_own_between_requests() {
    let dir = folder("sampling");
    let (mailer, _) = mailer(dir.path()).await;
    let admin = Admin::new(mailer)
        .chart_every(Duration::from_millis(100))
        .unwrap();
    let router = admin.router();
    tokio::time::sleep(Duration::from_millis(400)).await;
    // This request keeps one reading; the others were the router's own.
    let outbox = json(&router, "/api/outbox").await;
    let readings = outbox["last_hour"].as_array().expect("last_hour").len();
    assert!(readings >= 2, "{outbox}");
}

#[tokio::test]
async fn a_page_is_read_only_once_made_so_and_not_before() {
    let dir = folder("is-read-only");
    let (mailer, _) = mailer(dir.path()).await;
    let admin = Admin::new(mailer);
    assert!(!admin.is_read_only());
    assert!(admin.read_only().is_read_only());
}

#[tokio::test]
async fn the_page_shows_each_member_its_state_and_forms_with_the_token() {
    let dir = folder("page");
    let (mailer, members) = mailer(dir.path()).await;
    mailer.breaker(members.second).unwrap().isolate().await;
    let admin = Admin::new(Arc::clone(&mailer));
    let page = text(call(&admin.router(), get("/")).await).await;
    assert!(
        page.contains(&format!(r#"data-member="{}""#, members.first)),
        "{page}"
    );
    assert!(page.contains(r#"data-state="closed">closed<"#), "{page}");
    assert!(
        page.contains(r#"data-state="isolated">isolated<"#),
        "{page}"
    );
    assert!(page.contains("isolated by hand"), "{page}");
    // When: a moment ago, as people read it.
    assert!(page.contains(" s ago</span>"), "{page}");
    let isolate = format!(r#"action="/breakers/{}/isolate""#, encoded(&members.first));
    assert!(page.contains(&isolate), "{page}");
    assert!(
        page.contains(&format!(r#"name="token" value="{}""#, admin.token())),
        "{page}"
    );
}

#[tokio::test]
async fn a_router_nested_under_a_path_posts_its_forms_and_sends_back_under_that_path() {
    let dir = folder("nested");
    let (mailer, members) = mailer(dir.path()).await;
    let admin = Admin::new(Arc::clone(&mailer));
    let app = Router::new().nest("/ops/mail", admin.router());
    let page = text(call(&app, get("/ops/mail")).await).await;
    let isolate = format!("/ops/mail/breakers/{}/isolate", encoded(&members.first));
    assert!(page.contains(&format!(r#"action="{isolate}""#)), "{page}");
    let form = format!("token={}", admin.token());
    let response = call(&app, post(&isolate, &form, &[])).await;
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    assert_eq!(
        response.headers()[header::LOCATION],
        "/ops/mail?notice=isolated-here"
    );
    assert!(
        mailer
            .breaker(&members.first)
            .unwrap()
            .snapshot()
            .await
            .is_isolated()
    );
}

#[tokio::test]
async fn a_token_given_must_be_long_and_plain_and_is_the_one_the_forms_carry() {
    let dir = folder("given-token");
    let (mailer, _) = mailer(dir.path()).await;
    for bad in ["short", "sixteen-chars-but-\"quoted\"", ""] {
        let error = Admin::new(Arc::clone(&mailer)).with_token(bad).unwrap_err();
        assert_eq!(error.setting(), "token", "{bad:?}");
    }
    let admin = Admin::new(mailer)
        .with_token("a-token-kept-in-a-vault")
        .unwrap();
    assert_eq!(admin.token(), "a-token-kept-in-a-vault");
    let page = text(call(&admin.router(), get("/")).await).await;
    assert!(
        page.contains(r#"value="a-token-kept-in-a-vault""#),
        "{page}"
    );
}

#[tokio::test]
async fn a_token_of_exactly_sixteen_characters_is_taken_and_one_of_fifteen_refused() {
    let dir = folder("token-length");
    let (mailer, _) = mailer(dir.path()).await;
    let sixteen = "abcdefghij-_0123";
    assert_eq!(sixteen.len(), 16);
    let admin = Admin::new(Arc::clone(&mailer))
        .with_token(sixteen)
        .expect("sixteen characters are enough");
    assert_eq!(admin.token(), sixteen);
    let error = Admin::new(mailer).with_token(&sixteen[1..]).unwrap_err();
    assert_eq!(error.setting(), "token");
}

#[tokio::test]
async fn the_chart_is_read_every_100_ms_or_less_often_and_never_more_often() {
    let dir = folder("chart-every");
    let (mailer, _) = mailer(dir.path()).await;
    for every in [Duration::from_millis(100), Duration::from_secs(60)] {
        assert!(
            Admin::new(Arc::clone(&mailer)).chart_every(every).is_ok(),
            "{every:?}"
        );
    }
    let error = Admin::new(mailer)
        .chart_every(Duration::from_millis(99))
        .unwrap_err();
    assert_eq!(error.setting(), "chart_every");
}

#[tokio::test]
async fn an_admins_debug_shows_its_mailer_and_whether_it_is_read_only_never_its_token() {
    let dir = folder("debug");
    let (mailer, _) = mailer(dir.path()).await;
    let token = "a-secret-token-never-printed";
    let admin = Admin::new(mailer).with_token(token).unwrap().read_only();
    let shown = format!("{admin:?}");
    assert!(shown.starts_with("Admin {"), "{shown}");
    assert!(shown.contains("read_only: true"), "{shown}");
    assert!(shown.contains("mailer: "), "{shown}");
    assert!(!shown.contains(token), "{shown}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_outbox_chart_counts_what_this_process_s_workers_sent_in_each_reading() {
    let dir = folder("api-outbox-sent");
    let server = embedded::EmbeddedSmtp::start();
    let dsn = format!(
        "smtp://127.0.0.1:{}?timeout=2s&outbox=sqlite://{}&outbox.poll=50ms",
        server.port(),
        dir.path().join("outbox.db").display()
    );
    let mailer = Arc::new(Mailer::from_dsn(&dsn).unwrap().build().await.unwrap());
    let router = Admin::new(Arc::clone(&mailer))
        .chart_every(std::time::Duration::from_millis(100))
        .unwrap()
        .router();
    let before = json(&router, "/api/outbox").await;
    assert_eq!(before["last_hour"][0]["sent"], 0, "{before}");
    // Queued, then sent by the mailer's own worker in this process.
    let outbox = mailer.outbox().unwrap();
    outbox
        .enqueue_many(&support::numbered_messages(3))
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while outbox.sent_here() < 3 && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(outbox.sent_here(), 3);
    assert_eq!(server.accepted(), 3);
    tokio::time::sleep(std::time::Duration::from_millis(120)).await;
    let after = json(&router, "/api/outbox").await;
    let sent: u64 = after["last_hour"]
        .as_array()
        .unwrap()
        .iter()
        .map(|point| point["sent"].as_u64().unwrap())
        .sum();
    assert_eq!(sent, 3, "{after}");
    let page = text(call(&router, get("/")).await).await;
    assert!(page.contains("polyline class=\"sent\""), "{page}");
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letters_subject_is_read_from_postgresql_too() {
    let Some(postgres) = support::postgres::PostgresServer::start("admin_dead_subject_pg") else {
        return;
    };
    let outbox = Outbox::postgres(&postgres.url()).await.unwrap();
    outbox.enqueue(&message("a refused welcome")).await.unwrap();
    let refusing = Scripted::answering("refusing", Reply::fail(Category::Rejected));
    outbox.worker(refusing).drain().await.unwrap();
    let mailer = postgres_mailer(&postgres).await;
    let router = admin::router(Arc::clone(&mailer));
    let dead = json(&router, "/api/dead").await;
    assert_eq!(dead[0]["subject"], "a refused welcome", "{dead}");
}

// ---------------------------------------------------------------------------------------
// Who may use the page, and from where (behind a proxy, over HTTP/2)

/// An isolate of `members.first` POSTed with the token and `headers` only (no `Host` unless
/// given), to `uri`.
fn isolate_request(uri: &str, token: &str, headers: &[(&str, &str)]) -> Request<Body> {
    let mut request =
        Request::post(uri).header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request.body(Body::from(format!("token={token}"))).unwrap()
}

async fn is_isolated(mailer: &Mailer, member: &str) -> bool {
    mailer
        .breaker(member)
        .unwrap()
        .snapshot()
        .await
        .is_isolated()
}

#[tokio::test]
async fn the_origin_check_uses_the_requests_authority_which_http2_sends_without_a_host() {
    let dir = folder("http2-authority");
    let (mailer, members) = mailer(dir.path()).await;
    let admin = Admin::new(Arc::clone(&mailer));
    let uri = format!(
        "http://ops.example:8443/breakers/{}/isolate",
        encoded(&members.first)
    );
    let mut request = isolate_request(
        &uri,
        admin.token(),
        &[("origin", "http://ops.example:8443")],
    );
    *request.version_mut() = axum::http::Version::HTTP_2;
    let response = call(&admin.router(), request).await;
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    assert!(is_isolated(&mailer, &members.first).await);

    let mut other = isolate_request(&uri, admin.token(), &[("origin", "http://evil.example")]);
    *other.version_mut() = axum::http::Version::HTTP_2;
    let response = call(&admin.router(), other).await;
    assert_eq!(response.status(), StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn behind_a_proxy_that_sends_its_upstreams_name_a_form_from_the_public_origin_acts() {
    let dir = folder("public-origin");
    let (mailer, members) = mailer(dir.path()).await;
    let admin = Admin::new(Arc::clone(&mailer))
        .public_origin("https://ops.example.com/")
        .unwrap();
    let path = format!("/breakers/{}/isolate", encoded(&members.first));
    // nginx's default: `Host` is its upstream's name, `Origin` the browser's.
    let from = |origin: &'static str| {
        isolate_request(
            &path,
            admin.token(),
            &[("host", "127.0.0.1:8025"), ("origin", origin)],
        )
    };
    let response = call(&admin.router(), from("https://evil.example")).await;
    assert_eq!(response.status(), StatusCode::FORBIDDEN);
    let response = call(&admin.router(), from("http://ops.example.com")).await;
    assert_eq!(response.status(), StatusCode::FORBIDDEN, "another scheme");
    assert!(!is_isolated(&mailer, &members.first).await);
    let response = call(&admin.router(), from("https://ops.example.com")).await;
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    assert!(is_isolated(&mailer, &members.first).await);
}

#[tokio::test]
async fn a_public_origin_is_an_http_or_https_origin_and_nothing_more() {
    let dir = folder("public-origin-form");
    let (mailer, _) = mailer(dir.path()).await;
    for bad in [
        "ops.example.com",
        "ftp://ops.example.com",
        "https://ops.example.com/mail",
        "https://ops.example.com/?a=b",
        "https://user@ops.example.com",
        "",
    ] {
        let error = Admin::new(Arc::clone(&mailer))
            .public_origin(bad)
            .unwrap_err();
        assert_eq!(error.setting(), "public_origin", "{bad:?}");
    }
    for good in ["https://ops.example.com", "http://10.0.0.5:8025/"] {
        assert!(
            Admin::new(Arc::clone(&mailer)).public_origin(good).is_ok(),
            "{good:?}"
        );
    }
}

/// `Authorization: Basic` for `user` and `password`.
fn basic(user: &str, password: &str) -> String {
    use base64::Engine as _;
    let encoded = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    format!("Basic {encoded}")
}

#[tokio::test]
async fn with_a_credential_every_request_without_it_is_401_and_changes_nothing() {
    let dir = folder("credential-bearer");
    let (mailer, members) = mailer(dir.path()).await;
    let token = "a-bearer-token-for-scripts";
    let admin = Admin::new(Arc::clone(&mailer)).credential(Credential::bearer(token).unwrap());
    let router = admin.router();
    for path in ["/", "/api/breakers", "/api/dead"] {
        let response = call(&router, get(path)).await;
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "{path}");
        assert!(
            response.headers()[header::WWW_AUTHENTICATE]
                .to_str()
                .unwrap()
                .starts_with("Bearer"),
            "{path}"
        );
    }
    let path = format!("/breakers/{}/isolate", encoded(&members.first));
    let wrong = format!("Bearer {token}x");
    for headers in [&[][..], &[("authorization", wrong.as_str())][..]] {
        let response = call(
            &router,
            post(&path, &format!("token={}", admin.token()), headers),
        )
        .await;
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "{headers:?}");
    }
    assert!(!is_isolated(&mailer, &members.first).await);

    let right = format!("Bearer {token}");
    let page = Request::get("/")
        .header(header::AUTHORIZATION, &right)
        .body(Body::empty())
        .unwrap();
    assert_eq!(call(&router, page).await.status(), StatusCode::OK);
    let form = format!("token={}", admin.token());
    let response = call(&router, post(&path, &form, &[("authorization", &right)])).await;
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    assert!(is_isolated(&mailer, &members.first).await);
}

#[tokio::test]
async fn a_user_and_password_is_asked_for_as_a_browser_asks_and_both_must_match() {
    let dir = folder("credential-user");
    let (mailer, _) = mailer(dir.path()).await;
    let router = Admin::new(mailer)
        .credential(Credential::user("ops", "a password of some length").unwrap())
        .router();
    let response = call(&router, get("/")).await;
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(
        response.headers()[header::WWW_AUTHENTICATE],
        "Basic realm=\"mail-breaker\", charset=\"UTF-8\""
    );
    let with = |authorization: String| {
        Request::get("/")
            .header(header::AUTHORIZATION, authorization)
            .body(Body::empty())
            .unwrap()
    };
    for (user, password) in [
        ("ops", "a password of some lengtH"),
        ("opz", "a password of some length"),
        ("ops", ""),
    ] {
        let response = call(&router, with(basic(user, password))).await;
        assert_eq!(
            response.status(),
            StatusCode::UNAUTHORIZED,
            "{user}:{password}"
        );
    }
    let response = call(&router, with(basic("ops", "a password of some length"))).await;
    assert_eq!(response.status(), StatusCode::OK);
}

#[tokio::test]
async fn a_dead_letter_requeued_before_the_pages_purge_stays_queued() {
    let dir = folder("purge-requeued");
    dead_letter(dir.path(), "requeued meanwhile").await;
    let (mailer, _) = mailer(dir.path()).await;
    let admin = Admin::new(Arc::clone(&mailer));
    let outbox = mailer.outbox().unwrap();
    let id = outbox.dead_letters(10).await.unwrap()[0].id;
    // Another operator requeues it after this one's page showed it dead.
    assert!(outbox.requeue(id).await.unwrap());
    let purge = format!("/outbox/dead/{id}/purge");
    let form = format!("token={}", admin.token());
    let response = call(&admin.router(), post(&purge, &form, &[])).await;
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    assert_eq!(outbox.stats().await.unwrap().queued, 1);
}

/// Puts `count` messages (subjects `dead 0`, `dead 1`, ...) among the dead letters of the
/// outbox in `dir`; their ids, oldest first.
async fn dead_letters(dir: &Path, count: usize) -> Vec<i64> {
    let outbox = Outbox::sqlite(dir.join("outbox.db")).await.unwrap();
    let messages: Vec<Message> = (0..count).map(|i| message(&format!("dead {i}"))).collect();
    let ids = outbox.enqueue_many(&messages).await.unwrap();
    let refusing = Scripted::answering("refusing", Reply::fail(Category::Rejected));
    outbox
        .worker(refusing)
        .concurrency(8)
        .drain()
        .await
        .unwrap();
    assert_eq!(outbox.stats().await.unwrap().dead, count as u64);
    ids.into_iter().map(i64::from).collect()
}

/// The ids of the dead letters a page lists, in its order.
fn listed_ids(page: &str) -> Vec<i64> {
    page.split("data-id=\"")
        .skip(1)
        .map(|rest| rest[..rest.find('"').unwrap()].parse().unwrap())
        .collect()
}

/// Where a page's "older" link goes, if it has one.
fn older_link(page: &str) -> Option<String> {
    let link = &page[page.find("class=\"older\"")?..];
    let href = &link[link.find("href=\"")? + "href=\"".len()..];
    Some(href[..href.find('"')?].replace("&amp;", "&"))
}

#[tokio::test]
async fn the_page_lists_dead_letters_newest_first_and_links_each_page_to_the_older_one() {
    let dir = folder("dead-pages");
    let mut ids = dead_letters(dir.path(), 250).await;
    ids.reverse();
    let (mailer, _) = mailer(dir.path()).await;
    let router = Router::new().nest("/ops/mail", admin::router(mailer));

    let mut seen = Vec::new();
    let mut pages = Vec::new();
    let mut path = String::from("/ops/mail");
    loop {
        let response = call(&router, get(&path)).await;
        assert_eq!(response.status(), StatusCode::OK, "{path}");
        let page = text(response).await;
        let listed = listed_ids(&page);
        pages.push(listed.len());
        seen.extend(listed);
        match older_link(&page) {
            Some(older) => {
                assert_eq!(older, format!("/ops/mail?before={}", seen.last().unwrap()));
                path = older;
            }
            None => break,
        }
    }
    assert_eq!(pages, [100, 100, 50]);
    assert_eq!(seen, ids, "every dead letter once, newest first");
    let newest = text(call(&router, get(&path)).await).await;
    assert!(newest.contains("dead 0"), "the oldest on the last page");
    assert!(
        newest.contains("href=\"/ops/mail\""),
        "a link back to the newest"
    );
}

#[tokio::test]
async fn the_dead_letter_api_gives_the_page_before_and_limit_ask_for_and_refuses_a_wrong_one() {
    let dir = folder("dead-api-pages");
    let mut ids = dead_letters(dir.path(), 250).await;
    ids.reverse();
    let (mailer, _) = mailer(dir.path()).await;
    let router = admin::router(mailer);
    let id_list = |page: &Value| -> Vec<i64> {
        page.as_array()
            .unwrap()
            .iter()
            .map(|letter| letter["id"].as_i64().unwrap())
            .collect()
    };
    assert_eq!(id_list(&json(&router, "/api/dead").await), ids[..100]);
    assert_eq!(
        id_list(&json(&router, "/api/dead?before=&limit=").await),
        ids[..100]
    );
    let mut seen = Vec::new();
    let mut path = String::from("/api/dead?limit=120");
    loop {
        let page = id_list(&json(&router, &path).await);
        let Some(last) = page.last() else { break };
        path = format!("/api/dead?before={last}&limit=120");
        seen.extend(page);
    }
    assert_eq!(seen, ids);
    let page = json(&router, &format!("/api/dead?before={}&limit=2", ids[9])).await;
    assert_eq!(id_list(&page), ids[10..12]);
    assert_eq!(page[0]["subject"], "dead 239");
    for wrong in ["/api/dead?limit=1001", "/api/dead?before=x", "/?limit=-1"] {
        let response = call(&router, get(wrong)).await;
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{wrong}");
    }
}

#[tokio::test]
async fn a_dead_letter_on_an_older_page_is_requeued_and_purged_by_its_id() {
    let dir = folder("dead-older-actions");
    let ids = dead_letters(dir.path(), 250).await;
    let (mailer, _) = mailer(dir.path()).await;
    let admin = Admin::new(Arc::clone(&mailer));
    let router = admin.router();
    let first_page = listed_ids(&text(call(&router, get("/")).await).await);
    assert!(!first_page.contains(&ids[0]) && !first_page.contains(&ids[1]));
    let form = format!("token={}", admin.token());
    for action in [
        format!("/outbox/dead/{}/requeue", ids[0]),
        format!("/outbox/dead/{}/purge", ids[1]),
    ] {
        let response = call(&router, post(&action, &form, &[])).await;
        assert_eq!(response.status(), StatusCode::SEE_OTHER, "{action}");
    }
    let outbox = mailer.outbox().unwrap();
    let stats = outbox.stats().await.unwrap();
    assert_eq!((stats.queued, stats.dead), (1, 248));
    assert!(outbox.message(ids[1].into()).await.unwrap().is_none());
}

#[tokio::test]
async fn a_page_that_holds_the_oldest_dead_letter_links_to_no_older_page() {
    let dir = folder("dead-last-page");
    dead_letters(dir.path(), 100).await;
    let (mailer, _) = mailer(dir.path()).await;
    let page = text(call(&admin::router(mailer), get("/")).await).await;
    assert_eq!(listed_ids(&page).len(), 100);
    assert_eq!(older_link(&page), None, "a full page, and nothing older");
}

// ---------------------------------------------------------------------------------------
// Review of issue 63, second pass

#[tokio::test]
async fn after_an_action_the_redirect_of_a_nested_router_lands_on_its_page() {
    let dir = folder("nested-redirect");
    dead_letter(dir.path(), "first").await;
    let (mailer, members) = mailer(dir.path()).await;
    let admin = Admin::new(Arc::clone(&mailer));
    let app = Router::new().nest("/ops/mail", admin.router());
    let form = format!("token={}", admin.token());
    let dead = mailer.outbox().unwrap().dead_letters(10).await.unwrap();
    for action in [
        format!("/ops/mail/breakers/{}/isolate", encoded(&members.first)),
        format!("/ops/mail/outbox/dead/{}/requeue", dead[0].id),
    ] {
        let response = call(&app, post(&action, &form, &[])).await;
        assert_eq!(response.status(), StatusCode::SEE_OTHER, "{action}");
        let location = response.headers()[header::LOCATION].to_str().unwrap();
        let landed = call(&app, get(location)).await;
        assert_eq!(
            landed.status(),
            StatusCode::OK,
            "{action} sent to {location}"
        );
    }
}

/// A mailer of one member (`relay`) that is never sent to, with no outbox: it opens no file,
/// and so runs under a paused clock.
async fn plain_mailer() -> Arc<Mailer> {
    let mailer = Mailer::from_dsn("smtp://127.0.0.1:9?name=relay")
        .unwrap()
        .build_without_worker()
        .await
        .unwrap();
    Arc::new(mailer)
}

/// A GET of `/api/breakers` from `peer` with `authorization`.
fn from_peer(peer: &str, authorization: &str) -> Request<Body> {
    let mut request = Request::get("/api/breakers")
        .header(header::AUTHORIZATION, authorization)
        .body(Body::empty())
        .unwrap();
    let peer: std::net::SocketAddr = peer.parse().unwrap();
    request
        .extensions_mut()
        .insert(axum::extract::ConnectInfo(peer));
    request
}

#[tokio::test]
async fn after_ten_wrong_credentials_from_one_peer_its_further_attempts_are_429_for_a_while() {
    let mailer = plain_mailer().await;
    tokio::time::pause();
    let password = "the right password";
    let admin = Admin::new(mailer).credential(Credential::user("ops", password).unwrap());
    let router = admin.router();
    let (guesser, operator) = ("203.0.113.7:40000", "198.51.100.1:40000");
    for guess in 0..10 {
        let wrong = basic("ops", &format!("guess number {guess}"));
        let answer = call(&router, from_peer(guesser, &wrong)).await;
        assert_eq!(answer.status(), StatusCode::UNAUTHORIZED, "guess {guess}");
    }
    let right = basic("ops", password);
    for authorization in [basic("ops", "guess number 11"), right.clone()] {
        let answer = call(&router, from_peer(guesser, &authorization)).await;
        assert_eq!(answer.status(), StatusCode::TOO_MANY_REQUESTS);
        assert!(answer.headers().contains_key(header::RETRY_AFTER));
    }
    // Another port of the same address is the same peer.
    let same_host = call(&router, from_peer("203.0.113.7:40001", &right)).await;
    assert_eq!(same_host.status(), StatusCode::TOO_MANY_REQUESTS);
    // Another peer is not held back by the guesser.
    let other = call(&router, from_peer(operator, &right)).await;
    assert_eq!(other.status(), StatusCode::OK);
    tokio::time::advance(Duration::from_secs(3600)).await;
    let later = call(&router, from_peer(guesser, &right)).await;
    assert_eq!(later.status(), StatusCode::OK, "held back for ever");
}

/// A GET of `/api/breakers` from `peer` with `authorization`, which a proxy forwarded for
/// the client `forwarded_for` (its `X-Forwarded-For`).
fn forwarded(peer: &str, forwarded_for: &str, authorization: &str) -> Request<Body> {
    let mut request = from_peer(peer, authorization);
    request.headers_mut().insert(
        "x-forwarded-for",
        header::HeaderValue::from_str(forwarded_for).unwrap(),
    );
    request
}

/// A page asking for a user and password, behind the trusted proxy 10.0.0.5, under a paused
/// clock: its router, its password, and the proxy's address as a peer.
async fn behind_a_trusted_proxy() -> (Router, &'static str, &'static str) {
    let mailer = plain_mailer().await;
    tokio::time::pause();
    let password = "the right password";
    let admin = Admin::new(mailer)
        .credential(Credential::user("ops", password).unwrap())
        .trusted_proxies(["10.0.0.5".parse().unwrap()]);
    (admin.router(), password, "10.0.0.5:50000")
}

#[tokio::test]
async fn behind_a_trusted_proxy_one_clients_wrong_credentials_hold_back_that_client_alone() {
    let (router, password, proxy) = behind_a_trusted_proxy().await;
    for guess in 0..10 {
        let wrong = basic("ops", &format!("guess number {guess}"));
        // The guesser's own claim (left) is not believed: the proxy's entry (right) is.
        let answer = call(&router, forwarded(proxy, "192.0.2.99, 203.0.113.7", &wrong)).await;
        assert_eq!(answer.status(), StatusCode::UNAUTHORIZED, "guess {guess}");
    }
    let right = basic("ops", password);
    let guesser = call(&router, forwarded(proxy, "203.0.113.7", &right)).await;
    assert_eq!(guesser.status(), StatusCode::TOO_MANY_REQUESTS);
    let operator = call(&router, forwarded(proxy, "198.51.100.1", &right)).await;
    assert_eq!(
        operator.status(),
        StatusCode::OK,
        "another client of the same proxy is not held back"
    );
}

/// Hostile review of the trusted proxies: a proxy that passes on its clients' own
/// `X-Forwarded-For` (one that sets only `X-Real-IP`, or forwards TCP) lets a guesser name a
/// new address for each guess; a thousand wrong credentials through one proxy within a
/// minute hold back everything that comes through it, so guessing stays slow.
#[tokio::test]
async fn through_one_trusted_proxy_a_thousand_wrong_credentials_hold_back_all_it_forwards() {
    let (router, password, proxy) = behind_a_trusted_proxy().await;
    for guess in 0..1000u32 {
        let wrong = basic("ops", &format!("guess number {guess}"));
        let answer = call(&router, forwarded(proxy, &forged(guess), &wrong)).await;
        assert_eq!(answer.status(), StatusCode::UNAUTHORIZED, "guess {guess}");
    }
    let right = basic("ops", password);
    let next = call(&router, forwarded(proxy, "192.0.2.200", &right)).await;
    assert_eq!(next.status(), StatusCode::TOO_MANY_REQUESTS);
    tokio::time::advance(Duration::from_secs(3600)).await;
    let later = call(&router, forwarded(proxy, "192.0.2.200", &right)).await;
    assert_eq!(later.status(), StatusCode::OK, "held back for ever");
}

/// A forged client address of its own network (a /24) for each guess.
fn forged(guess: u32) -> String {
    format!("100.{}.{}.1", 64 + guess / 256, guess % 256)
}

/// Review 6: a hundred wrong credentials through a proxy held back everyone it forwards, so
/// ten guessers, each stopped after its own ten, kept the operator on call out. Guessers are
/// counted by their networks; only a thousand hold the proxy.
#[tokio::test]
async fn guessers_from_ten_networks_behind_a_trusted_proxy_do_not_keep_out_an_operator_with_the_right_credential()
 {
    let (router, password, proxy) = behind_a_trusted_proxy().await;
    for guess in 0..100u32 {
        let wrong = basic("ops", &format!("guess number {guess}"));
        let guesser = format!("198.51.{}.7", guess / 10);
        call(&router, forwarded(proxy, &guesser, &wrong)).await;
    }
    let right = basic("ops", password);
    let operator = call(&router, forwarded(proxy, "192.0.2.200", &right)).await;
    assert_eq!(operator.status(), StatusCode::OK);
}

/// Review 6: a client is an IPv4 address or an IPv6 /64, and one network holds many; a
/// hundred wrong credentials from one network (an IPv4 /24, an IPv6 /48) within a minute
/// hold back the whole network, and no other.
#[tokio::test]
async fn a_hundred_wrong_credentials_from_one_network_hold_back_its_clients_and_no_other() {
    let mailer = plain_mailer().await;
    tokio::time::pause();
    let password = "the right password";
    let router = Admin::new(mailer)
        .credential(Credential::user("ops", password).unwrap())
        .router();
    let right = basic("ops", password);
    for (client, neighbour, stranger) in [
        (
            (|n: u32| format!("203.0.113.{}:40000", n + 1)) as fn(u32) -> String,
            "203.0.113.200:40000",
            "198.51.100.1:40000",
        ),
        (
            |n: u32| format!("[2001:db8:0:{:x}::1]:40000", n + 1),
            "[2001:db8:0:ff::1]:40000",
            "[2001:db8:1::1]:40000",
        ),
    ] {
        for guess in 0..100u32 {
            let wrong = basic("ops", &format!("guess number {guess}"));
            call(&router, from_peer(&client(guess / 10), &wrong)).await;
        }
        let neighbour = call(&router, from_peer(neighbour, &right)).await;
        assert_eq!(neighbour.status(), StatusCode::TOO_MANY_REQUESTS);
        let stranger = call(&router, from_peer(stranger, &right)).await;
        assert_eq!(stranger.status(), StatusCode::OK);
    }
}

/// Second hostile review: guessers behind one proxy hold the proxy back, but not an
/// operator who logged in through it within the hour: the hold keeps out whom it does not
/// know, not the people already at work.
#[tokio::test]
async fn a_held_back_proxy_still_lets_through_a_client_it_admitted_within_the_hour() {
    let (router, password, proxy) = behind_a_trusted_proxy().await;
    let right = basic("ops", password);
    let operator = call(&router, forwarded(proxy, "198.51.100.1", &right)).await;
    assert_eq!(operator.status(), StatusCode::OK);
    for guess in 0..1000u32 {
        let wrong = basic("ops", &format!("guess number {guess}"));
        call(&router, forwarded(proxy, &forged(guess), &wrong)).await;
    }
    let newcomer = call(&router, forwarded(proxy, "192.0.2.200", &right)).await;
    assert_eq!(newcomer.status(), StatusCode::TOO_MANY_REQUESTS);
    let operator = call(&router, forwarded(proxy, "198.51.100.1", &right)).await;
    assert_eq!(
        operator.status(),
        StatusCode::OK,
        "the operator admitted before the guessing came"
    );
}

#[tokio::test]
async fn a_forwarded_for_header_from_a_peer_that_is_not_a_trusted_proxy_changes_nothing() {
    let (router, password, _proxy) = behind_a_trusted_proxy().await;
    let guesser = "203.0.113.7:40000";
    for guess in 0..10 {
        let wrong = basic("ops", &format!("guess number {guess}"));
        // A new address claimed each time: were it believed, no count would reach ten.
        let claim = format!("198.51.100.{guess}");
        let answer = call(&router, forwarded(guesser, &claim, &wrong)).await;
        assert_eq!(answer.status(), StatusCode::UNAUTHORIZED, "guess {guess}");
    }
    let right = basic("ops", password);
    let held = call(&router, forwarded(guesser, "198.51.100.200", &right)).await;
    assert_eq!(held.status(), StatusCode::TOO_MANY_REQUESTS);
}

/// Every field of every event logged while `during` runs, as its value reads.
async fn logged_fields(during: impl std::future::Future<Output = ()>) -> Vec<String> {
    use tracing_subscriber::layer::SubscriberExt as _;

    #[derive(Clone, Default)]
    struct Fields(Arc<std::sync::Mutex<Vec<String>>>);
    impl tracing::field::Visit for Fields {
        fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
            self.0
                .lock()
                .unwrap()
                .push(format!("{}={value:?}", field.name()));
        }
        fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
            self.0
                .lock()
                .unwrap()
                .push(format!("{}={value}", field.name()));
        }
    }
    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Fields {
        fn on_event(
            &self,
            event: &tracing::Event<'_>,
            _: tracing_subscriber::layer::Context<'_, S>,
        ) {
            event.record(&mut self.clone());
        }
    }
    let fields = Fields::default();
    let subscriber = tracing_subscriber::registry().with(fields.clone());
    let _guard = tracing::subscriber::set_default(subscriber);
    during.await;
    fields.0.lock().unwrap().clone()
}

#[tokio::test]
async fn a_path_or_header_written_to_the_log_holds_no_control_or_bidi_character() {
    let mailer = plain_mailer().await;
    let token = "a-bearer-token-for-scripts";
    let guarded = Admin::new(mailer)
        .credential(Credential::bearer(token).unwrap())
        .router();
    let hostile = "/\u{202e}gpj.exe/\u{9b}31m\u{2066}x";
    let logged = logged_fields(async {
        let wrong = Request::get(hostile)
            .header(header::AUTHORIZATION, "Bearer wrong-token-of-enough-length")
            .body(Body::empty())
            .unwrap();
        assert_eq!(
            call(&guarded, wrong).await.status(),
            StatusCode::UNAUTHORIZED
        );
    })
    .await;
    assert!(
        logged.iter().any(|field| field.contains("gpj.exe")),
        "the path is logged: {logged:?}"
    );
    for field in &logged {
        assert!(
            !field.chars().any(|c| c.is_control()
                || ('\u{202a}'..='\u{202e}').contains(&c)
                || ('\u{2066}'..='\u{2069}').contains(&c)),
            "{field:?}"
        );
    }
}

#[tokio::test]
async fn a_public_origin_with_a_password_is_refused_without_showing_it() {
    let mailer = plain_mailer().await;
    for url in [
        "https://ops:Hunter2-never-shown@ops.example.com",
        "https://ops:Hunter2-never-shown@ops example.com",
        "ftp://ops:Hunter2-never-shown@ops.example.com",
    ] {
        let error = Admin::new(Arc::clone(&mailer))
            .public_origin(url)
            .unwrap_err();
        assert_eq!(error.setting(), "public_origin");
        assert!(!error.to_string().contains("Hunter2"), "{error}");
    }
}

#[tokio::test]
async fn a_page_said_to_be_served_over_https_refuses_a_form_from_its_plain_http_origin() {
    let mailer = plain_mailer().await;
    let admin = Admin::new(Arc::clone(&mailer)).served_over_https(true);
    let router = admin.router();
    let form = format!("token={}", admin.token());
    let path = "/breakers/relay/isolate";
    let plain = call(
        &router,
        post(path, &form, &[("origin", "http://127.0.0.1:8025")]),
    )
    .await;
    assert_eq!(plain.status(), StatusCode::FORBIDDEN);
    assert!(!is_isolated(&mailer, "relay").await);
    let secure = call(
        &router,
        post(path, &form, &[("origin", "https://127.0.0.1:8025")]),
    )
    .await;
    assert_eq!(secure.status(), StatusCode::SEE_OTHER);
    // Said plain http: the https origin of the same host is another site.
    let admin = Admin::new(mailer).served_over_https(false);
    let form = format!("token={}", admin.token());
    let secure = call(
        &admin.router(),
        post(path, &form, &[("origin", "https://127.0.0.1:8025")]),
    )
    .await;
    assert_eq!(secure.status(), StatusCode::FORBIDDEN);
}
