//! A worker's own connections: a fixed number, each used by one statement (or transaction) at
//! a time and handed back only when it succeeded.
//!
//! sqlx's pool pings every connection it gets back, in a task of its own, before anyone may
//! use it again: a round trip per statement that a worker's claims and answers would wait on
//! (on SQLite, where they share one connection, every statement would wait for the last
//! one's ping). A lane instead trusts a connection whose statement succeeded, and closes one
//! whose statement failed or was dropped mid-way, so that the next use opens a fresh one.

use std::fmt;
use std::sync::Mutex;

use futures::future::BoxFuture;
use tokio::sync::{Semaphore, SemaphorePermit};

/// Opens a connection for a lane.
pub(crate) type Connect<C> =
    Box<dyn Fn() -> BoxFuture<'static, Result<C, sqlx::Error>> + Send + Sync>;

/// Up to a fixed number of connections in use at once; the rest wait their turn, first come
/// first served.
pub(crate) struct Lanes<C> {
    turns: Semaphore,
    idle: Mutex<Vec<C>>,
    connect: Connect<C>,
}

impl<C> fmt::Debug for Lanes<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lanes")
            .field("free", &self.turns.available_permits())
            .finish_non_exhaustive()
    }
}

impl<C: Send> Lanes<C> {
    /// `lanes` connections at most (at least one), each opened by `connect` when first needed.
    pub(crate) fn new(lanes: usize, connect: Connect<C>) -> Lanes<C> {
        Lanes {
            turns: Semaphore::new(lanes.max(1)),
            idle: Mutex::new(Vec::new()),
            connect,
        }
    }

    /// Keeps an open connection for the next use.
    pub(crate) fn give(&self, connection: C) {
        self.idle
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(connection);
    }

    /// Waits for a free lane, and its connection (opened now if it has none).
    pub(crate) async fn get(&self) -> Result<Lane<'_, C>, sqlx::Error> {
        let turn = self
            .turns
            .acquire()
            .await
            .map_err(|_| sqlx::Error::PoolClosed)?;
        let idle = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let connection = match idle {
            Some(connection) => connection,
            None => (self.connect)().await?,
        };
        Ok(Lane {
            lanes: self,
            connection: Some(connection),
            _turn: turn,
        })
    }
}

/// A lane in use. [`done`](Self::done) hands its connection back; dropped without it (an
/// error, or a future dropped mid-statement), the connection is closed.
pub(crate) struct Lane<'a, C> {
    lanes: &'a Lanes<C>,
    connection: Option<C>,
    _turn: SemaphorePermit<'a>,
}

impl<C: Send> Lane<'_, C> {
    /// The connection, for one statement or transaction.
    pub(crate) fn connection(&mut self) -> &mut C {
        self.connection
            .as_mut()
            .expect("held until done or dropped")
    }

    /// Hands the connection back for the next use: its statement succeeded.
    pub(crate) fn done(mut self) {
        if let Some(connection) = self.connection.take() {
            self.lanes.give(connection);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Lanes whose connections are numbers, counting how many were opened.
    fn counted(lanes: usize) -> (Lanes<usize>, Arc<AtomicUsize>) {
        let opened = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&opened);
        let connect: Connect<usize> = Box::new(move || {
            let number = counter.fetch_add(1, Ordering::SeqCst);
            Box::pin(async move { Ok(number) })
        });
        (Lanes::new(lanes, connect), opened)
    }

    #[tokio::test]
    async fn a_connection_handed_back_is_used_again_without_opening_another() {
        let (lanes, opened) = counted(1);
        let lane = lanes.get().await.expect("a lane");
        lane.done();
        let mut lane = lanes.get().await.expect("a lane");
        assert_eq!(*lane.connection(), 0);
        assert_eq!(opened.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_connection_dropped_without_done_is_replaced_by_a_new_one() {
        let (lanes, opened) = counted(1);
        drop(lanes.get().await.expect("a lane"));
        let mut lane = lanes.get().await.expect("a lane");
        assert_eq!(*lane.connection(), 1);
        assert_eq!(opened.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn no_more_lanes_are_in_use_at_once_than_there_are() {
        let (lanes, _) = counted(2);
        let first = lanes.get().await.expect("a lane");
        let _second = lanes.get().await.expect("a lane");
        let third = lanes.get();
        tokio::pin!(third);
        assert!(futures::poll!(third.as_mut()).is_pending());
        first.done();
        let mut third = third.await.expect("a lane after one is free");
        assert_eq!(*third.connection(), 0, "the connection handed back");
    }

    #[tokio::test]
    async fn zero_lanes_is_taken_as_one() {
        let (lanes, _) = counted(0);
        let lane = lanes.get().await.expect("one lane");
        let second = lanes.get();
        tokio::pin!(second);
        assert!(futures::poll!(second.as_mut()).is_pending());
        drop(lane);
        assert!(second.await.is_ok());
    }

    #[tokio::test]
    async fn lanes_say_how_many_are_free_when_debugged() {
        let (lanes, _) = counted(2);
        let _lane = lanes.get().await.expect("a lane");
        assert_eq!(format!("{lanes:?}"), "Lanes { free: 1, .. }");
    }

    #[tokio::test]
    async fn a_failed_connect_takes_no_lane() {
        let connect: Connect<usize> =
            Box::new(|| Box::pin(async { Err(sqlx::Error::PoolTimedOut) }));
        let lanes = Lanes::new(1, connect);
        assert!(lanes.get().await.is_err());
        assert!(lanes.get().await.is_err(), "the lane is free again");
    }
}
