//! The store's way to Redis: one server through a `ConnectionManager`, or a Redis Cluster
//! through redis-rs's cluster client, behind one type so that the rest of the store is the
//! same for both.
//!
//! Every breaker key has one hash tag, so each script call touches one slot: the cluster
//! client sends it to the master that owns the slot, follows MOVED and ASK, and answers
//! NOSCRIPT by loading the script on every node before it tries again. Only SCAN needs to
//! know the cluster's shape, since each master holds its own share of the keys.

use std::time::Duration;

use ::redis::aio::{ConnectionLike, ConnectionManager};
use ::redis::cluster_async::ClusterConnection;
use ::redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use ::redis::{Cmd, Pipeline, RedisError, RedisFuture, Value};

/// A connection to one Redis server or to a Redis Cluster; cheap to clone, each clone sharing
/// the same sockets.
#[derive(Clone)]
pub(crate) enum Connection {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

/// Where one SCAN runs: the one server, or one master of a cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum ScanTarget {
    Server,
    Master { host: String, port: u16 },
}

impl Connection {
    /// A cluster connection that connects in the background: a cluster that cannot be reached
    /// yet is not an error, as for one server.
    /// `certificates`: the authority to trust over TLS, instead of the system's.
    pub(super) fn cluster(
        urls: &[&str],
        timeout: Duration,
        certificates: Option<::redis::TlsCertificates>,
    ) -> Result<Connection, RedisError> {
        let mut builder = ::redis::cluster::ClusterClient::builder(urls.iter().copied());
        if let Some(certificates) = certificates {
            builder = builder.certs(certificates);
        }
        let client = builder
            .connection_timeout(timeout)
            .response_timeout(timeout)
            // Few and quick retries: the store's own timeout bounds each call anyway, and a
            // call that outlives it is settled in the background.
            .retries(2)
            .min_retry_wait(50)
            .max_retry_wait(500)
            .build()?;
        let config = ::redis::cluster::ClusterConfig::new()
            .set_connection_timeout(timeout)
            .set_response_timeout(timeout);
        Ok(Connection::Cluster(
            client.get_pending_async_connection_with_config(config),
        ))
    }

    /// Every place a SCAN must run to see every key: the server, or each master of the
    /// cluster as the cluster says now (`CLUSTER SLOTS`).
    pub(super) async fn scan_targets(&mut self) -> Result<Vec<ScanTarget>, RedisError> {
        let Connection::Cluster(cluster) = self else {
            return Ok(vec![ScanTarget::Server]);
        };
        let slots = cluster
            .route_command(
                ::redis::cmd("CLUSTER").arg("SLOTS").clone(),
                RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
            )
            .await?;
        Ok(masters_of(&slots))
    }

    /// One step of `SCAN cursor MATCH pattern COUNT count` on `target`: the next cursor and
    /// the names found.
    pub(super) async fn scan(
        &mut self,
        target: &ScanTarget,
        cursor: u64,
        pattern: &str,
    ) -> Result<(u64, Vec<String>), RedisError> {
        let mut scan = ::redis::cmd("SCAN");
        scan.arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(500);
        match (self, target) {
            (Connection::Cluster(cluster), ScanTarget::Master { host, port }) => {
                let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                    host: host.clone(),
                    port: *port,
                });
                let value = cluster.route_command(scan, routing).await?;
                Ok(::redis::from_redis_value(value)?)
            }
            (connection, _) => scan.query_async(connection).await,
        }
    }
}

/// The masters named in a `CLUSTER SLOTS` reply: each entry is `[start, end, [host, port,
/// id, ...], replicas...]`. A master that owns several ranges is named once.
fn masters_of(slots: &Value) -> Vec<ScanTarget> {
    let mut masters = Vec::new();
    let Value::Array(ranges) = slots else {
        return masters;
    };
    for range in ranges {
        let Value::Array(parts) = range else { continue };
        let Some(Value::Array(master)) = parts.get(2) else {
            continue;
        };
        let host = match master.first() {
            Some(Value::BulkString(bytes)) => String::from_utf8_lossy(bytes).into_owned(),
            Some(Value::SimpleString(text)) => text.clone(),
            _ => continue,
        };
        let Some(Value::Int(port)) = master.get(1) else {
            continue;
        };
        let Ok(port) = u16::try_from(*port) else {
            continue;
        };
        let target = ScanTarget::Master { host, port };
        if !masters.contains(&target) {
            masters.push(target);
        }
    }
    masters
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Connection::Single(single) => single.req_packed_command(cmd),
            Connection::Cluster(cluster) => cluster.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Connection::Single(single) => single.req_packed_commands(pipeline, offset, count),
            Connection::Cluster(cluster) => cluster.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Single(single) => single.get_db(),
            Connection::Cluster(cluster) => cluster.get_db(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(host: &str, port: i64) -> Value {
        Value::Array(vec![
            Value::BulkString(host.as_bytes().to_vec()),
            Value::Int(port),
            Value::BulkString(b"id".to_vec()),
        ])
    }

    #[test]
    fn each_master_of_a_slots_reply_is_scanned_once() {
        let reply = Value::Array(vec![
            Value::Array(vec![
                Value::Int(0),
                Value::Int(5460),
                node("127.0.0.1", 7000),
                node("127.0.0.1", 7003),
            ]),
            Value::Array(vec![
                Value::Int(5461),
                Value::Int(10922),
                node("127.0.0.1", 7001),
            ]),
            Value::Array(vec![
                Value::Int(10923),
                Value::Int(10923),
                node("127.0.0.1", 7000),
            ]),
            Value::Array(vec![Value::Int(1)]),
        ]);
        assert_eq!(
            masters_of(&reply),
            [
                ScanTarget::Master {
                    host: "127.0.0.1".to_owned(),
                    port: 7000
                },
                ScanTarget::Master {
                    host: "127.0.0.1".to_owned(),
                    port: 7001
                },
            ]
        );
        assert!(masters_of(&Value::Nil).is_empty());
    }

    #[test]
    fn a_master_named_by_a_simple_string_is_scanned_too() {
        let reply = Value::Array(vec![Value::Array(vec![
            Value::Int(0),
            Value::Int(16383),
            Value::Array(vec![
                Value::SimpleString("10.0.0.5".to_owned()),
                Value::Int(6379),
            ]),
        ])]);
        assert_eq!(
            masters_of(&reply),
            [ScanTarget::Master {
                host: "10.0.0.5".to_owned(),
                port: 6379
            }]
        );
    }

    #[test]
    fn a_slot_range_without_a_usable_master_is_passed_over() {
        let range = |master: Value| Value::Array(vec![Value::Int(0), Value::Int(16383), master]);
        let reply = Value::Array(vec![
            range(Value::Array(vec![Value::Int(1), Value::Int(6379)])),
            range(Value::Array(vec![
                Value::SimpleString("h".to_owned()),
                Value::Int(70_000),
            ])),
            range(Value::Array(vec![Value::SimpleString("h".to_owned())])),
            range(Value::Nil),
            Value::Int(3),
        ]);
        assert!(masters_of(&reply).is_empty());
    }
}
