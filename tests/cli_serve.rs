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

// ---------------------------------------------------------------------------------------
// Who may use a page served on a public address, over what, and from where

/// `mail-breaker serve` with `args` and `env`, owned by a guard, and the first line it
/// prints (the page's URL); `None` when it printed nothing (it did not start).
fn start(args: &[&str], env: &[(&str, &str)]) -> (ServerProcess, Option<String>) {
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
    let read = BufReader::new(stdout).read_line(&mut url).unwrap_or(0);
    (process, (read > 0).then(|| url.trim().to_owned()))
}

/// Runs `mail-breaker serve` with `args` and `env`, which must refuse to start: its output
/// once it exits. A `serve` still running after 30 s started, and fails the test.
fn refused(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut command = Command::new(BIN);
    command
        .arg("serve")
        .args(args)
        .env_remove("MAILER_DSN")
        .env_remove("MAILER_ADMIN_TOKEN")
        .env_remove("MAILER_ADMIN_USER")
        .env_remove("MAILER_ADMIN_PASSWORD")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (name, value) in env {
        command.env(name, value);
    }
    let mut child = command.spawn().expect("the mail-breaker binary runs");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while child.try_wait().ok().flatten().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let output = child.wait_with_output().expect("its output");
            panic!(
                "serve {args:?} started instead of refusing: {}",
                String::from_utf8_lossy(&output.stdout)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("its output")
}

/// A request to the page at `127.0.0.1:port` with `headers` (none added) and `body`; its
/// status and body.
fn send(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("the page listens");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("a read timeout");
    let mut request = format!(
        "{method} {path} HTTP/1.0\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    request.push_str(body);
    stream.write_all(request.as_bytes()).expect("sending");
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
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

/// The port of a URL the command printed (`http://0.0.0.0:PORT/`).
fn port_of(url: &str) -> u16 {
    url.trim_end_matches('/')
        .rsplit(':')
        .next()
        .and_then(|port| port.parse().ok())
        .unwrap_or_else(|| panic!("no port in {url:?}"))
}

/// A file holding `text`, in a folder removed with it.
fn credential_file(text: &str) -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("mail-breaker-credential-")
        .tempdir()
        .expect("a folder");
    std::fs::write(dir.path().join("credential"), text).expect("the file");
    dir
}

const DSN: &str = "smtp://127.0.0.1:25?name=relay";
const TOKEN: &str = "a-bearer-token-never-printed";

#[test]
fn serve_on_an_address_that_is_not_loopback_without_a_credential_refuses_to_start_and_says_why() {
    let output = refused(
        &[
            "--listen",
            "0.0.0.0:0",
            "--allow-host",
            "ops.internal:8025",
            "--dsn",
            DSN,
        ],
        &[],
    );
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--credential-file") && stderr.contains("--read-only"),
        "{stderr}"
    );
}

#[test]
fn serve_read_only_on_an_address_that_is_not_loopback_starts_without_a_credential() {
    let (_server, url) = start(
        &[
            "--listen",
            "0.0.0.0:0",
            "--allow-host",
            "ops.internal:8025",
            "--read-only",
            "--dsn",
            DSN,
        ],
        &[],
    );
    let url = url.expect("serve started");
    let host = format!("127.0.0.1:{}", port_of(&url));
    let (status, _) = send(port_of(&url), "GET", "/", &[("Host", &host)], "");
    assert_eq!(status, 200);
}

#[test]
fn a_credential_on_an_address_that_is_not_loopback_needs_tls_or_a_tls_proxy() {
    let file = credential_file(&format!("{TOKEN}\n"));
    let path = file.path().join("credential");
    let output = refused(
        &[
            "--listen",
            "0.0.0.0:0",
            "--allow-host",
            "ops.internal:8025",
            "--credential-file",
            path.to_str().expect("a UTF-8 path"),
            "--dsn",
            DSN,
        ],
        &[],
    );
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--tls-cert") && stderr.contains("--behind-tls-proxy"),
        "{stderr}"
    );
    assert!(!stderr.contains(TOKEN), "{stderr}");
    // Read-only changes nothing: the credential would still cross the network in clear.
    let output = refused(
        &[
            "--listen",
            "0.0.0.0:0",
            "--allow-host",
            "ops.internal:8025",
            "--read-only",
            "--dsn",
            DSN,
        ],
        &[("MAILER_ADMIN_TOKEN", TOKEN)],
    );
    assert_eq!(output.status.code(), Some(2));
}

