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

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};

use futures::{Stream, StreamExt, stream};
use tokio::time::{Instant, Sleep};

use crate::{Category, Message, MessageStream, Receipt, ReceiptStream, SendError};

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
    }
    .boxed()
}

struct Shared<'a, S: Stages<'a>> {
    stages: S,
    state: Mutex<State<'a, S::Note>>,
}

impl<'a, S: Stages<'a>> Shared<'a, S> {
    fn lock(&self) -> MutexGuard<'_, State<'a, S::Note>> {
        // Each change under this lock leaves the queues whole: a panic cannot tear them.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

struct Item<N> {
    seq: u64,
    message: Message,
    note: N,
    not_before: Option<Instant>,
}

enum Status {
    Open,
    /// Its batch failed as a whole: everything sent its way is judged with this error.
    Failed(SendError),
}

struct StageState<N> {
    status: Status,
    /// Messages waiting for this stage's batch to read them.
    inbox: VecDeque<Item<N>>,
    /// Messages its batch read and has not answered yet, in the order read.
    pending: VecDeque<Item<N>>,
    /// The wait for the inbox's first message.
    delay: Option<Pin<Box<Sleep>>>,
    waker: Option<Waker>,
    read_in_batch: usize,
}

impl<N> Default for StageState<N> {
    fn default() -> Self {
        StageState {
            status: Status::Open,
            inbox: VecDeque::new(),
            pending: VecDeque::new(),
            delay: None,
            waker: None,
            read_in_batch: 0,
        }
    }
}

struct State<'a, N> {
    source: MessageStream<'a>,
    source_done: bool,
    next_seq: u64,
    first_unemitted: u64,
    /// The answer of each message read and not yet given out, from `first_unemitted` on.
    answers: VecDeque<Option<Result<Receipt, SendError>>>,
    stages: Vec<StageState<N>>,
    output_waker: Option<Waker>,
}

impl<N> State<'_, N> {
    /// The stage that reads the caller's messages: the first whose batch has not failed.
    fn source_stage(&self) -> Option<usize> {
        self.stages
            .iter()
            .position(|stage| matches!(stage.status, Status::Open))
    }

    fn reads_source(&self, stage: usize) -> bool {
        !self.source_done && self.source_stage() == Some(stage)
    }

    /// Whether no stage before `stage` can send it anything more.
    fn upstream_idle(&self, stage: usize) -> bool {
        (0..stage).all(|before| {
            let state = &self.stages[before];
            state.pending.is_empty() && state.inbox.is_empty() && !self.reads_source(before)
        })
    }

    fn read(&mut self) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.answers.push_back(None);
        seq
    }

    fn answer(&mut self, seq: u64, result: Result<Receipt, SendError>) {
        let slot = seq
            .checked_sub(self.first_unemitted)
            .and_then(|index| usize::try_from(index).ok())
            .and_then(|index| self.answers.get_mut(index));
        if let Some(slot @ None) = slot {
            *slot = Some(result);
        }
        wake(&mut self.output_waker);
    }

    fn pop_ready(&mut self) -> Option<Result<Receipt, SendError>> {
        if !matches!(self.answers.front(), Some(Some(_))) {
            return None;
        }
        self.first_unemitted += 1;
        self.answers.pop_front().flatten()
    }

    fn has_ready(&self) -> bool {
        matches!(self.answers.front(), Some(Some(_)))
    }

    fn finished(&self) -> bool {
        self.source_done && self.answers.is_empty()
    }

    /// Makes sure the state of `stage` exists, if there is such a stage.
    fn ensure(&mut self, stage: usize, count: usize) {
        while self.stages.len() <= stage && self.stages.len() < count {
            self.stages.push(StageState::default());
        }
    }

    fn wake_inputs(&mut self) {
        for stage in &mut self.stages {
            wake(&mut stage.waker);
        }
    }
}

fn wake(waker: &mut Option<Waker>) {
    if let Some(waker) = waker.take() {
        waker.wake();
    }
}

