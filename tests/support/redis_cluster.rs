//! A real Redis Cluster on loopback: `redis-server --cluster-enabled yes` nodes on free ports,
//! joined with `redis-cli --cluster create`, killed and their files removed when dropped.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::ready::{ServerProcess, listens_on, redis_pong, wait_until_ready};
use super::servers::{free_port, report_skip, require_program, under_ci};

/// One node of the cluster.
#[derive(Debug)]
struct Node {
    port: u16,
    child: Option<ServerProcess>,
}

/// A Redis Cluster of child processes on 127.0.0.1, without persistence.
#[derive(Debug)]
pub struct RedisCluster {
    cli: PathBuf,
    nodes: Vec<Node>,
    dir: PathBuf,
}

impl RedisCluster {
    /// Three masters and no replica; `None` (after printing SKIPPED) where redis-server or
    /// redis-cli is missing, a panic under CI.
    pub fn start(test: &str) -> Option<RedisCluster> {
        RedisCluster::start_with(test, 3, 0, Duration::from_secs(5))
    }

    /// `masters` masters with `replicas` replicas each; a node that does not answer for
    /// `node_timeout` is failed over by its replica.
    pub fn start_with(
        test: &str,
        masters: usize,
        replicas: usize,
        node_timeout: Duration,
    ) -> Option<RedisCluster> {
        let server = require_program("redis-server", test)?;
        let cli = require_program("redis-cli", test)?;
        let dir = std::env::temp_dir().join(format!(
            "mail-breaker-cluster-{}-{}",
            std::process::id(),
            free_port()
        ));
        std::fs::create_dir_all(&dir).expect("a folder for the cluster's files");
        let mut cluster = RedisCluster {
            cli,
            nodes: Vec::new(),
            dir,
        };
        for _ in 0..masters * (1 + replicas) {
            let node = cluster.spawn(&server, node_timeout);
            cluster.nodes.push(node);
        }
        let mut create = Command::new(&cluster.cli);
        create.args(["--cluster", "create"]);
        for node in &cluster.nodes {
            create.arg(format!("127.0.0.1:{}", node.port));
        }
        let output = create
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .expect("running redis-cli --cluster create");
        if !output.status.success() {
            let why = format!(
                "{test}: redis-cli --cluster create failed: {}",
                String::from_utf8_lossy(&output.stdout)
            );
            assert!(!under_ci(), "{why}");
            report_skip(&format!("SKIPPED {why}"));
            return None;
        }
        cluster.wait_until_healthy(Duration::from_secs(30));
        Some(cluster)
    }

