//! `mail-breaker reputation [reset MEMBER]` (issue 64), driven as `tests/cli.rs` drives the
//! command: the built binary against a redis-server the application shares and an in-test
//! SESv2 endpoint answering `GetAccount`; its exit codes, table and JSON checked, and what
//! it changed read back through the application's own breaker.
#![cfg(all(
    feature = "cli",
    feature = "ses",
    feature = "webhooks",
    feature = "redis"
))]

mod support;

use std::process::Output;
use std::sync::Once;
use std::time::Duration;

use assert_cmd::Command;
use mail_breaker::config::Mailer;
use mail_breaker::reputation::Tier;
use mail_breaker::{Message, Transport};
use serde_json::Value;
use support::redis::RedisServer;
use support::servers::free_port;
use support::ses_faults::{Fault, FaultServer};

const BIN: &str = env!("CARGO_BIN_EXE_mail-breaker");
const ACCESS_KEY: &str = "AKIDTESTONLY";
/// The AWS secret, which no output may show.
const SECRET_KEY: &str = "test-secret-never-shown-0123";

/// The application in this process reads SES's keys from the environment, as the command does.
fn aws_keys() {
    static KEYS: Once = Once::new();
    KEYS.call_once(|| {
        // SAFETY: set once, before any test of this file reads the environment, with the
        // same values for all.
        unsafe {
            std::env::set_var("AWS_ACCESS_KEY_ID", ACCESS_KEY);
            std::env::set_var("AWS_SECRET_ACCESS_KEY", SECRET_KEY);
        }
    });
}

fn run(args: &[&str]) -> Output {
    let output = Command::new(BIN)
        .env_remove("MAILER_DSN")
        .env("NO_COLOR", "1")
        .env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
        .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
        .args(args)
        .timeout(Duration::from_secs(120))
        .output()
        .expect("the mail-breaker binary runs");
    for bytes in [&output.stdout, &output.stderr] {
        assert!(
            !String::from_utf8_lossy(bytes).contains(SECRET_KEY),
            "{args:?} printed the secret"
        );
    }
    output
}