#[test]
fn a_credential_file_beside_any_one_credential_variable_is_refused_as_two_credentials() {
    let file = credential_file(&format!("{TOKEN}\n"));
    let path = file.path().join("credential");
    for variable in [
        "MAILER_ADMIN_TOKEN",
        "MAILER_ADMIN_USER",
        "MAILER_ADMIN_PASSWORD",
    ] {
        let output = refused(
            &[
                "--listen",
                "127.0.0.1:0",
                "--credential-file",
                path.to_str().expect("a UTF-8 path"),
                "--dsn",
                DSN,
            ],
            &[(variable, "something")],
        );
        assert_eq!(output.status.code(), Some(2), "{variable}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains("both in --credential-file"),
            "{variable}: {stderr}"
        );
    }
}

#[test]
fn behind_a_tls_proxy_every_request_needs_the_credential_from_the_file() {
    let file = credential_file(&format!("{TOKEN}\n"));
    let path = file.path().join("credential");
    let (_server, url) = start(
        &[
            "--listen",
            "0.0.0.0:0",
            "--allow-host",
            "ops.internal:8025",
            "--behind-tls-proxy",
            "--credential-file",
            path.to_str().expect("a UTF-8 path"),
            "--dsn",
            DSN,
        ],
        &[],
    );
    let url = url.expect("serve started");
    let port = port_of(&url);
    let host = format!("127.0.0.1:{port}");
    let (status, _) = send(port, "GET", "/api/breakers", &[("Host", &host)], "");
    assert_eq!(status, 401);
    let bearer = format!("Bearer {TOKEN}");
    let (status, breakers) = send(
        port,
        "GET",
        "/api/breakers",
        &[("Host", &host), ("Authorization", &bearer)],
        "",
    );
    assert_eq!(status, 200);
    assert!(breakers.contains("relay"), "{breakers}");
}

