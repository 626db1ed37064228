//! The suppression list's rules in Redis, a server of its own per test.

mod support;

use mail_breaker::RedisStore;
use mail_breaker::suppression::SuppressionList;
use support::redis::RedisServer;

async fn open(test: &str) -> Option<(SuppressionList, RedisServer)> {
    let server = RedisServer::start(test)?;
    let store = RedisStore::connect(&server.url())
        .await
        .expect("a Redis store");
    Some((SuppressionList::redis(&store), server))
}

all_suppression_rules!(open);
