//! `mail-breaker serve` with the webhook receivers (`webhooks.*`): mounted at
//! `/webhooks/{provider}` outside the page's token, origin and credential checks (each route
//! authenticates itself), with a bounded body; `--webhooks-only` serves them without the page.
//! Driven as a provider and an operator would: a real process on a free loopback port.
#![cfg(feature = "cli")]

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use support::ready::ServerProcess;

const BIN: &str = env!("CARGO_BIN_EXE_mail-breaker");
const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const TOKEN: &str = "a-bearer-token-never-printed";

/// A permanent bounce for `gone@example.org`, as Resend posts it.
const BOUNCED: &str = r#"{"type":"email.bounced","created_at":"2024-11-22T23:41:12.126Z","data":{"created_at":"2024-11-22T23:41:11.894719+00:00","email_id":"56761188-7520-42d8-8898-ff6fc54ce618","from":"Acme <onboarding@resend.dev>","to":["gone@example.org"],"subject":"Hello","bounce":{"message":"Hard bounce","subType":"General","type":"Permanent"}}}"#;

/// Svix's headers for `body` under `id`, signed now with `secret`.
fn signed(secret: &str, id: &str, body: &str) -> Vec<(&'static str, String)> {
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let key = STANDARD
        .decode(secret.trim_start_matches("whsec_"))
        .unwrap();
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).unwrap();
    mac.update(format!("{id}.{now}.{body}").as_bytes());
    let signature = format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()));
    vec![
        ("svix-id", id.to_owned()),
        ("svix-timestamp", now.to_string()),
        ("svix-signature", signature),
    ]
}

/// A folder with an outbox (and its suppression list) in it, and the DSN of a stack that
/// keeps Resend's events there; `more` options after it.
fn stack(more: &str) -> (tempfile::TempDir, String) {
    let dir = tempfile::Builder::new()
        .prefix("mail-breaker-serve-webhooks-")
        .tempdir()
        .expect("a folder");
    let path = dir.path().join("outbox.db");
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(mail_breaker::Outbox::sqlite(&path))
        .expect("an outbox");
    let dsn = format!(
        "smtp://127.0.0.1:25?name=relay&outbox=sqlite://{}&suppression=true\
         &webhooks.resend.secret={SECRET}{more}",
        path.display()
    );
    (dir, dsn)
}

/// `mail-breaker serve` with `args` and `env`, owned by a guard, and its port (from the
/// first line it prints).
fn start(args: &[&str], env: &[(&str, &str)]) -> (ServerProcess, u16) {
    let mut command = Command::new(BIN);
    command
        .arg("serve")
        .args(args)
        .env_remove("MAILER_DSN")
        .env_remove("MAILER_ADMIN_TOKEN")
        .env_remove("MAILER_ADMIN_USER")
        .env_remove("MAILER_ADMIN_PASSWORD")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    for (name, value) in env {
        command.env(name, value);
    }
    let mut child = command.spawn().expect("the mail-breaker binary runs");
    let stdout = child.stdout.take().expect("a piped stdout");
    let process = ServerProcess::new(child);
    let mut url = String::new();
    BufReader::new(stdout)
        .read_line(&mut url)
        .expect("serve prints its address");
    let port = url
        .trim()
        .trim_end_matches('/')
        .rsplit(':')
        .next()
        .and_then(|port| port.parse().ok())
        .unwrap_or_else(|| panic!("serve did not start: {url:?}"));
    (process, port)
}

/// Runs `mail-breaker serve` with `args`, which must refuse to start: its output.
fn refused(args: &[&str]) -> std::process::Output {
    let mut child = Command::new(BIN)
        .arg("serve")
        .args(args)
        .env_remove("MAILER_DSN")
        .env_remove("MAILER_ADMIN_TOKEN")
        .env_remove("MAILER_ADMIN_USER")
        .env_remove("MAILER_ADMIN_PASSWORD")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the mail-breaker binary runs");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while child.try_wait().ok().flatten().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("serve {args:?} started instead of refusing");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("its output")
}

/// A request to `127.0.0.1:port` with `headers` and `body`; its status and body.
fn send(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, String)],
    body: &str,
) -> (u16, String) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("serve listens");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("a read timeout");
    let mut request = format!(
        "{method} {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    request.push_str(body);
    // A server that answers before reading a large body may close early: what it answered
    // is what counts.
    let _ = stream.write_all(request.as_bytes());
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer);
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