/// Hostile review 3 of issue 63: behind a proxy every request comes from the proxy's
/// address; with `--trusted-proxy` one client's wrong credentials hold back that client,
/// named by the proxy's `X-Forwarded-For`, and not everyone behind the proxy.
#[test]
fn behind_a_trusted_proxy_ten_wrong_credentials_hold_back_their_client_alone() {
    let (_server, url) = start(
        &[
            "--listen",
            "127.0.0.1:0",
            "--behind-tls-proxy",
            "--trusted-proxy",
            "127.0.0.1",
            "--dsn",
            DSN,
        ],
        &[("MAILER_ADMIN_TOKEN", TOKEN)],
    );
    let port = port_of(&url.expect("serve started"));
    let host = format!("127.0.0.1:{port}");
    let wrong = "Bearer a-wrong-token-of-enough-length";
    for guess in 0..10 {
        let (status, _) = send(
            port,
            "GET",
            "/api/breakers",
            &[
                ("Host", &host),
                ("Authorization", wrong),
                ("X-Forwarded-For", "203.0.113.7"),
            ],
            "",
        );
        assert_eq!(status, 401, "guess {guess}");
    }
    let bearer = format!("Bearer {TOKEN}");
    let from = |client: &str| {
        send(
            port,
            "GET",
            "/api/breakers",
            &[
                ("Host", &host),
                ("Authorization", &bearer),
                ("X-Forwarded-For", client),
            ],
            "",
        )
        .0
    };
    assert_eq!(from("203.0.113.7"), 429, "the guesser is held back");
    assert_eq!(from("198.51.100.1"), 200, "another client is not");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_tls_the_page_answers_https_with_the_user_and_password_from_the_environment() {
    let Some(certificates) = support::test_certs::TestCertificates::make("cli_serve_tls") else {
        return;
    };
    let (cert, key) = (
        certificates.path("server.pem"),
        certificates.path("server.key"),
    );
    let password = "a password from the environment";
    let (_server, url) = start(
        &[
            "--listen",
            "0.0.0.0:0",
            "--allow-host",
            "ops.internal:8025",
            "--tls-cert",
            cert.to_str().expect("a UTF-8 path"),
            "--tls-key",
            key.to_str().expect("a UTF-8 path"),
            "--dsn",
            DSN,
        ],
        &[
            ("MAILER_ADMIN_USER", "ops"),
            ("MAILER_ADMIN_PASSWORD", password),
        ],
    );
    let url = url.expect("serve started");
    assert!(url.starts_with("https://"), "{url}");
    let ca = std::fs::read(certificates.path("ca.pem")).expect("the CA");
    let client = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&ca).expect("a PEM CA"))
        .build()
        .expect("a client");
    let page = format!("https://localhost:{}/api/breakers", port_of(&url));
    let asked = client.get(&page).send().await.expect("an answer over TLS");
    assert_eq!(asked.status(), 401);
    let answered = client
        .get(&page)
        .basic_auth("ops", Some(password))
        .send()
        .await
        .expect("an answer over TLS");
    assert_eq!(answered.status(), 200);
    let plain = format!("http://127.0.0.1:{}/", port_of(&url));
    assert!(
        reqwest::get(&plain).await.is_err(),
        "no plain HTTP on the TLS port"
    );
}

/// A loopback name given to `--allow-host` keeps the page on this machine: it needs no
/// credential, as without the flag.
#[test]
fn an_allow_host_naming_this_machine_keeps_the_page_local_and_needs_no_credential() {
    for host in ["localhost:8025", "127.0.0.1:8025", "[::1]:8025"] {
        let (_server, url) = start(
            &[
                "--listen",
                "127.0.0.1:0",
                "--allow-host",
                host,
                "--dsn",
                DSN,
            ],
            &[],
        );
        assert!(url.is_some(), "{host}: serve refused to start");
    }
}

#[test]
fn serve_with_allow_host_still_answers_to_its_loopback_names() {
    let (_server, url) = start(
        &[
            "--listen",
            "127.0.0.1:0",
            "--allow-host",
            "ops.internal:8025",
            // A host that is not loopback makes the page public: read-only without a credential.
            "--read-only",
            "--dsn",
            DSN,
        ],
        &[],
    );
    let port = port_of(&url.expect("serve started"));
    for host in [
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        "ops.internal:8025".into(),
    ] {
        let (status, _) = send(port, "GET", "/", &[("Host", &host)], "");
        assert_eq!(status, 200, "{host}");
    }
    let (status, _) = send(port, "GET", "/", &[("Host", "rebound.example:80")], "");
    assert_eq!(status, 403);
}

