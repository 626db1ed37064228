//! `send_many` for wrappers that send a message again elsewhere when it fails: the pool's
//! next member, the retry's next attempt.
//!
//! Each stage (a member, an attempt) gets its messages as **one** lazy batch of its
//! transport's `send_many`, started when its first message arrives. A message a stage's
//! [`Stages::judge`] passes on joins the next stage's batch, not before the time it names;
//! the answers come out in the order the messages were read, one per message.
//!
//! A stage whose batch fails as a whole (a [`SendError::batch_failure`]) is done: each message
//! it read or would have read is judged with a clone of that error, so a pool fails the rest
//! of the batch over and a retry retries it.
//!
//! All stages run inside the output stream's `poll_next`; the stages' input streams share the
//! state behind one lock, which is never held while a stage's stream is polled.

mod state;
mod stream;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use tokio::time::Instant;

use crate::{MessageStream, Receipt, ReceiptStream, SendError};
use state::{Shared, StageState, State};
use stream::Cascade;

/// What becomes of a message after one stage answered it.
pub(crate) enum Verdict {
    /// This is the message's answer.
    Answer(Result<Receipt, SendError>),
    /// Send it through the next stage, not before `not_before`.
    Next {
        error: SendError,
        not_before: Option<Instant>,
    },
}

/// The stages a message may go through, and the rule between them.
pub(crate) trait Stages<'a>: Send + Sync + 'a {
    /// What is kept about each message from stage to stage.
    type Note: Send + 'a;

    /// How many stages there are (at least 1).
    fn count(&self) -> usize;
    /// The name of the transport of `stage`, for errors.
    fn name(&self, stage: usize) -> &str;
    /// The note of a message just read from the caller.
    fn note(&self) -> Self::Note;
    /// Starts a batch on the transport of `stage`.
    fn send_many(&self, stage: usize, messages: MessageStream<'a>) -> ReceiptStream<'a>;
    /// Decides what `result` from `stage` means for a message. `repeated` is set for the
    /// clones of a batch failure already judged once.
    fn judge(
        &self,
        stage: usize,
        note: &mut Self::Note,
        result: Result<Receipt, SendError>,
        repeated: bool,
    ) -> Verdict;
}

/// Sends `messages` through `stages`; one answer per message, in message order.
pub(crate) fn send_many<'a, S: Stages<'a>>(
    stages: S,
    messages: MessageStream<'a>,
) -> ReceiptStream<'a> {
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            source: messages,
            source_done: false,
            next_seq: 0,
            first_unemitted: 0,
            answers: VecDeque::new(),
            // Stages are added when first needed: a retry may allow very many tries.
            stages: vec![StageState::default()],
            output_waker: None,
        }),
        stages,
    });
    Cascade {
        shared,
        running: Vec::new(),
        not_yet: Vec::new(),
    }
    .boxed()
}