/// The addresses `mail-breaker suppressions list` shows for `dsn`.
fn suppressed(dsn: &str) -> Vec<String> {
    let output = Command::new(BIN)
        .args(["suppressions", "list", "--json", "--dsn", dsn])
        .env_remove("MAILER_DSN")
        .output()
        .expect("the mail-breaker binary runs");
    assert!(output.status.success(), "{output:?}");
    let listed: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    listed["suppressions"]
        .as_array()
        .expect("a list")
        .iter()
        .filter_map(|entry| entry["address"].as_str().map(str::to_owned))
        .collect()
}

#[test]
fn a_signed_event_posted_to_serve_is_kept_without_the_pages_credential() {
    let (_dir, dsn) = stack("");
    let (_server, port) = start(
        &["--listen", "127.0.0.1:0", "--dsn", &dsn],
        &[("MAILER_ADMIN_TOKEN", TOKEN)],
    );
    let (status, body) = send(
        port,
        "POST",
        "/webhooks/resend",
        &signed(SECRET, "msg_1", BOUNCED),
        BOUNCED,
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(suppressed(&dsn), ["gone@example.org"]);
}

#[test]
fn a_forged_event_posted_to_serve_is_400_and_changes_nothing() {
    let (_dir, dsn) = stack("");
    let (_server, port) = start(&["--listen", "127.0.0.1:0", "--dsn", &dsn], &[]);
    let forged = signed("whsec_c2VjcmV0LW9mLXNvbWVvbmUtZWxzZQ==", "msg_2", BOUNCED);
    let (status, _) = send(port, "POST", "/webhooks/resend", &forged, BOUNCED);
    assert_eq!(status, 400);
    assert!(suppressed(&dsn).is_empty());
}

#[test]
fn the_pages_routes_beside_the_receivers_still_need_their_credential_token_and_host() {
    let (_dir, dsn) = stack("");
    let (_server, port) = start(
        &["--listen", "127.0.0.1:0", "--dsn", &dsn],
        &[("MAILER_ADMIN_TOKEN", TOKEN)],
    );
    let bearer = [("Authorization", format!("Bearer {TOKEN}"))];
    let form = [
        ("Authorization", format!("Bearer {TOKEN}")),
        (
            "Content-Type",
            "application/x-www-form-urlencoded".to_owned(),
        ),
    ];
    assert_eq!(send(port, "GET", "/", &[], "").0, 401);
    assert_eq!(send(port, "GET", "/api/breakers", &[], "").0, 401);
    assert_eq!(send(port, "GET", "/", &bearer, "").0, 200);
    assert_eq!(
        send(
            port,
            "POST",
            "/breakers/relay/isolate",
            &form,
            "token=wrong"
        )
        .0,
        403,
        "the credential without the page's token acts on nothing"
    );
    // A receiver answers whatever the Host: its signature is what it checks.
    let mut other_host = signed(SECRET, "msg_3", BOUNCED);
    other_host.push(("Host", "evil.example:80".to_owned()));
    let (status, _) = send(port, "POST", "/webhooks/resend", &other_host, BOUNCED);
    assert_eq!(status, 200);
}

#[test]
fn webhooks_only_answers_404_for_the_page_and_serves_the_receivers() {
    let (_dir, dsn) = stack("");
    let (_server, port) = start(
        &["--listen", "127.0.0.1:0", "--webhooks-only", "--dsn", &dsn],
        &[],
    );
    assert_eq!(send(port, "GET", "/", &[], "").0, 404);
    assert_eq!(send(port, "GET", "/api/breakers", &[], "").0, 404);
    assert_eq!(
        send(port, "POST", "/breakers/relay/isolate", &[], "").0,
        404
    );
    let (status, body) = send(
        port,
        "POST",
        "/webhooks/resend",
        &signed(SECRET, "msg_4", BOUNCED),
        BOUNCED,
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(suppressed(&dsn), ["gone@example.org"]);
}

#[test]
fn a_body_past_the_configured_limit_is_413_and_changes_nothing() {
    let (_dir, dsn) = stack("&webhooks.body_limit=1024");
    let (_server, port) = start(&["--listen", "127.0.0.1:0", "--dsn", &dsn], &[]);
    let padded = BOUNCED.replace("Hard bounce", &"x".repeat(2048));
    let (status, _) = send(
        port,
        "POST",
        "/webhooks/resend",
        &signed(SECRET, "msg_5", &padded),
        &padded,
    );
    assert_eq!(status, 413);
    assert!(suppressed(&dsn).is_empty());
}

#[test]
fn webhooks_only_on_an_address_that_is_not_loopback_needs_tls_or_a_tls_proxy_but_no_credential() {
    let (_dir, dsn) = stack("");
    let output = refused(&["--listen", "0.0.0.0:0", "--webhooks-only", "--dsn", &dsn]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--tls-cert") && stderr.contains("--behind-tls-proxy"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
        "{stderr}"
    );
    let (_server, port) = start(
        &[
            "--listen",
            "0.0.0.0:0",
            "--webhooks-only",
            "--behind-tls-proxy",
            "--dsn",
            &dsn,
        ],
        &[],
    );
    let (status, _) = send(
        port,
        "POST",
        "/webhooks/resend",
        &signed(SECRET, "msg_6", BOUNCED),
        BOUNCED,
    );
    assert_eq!(status, 200);
}

#[test]
fn receivers_beside_a_read_only_page_on_an_address_that_is_not_loopback_need_tls_or_a_tls_proxy() {
    let (_dir, dsn) = stack("");
    let output = refused(&[
        "--listen",
        "0.0.0.0:0",
        "--allow-host",
        "ops.internal:8025",
        "--read-only",
        "--dsn",
        &dsn,
    ]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("webhook"), "{stderr}");
    assert!(stderr.contains("--behind-tls-proxy"), "{stderr}");
}

#[test]
fn webhooks_only_without_receivers_configured_is_refused() {
    let output = refused(&[
        "--listen",
        "127.0.0.1:0",
        "--webhooks-only",
        "--dsn",
        "smtp://127.0.0.1:25",
    ]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("webhooks."), "{stderr}");
}

#[test]
fn webhooks_only_takes_none_of_the_pages_options() {
    let (_dir, dsn) = stack("");
    for option in [&["--read-only"][..], &["--allow-host", "ops.internal:8025"]] {
        let mut args = vec!["--listen", "127.0.0.1:0", "--webhooks-only", "--dsn", &dsn];
        args.extend_from_slice(option);
        let output = refused(&args);
        assert_eq!(output.status.code(), Some(2), "{option:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhooks_only_over_tls_on_an_address_that_is_not_loopback_keeps_a_signed_event() {
    let Some(certificates) = support::test_certs::TestCertificates::make("cli_serve_webhooks_tls")
    else {
        return;
    };
    let (cert, key) = (
        certificates.path("server.pem"),
        certificates.path("server.key"),
    );
    // The outbox is made on a runtime of its own, off this one.
    let (_dir, dsn) = tokio::task::spawn_blocking(|| stack(""))
        .await
        .expect("an outbox");
    let (_server, port) = start(
        &[
            "--listen",
            "0.0.0.0:0",
            "--webhooks-only",
            "--tls-cert",
            cert.to_str().expect("a UTF-8 path"),
            "--tls-key",
            key.to_str().expect("a UTF-8 path"),
            "--dsn",
            &dsn,
        ],
        &[],
    );
    let ca = std::fs::read(certificates.path("ca.pem")).expect("the CA");
    let client = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&ca).expect("a PEM CA"))
        .build()
        .expect("a client");
    let mut request = client
        .post(format!("https://localhost:{port}/webhooks/resend"))
        .body(BOUNCED);
    for (name, value) in signed(SECRET, "msg_7", BOUNCED) {
        request = request.header(name, value);
    }
    let answer = request.send().await.expect("an answer over TLS");
    assert_eq!(answer.status(), 200);
    let dsn_for_list = dsn.clone();
    let listed = tokio::task::spawn_blocking(move || suppressed(&dsn_for_list))
        .await
        .expect("the command ran");
    assert_eq!(listed, ["gone@example.org"]);
}

#[test]
fn a_read_only_page_keeps_its_receivers_which_are_no_action_of_the_page() {
    let (_dir, dsn) = stack("");
    let (_server, port) = start(
        &["--listen", "127.0.0.1:0", "--read-only", "--dsn", &dsn],
        &[],
    );
    assert_eq!(
        send(port, "POST", "/breakers/relay/isolate", &[], "").0,
        405
    );
    let (status, _) = send(
        port,
        "POST",
        "/webhooks/resend",
        &signed(SECRET, "msg_8", BOUNCED),
        BOUNCED,
    );
    assert_eq!(status, 200);
}