/// Behind a proxy that terminates TLS, the browser's scheme is `https` though the page
/// speaks plain HTTP: a form from the https origin acts, one from the http origin is
/// another site's.
#[test]
fn behind_a_tls_proxy_a_form_from_the_https_origin_acts_and_one_from_http_is_refused() {
    let (_server, url) = start(
        &[
            "--listen",
            "127.0.0.1:0",
            "--allow-host",
            "ops.internal",
            "--behind-tls-proxy",
            "--dsn",
            DSN,
        ],
        &[("MAILER_ADMIN_TOKEN", TOKEN)],
    );
    let port = port_of(&url.expect("serve started"));
    let bearer = format!("Bearer {TOKEN}");
    let (status, page) = send(
        port,
        "GET",
        "/",
        &[("Host", "ops.internal"), ("Authorization", &bearer)],
        "",
    );
    assert_eq!(status, 200);
    let token = page
        .split("name=\"token\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("a form with the token");
    let form = format!("token={token}");
    let post = |origin: &str| {
        send(
            port,
            "POST",
            "/breakers/relay/isolate",
            &[
                ("Host", "ops.internal"),
                ("Origin", origin),
                ("Authorization", &bearer),
                ("Content-Type", "application/x-www-form-urlencoded"),
            ],
            &form,
        )
        .0
    };
    assert_eq!(post("http://ops.internal"), 403);
    assert_eq!(post("https://ops.internal"), 303);
}

#[test]
fn serve_with_a_public_origin_acts_on_a_form_a_proxy_passes_on_from_it() {
    let (_server, url) = start(
        &[
            "--listen",
            "127.0.0.1:0",
            "--public-origin",
            "https://ops.example.com",
            "--behind-tls-proxy",
            "--dsn",
            DSN,
        ],
        &[("MAILER_ADMIN_TOKEN", TOKEN)],
    );
    let port = port_of(&url.expect("serve started"));
    // What nginx sends by default: its upstream's name as `Host`.
    let host = format!("127.0.0.1:{port}");
    let bearer = format!("Bearer {TOKEN}");
    let (status, page) = send(
        port,
        "GET",
        "/",
        &[("Host", &host), ("Authorization", &bearer)],
        "",
    );
    assert_eq!(status, 200);
    let token = page
        .split("name=\"token\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("a form with the token");
    let form = format!("token={token}");
    let post = |origin: &str| {
        send(
            port,
            "POST",
            "/breakers/relay/isolate",
            &[
                ("Host", &host),
                ("Origin", origin),
                ("Authorization", &bearer),
                ("Content-Type", "application/x-www-form-urlencoded"),
            ],
            &form,
        )
        .0
    };
    assert_eq!(post("https://evil.example"), 403);
    assert_eq!(post("https://ops.example.com"), 303);
    // A proxy that passes the browser's `Host` on (nginx's `$host`) is answered too.
    let (status, _) = send(
        port,
        "GET",
        "/",
        &[("Host", "ops.example.com"), ("Authorization", &bearer)],
        "",
    );
    assert_eq!(status, 200);
    let (_, breakers) = send(
        port,
        "GET",
        "/api/breakers",
        &[("Host", &host), ("Authorization", &bearer)],
        "",
    );
    assert!(breakers.contains("isolated"), "{breakers}");
}

#[test]
fn a_credential_given_twice_half_or_malformed_is_refused_at_start_without_being_shown() {
    let short = credential_file("short-token\n");
    let short = short.path().join("credential");
    let empty = credential_file("\n\n");
    let empty = empty.path().join("credential");
    let good = credential_file(&format!("{TOKEN}\n"));
    let good = good.path().join("credential");
    let path = |file: &std::path::Path| file.to_str().expect("a UTF-8 path").to_owned();
    // The arguments, the environment, and what the refusal says.
    type Case<'a> = (Vec<String>, Vec<(&'a str, &'a str)>, &'a str);
    let cases: [Case; 5] = [
        (
            vec!["--credential-file".into(), path(&short)],
            vec![],
            "token",
        ),
        (
            vec!["--credential-file".into(), path(&empty)],
            vec![],
            "empty",
        ),
        (
            vec!["--credential-file".into(), path(&good)],
            vec![("MAILER_ADMIN_TOKEN", TOKEN)],
            "give one",
        ),
        (
            vec![],
            vec![("MAILER_ADMIN_USER", "ops")],
            "MAILER_ADMIN_PASSWORD",
        ),
        (vec![], vec![("MAILER_ADMIN_TOKEN", "short-token")], "token"),
    ];
    for (extra, env, said) in cases {
        let mut args = vec!["--listen", "127.0.0.1:0", "--dsn", DSN];
        args.extend(extra.iter().map(String::as_str));
        let output = refused(&args, &env);
        assert_eq!(output.status.code(), Some(2), "{extra:?} {env:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(said), "{extra:?} {env:?}: {stderr}");
        assert!(
            !stderr.contains("short-token") && !stderr.contains(TOKEN),
            "{stderr}"
        );
    }
}

#[test]
fn a_user_and_password_in_the_credential_file_is_asked_of_every_request() {
    let file = credential_file("  ops:a password kept in a file  \n");
    let path = file.path().join("credential");
    let (_server, url) = start(
        &[
            "--listen",
            "127.0.0.1:0",
            "--credential-file",
            path.to_str().expect("a UTF-8 path"),
            "--dsn",
            DSN,
        ],
        &[],
    );
    let port = port_of(&url.expect("serve started"));
    let host = format!("127.0.0.1:{port}");
    let (status, _) = send(port, "GET", "/", &[("Host", &host)], "");
    assert_eq!(status, 401);
    use base64::Engine as _;
    let basic = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode("ops:a password kept in a file")
    );
    let (status, _) = send(
        port,
        "GET",
        "/",
        &[("Host", &host), ("Authorization", &basic)],
        "",
    );
    assert_eq!(status, 200);
}

/// Issue 63 review: a page on loopback behind a proxy on the same machine is as public as the
/// proxy; naming a public origin, a TLS proxy or a host that is not loopback needs a
/// credential, or `--read-only`.
#[test]
fn serve_behind_a_proxy_named_by_public_origin_or_allow_host_needs_a_credential_or_read_only() {
    for proxy in [
        &["--public-origin", "https://ops.example.com"][..],
        &["--allow-host", "ops.example.com:443"][..],
        &["--behind-tls-proxy"][..],
    ] {
        let mut args = vec!["--listen", "127.0.0.1:0", "--dsn", DSN];
        args.extend_from_slice(proxy);
        let (_server, url) = start(&args, &[]);
        assert!(url.is_none(), "{proxy:?}: started without a credential");
        args.push("--read-only");
        let (_server, url) = start(&args, &[]);
        assert!(url.is_some(), "{proxy:?}: --read-only may start");
    }
}

/// Issue 63 review: a credential never goes to a page served under a plain-http origin.
#[test]
fn a_credential_with_a_plain_http_public_origin_is_refused() {
    let (_server, url) = start(
        &[
            "--listen",
            "127.0.0.1:0",
            "--public-origin",
            "http://ops.example.com",
            "--behind-tls-proxy",
            "--dsn",
            DSN,
        ],
        &[("MAILER_ADMIN_TOKEN", TOKEN)],
    );
    assert!(url.is_none(), "a credential over plain http");
}

/// Hostile review of issue 63: a URL parser drops the spaces and controls around a URL, so
/// the refusal of a plain-http origin does too.
#[test]
fn a_credential_with_a_plain_http_public_origin_behind_a_space_is_refused() {
    let (_server, url) = start(
        &[
            "--listen",
            "127.0.0.1:0",
            "--public-origin",
            " http://ops.example.com",
            "--behind-tls-proxy",
            "--dsn",
            DSN,
        ],
        &[("MAILER_ADMIN_TOKEN", TOKEN)],
    );
    assert!(url.is_none(), "a credential over plain http");
}

// ---------------------------------------------------------------------------------------
// Review of issue 63, second pass: connections that hold the server, origins, redaction

/// `serve` over TLS on loopback with `MAILER_ADMIN_USER=ops` and `PASSWORD`, its URL and
/// the test CA's PEM; `None` when no test certificates can be made here.
fn serve_over_tls(
    test: &str,
) -> Option<(
    support::test_certs::TestCertificates,
    ServerProcess,
    u16,
    Vec<u8>,
)> {
    let certificates = support::test_certs::TestCertificates::make(test)?;
    let (cert, key) = (
        certificates.path("server.pem"),
        certificates.path("server.key"),
    );
    let (server, url) = start(
        &[
            "--listen",
            "127.0.0.1:0",
            "--tls-cert",
            cert.to_str().expect("a UTF-8 path"),
            "--tls-key",
            key.to_str().expect("a UTF-8 path"),
            "--dsn",
            DSN,
        ],
        &[
            ("MAILER_ADMIN_USER", "ops"),
            ("MAILER_ADMIN_PASSWORD", PASSWORD),
        ],
    );
    let url = url.expect("serve started");
    assert!(url.starts_with("https://"), "{url}");
    let ca = std::fs::read(certificates.path("ca.pem")).expect("the CA");
    Some((certificates, server, port_of(&url), ca))
}

const PASSWORD: &str = "a password for the page";

fn client_trusting(ca: &[u8]) -> reqwest::Client {
    reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(ca).expect("a PEM CA"))
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(60))
        .build()
        .expect("a client")
}

