//! The rule every launcher in `tests/support` keeps: a server is ready when it has answered as
//! itself on its port, never when a bare TCP connect succeeds.

mod support;

use std::io::Read;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::thread;
use std::time::Duration;

use support::ready::{
    ServerProcess, http_answer, listening_ports, listens_on, redis_pong, smtp_greeting,
    wait_until_ready,
};

/// A plain listener that accepts every connection, reads what comes and says nothing: what a
/// port looks like when something else holds it, or when a connect meets itself.
fn silent_listener() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("binding a loopback port");
    let address = listener.local_addr().expect("a bound address");
    thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            thread::spawn(move || {
                let mut buffer = [0u8; 64];
                while matches!(stream.read(&mut buffer), Ok(n) if n > 0) {}
            });
        }
    });
    address
}

/// A process that runs until killed and listens nowhere.
fn idle_process() -> ServerProcess {
    let child = Command::new("sleep")
        .arg("60")
        .stdin(Stdio::null())
        .spawn()
        .expect("spawning sleep");
    ServerProcess::new(child)
}

#[test]
fn a_listener_that_accepts_and_says_nothing_is_not_an_smtp_server() {
    let address = silent_listener();
    // A bare connect succeeds there, which is why it never counts as ready.
    assert!(TcpStream::connect(address).is_ok());
    assert!(smtp_greeting(address).is_err());
}

#[test]
fn a_listener_that_accepts_and_says_nothing_is_not_a_redis_server() {
    let address = silent_listener();
    assert!(redis_pong(address).is_err());
}

#[test]
fn a_listener_that_accepts_and_says_nothing_is_not_an_http_server() {
    let address = silent_listener();
    assert!(http_answer(address).is_err());
}

#[test]
fn a_launcher_waiting_on_a_silent_port_gives_up_with_the_probes_last_answer() {
    let address = silent_listener();
    let mut process = idle_process();
    let outcome = wait_until_ready(
        "the test's server",
        &mut process,
        Duration::from_secs(1),
        || String::from("its log"),
        || smtp_greeting(address).map(drop),
    );
    let error = outcome.expect_err("a silent port is never ready");
    assert!(error.contains("did not answer"), "{error}");
    assert!(error.contains("its log"), "{error}");
}

#[test]
fn a_port_held_by_another_process_is_not_the_started_servers() {
    let address = silent_listener();
    let process = idle_process();
    assert!(!listens_on(process.id(), address.port()));
    assert!(listening_ports(process.id()).is_empty());
}

#[test]
fn the_port_a_process_listens_on_is_read_from_the_system() {
    if std::fs::metadata("/proc/net/tcp").is_err() {
        support::servers::report_skip("SKIPPED: no /proc to read listening sockets from");
        return;
    }
    let address = silent_listener();
    assert!(listens_on(std::process::id(), address.port()));
}

#[test]
fn a_server_that_exits_at_start_fails_the_wait_at_once_with_its_log() {
    let child = Command::new("false").spawn().expect("spawning false");
    let mut process = ServerProcess::new(child);
    let outcome = wait_until_ready(
        "the test's server",
        &mut process,
        Duration::from_secs(60),
        || String::from("why it exited"),
        || Err(String::from("not yet")),
    );
    let error = outcome.expect_err("an exited server is never ready");
    assert!(error.contains("exited"), "{error}");
    assert!(error.contains("why it exited"), "{error}");
}

#[test]
fn a_greeting_that_is_not_220_is_not_ready() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("binding a loopback port");
    let address = listener.local_addr().expect("a bound address");
    thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let _ = std::io::Write::write_all(&mut stream, b"554 no service\r\n");
        }
    });
    let error = smtp_greeting(address).expect_err("554 is not a greeting");
    assert!(error.contains("554"), "{error}");
}

#[test]
fn a_free_port_refuses_connections_when_handed_out_while_other_threads_spawn_processes() {
    // A process forked by another thread holds a copy of every listener open at that moment
    // until it execs: a port found free by binding and closing a listener can still accept a
    // connection then. The port handed out must refuse one.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let spawners: Vec<_> = (0..3)
        .map(|_| {
            let stop = stop.clone();
            thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let _ = Command::new("true").status();
                }
            })
        })
        .collect();
    let accepted = (0..3000)
        .filter(|_| {
            let port = support::servers::free_port();
            TcpStream::connect_timeout(
                &SocketAddr::from(([127, 0, 0, 1], port)),
                Duration::from_millis(200),
            )
            .is_ok()
        })
        .count();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for spawner in spawners {
        let _ = spawner.join();
    }
    assert_eq!(accepted, 0, "free ports that accepted a connection");
}

#[test]
fn a_restarted_counting_sink_keeps_every_message_both_runs_took() {
    // smtp-sink names each dump with a pseudo-random suffix; a restart that drew the names of
    // the first run would find them taken and stop at its first message.
    use mail_breaker::{Message, SmtpTransport, Transport};
    let Some(mut sink) = support::smtp_sink::SmtpSink::start_counting("sink_restart", &[]) else {
        return;
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let send = |port: u16, first: usize| {
        runtime.block_on(async {
            let smtp =
                SmtpTransport::unencrypted("127.0.0.1", port).with_timeout(Duration::from_secs(5));
            for n in first..first + 300 {
                let message = Message::builder()
                    .from("app@example.com".parse().expect("a sender"))
                    .to("user@example.org".parse().expect("a recipient"))
                    .subject(format!("restart {n}"))
                    .body(format!("body {n}"))
                    .expect("a message");
                if let Err(error) = smtp.send(&message).await {
                    return Err(format!("message {n}: {error}"));
                }
            }
            Ok(())
        })
    };
    send(sink.port(), 0).expect("the first run takes every message");
    sink.restart();
    let second = send(sink.port(), 300);
    assert!(second.is_ok(), "{second:?}\n{}", sink.log());
    assert_eq!(sink.received(), 600);
}