/// Puts `item` in the inbox of `stage`, judging it at once by each failed stage on its way.
fn enter<'a, S: Stages<'a>>(
    stages: &S,
    state: &mut State<'a, S::Note>,
    mut item: Item<S::Note>,
    mut stage: usize,
    mut carried: Option<SendError>,
) {
    loop {
        state.ensure(stage, stages.count());
        let Some(target) = state.stages.get_mut(stage) else {
            // Only a judge that passes a message on from the last stage gets here.
            let name = stage
                .checked_sub(1)
                .map_or("cascade", |last| stages.name(last));
            let error = carried.unwrap_or_else(|| unanswered(name));
            state.answer(item.seq, Err(error));
            return;
        };
        match &target.status {
            Status::Open => {
                target.inbox.push_back(item);
                wake(&mut target.waker);
                return;
            }
            Status::Failed(error) => {
                let error = error.clone();
                match stages.judge(stage, &mut item.note, Err(error), true) {
                    Verdict::Answer(result) => {
                        state.answer(item.seq, result);
                        return;
                    }
                    Verdict::Next { error, not_before } => {
                        item.not_before = not_before;
                        carried = Some(error);
                        stage += 1;
                    }
                }
            }
        }
    }
}

/// Judges `result` from `stage` for `item` and answers it or passes it on.
fn settle<'a, S: Stages<'a>>(
    stages: &S,
    state: &mut State<'a, S::Note>,
    stage: usize,
    mut item: Item<S::Note>,
    result: Result<Receipt, SendError>,
    repeated: bool,
) {
    match stages.judge(stage, &mut item.note, result, repeated) {
        Verdict::Answer(result) => state.answer(item.seq, result),
        Verdict::Next { error, not_before } => {
            item.not_before = not_before;
            enter(stages, state, item, stage + 1, Some(error));
        }
    }
}

/// Marks `stage` failed with `error` and judges each message still waiting on it.
fn fail_stage<'a, S: Stages<'a>>(
    stages: &S,
    state: &mut State<'a, S::Note>,
    stage: usize,
    error: SendError,
) {
    // The caller's messages go on to the next stage now: it must exist to read them.
    state.ensure(stage + 1, stages.count());
    let target = &mut state.stages[stage];
    target.status = Status::Failed(error.clone());
    target.delay = None;
    // Those it read were read before those still in its inbox: message order is kept.
    let waiting: Vec<_> = target
        .pending
        .drain(..)
        .chain(target.inbox.drain(..))
        .collect();
    for item in waiting {
        settle(stages, state, stage, item, Err(error.clone()), true);
    }
}

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
struct Cascade<'a, S: Stages<'a>> {
    shared: Arc<Shared<'a, S>>,
    running: Vec<Option<ReceiptStream<'a>>>,
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
                for index in 0..this.running.len() {
                    let stage = &state.stages[index];
                    let idle = this.running[index].is_none();
                    let open = matches!(stage.status, Status::Open);
                    let waiting = !stage.inbox.is_empty();
                    if idle && open && (waiting || state.reads_source(index)) {
                        state.stages[index].read_in_batch = 0;
                        to_start.push(index);
                    }
                }
                if state.source_stage().is_none() && !state.source_done {
                    // Every stage failed as a whole: the caller's messages are judged here.
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
                this.running[index] = Some(this.shared.stages.send_many(index, input));
            }
            match this.poll_stages(cx) {
                Some(Event::Answer(stage, result)) => this.on_answer(stage, result),
                Some(Event::End(stage)) => this.on_end(stage),
                None => {
                    let mut state = this.shared.lock();
                    if state.has_ready() || state.finished() {
                        continue;
                    }
                    if this.running.iter().all(Option::is_none)
                        && (state.source_done || state.source_stage().is_some())
                    {
                        // Nothing is left that could answer the messages still waiting: a
                        // broken invariant, answered rather than left hanging.
                        let first = state.first_unemitted;
                        for offset in 0..state.answers.len() as u64 {
                            state.answer(first + offset, Err(unanswered("cascade")));
                        }
                        continue;
                    }
                    return Poll::Pending;
                }
            }
        }
    }
}

impl<'a, S: Stages<'a>> Cascade<'a, S> {
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

/// The answer for a message a transport read but ended its batch without answering.
pub(crate) fn unanswered(transport: &str) -> SendError {
    SendError::new(
        Category::ServerError,
        "transport.unanswered",
        "the transport ended its batch without answering this message",
    )
    .with_transport(transport)
}