/// Whether the server has not closed `stream` (nothing to read yet, and no end).
fn still_open(stream: &TcpStream) -> bool {
    stream.set_nonblocking(true).expect("non-blocking");
    let mut byte = [0u8; 1];
    let open = matches!(
        (&*stream).read(&mut byte),
        Err(error) if error.kind() == std::io::ErrorKind::WouldBlock
    );
    stream.set_nonblocking(false).expect("blocking again");
    open
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_that_never_send_a_client_hello_keep_no_one_else_from_the_page() {
    let Some((_certificates, _server, port, ca)) = serve_over_tls("cli_serve_silent") else {
        return;
    };
    // As many as the server makes handshakes at once, each from an address of its own (one
    // address's own oldest goes first), and none says anything.
    let mut silent: Vec<TcpStream> = Vec::new();
    for at in 0..64u8 {
        let stream = connect_from([127, 0, 1, at + 1], port).await;
        silent.push(stream.into_std().expect("a std stream"));
    }
    let asked = client_trusting(&ca)
        .get(format!("https://localhost:{port}/api/breakers"))
        .send()
        .await
        .expect("an answer over TLS");
    assert_eq!(asked.status(), 401);
    // The client got in while the silent connections were still waiting for their
    // handshake (one of them let go to make room, at most), not once they had been cut.
    let cut = silent.iter().filter(|stream| !still_open(stream)).count();
    assert!(
        cut <= 1,
        "the client got in only once {cut} of the 64 silent connections had been cut"
    );
}

/// A TCP connection to the page from `from` (an address of the loopback network), that has
/// said nothing yet.
async fn connect_from(from: [u8; 4], port: u16) -> tokio::net::TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().expect("a socket");
    socket
        .bind(std::net::SocketAddr::from((from, 0)))
        .expect("an address of the loopback network");
    socket
        .connect(std::net::SocketAddr::from(([127, 0, 0, 1], port)))
        .await
        .expect("connects")
}