    /// The URL of each node.
    pub fn urls(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|node| format!("redis://127.0.0.1:{}/", node.port))
            .collect()
    }

    /// The ports of the masters that serve slots now, as the cluster says.
    pub fn master_ports(&self) -> Vec<u16> {
        let Some(live) = self.nodes.iter().find(|node| node.child.is_some()) else {
            return Vec::new();
        };
        let nodes = self.cli(live.port, &["CLUSTER", "NODES"]);
        let mut ports: Vec<u16> = nodes
            .lines()
            .filter(|line| {
                let flags = line.split_whitespace().nth(2).unwrap_or("");
                flags.contains("master")
                    && !flags.contains("fail")
                    && line.split_whitespace().count() > 8
            })
            .filter_map(|line| {
                let address = line.split_whitespace().nth(1)?;
                address.split(['@', ':']).nth(1)?.parse().ok()
            })
            .collect();
        ports.sort_unstable();
        ports
    }

    /// The port of the master that holds `key` now.
    pub fn master_of(&self, key: &str) -> u16 {
        let live = self
            .nodes
            .iter()
            .find(|node| node.child.is_some())
            .expect("a live node");
        let slot: u16 = self
            .cli(live.port, &["CLUSTER", "KEYSLOT", key])
            .trim()
            .parse()
            .expect("a slot number");
        let slots = self.cli(live.port, &["CLUSTER", "NODES"]);
        for line in slots.lines() {
            let words: Vec<&str> = line.split_whitespace().collect();
            if words.len() < 9 || !words[2].contains("master") {
                continue;
            }
            let owns = words[8..].iter().any(|range| {
                let mut ends = range.split('-').filter_map(|end| end.parse::<u16>().ok());
                match (ends.next(), ends.next()) {
                    (Some(start), Some(end)) => (start..=end).contains(&slot),
                    (Some(only), None) => only == slot,
                    _ => false,
                }
            });
            if owns {
                let address = words[1];
                return address
                    .split(['@', ':'])
                    .nth(1)
                    .and_then(|port| port.parse().ok())
                    .expect("a node address");
            }
        }
        panic!("no master holds slot {slot}");
    }

    /// How many keys the node on `port` holds.
    pub fn keys_on(&self, port: u16) -> usize {
        self.cli(port, &["DBSIZE"]).trim().parse().unwrap_or(0)
    }

    /// Kills the node on `port` at once (SIGKILL), as a crash would.
    pub fn kill(&mut self, port: u16) {
        for node in &mut self.nodes {
            if node.port == port
                && let Some(mut process) = node.child.take()
            {
                process.kill();
            }
        }
    }

    /// Waits until every live node says the cluster is `ok` and each live replica is in sync
    /// with its master, up to `limit`: after a start, or after a master was killed and its
    /// replica took over.
    pub fn wait_until_healthy(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            let healthy = self
                .nodes
                .iter()
                .filter(|node| node.child.is_some())
                .all(|node| {
                    let replication = self.cli(node.port, &["INFO", "replication"]);
                    self.cli(node.port, &["CLUSTER", "INFO"])
                        .contains("cluster_state:ok")
                        && (replication.contains("role:master")
                            || replication.contains("master_link_status:up"))
                });
            if healthy {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the cluster was not healthy within {limit:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn cli(&self, port: u16, args: &[&str]) -> String {
        let output = Command::new(&self.cli)
            .args(["-h", "127.0.0.1", "-p", &port.to_string()])
            .args(args)
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output()
            .expect("running redis-cli");
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    fn spawn(&self, server: &PathBuf, node_timeout: Duration) -> Node {
        let mut why = String::new();
        for _ in 0..5 {
            let (port, bus) = (free_port(), free_port());
            let child = Command::new(server)
                .args(["--port", &port.to_string()])
                .args(["--cluster-port", &bus.to_string()])
                .args(["--bind", "127.0.0.1"])
                .args(["--cluster-enabled", "yes"])
                .args(["--cluster-config-file", &format!("nodes-{port}.conf")])
                .args([
                    "--cluster-node-timeout",
                    &node_timeout.as_millis().to_string(),
                ])
                .args(["--dir", &self.dir.to_string_lossy()])
                .args(["--save", ""])
                // Replicas sync at once (the default waits 5 s for more replicas), and a
                // replica may take over however long it was cut off, so a failover in a test
                // never depends on how busy the machine was.
                .args(["--repl-diskless-sync-delay", "0"])
                .args(["--cluster-replica-validity-factor", "0"])
                .args(["--appendonly", "no"])
                .args(["--logfile", &format!("node-{port}.log")])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawning redis-server");
            // Owned before the wait: a failed wait still kills it. The node is ready when it
            // answers PING and the listener on its port is this process's.
            let mut process = ServerProcess::new(child);
            let (pid, address) = (process.id(), SocketAddr::from(([127, 0, 0, 1], port)));
            let log_file = self.dir.join(format!("node-{port}.log"));
            let log = || std::fs::read_to_string(&log_file).unwrap_or_default();
            // Patient: other tests start their servers on the same two cores.
            match wait_until_ready(
                "a cluster node",
                &mut process,
                Duration::from_secs(15),
                log,
                || {
                    redis_pong(address)?;
                    if listens_on(pid, port) {
                        Ok(())
                    } else {
                        Err(format!("port {port} is not this node's"))
                    }
                },
            ) {
                Ok(()) => {
                    return Node {
                        port,
                        child: Some(process),
                    };
                }
                // Another process took a port: try others.
                Err(error) => why = error,
            }
        }
        panic!("a cluster node did not start on any of 5 pairs of free ports; last: {why}");
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            if let Some(mut process) = node.child.take() {
                process.kill();
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
