//! The messages between the stages: who waits where, and what a stage's answer makes of them.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::task::Waker;

use tokio::time::{Instant, Sleep};

use super::{Stages, Verdict};
use crate::transport::unanswered;
use crate::{Message, MessageStream, Receipt, SendError};

pub(super) struct Shared<'a, S: Stages<'a>> {
    pub(super) stages: S,
    pub(super) state: Mutex<State<'a, S::Note>>,
}

impl<'a, S: Stages<'a>> Shared<'a, S> {
    pub(super) fn lock(&self) -> MutexGuard<'_, State<'a, S::Note>> {
        // Each change under this lock leaves the queues whole: a panic cannot tear them.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

pub(super) struct Item<N> {
    pub(super) seq: u64,
    pub(super) message: Message,
    pub(super) note: N,
    pub(super) not_before: Option<Instant>,
}

pub(super) enum Status {
    Open,
    /// Its batch failed as a whole: everything sent its way is judged with this error.
    Failed(SendError),
}

pub(super) struct StageState<N> {
    pub(super) status: Status,
    /// Messages waiting for this stage's batch to read them.
    pub(super) inbox: VecDeque<Item<N>>,
    /// Messages its batch read and has not answered yet, in the order read.
    pub(super) pending: VecDeque<Item<N>>,
    /// The wait for the inbox's first message.
    pub(super) delay: Option<Pin<Box<Sleep>>>,
    pub(super) waker: Option<Waker>,
    pub(super) read_in_batch: usize,
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

pub(super) struct State<'a, N> {
    pub(super) source: MessageStream<'a>,
    pub(super) source_done: bool,
    pub(super) next_seq: u64,
    pub(super) first_unemitted: u64,
    /// The answer of each message read and not yet given out, from `first_unemitted` on.
    pub(super) answers: VecDeque<Option<Result<Receipt, SendError>>>,
    pub(super) stages: Vec<StageState<N>>,
    pub(super) output_waker: Option<Waker>,
}

impl<N> State<'_, N> {
    /// The stage that reads the caller's messages: the first whose batch has not failed.
    pub(super) fn source_stage(&self) -> Option<usize> {
        self.stages
            .iter()
            .position(|stage| matches!(stage.status, Status::Open))
    }

    pub(super) fn reads_source(&self, stage: usize) -> bool {
        !self.source_done && self.source_stage() == Some(stage)
    }

    /// Whether no stage before `stage` can send it anything more.
    pub(super) fn upstream_idle(&self, stage: usize) -> bool {
        (0..stage).all(|before| {
            let state = &self.stages[before];
            state.pending.is_empty() && state.inbox.is_empty() && !self.reads_source(before)
        })
    }

    pub(super) fn read(&mut self) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.answers.push_back(None);
        seq
    }

    pub(super) fn answer(&mut self, seq: u64, result: Result<Receipt, SendError>) {
        // The cascade answers every message and its stream goes on: no answer of it is the end
        // of its batch, whatever the stage that failed said of its own.
        let result = result.map_err(SendError::for_one_message);
        let slot = seq
            .checked_sub(self.first_unemitted)
            .and_then(|index| usize::try_from(index).ok())
            .and_then(|index| self.answers.get_mut(index));
        if let Some(slot @ None) = slot {
            *slot = Some(result);
        }
        wake(&mut self.output_waker);
    }

    pub(super) fn pop_ready(&mut self) -> Option<Result<Receipt, SendError>> {
        if !matches!(self.answers.front(), Some(Some(_))) {
            return None;
        }
        self.first_unemitted += 1;
        self.answers.pop_front().flatten()
    }

    pub(super) fn has_ready(&self) -> bool {
        matches!(self.answers.front(), Some(Some(_)))
    }

    pub(super) fn finished(&self) -> bool {
        self.source_done && self.answers.is_empty()
    }

    /// Whether the output has something to give: the next answer, or its end.
    pub(super) fn has_output(&self) -> bool {
        self.has_ready() || self.finished()
    }

    /// Makes sure the state of `stage` exists, if there is such a stage.
    pub(super) fn ensure(&mut self, stage: usize, count: usize) {
        while self.stages.len() <= stage && self.stages.len() < count {
            self.stages.push(StageState::default());
        }
    }

    pub(super) fn wake_inputs(&mut self) {
        for stage in &mut self.stages {
            wake(&mut stage.waker);
        }
    }
}

pub(super) fn wake(waker: &mut Option<Waker>) {
    if let Some(waker) = waker.take() {
        waker.wake();
    }
}

/// Puts `item` in the inbox of `stage`, judging it at once by each failed stage on its way.
pub(super) fn enter<'a, S: Stages<'a>>(
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
pub(super) fn settle<'a, S: Stages<'a>>(
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
pub(super) fn fail_stage<'a, S: Stages<'a>>(
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
