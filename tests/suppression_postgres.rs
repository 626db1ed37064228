//! The suppression list's rules in a PostgreSQL outbox's database, a server of its own per
//! test; and that `keep` is all or nothing there.

mod support;

use mail_breaker::events::{BounceKind, EventSink};
use mail_breaker::outbox::Outbox;
use mail_breaker::suppression::SuppressionList;
use support::postgres::PostgresServer;
use support::suppression_rules::{Clock, bounce};

async fn open(test: &str) -> Option<(SuppressionList, PostgresServer)> {
    let server = PostgresServer::start(test)?;
    let outbox = Outbox::postgres(&server.url())
        .await
        .expect("a PostgreSQL outbox");
    let list = SuppressionList::in_outbox(&outbox).expect("the list in the outbox's database");
    Some((list, server))
}

all_suppression_rules!(open);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_is_all_or_nothing_on_postgres_an_event_that_cannot_be_kept_keeps_none_of_its_batch() {
    let Some(server) = PostgresServer::start("keep_is_all_or_nothing_on_postgres") else {
        return;
    };
    let outbox = Outbox::postgres(&server.url()).await.unwrap();
    let pool = sqlx::PgPool::connect(&server.url()).await.unwrap();
    for statement in [
        "CREATE FUNCTION refuse_boom() RETURNS trigger AS $$ BEGIN \
         IF NEW.recipient = 'boom@example.org' THEN RAISE EXCEPTION 'disk full'; END IF; \
         RETURN NEW; END $$ LANGUAGE plpgsql",
        "CREATE TRIGGER refuse_boom BEFORE INSERT ON mail_breaker_suppression_event \
         FOR EACH ROW EXECUTE FUNCTION refuse_boom()",
    ] {
        sqlx::query(statement).execute(&pool).await.unwrap();
    }
    let clock = Clock::new();
    let list = clock.drive(SuppressionList::in_outbox(&outbox).unwrap());
    let events = [
        bounce(
            "e-1",
            BounceKind::Permanent,
            "first@example.org",
            clock.now(),
        ),
        bounce(
            "e-2",
            BounceKind::Permanent,
            "boom@example.org",
            clock.now(),
        ),
    ];
    let error = list.keep(&events).await.unwrap_err();
    assert!(error.to_string().contains("disk full"), "{error}");
    assert!(!list.contains("first@example.org").await.unwrap());
    sqlx::query("DROP TRIGGER refuse_boom ON mail_breaker_suppression_event")
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(list.keep(&events).await.unwrap().new, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_transient_bounces_kept_at_once_by_three_receivers_still_suppress_the_address() {
    let Some(server) = PostgresServer::start("transient_bounces_kept_at_once") else {
        return;
    };
    let outbox = Outbox::postgres(&server.url()).await.unwrap();
    let clock = Clock::new();
    let list = clock.drive(SuppressionList::in_outbox(&outbox).unwrap());
    for round in 0..20 {
        let to = format!("full{round}@example.org");
        let keeps = (0..3).map(|n| {
            let list = list.clone();
            let event = bounce(
                &format!("t-{round}-{n}"),
                BounceKind::Transient,
                &to,
                clock.now(),
            );
            tokio::spawn(async move { list.keep(&[event]).await })
        });
        for kept in futures::future::join_all(keeps).await {
            assert_eq!(kept.unwrap().unwrap().new, 1);
        }
        assert!(
            list.contains(&to).await.unwrap(),
            "round {round}: three transient bounces kept at once are three"
        );
    }
}
