//! `mail-breaker serve`: the operator page served by the command over the stack of a DSN,
//! driven as an operator would (an HTTP client, and Debian's Chromium).
#![cfg(feature = "cli")]

mod support;

#[path = "support/chromium.rs"]
#[allow(dead_code)] // this test clicks nothing
mod chromium;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::Duration;

use chromium::Chromium;
use serde_json::json;
use support::ready::ServerProcess;
use support::smtp_sink::SmtpSink;

const BIN: &str = env!("CARGO_BIN_EXE_mail-breaker");

/// `mail-breaker serve --listen 127.0.0.1:0` with `extra` arguments over `dsn`, owned by a
/// guard, and the page's URL from the first line it prints.
fn serve(dsn: &str, extra: &[&str]) -> (ServerProcess, String) {
    let mut child = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--dsn", dsn])
        .args(extra)
        .env_remove("MAILER_DSN")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("the mail-breaker binary runs");
    let stdout = child.stdout.take().expect("a piped stdout");
    // Owned before the wait: a failed read still stops it.
    let process = ServerProcess::new(child);
    let mut url = String::new();
    BufReader::new(stdout)
        .read_line(&mut url)
        .expect("serve prints the page's address");
    let url = url.trim().to_owned();
    assert!(url.starts_with("http://127.0.0.1:"), "{url:?}");
    (process, url)
}

/// A plain HTTP/1.0 request to the page; its status code and body.
fn request(url: &str, method: &str, path: &str) -> (u16, String) {
    let authority = url.trim_start_matches("http://").trim_end_matches('/');
    let mut stream = TcpStream::connect(authority).expect("the page listens");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("a read timeout");
    let request =
        format!("{method} {path} HTTP/1.0\r\nHost: {authority}\r\nContent-Length: 0\r\n\r\n");
    stream
        .write_all(request.as_bytes())
        .expect("sending the request");
    let mut answer = String::new();
    stream
        .read_to_string(&mut answer)
        .expect("reading the answer");
    let status = answer
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default();
    (status, body)
}

#[test]
fn serve_prints_its_address_and_serves_the_page_and_the_api_with_the_configured_member() {
    let Some(sink) = SmtpSink::start("cli_serve_page", &[]) else {
        return;
    };
    let dsn = format!("smtp://127.0.0.1:{}?name=relay", sink.port());
    let (_server, url) = serve(&dsn, &[]);
    let (status, page) = request(&url, "GET", "/");
    assert_eq!(status, 200);
    assert!(page.contains("relay"), "the page names the member: {page}");
    assert!(page.contains("<form"), "the page has its actions");
    let (status, breakers) = request(&url, "GET", "/api/breakers");
    assert_eq!(status, 200);
    let breakers: serde_json::Value = serde_json::from_str(&breakers).expect("JSON");
    assert!(breakers.to_string().contains("relay"), "{breakers}");
}

#[test]
fn serve_read_only_shows_no_form_and_answers_a_post_405() {
    let Some(sink) = SmtpSink::start("cli_serve_read_only", &[]) else {
        return;
    };
    let dsn = format!("smtp://127.0.0.1:{}?name=relay", sink.port());
    let (_server, url) = serve(&dsn, &["--read-only"]);
    let (status, page) = request(&url, "GET", "/");
    assert_eq!(status, 200);
    assert!(!page.contains("<form"), "a read-only page shows no form");
    let (status, _) = request(&url, "POST", "/breakers/relay/isolate");
    assert_eq!(status, 405);
}

#[test]
fn serve_on_an_address_that_is_not_loopback_without_allow_host_exits_2() {
    let output = Command::new(BIN)
        .args([
            "serve",
            "--listen",
            "0.0.0.0:0",
            "--dsn",
            "smtp://127.0.0.1:25",
        ])
        .env_remove("MAILER_DSN")
        .stdin(Stdio::null())
        .output()
        .expect("the mail-breaker binary runs");
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--allow-host"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_that_serve_serves_loads_in_chromium_and_shows_the_member_closed() {
    let Some(sink) = SmtpSink::start("cli_serve_chromium", &[]) else {
        return;
    };
    let Some(browser) = Chromium::start("cli_serve_chromium").await else {
        return;
    };
    let dsn = format!("smtp://127.0.0.1:{}?name=relay", sink.port());
    let (_server, url) = serve(&dsn, &[]);
    let page = browser.page(1000, 800).await;
    page.goto(&url).await;
    let shown = page
        .wait_for(
            "document.body && document.body.innerText.includes('relay') \
             && document.body.innerText.toLowerCase().includes('closed')",
            &json!(true),
            Duration::from_secs(15),
        )
        .await;
    assert!(
        shown.is_ok(),
        "the page did not show the member closed: {:?}",
        page.eval("document.body && document.body.innerText").await
    );
}