/// A client configuration trusting the PEM `ca`.
fn tls_client_trusting(ca: &[u8]) -> tokio_rustls::TlsConnector {
    let mut roots = tokio_rustls::rustls::RootCertStore::empty();
    for certificate in
        <tokio_rustls::rustls::pki_types::CertificateDer as tokio_rustls::rustls::pki_types::pem::PemObject>::pem_slice_iter(ca)
    {
        roots.add(certificate.expect("a PEM certificate")).expect("the CA");
    }
    let config = tokio_rustls::rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        tokio_rustls::rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("TLS versions")
    .with_root_certificates(roots)
    .with_no_client_auth();
    tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_handshakes_from_one_address_lets_go_of_its_own_not_of_another_addresss() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Some((_certificates, _server, port, ca)) = serve_over_tls("cli_serve_flood") else {
        return;
    };
    // A client across the world: its TCP connection is made, its ClientHello not yet.
    let slow = connect_from([127, 0, 0, 2], port).await;
    // Meanwhile one address opens connections faster than that client's round trip.
    let mut flood = Vec::new();
    for _ in 0..300 {
        flood.push(connect_from([127, 0, 0, 3], port).await);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;

    let name = tokio_rustls::rustls::pki_types::ServerName::try_from("localhost").expect("a name");
    let handshake = tokio::time::timeout(
        Duration::from_secs(60),
        tls_client_trusting(&ca).connect(name, slow),
    )
    .await
    .expect("the handshake ended");
    let mut tls = handshake.expect("the slow client's handshake was let go for the flood's");
    let request = format!(
        "GET /api/breakers HTTP/1.1\r\nHost: localhost:{port}\r\nConnection: close\r\n\r\n"
    );
    tls.write_all(request.as_bytes())
        .await
        .expect("the request");
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(60), tls.read_to_end(&mut answer)).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer:?}");
    drop(flood);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_tls_a_connection_that_sends_no_request_after_its_handshake_is_cut() {
    use tokio::io::AsyncReadExt;
    let Some((_certificates, _server, port, ca)) = serve_over_tls("cli_serve_idle_tls") else {
        return;
    };
    let mut roots = tokio_rustls::rustls::RootCertStore::empty();
    for certificate in
        <tokio_rustls::rustls::pki_types::CertificateDer as tokio_rustls::rustls::pki_types::pem::PemObject>::pem_slice_iter(&ca)
    {
        roots.add(certificate.expect("a PEM certificate")).expect("the CA");
    }
    let config = tokio_rustls::rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        tokio_rustls::rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("TLS versions")
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connects");
    let name = tokio_rustls::rustls::pki_types::ServerName::try_from("localhost").expect("a name");
    let mut tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
        .connect(name, tcp)
        .await
        .expect("a handshake");
    let mut byte = [0u8; 1];
    // Bounds the test alone: the server's own limit is far shorter.
    let read = tokio::time::timeout(Duration::from_secs(120), tls.read(&mut byte)).await;
    assert!(
        matches!(read, Ok(Ok(0) | Err(_))),
        "an idle TLS connection was not cut by the server: {read:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_tls_a_form_posted_from_the_plain_http_origin_of_the_same_host_is_refused() {
    let Some((_certificates, _server, port, ca)) = serve_over_tls("cli_serve_scheme") else {
        return;
    };
    let client = client_trusting(&ca);
    let page = client
        .get(format!("https://localhost:{port}/"))
        .basic_auth("ops", Some(PASSWORD))
        .send()
        .await
        .expect("the page")
        .text()
        .await
        .expect("its text");
    let token = page
        .split(r#"name="token" value=""#)
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("a form with the token")
        .to_owned();
    let isolate = |origin: String| {
        client
            .post(format!("https://localhost:{port}/breakers/relay/isolate"))
            .basic_auth("ops", Some(PASSWORD))
            .header("origin", origin)
            .form(&[("token", token.as_str())])
            .send()
    };
    let plain = isolate(format!("http://localhost:{port}"))
        .await
        .expect("an answer");
    assert_eq!(plain.status(), 403, "a form from http:// acted on https://");
    let same = isolate(format!("https://localhost:{port}"))
        .await
        .expect("an answer");
    assert_eq!(same.status(), 303);
}

#[test]
fn public_origin_errors_never_show_the_password_in_its_url() {
    let secret = "Hunter2-never-shown";
    for url in [
        format!("https://ops:{secret}@ops.example.com"),
        format!("https://ops:{secret}@ops example.com"),
        format!("https://ops:{secret}@ops.example.com/mail"),
    ] {
        let output = refused(
            &[
                "--listen",
                "127.0.0.1:0",
                "--read-only",
                "--public-origin",
                &url,
                "--dsn",
                DSN,
            ],
            &[],
        );
        assert_eq!(output.status.code(), Some(2), "{url}");
        for (stream, bytes) in [("stdout", &output.stdout), ("stderr", &output.stderr)] {
            let text = String::from_utf8_lossy(bytes);
            assert!(!text.contains(secret), "{url}: {stream} shows it: {text}");
        }
        let said = String::from_utf8_lossy(&output.stderr);
        assert!(said.contains("--public-origin"), "{url}");
        // The rest of the URL is shown as written, the user and password as `***`.
        assert!(said.contains("\"https://***@"), "{url}: {said}");
    }
}
