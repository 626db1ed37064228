//! The streams: each stage's batch input, and the output that drives them all.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::{Stream, StreamExt, stream};
use tokio::time::{Instant, Sleep};

use super::Stages;
use super::state::{Item, Shared, State, Status, enter, fail_stage, settle, wake};
use crate::panicked::panicked;
use crate::transport::unanswered;
use crate::{Message, MessageStream, Receipt, ReceiptStream, SendError};

/// The input of one batch of `stage`: its inbox, and the caller's messages while it is the
/// first stage still open.
fn input<'a, S: Stages<'a>>(shared: Arc<Shared<'a, S>>, stage: usize) -> MessageStream<'a> {
    stream::poll_fn(move |cx| poll_input(&shared, stage, cx)).boxed()
}

fn poll_input<'a, S: Stages<'a>>(
    shared: &Shared<'a, S>,
    stage: usize,
    cx: &mut Context<'_>,
) -> Poll<Option<Message>> {
    let mut state = shared.lock();
    loop {
        let target = &mut state.stages[stage];
        if matches!(target.status, Status::Failed(_)) {
            return Poll::Ready(None);
        }
        if let Some(first) = target.inbox.front() {
            if let Some(at) = first.not_before
                && at > Instant::now()
            {
                let delay = target
                    .delay
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(at)));
                if delay.deadline() != at {
                    delay.as_mut().reset(at);
                }
                if delay.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
            }
            target.delay = None;
            if let Some(item) = target.inbox.pop_front() {
                let message = item.message.clone();
                target.pending.push_back(item);
                target.read_in_batch += 1;
                return Poll::Ready(Some(message));
            }
        }
        if state.reads_source(stage) {
            match state.source.poll_next_unpin(cx) {
                Poll::Ready(Some(message)) => {
                    let item = Item {
                        seq: state.read(),
                        message,
                        note: shared.stages.note(),
                        not_before: None,
                    };
                    enter(&shared.stages, &mut state, item, 0, None);
                    continue;
                }
                Poll::Ready(None) => {
                    state.source_done = true;
                    state.wake_inputs();
                    wake(&mut state.output_waker);
                    continue;
                }
                Poll::Pending => return Poll::Pending,
            }
        }
        if state.upstream_idle(stage) {
            return Poll::Ready(None);
        }
        state.stages[stage].waker = Some(cx.waker().clone());
        return Poll::Pending;
    }
}

/// The output: drives every stage's batch and gives out the answers in message order.
pub(super) struct Cascade<'a, S: Stages<'a>> {
    pub(super) shared: Arc<Shared<'a, S>>,
    pub(super) running: Vec<Option<ReceiptStream<'a>>>,
    /// For each stage not running, the wait until the first message of its inbox is due: a
    /// batch starts only then, so a provider is not asked before the time a retry named.
    pub(super) not_yet: Vec<Option<Pin<Box<Sleep>>>>,
}

/// Whether `first`, the first message of an idle stage's inbox, may be sent now; if not, a
/// timer in `wait` wakes the output when it may.
fn is_due<N>(
    wait: &mut Option<Pin<Box<Sleep>>>,
    first: Option<&Item<N>>,
    cx: &mut Context<'_>,
) -> bool {
    let Some(at) = first.and_then(|item| item.not_before) else {
        *wait = None;
        return true;
    };
    if at <= Instant::now() {
        *wait = None;
        return true;
    }
    let sleep = wait.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(at)));
    if sleep.deadline() != at {
        sleep.as_mut().reset(at);
    }
    if sleep.as_mut().poll(cx).is_ready() {
        *wait = None;
        return true;
    }
    false
}

enum Event {
    Answer(usize, Result<Receipt, SendError>),
    End(usize),
}

impl<'a, S: Stages<'a>> Stream for Cascade<'a, S> {
    type Item = Result<Receipt, SendError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        loop {
            let mut to_start = Vec::new();
            {
                let mut state = this.shared.lock();
                if let Some(answer) = state.pop_ready() {
                    return Poll::Ready(Some(answer));
                }
                if state.finished() {
                    return Poll::Ready(None);
                }
                state.output_waker = Some(cx.waker().clone());
                this.running.resize_with(state.stages.len(), || None);
                this.not_yet.resize_with(state.stages.len(), || None);
                for index in 0..this.running.len() {
                    let stage = &state.stages[index];
                    let idle = this.running[index].is_none();
                    let open = matches!(stage.status, Status::Open);
                    let waiting = !stage.inbox.is_empty()
                        && is_due(&mut this.not_yet[index], stage.inbox.front(), cx);
                    // The first stage starts on the caller's messages; a later one once a
                    // message is due in its inbox (after the wait a retry named).
                    let first_reads = index == 0 && state.reads_source(index);
                    if idle && open && (waiting || first_reads) {
                        state.stages[index].read_in_batch = 0;
                        to_start.push(index);
                    }
                }
                if this.reads_source_itself(&state, &to_start) && !state.source_done {
                    // No running batch reads the caller's messages (every stage failed as a
                    // whole, or the next is not due yet): they are judged here.
                    match state.source.poll_next_unpin(cx) {
                        Poll::Ready(Some(message)) => {
                            let item = Item {
                                seq: state.read(),
                                message,
                                note: this.shared.stages.note(),
                                not_before: None,
                            };
                            enter(&this.shared.stages, &mut state, item, 0, None);
                            continue;
                        }
                        Poll::Ready(None) => {
                            state.source_done = true;
                            continue;
                        }
                        Poll::Pending => {}
                    }
                }
            }
            for index in to_start {
                let input = input(Arc::clone(&this.shared), index);
                let batch = this.shared.stages.send_many(index, input);
                let name = this.shared.stages.name(index);
                this.running[index] = Some(answering_panics(name, batch));
            }
            match this.poll_stages(cx) {
                Some(Event::Answer(stage, result)) => this.on_answer(stage, result),
                Some(Event::End(stage)) => this.on_end(stage),
                None => {
                    let mut state = this.shared.lock();
                    if state.has_output() {
                        continue;
                    }
                    if this.stranded(&state) {
                        answer_stranded(&mut state);
                        continue;
                    }
                    return Poll::Pending;
                }
            }
        }
    }
}

