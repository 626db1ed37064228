//! A transport that answers from a script, for state-machine tests under paused time.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use mail_breaker::{
    Category, Envelope, Message, MessageStream, Receipt, ReceiptStream, SendError, Transport,
};

/// One scripted answer.
#[derive(Debug, Clone)]
pub enum Reply {
    /// Delivered.
    Ok,
    /// Fails with this error.
    Err(SendError),
    /// Waits, then answers.
    After(Duration, Box<Reply>),
    /// Never answers.
    Hang,
}

impl Reply {
    /// An error of `category` with code `test.<category>`.
    pub fn fail(category: Category) -> Reply {
        Reply::Err(SendError::new(
            category,
            format!("test.{category}"),
            "scripted failure",
        ))
    }

    /// Waits `delay`, then answers `reply`.
    pub fn after(delay: Duration, reply: Reply) -> Reply {
        Reply::After(delay, Box::new(reply))
    }
}

#[derive(Debug)]
struct Script {
    queue: VecDeque<Reply>,
    default: Reply,
    sends: usize,
    batches: Vec<usize>,
    subjects: Vec<String>,
    verify: Option<SendError>,
    verifies: usize,
}

/// A transport that answers each send with the next scripted reply, then with its default.
///
/// It counts the sends it saw and, when made [`batched`](Scripted::batched), the size of each
/// `send_many` batch.
#[derive(Debug, Clone)]
pub struct Scripted {
    name: String,
    script: Arc<Mutex<Script>>,
    batched: bool,
    receipts_name_subjects: bool,
}

impl Scripted {
    /// A transport that delivers everything.
    pub fn new(name: &str) -> Self {
        Scripted::answering(name, Reply::Ok)
    }

    /// A transport that answers every send with `reply`.
    pub fn answering(name: &str, reply: Reply) -> Self {
        Scripted {
            name: name.to_owned(),
            script: Arc::new(Mutex::new(Script {
                queue: VecDeque::new(),
                default: reply,
                sends: 0,
                batches: Vec::new(),
                subjects: Vec::new(),
                verify: None,
                verifies: 0,
            })),
            batched: false,
            receipts_name_subjects: false,
        }
    }

    /// Makes `send_many` read its whole batch first, then answer it, recording the batch size.
    pub fn batched(mut self) -> Self {
        self.batched = true;
        self
    }

    /// Makes each receipt carry the message's subject as its message id, so that a test can
    /// tell which message an answer belongs to.
    pub fn naming_subjects_in_receipts(mut self) -> Self {
        self.receipts_name_subjects = true;
        self
    }

    /// Gives the transport another name, as an application may through the breaker's
    /// `inner_mut`.
    pub fn rename(&mut self, name: &str) {
        name.clone_into(&mut self.name);
    }

    /// Queues replies for the next sends.
    pub fn then(&self, replies: impl IntoIterator<Item = Reply>) -> &Self {
        self.lock().queue.extend(replies);
        self
    }

    /// Forgets the queued replies not yet used.
    pub fn clear_queue(&self) {
        self.lock().queue.clear();
    }

    /// Sets the reply once the queue is empty.
    pub fn set_default(&self, reply: Reply) {
        self.lock().default = reply;
    }

    /// Makes `verify` answer with `reply`'s error (an `Ok` reply makes it succeed).
    pub fn fail_verify_with(&self, reply: Reply) {
        self.lock().verify = match reply {
            Reply::Err(error) => Some(error),
            _ => None,
        };
    }

    /// How many times `verify` reached this transport.
    pub fn verifies(&self) -> usize {
        self.lock().verifies
    }

    /// How many sends reached this transport.
    pub fn sends(&self) -> usize {
        self.lock().sends
    }

    /// The size of each `send_many` batch, when batched.
    pub fn batches(&self) -> Vec<usize> {
        self.lock().batches.clone()
    }

    /// The subject line of each message sent, in order of arrival.
    pub fn subjects(&self) -> Vec<String> {
        self.lock().subjects.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Script> {
        self.script.lock().expect("script lock")
    }

    fn next_reply(&self, raw: &[u8]) -> (Reply, String) {
        let subject = subject_of(raw);
        let mut script = self.lock();
        script.sends += 1;
        script.subjects.push(subject.clone());
        let default = script.default.clone();
        (script.queue.pop_front().unwrap_or(default), subject)
    }

    async fn play(&self, (reply, subject): (Reply, String)) -> Result<Receipt, SendError> {
        let mut reply = reply;
        loop {
            match reply {
                Reply::Ok if self.receipts_name_subjects => {
                    return Ok(Receipt::new(&self.name)
                        .with_response("250 ok")
                        .with_message_id(subject));
                }
                Reply::Ok => return Ok(Receipt::new(&self.name).with_response("250 ok")),
                Reply::Err(error) => return Err(error.with_transport(&self.name)),
                Reply::After(delay, then) => {
                    tokio::time::sleep(delay).await;
                    reply = *then;
                }
                Reply::Hang => futures::future::pending::<()>().await,
            }
        }
    }
}

fn subject_of(raw: &[u8]) -> String {
    String::from_utf8_lossy(raw)
        .lines()
        .find_map(|line| line.strip_prefix("Subject: ").map(str::to_owned))
        .unwrap_or_default()
}

impl Scripted {
    /// Plays the next reply of the script for the message `raw`.
    async fn reply_to(&self, raw: &[u8]) -> Result<Receipt, SendError> {
        let reply = self.next_reply(raw);
        self.play(reply).await
    }
}

#[async_trait::async_trait]
impl Transport for Scripted {
    fn name(&self) -> &str {
        &self.name
    }

    async fn send_raw(&self, _envelope: &Envelope, raw: &[u8]) -> Result<Receipt, SendError> {
        self.reply_to(raw).await
    }

    // The same sends unboxed, so that a breaker over this transport polls them in place: a
    // future that is not `Unpin`, pinned inside the breaker's. (Transports that give only
    // the boxed futures, such as `Flaky`, cover the default.)
    // Not an `async fn`: `async_trait` would box that.
    #[allow(clippy::manual_async_fn)]
    fn send_unboxed<'a>(
        &'a self,
        message: &'a Message,
    ) -> impl Future<Output = Result<Receipt, SendError>> + Send + 'a {
        async move { self.reply_to(&message.formatted()).await }
    }

    fn send_raw_unboxed<'a>(
        &'a self,
        _envelope: &'a Envelope,
        raw: &'a [u8],
    ) -> impl Future<Output = Result<Receipt, SendError>> + Send + 'a {
        self.reply_to(raw)
    }

    async fn verify(&self) -> Result<(), SendError> {
        let mut script = self.lock();
        script.verifies += 1;
        match &script.verify {
            Some(error) => Err(error.clone()),
            None => Ok(()),
        }
    }

    fn send_many<'a>(&'a self, messages: MessageStream<'a>) -> ReceiptStream<'a> {
        if !self.batched {
            return messages
                .then(move |message| async move { self.send(&message).await })
                .boxed();
        }
        futures::stream::once(async move {
            let batch: Vec<_> = messages.collect().await;
            self.lock().batches.push(batch.len());
            let mut answers = Vec::with_capacity(batch.len());
            for message in &batch {
                let reply = self.next_reply(&message.formatted());
                let answer = self.play(reply).await;
                let stop = matches!(&answer, Err(e) if e.is_batch_failure());
                answers.push(answer);
                if stop {
                    break;
                }
            }
            futures::stream::iter(answers)
        })
        .flatten()
        .boxed()
    }
}