fn code(output: &Output) -> i32 {
    output.status.code().unwrap_or(-1)
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn json(output: &Output) -> Value {
    serde_json::from_slice(&output.stdout).unwrap_or_else(|error| {
        panic!(
            "not one JSON document ({error}): {}\nstderr: {}",
            stdout(output),
            stderr(output)
        )
    })
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
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

/// 10 sends make a volume; warn at 5 % of hard bounces, open at 30 %.
const REPUTATION: &str = "reputation.hard_bounces.min_sends=10&reputation.complaints.min_sends=10\
     &reputation.window_sends=20&reputation.buckets=2\
     &reputation.hard_bounces.warn=5%25&reputation.hard_bounces.throttle=20%25\
     &reputation.hard_bounces.open=30%25";

/// An SES member named `ses` at `endpoint` with a reputation breaker, shared through `redis`
/// under `namespace`.
fn dsn(endpoint: &str, redis: &str, namespace: &str) -> String {
    format!(
        "ses://us-east-1?endpoint={endpoint}&name=ses&{REPUTATION}&redis={redis}\
         &redis.namespace={namespace}"
    )
}

/// The application: `sends` messages through it, then `bounces` permanent bounces heard for
/// its member.
async fn application(dsn: &str, sends: usize, bounces: usize) -> Mailer {
    aws_keys();
    let mailer = Mailer::from_dsn(dsn).unwrap().build().await.unwrap();
    for n in 0..sends {
        let message = Message::builder()
            .from("app@example.com".parse().unwrap())
            .to(format!("user{n}@example.org").parse().unwrap())
            .subject("hello")
            .body(String::from("hello"))
            .unwrap();
        mailer.send(&message).await.unwrap();
    }
    mailer
        .reputation("ses")
        .unwrap()
        .record(&support::hard_bounces("ses", bounces))
        .await
        .unwrap();
    mailer
}

#[test]
fn reputation_json_shows_each_members_tier_rates_sends_thresholds_and_its_ses_account_status() {
    let Some(redis) = RedisServer::start("cli_reputation_json") else {
        return;
    };
    let runtime = runtime();
    for status in ["HEALTHY", "PROBATION", "SHUTDOWN"] {
        let server = runtime.block_on(FaultServer::start(account(status)));
        let dsn = dsn(
            &server.endpoint(),
            &redis.url(),
            &format!("cli-rep-{status}"),
        );
        let _application = runtime.block_on(application(&dsn, 10, 1));

        let output = run(&["reputation", "--json", "--dsn", &dsn]);
        assert_eq!(code(&output), 0, "{status}: {}", stderr(&output));
        let read = json(&output);
        let ses = &read["reputation"][0];
        assert_eq!(ses["member"], "ses", "{read}");
        assert_eq!(ses["tier"], "warn", "{read}");
        assert_eq!(ses["sends"], 10, "{read}");
        assert_eq!(ses["hard_bounces"], 1, "{read}");
        assert_eq!(ses["hard_bounce_rate"], 0.1, "{read}");
        assert_eq!(ses["complaint_rate"], 0.0, "{read}");
        assert_eq!(ses["thresholds"]["hard_bounces"]["open_percent"], 30.0);
        assert_eq!(ses["thresholds"]["complaints"]["minimum_sends"], 10);
        assert_eq!(ses["ses"]["enforcement"], status, "{read}");
        assert_eq!(ses["ses"]["sending_enabled"], status != "SHUTDOWN");

        let output = run(&["reputation", "--dsn", &dsn]);
        assert_eq!(code(&output), 0, "{status}: {}", stderr(&output));
        let table = stdout(&output);
        assert!(table.contains("MEMBER"), "{table}");
        let row = table
            .lines()
            .find(|line| line.trim_start().starts_with("ses"))
            .unwrap_or("");
        for shown in ["warn", "10.00 % (1)", status] {
            assert!(row.contains(shown), "{status}: {shown} in {table}");
        }
    }
}

#[test]
fn reputation_of_an_ses_account_that_cannot_be_read_shows_unknown_with_why_and_exits_0() {
    let Some(redis) = RedisServer::start("cli_reputation_unknown") else {
        return;
    };
    let runtime = runtime();
    let server = runtime.block_on(FaultServer::start(Fault::ses_error(
        403,
        "AccessDeniedException",
        // A JSON escape: SES's message, once read, holds the terminal's control.
        "not allowed \\u001b[2J to GetAccount",
    )));
    let dsn = dsn(&server.endpoint(), &redis.url(), "cli-rep-unknown");
    let output = run(&["reputation", "--json", "--dsn", &dsn]);
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    let read = json(&output);
    assert_eq!(read["reputation"][0]["ses"]["enforcement"], "unknown");
    let why = read["reputation"][0]["ses"]["error"].as_str().unwrap_or("");
    assert!(why.contains("AccessDenied"), "{read}");
    let output = run(&["reputation", "--dsn", &dsn]);
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    let table = stdout(&output);
    assert!(table.contains("unknown"), "{table}");
    assert!(table.contains("AccessDenied"), "{table}");
    assert!(
        !table.contains('\u{1b}') && table.contains("\\u{1b}[2J"),
        "a server's text reaches the terminal escaped: {table:?}"
    );
}

#[test]
fn reputation_reset_closes_an_open_breaker_for_the_application_through_redis() {
    let Some(redis) = RedisServer::start("cli_reputation_reset") else {
        return;
    };
    let runtime = runtime();
    let server = runtime.block_on(FaultServer::start(account("HEALTHY")));
    let dsn = dsn(&server.endpoint(), &redis.url(), "cli-rep-reset");
    let application = runtime.block_on(application(&dsn, 10, 3));
    let breaker = application.reputation("ses").unwrap();
    let standing = || runtime.block_on(breaker.standing()).unwrap();
    assert_eq!(standing().tier, Tier::Open);
    let listed = json(&run(&["reputation", "--json", "--dsn", &dsn]));
    assert_eq!(listed["reputation"][0]["tier"], "open", "{listed}");

    let output = run(&["reputation", "reset", "ses", "--dsn", &dsn]);
    assert_eq!(code(&output), 0, "{}{}", stdout(&output), stderr(&output));
    assert!(stdout(&output).contains("reset"), "{}", stdout(&output));
    assert_eq!(
        standing().tier,
        Tier::Healthy,
        "the application's breaker closed"
    );
    assert_eq!(standing().window.sends, 0, "its counts cleared");

    let output = run(&["reputation", "reset", "ses", "--json", "--dsn", &dsn]);
    assert_eq!(code(&output), 0);
    let done = json(&output);
    assert_eq!(done["action"], "reset");
    assert_eq!(done["reputation"]["tier"], "healthy", "{done}");
}

#[test]
fn reputation_reset_of_a_member_without_a_reputation_breaker_exits_2_and_names_those_with_one() {
    let Some(redis) = RedisServer::start("cli_reputation_unknown_member") else {
        return;
    };
    let runtime = runtime();
    let server = runtime.block_on(FaultServer::start(account("HEALTHY")));
    let dsn = dsn(&server.endpoint(), &redis.url(), "cli-rep-nobody");
    let output = run(&["reputation", "reset", "nobody", "--dsn", &dsn]);
    assert_eq!(code(&output), 2);
    assert!(stderr(&output).contains("ses"), "{}", stderr(&output));
}

#[test]
fn reputation_reset_on_the_in_memory_store_exits_2_and_says_it_reaches_this_process_only() {
    let dsn = format!("smtp://127.0.0.1:{}?name=relay&{REPUTATION}", free_port());
    let output = run(&["reputation", "reset", "relay", "--dsn", &dsn]);
    assert_eq!(code(&output), 2);
    assert!(
        stderr(&output).contains("this process only"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn reputation_on_the_in_memory_store_shows_no_counts_and_says_why() {
    let dsn = format!("smtp://127.0.0.1:{}?name=relay&{REPUTATION}", free_port());
    let output = run(&["reputation", "--json", "--dsn", &dsn]);
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    let read = json(&output);
    assert_eq!(read["shared"], false, "{read}");
    assert_eq!(read["reputation"][0]["member"], "relay");
    assert_eq!(read["reputation"][0]["tier"], Value::Null, "{read}");
    assert_eq!(read["reputation"][0]["ses"], Value::Null, "{read}");
    let output = run(&["reputation", "--dsn", &dsn]);
    assert_eq!(code(&output), 0);
    assert!(
        stderr(&output).contains("this process only"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn reputation_with_its_redis_down_exits_4_and_says_what_it_could_not_read() {
    let dsn = format!(
        "smtp://127.0.0.1:{}?name=relay&{REPUTATION}&redis=redis://127.0.0.1:{}/",
        free_port(),
        free_port()
    );
    for args in [
        &["reputation", "--dsn", &dsn][..],
        &["reputation", "reset", "relay", "--dsn", &dsn][..],
    ] {
        let output = run(args);
        assert_eq!(
            code(&output),
            4,
            "{args:?}: {}{}",
            stdout(&output),
            stderr(&output)
        );
    }
}

#[test]
fn reputation_of_a_configuration_without_reputation_breakers_exits_2_saying_how_to_add_one() {
    let dsn = format!("smtp://127.0.0.1:{}?name=relay", free_port());
    let output = run(&["reputation", "--dsn", &dsn]);
    assert_eq!(code(&output), 2);
    assert!(
        stderr(&output).contains("reputation."),
        "{}",
        stderr(&output)
    );
}
