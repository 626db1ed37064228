//! The `cli` feature (what `cargo install mail-breaker --features cli` builds) reads every
//! DSN the crate reads: OAuth 2.0 members included (Microsoft 365, Gmail), through the
//! command built with `cli` alone. Run it so to see that, not with `--all-features`:
//! `cargo test --no-default-features --features cli --test cli_oauth`.

mod support;

use std::collections::BTreeSet;
use std::process::Output;
use std::time::Duration;

use assert_cmd::Command;
use support::aiosmtpd_oauth::{GOOD_TOKEN, OAuthSmtpd, Offered};
use support::http_api::{ApiServer, Reply};
use support::servers::report_skip;

const BIN: &str = env!("CARGO_BIN_EXE_mail-breaker");

/// The crate's features that `cli` leaves out, each with why the command needs none of it.
const NOT_IN_CLI: &[(&str, &str)] = &[
    ("default", "cli names the default features one by one"),
    (
        "metrics",
        "the command records no metrics: nothing scrapes a command that ends",
    ),
    (
        "tower",
        "the tower layer and services are for applications; the command sends through a Mailer",
    ),
];

/// The features `feature` turns on, itself included, following the crate's own features
/// (not its dependencies'), from `cargo metadata`.
fn closure(
    features: &serde_json::Map<String, serde_json::Value>,
    feature: &str,
) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut next = vec![feature.to_owned()];
    while let Some(name) = next.pop() {
        if !seen.insert(name.clone()) {
            continue;
        }
        for part in features[&name].as_array().into_iter().flatten() {
            let part = part.as_str().unwrap_or_default();
            if features.contains_key(part) {
                next.push(part.to_owned());
            }
        }
    }
    seen
}

#[test]
fn the_cli_feature_holds_every_feature_the_command_reads_oauth2_among_them() {
    let metadata = std::process::Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--offline",
            "--no-deps",
            "--format-version",
            "1",
        ])
        .args([
            "--manifest-path",
            concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"),
        ])
        .output()
        .expect("cargo metadata runs");
    if !metadata.status.success() {
        report_skip(&format!(
            "SKIPPED the_cli_feature_holds_every_feature_the_command_reads: cargo metadata \
             failed: {}",
            String::from_utf8_lossy(&metadata.stderr)
        ));
        return;
    }
    let metadata: serde_json::Value =
        serde_json::from_slice(&metadata.stdout).expect("cargo metadata writes JSON");
    let features = metadata["packages"][0]["features"]
        .as_object()
        .expect("the package's features");
    let in_cli = closure(features, "cli");
    let left_out: Vec<&str> = features
        .keys()
        .map(String::as_str)
        .filter(|name| !in_cli.contains(*name))
        .collect();
    let expected: Vec<&str> = NOT_IN_CLI.iter().map(|(name, _)| *name).collect();
    assert_eq!(
        left_out, expected,
        "a feature the command reads joins `cli`; one it does not goes in NOT_IN_CLI with why"
    );
    assert!(in_cli.contains("oauth2"));
}

fn run(args: &[&str]) -> Output {
    Command::new(BIN)
        .env_remove("MAILER_DSN")
        .env("NO_COLOR", "1")
        .args(args)
        .timeout(Duration::from_secs(60))
        .output()
        .expect("the mail-breaker binary runs")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_built_with_cli_sends_through_an_oauth2_member_of_a_dsn() {
    let test = "the_command_built_with_cli_sends_through_an_oauth2_member_of_a_dsn";
    let Some(server) = OAuthSmtpd::start_clear(test, Offered::Both) else {
        return;
    };
    let endpoint = ApiServer::start(|_| {
        Reply::json(
            200,
            &format!(r#"{{"access_token":"{GOOD_TOKEN}","expires_in":3600}}"#),
        )
    })
    .await;
    let dsn = format!(
        "smtp://mailer%40example.com@127.0.0.1:{}?tls=none&auth_without_tls=true&auth=xoauth2\
         &oauth2.token_url={}/token&oauth2.client_id=app-id&oauth2.client_secret=s3cret\
         &oauth2.scope=https://outlook.office365.com/.default&timeout=5s",
        server.port(),
        endpoint.endpoint()
    );
    let output = tokio::task::spawn_blocking(move || {
        run(&["test", "--to", "user@example.org", "--dsn", &dsn])
    })
    .await
    .expect("the command ran");

    let shown = format!(
        "{}{}\nserver log: {}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
        server.log()
    );
    assert_eq!(output.status.code(), Some(0), "{shown}");
    assert_eq!(
        server.tokens_seen(),
        vec![format!("XOAUTH2 {GOOD_TOKEN}")],
        "{shown}"
    );
    assert!(!shown.contains("s3cret"), "{shown}");
}

/// A token endpoint whose token grants `roles`, as a JWT Microsoft's would be read.
async fn graph_tokens(roles: &str) -> ApiServer {
    use base64::Engine;
    let part = |text: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(text);
    let token = format!(
        "{}.{}.sig",
        part(r#"{"alg":"RS256","typ":"JWT"}"#),
        part(&format!(
            r#"{{"aud":"https://graph.microsoft.com","roles":{roles}}}"#
        ))
    );
    ApiServer::start(move |_| {
        Reply::json(
            200,
            &format!(r#"{{"access_token":"{token}","expires_in":3599}}"#),
        )
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_on_a_graph_member_passes_a_token_granting_mail_send_and_reads_nothing_from_graph() {
    let graph = ApiServer::start(|_| Reply::text(500, "")).await;
    for (roles, ok) in [(r#"["Mail.Send"]"#, true), (r#"["User.Read.All"]"#, false)] {
        let tokens = graph_tokens(roles).await;
        let dsn = format!(
            "graph://app-id:s3cret@contoso.onmicrosoft.com?sender=app%40contoso.com\
             &graph.endpoint={}&oauth2.token_url={}/token",
            graph.endpoint(),
            tokens.endpoint()
        );
        let output = tokio::task::spawn_blocking(move || run(&["check", "--dsn", &dsn]))
            .await
            .expect("the command ran");
        let shown = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        assert_eq!(output.status.success(), ok, "{roles}: {shown}");
        if !ok {
            assert!(shown.contains("Mail.Send"), "{shown}");
        }
        assert!(!shown.contains("s3cret"), "{shown}");
    }
    assert_eq!(graph.request_count(), 0, "check reads nothing from Graph");
}