impl<'a, S: Stages<'a>> Cascade<'a, S> {
    /// Whether nothing is left that could answer the messages still waiting: no batch runs,
    /// none waits to start, and no stage can read more of the caller's messages.
    fn stranded(&self, state: &State<'a, S::Note>) -> bool {
        self.running.iter().all(Option::is_none)
            && self.not_yet.iter().all(Option::is_none)
            && (state.source_done || state.source_stage().is_some())
    }

    /// Whether the cascade reads the caller's next message itself: when no batch reads them
    /// (every stage failed as a whole, or the stage that would is idle and not starting).
    fn reads_source_itself(&self, state: &State<'a, S::Note>, to_start: &[usize]) -> bool {
        match state.source_stage() {
            None => true,
            Some(stage) => stage > 0 && self.running[stage].is_none() && !to_start.contains(&stage),
        }
    }

    fn poll_stages(&mut self, cx: &mut Context<'_>) -> Option<Event> {
        for (index, running) in self.running.iter_mut().enumerate() {
            if let Some(batch) = running {
                match batch.poll_next_unpin(cx) {
                    Poll::Ready(Some(result)) => return Some(Event::Answer(index, result)),
                    Poll::Ready(None) => return Some(Event::End(index)),
                    Poll::Pending => {}
                }
            }
        }
        None
    }

    fn on_answer(&mut self, stage: usize, result: Result<Receipt, SendError>) {
        let stages = &self.shared.stages;
        let mut state = self.shared.lock();
        let Some(item) = state.stages[stage].pending.pop_front() else {
            if let Err(error) = result
                && error.is_batch_failure()
            {
                // The batch failed before it read a message: the stage failed as a whole, and
                // its error, as it is, judges every message sent its way.
                self.running[stage] = None;
                fail_stage(stages, &mut state, stage, error);
                state.wake_inputs();
                return;
            }
            tracing::warn!(
                transport = stages.name(stage),
                "a batch answered more messages than it read; the extra answer is dropped"
            );
            return;
        };
        let batch_failure = match &result {
            Err(error) if error.is_batch_failure() => Some(error.clone()),
            _ => None,
        };
        settle(stages, &mut state, stage, item, result, false);
        if let Some(error) = batch_failure {
            // The batch ended with this error (DESIGN §1); it answers the rest of the batch.
            self.running[stage] = None;
            fail_stage(stages, &mut state, stage, error);
        }
        state.wake_inputs();
    }

    fn on_end(&mut self, stage: usize) {
        self.running[stage] = None;
        let stages = &self.shared.stages;
        let mut state = self.shared.lock();
        let name = stages.name(stage);
        let unanswered_items: Vec<_> = state.stages[stage].pending.drain(..).collect();
        for item in unanswered_items {
            settle(
                stages,
                &mut state,
                stage,
                item,
                Err(unanswered(name)),
                false,
            );
        }
        let has_more = !state.stages[stage].inbox.is_empty() || state.reads_source(stage);
        if has_more
            && state.stages[stage].read_in_batch == 0
            && matches!(state.stages[stage].status, Status::Open)
        {
            // A batch that ends without reading anything would be started again for ever.
            fail_stage(stages, &mut state, stage, unanswered(name));
        }
        state.wake_inputs();
    }
}

/// `batch`, with a panic while it is polled answered as the failure of the whole batch
/// (`transport.panicked`, naming `transport`): the stage is done, and the cascade judges
/// each message it held with that error (DESIGN §15: a panic is an answer).
fn answering_panics<'a>(transport: &str, batch: ReceiptStream<'a>) -> ReceiptStream<'a> {
    let transport = transport.to_owned();
    // A caught panic is the last item of `catch_unwind`'s stream.
    AssertUnwindSafe(batch)
        .catch_unwind()
        .map(move |item| {
            item.unwrap_or_else(|payload| {
                Err(panicked(&transport, payload.as_ref()).batch_failure())
            })
        })
        .boxed()
}

/// Answers each message still waiting with an error: a broken invariant of the cascade,
/// answered rather than left hanging.
fn answer_stranded<N>(state: &mut State<'_, N>) {
    let first = state.first_unemitted;
    for offset in 0..state.answers.len() as u64 {
        state.answer(first + offset, Err(unanswered("cascade")));
    }
}
