//! `send_many` through a breaker: while closed, messages flow into one batch of the inner
//! transport; a message the breaker holds back ends that batch and is answered in place.
//!
//! The caller's stream feeds two readers that never read at once: the inner transport's
//! batch (through [`batch_input`]) while a batch runs, and the output between batches. The
//! tickets of the messages the inner transport has read wait in order for their answers.

use std::collections::VecDeque;
use std::future::poll_fn;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use futures::StreamExt;
use futures::stream;

use super::gate::{Gate, Ticket};
use crate::transport::unanswered;
use crate::{Message, MessageStream, Receipt, ReceiptStream, SendError, Transport};

struct Feed<'a> {
    source: MessageStream<'a>,
    /// The message that starts the next inner batch; its ticket is already queued.
    first: Option<Message>,
    /// A message the breaker held back inside a batch, to be decided again by the output.
    held: Option<Message>,
    /// The tickets of the messages handed to the inner transport and not yet answered.
    tickets: VecDeque<Ticket<'a>>,
}

type SharedFeed<'a> = Arc<Mutex<Feed<'a>>>;

fn lock<'f, 'a>(feed: &'f Mutex<Feed<'a>>) -> MutexGuard<'f, Feed<'a>> {
    // Every change under this lock is a single push or take: a panic cannot leave it torn.
    feed.lock().unwrap_or_else(PoisonError::into_inner)
}

async fn next_from_source(feed: &Mutex<Feed<'_>>) -> Option<Message> {
    poll_fn(|cx| lock(feed).source.poll_next_unpin(cx)).await
}

pub(super) fn send_many<'a, T: Transport>(
    inner: &'a T,
    gate: &'a Gate,
    messages: MessageStream<'a>,
) -> ReceiptStream<'a> {
    let output = Output {
        inner,
        gate,
        feed: Arc::new(Mutex::new(Feed {
            source: messages,
            first: None,
            held: None,
            tickets: VecDeque::new(),
        })),
        batch: None,
        failure: None,
    };
    stream::unfold(output, |mut output| async move {
        let answer = output.next_answer().await?;
        Some((answer, output))
    })
    .boxed()
}

/// The messages of one inner batch: ends at the first message the breaker holds back.
fn batch_input<'a>(feed: SharedFeed<'a>, transport: &'a str, gate: &'a Gate) -> MessageStream<'a> {
    stream::unfold(feed, move |feed| async move {
        let first = lock(&feed).first.take();
        if let Some(message) = first {
            return Some((message, feed));
        }
        let message = next_from_source(&feed).await?;
        match gate.admit(transport, message.envelope()).await {
            Ok(ticket) => {
                lock(&feed).tickets.push_back(ticket);
                Some((message, feed))
            }
            Err(_held_back) => {
                lock(&feed).held = Some(message);
                None
            }
        }
    })
    .fuse()
    .boxed()
}

struct Output<'a, T> {
    inner: &'a T,
    gate: &'a Gate,
    feed: SharedFeed<'a>,
    batch: Option<ReceiptStream<'a>>,
    /// A batch failure that answers every message still without an answer.
    failure: Option<SendError>,
}

impl<'a, T: Transport> Output<'a, T> {
    async fn next_answer(&mut self) -> Option<Result<Receipt, SendError>> {
        loop {
            if let Some(error) = &self.failure {
                return self.answer_rest_with(error.clone()).await;
            }
            if let Some(batch) = &mut self.batch {
                match batch.next().await {
                    Some(result) => return Some(self.count(result).await),
                    None => {
                        self.batch = None;
                        lock(&self.feed).first = None;
                        continue;
                    }
                }
            }
            let unanswered_ticket = lock(&self.feed).tickets.pop_front();
            if unanswered_ticket.is_some() {
                return Some(Err(unanswered(self.inner.name())));
            }
            let held = lock(&self.feed).held.take();
            let message = match held {
                Some(message) => message,
                None => next_from_source(&self.feed).await?,
            };
            match self.gate.admit(self.inner.name(), message.envelope()).await {
                Err(held) => return Some(Err(self.gate.refusal(self.inner.name(), held))),
                Ok(ticket) => {
                    {
                        let mut feed = lock(&self.feed);
                        feed.tickets.push_back(ticket);
                        feed.first = Some(message);
                    }
                    let input = batch_input(Arc::clone(&self.feed), self.inner.name(), self.gate);
                    self.batch = Some(self.inner.send_many(input));
                }
            }
        }
    }

    /// Counts one answer of the inner batch against the ticket of its message.
    async fn count(&mut self, result: Result<Receipt, SendError>) -> Result<Receipt, SendError> {
        let ticket = lock(&self.feed).tickets.pop_front();
        if let Some(ticket) = ticket {
            ticket.finish(&result).await;
        }
        if let Err(error) = &result
            && error.is_batch_failure()
        {
            // Counted once above; every other message of the batch gets a clone.
            self.batch = None;
            self.failure = Some(error.clone());
        }
        result
    }

    /// After a batch failure: one clone for each message still without an answer, read
    /// by the inner transport or not. Their tickets go back uncounted.
    async fn answer_rest_with(&mut self, error: SendError) -> Option<Result<Receipt, SendError>> {
        let pending = {
            let mut feed = lock(&self.feed);
            feed.first = None; // its ticket stands for it
            feed.tickets.pop_front().is_some() || feed.held.take().is_some()
        };
        if pending || next_from_source(&self.feed).await.is_some() {
            return Some(Err(error));
        }
        None
    }
}
