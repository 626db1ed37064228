//! The retry transport and recipients a provider deferred (DESIGN §10: a 4xx to some RCPTs
//! while others were accepted): the message goes again to those recipients only, the same
//! octets, after the retry's wait. Time driven by `tokio::time::pause()`.

mod support;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mail_breaker::{
    Backoff, Category, Envelope, Message, Receipt, RetryTransport, SendError, Transport,
};
use tokio::time::Instant;

/// What the provider does with one send: which of its recipients it defers or rejects, or
/// an error for the whole send.
#[derive(Debug, Clone)]
enum Answer {
    Deliver {
        defer: Vec<&'static str>,
        reject: Vec<&'static str>,
        /// Recipients whose transaction's data went out with no answer.
        maybe: Vec<&'static str>,
    },
    Fail(SendError),
    /// Queued in an outbox (as `send_or_queue` answers when the stack behind it refused).
    Queue,
    /// Queued in an outbox after a failure that may have delivered: every recipient listed
    /// as maybe delivered (as `send_or_queue` answers then).
    QueueMaybe,
}

fn deliver_deferring(defer: &[&'static str]) -> Answer {
    Answer::Deliver {
        defer: defer.to_vec(),
        reject: Vec::new(),
        maybe: Vec::new(),
    }
}

fn deliver_all() -> Answer {
    deliver_deferring(&[])
}

fn greylisted() -> SendError {
    SendError::new(Category::ServerError, "smtp.450", "450 4.2.0 greylisted")
}

/// One send the provider saw: its recipients, its octets, and when it came.
type Sent = (Vec<String>, Vec<u8>, Instant);

/// A provider that answers each send from a script and keeps each send it saw.
#[derive(Debug, Clone, Default)]
struct Provider {
    script: Arc<Mutex<VecDeque<Answer>>>,
    sends: Arc<Mutex<Vec<Sent>>>,
}

impl Provider {
    fn new(answers: impl IntoIterator<Item = Answer>) -> Provider {
        Provider {
            script: Arc::new(Mutex::new(answers.into_iter().collect())),
            sends: Arc::default(),
        }
    }

    fn sends(&self) -> Vec<Sent> {
        self.sends.lock().expect("not poisoned").clone()
    }
}

#[async_trait::async_trait]
impl Transport for Provider {
    fn name(&self) -> &str {
        "provider"
    }

    async fn send_raw(&self, envelope: &Envelope, raw: &[u8]) -> Result<Receipt, SendError> {
        let recipients: Vec<String> = envelope.to().iter().map(ToString::to_string).collect();
        self.sends.lock().expect("not poisoned").push((
            recipients.clone(),
            raw.to_vec(),
            Instant::now(),
        ));
        let answer = self
            .script
            .lock()
            .expect("not poisoned")
            .pop_front()
            .unwrap_or_else(deliver_all);
        match answer {
            Answer::Fail(error) => Err(error),
            Answer::Queue => Ok(Receipt::new("outbox").with_message_id("7").queued()),
            Answer::QueueMaybe => {
                let why = SendError::new(Category::Timeout, "smtp.timeout", "no answer")
                    .maybe_delivered();
                Ok(envelope.to().iter().fold(
                    Receipt::new("outbox").with_message_id("8").queued(),
                    |receipt, to| receipt.with_maybe_delivered_recipient(to.clone(), why.clone()),
                ))
            }
            Answer::Deliver {
                defer,
                reject,
                maybe,
            } => {
                let mut receipt = Receipt::new("provider");
                for to in envelope.to() {
                    if defer.contains(&to.to_string().as_str()) {
                        receipt = receipt.with_deferred_recipient(to.clone(), greylisted());
                    } else if maybe.contains(&to.to_string().as_str()) {
                        let why = SendError::new(Category::Timeout, "smtp.timeout", "no answer");
                        receipt = receipt.with_maybe_delivered_recipient(to.clone(), why);
                    } else if reject.contains(&to.to_string().as_str()) {
                        let why = SendError::new(Category::Rejected, "smtp.550", "no such user");
                        receipt = receipt.with_rejected_recipient(to.clone(), why);
                    }
                }
                Ok(receipt)
            }
        }
    }
}

fn message_to_two() -> Message {
    Message::builder()
        .from("app@example.com".parse().expect("a sender"))
        .to("ann@example.org".parse().expect("a recipient"))
        .to("bob@example.net".parse().expect("a recipient"))
        .subject("two")
        .body(String::from("hello"))
        .expect("a message")
}

fn retry(provider: &Provider, attempts: u32) -> RetryTransport<Provider> {
    RetryTransport::builder(provider.clone())
        .max_attempts(attempts)
        .backoff(Backoff::constant(Duration::from_secs(5)))
        .build()
        .expect("valid settings")
}

fn recipients(receipt_list: &[(lettre::Address, SendError)]) -> Vec<String> {
    receipt_list.iter().map(|(to, _)| to.to_string()).collect()
}

#[tokio::test(start_paused = true)]
async fn a_deferred_recipient_gets_the_same_message_alone_after_the_backoff() {
    let provider = Provider::new([deliver_deferring(&["bob@example.net"]), deliver_all()]);
    let receipt = retry(&provider, 3)
        .send(&message_to_two())
        .await
        .expect("delivered");

    let sends = provider.sends();
    assert_eq!(sends.len(), 2);
    assert_eq!(sends[0].0, ["ann@example.org", "bob@example.net"]);
    assert_eq!(sends[1].0, ["bob@example.net"]);
    assert_eq!(
        sends[1].1, sends[0].1,
        "the same octets, so the same Message-ID"
    );
    assert_eq!(sends[1].2 - sends[0].2, Duration::from_secs(5));
    assert!(receipt.deferred_recipients().is_empty());
    assert_eq!(receipt.attempts(), 2);
}

#[tokio::test(start_paused = true)]
async fn send_raw_sends_the_deferred_recipients_the_same_octets_too() {
    let provider = Provider::new([deliver_deferring(&["bob@example.net"]), deliver_all()]);
    let message = message_to_two();
    let raw = message.formatted();
    let receipt = retry(&provider, 3)
        .send_raw(message.envelope(), &raw)
        .await
        .expect("delivered");
    let sends = provider.sends();
    assert_eq!(sends[1].0, ["bob@example.net"]);
    assert_eq!(sends[1].1, raw);
    assert!(receipt.deferred_recipients().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_recipient_still_deferred_when_the_attempts_run_out_stays_listed_as_deferred() {
    let provider = Provider::new([
        deliver_deferring(&["bob@example.net"]),
        deliver_deferring(&["bob@example.net"]),
    ]);
    let receipt = retry(&provider, 2)
        .send(&message_to_two())
        .await
        .expect("delivered to ann");
    assert_eq!(provider.sends().len(), 2);
    assert_eq!(
        recipients(receipt.deferred_recipients()),
        ["bob@example.net"]
    );
    assert_eq!(receipt.attempts(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_deferred_recipient_refused_for_good_on_the_next_try_is_listed_as_rejected() {
    let provider = Provider::new([
        deliver_deferring(&["bob@example.net"]),
        Answer::Fail(SendError::new(
            Category::Rejected,
            "smtp.550",
            "550 5.1.1 no such user",
        )),
    ]);
    let receipt = retry(&provider, 3)
        .send(&message_to_two())
        .await
        .expect("delivered to ann");
    assert!(receipt.deferred_recipients().is_empty());
    assert_eq!(
        recipients(receipt.rejected_recipients()),
        ["bob@example.net"]
    );
    assert_eq!(receipt.rejected_recipients()[0].1.code(), "smtp.550");
}

#[tokio::test(start_paused = true)]
async fn a_deferred_recipient_whose_next_try_fails_for_now_is_tried_again() {
    let provider = Provider::new([
        deliver_deferring(&["bob@example.net"]),
        Answer::Fail(SendError::new(Category::Network, "smtp.network", "reset")),
        deliver_all(),
    ]);
    let receipt = retry(&provider, 3)
        .send(&message_to_two())
        .await
        .expect("delivered");
    assert_eq!(provider.sends().len(), 3);
    assert!(receipt.deferred_recipients().is_empty());
    assert_eq!(receipt.attempts(), 3);
}

#[tokio::test(start_paused = true)]
async fn without_at_most_once_a_deferred_recipient_whose_next_try_may_have_arrived_is_tried_again()
{
    let provider = Provider::new([
        deliver_deferring(&["bob@example.net"]),
        Answer::Fail(
            SendError::new(Category::Timeout, "smtp.timeout", "no answer").maybe_delivered(),
        ),
        deliver_all(),
    ]);
    let receipt = retry(&provider, 3)
        .send(&message_to_two())
        .await
        .expect("delivered");
    assert_eq!(provider.sends().len(), 3, "at least once: bob again");
    assert!(receipt.deferred_recipients().is_empty(), "{receipt:?}");
    assert!(
        receipt.maybe_delivered_recipients().is_empty(),
        "{receipt:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn at_most_once_does_not_send_deferred_recipients_again_after_a_maybe_delivered_error() {
    let provider = Provider::new([
        deliver_deferring(&["bob@example.net"]),
        Answer::Fail(
            SendError::new(Category::Timeout, "smtp.timeout", "no answer").maybe_delivered(),
        ),
        deliver_all(),
    ]);
    let transport = RetryTransport::builder(provider.clone())
        .max_attempts(5)
        .backoff(Backoff::constant(Duration::from_secs(1)))
        .at_most_once()
        .build()
        .expect("valid settings");
    let receipt = transport
        .send(&message_to_two())
        .await
        .expect("delivered to ann");
    assert_eq!(provider.sends().len(), 2);
    assert!(receipt.deferred_recipients().is_empty(), "{receipt:?}");
    let maybe = receipt.maybe_delivered_recipients();
    assert_eq!(recipients(maybe), ["bob@example.net"]);
    assert!(maybe[0].1.is_maybe_delivered());
}

#[tokio::test(start_paused = true)]
async fn a_delivery_without_deferred_recipients_is_not_sent_again() {
    let provider = Provider::new([deliver_all()]);
    let receipt = retry(&provider, 3)
        .send(&message_to_two())
        .await
        .expect("delivered");
    assert_eq!(provider.sends().len(), 1);
    assert_eq!(receipt.attempts(), 1);
}

#[tokio::test(start_paused = true)]
async fn deferred_recipients_wait_their_errors_retry_after_when_it_is_longer() {
    let provider = Provider::new([
        Answer::Deliver {
            defer: vec!["bob@example.net"],
            reject: vec![],
            maybe: vec![],
        },
        deliver_all(),
    ]);
    // The provider's deferral says when: 30 s, longer than the 5 s backoff.
    let provider_with_wait = WithRetryAfter(provider.clone(), Duration::from_secs(30));
    let transport = RetryTransport::builder(provider_with_wait)
        .max_attempts(3)
        .backoff(Backoff::constant(Duration::from_secs(5)))
        .build()
        .expect("valid settings");
    transport.send(&message_to_two()).await.expect("delivered");
    let sends = provider.sends();
    assert_eq!(sends[1].2 - sends[0].2, Duration::from_secs(30));
}

/// A provider whose deferrals carry a `retry_after`.
#[derive(Debug)]
struct WithRetryAfter(Provider, Duration);

#[async_trait::async_trait]
impl Transport for WithRetryAfter {
    fn name(&self) -> &str {
        self.0.name()
    }

    async fn send_raw(&self, envelope: &Envelope, raw: &[u8]) -> Result<Receipt, SendError> {
        let receipt = self.0.send_raw(envelope, raw).await?;
        let mut later = Receipt::new(receipt.transport());
        for (to, why) in receipt.deferred_recipients() {
            later = later.with_deferred_recipient(to.clone(), why.clone().with_retry_after(self.1));
        }
        Ok(later)
    }
}

fn deliver_maybe(maybe: &[&'static str], defer: &[&'static str]) -> Answer {
    Answer::Deliver {
        defer: defer.to_vec(),
        reject: Vec::new(),
        maybe: maybe.to_vec(),
    }
}

fn at_most_once(provider: &Provider) -> RetryTransport<Provider> {
    RetryTransport::builder(provider.clone())
        .max_attempts(3)
        .backoff(Backoff::constant(Duration::from_secs(5)))
        .at_most_once()
        .build()
        .expect("valid settings")
}

#[tokio::test(start_paused = true)]
async fn under_at_most_once_a_maybe_delivered_recipient_is_not_sent_again() {
    let provider = Provider::new([deliver_maybe(&["bob@example.net"], &[])]);
    let receipt = at_most_once(&provider)
        .send(&message_to_two())
        .await
        .expect("delivered to ann");
    assert_eq!(provider.sends().len(), 1);
    assert_eq!(
        recipients(receipt.maybe_delivered_recipients()),
        ["bob@example.net"]
    );
    assert!(receipt.deferred_recipients().is_empty());
}

#[tokio::test(start_paused = true)]
async fn without_at_most_once_a_maybe_delivered_recipient_is_sent_again_alone() {
    let provider = Provider::new([deliver_maybe(&["bob@example.net"], &[]), deliver_all()]);
    let receipt = retry(&provider, 3)
        .send(&message_to_two())
        .await
        .expect("delivered");
    let sends = provider.sends();
    assert_eq!(sends.len(), 2);
    assert_eq!(sends[1].0, ["bob@example.net"]);
    assert!(
        receipt.maybe_delivered_recipients().is_empty(),
        "{receipt:?}"
    );
    assert!(receipt.deferred_recipients().is_empty());
}

#[tokio::test(start_paused = true)]
async fn under_at_most_once_the_deferred_go_again_and_the_maybe_delivered_do_not() {
    let provider = Provider::new([
        deliver_maybe(&["bob@example.net"], &["ann@example.org"]),
        deliver_all(),
    ]);
    let receipt = at_most_once(&provider)
        .send(&message_to_two())
        .await
        .expect("delivered");
    let sends = provider.sends();
    assert_eq!(sends.len(), 2);
    assert_eq!(sends[1].0, ["ann@example.org"]);
    assert!(receipt.deferred_recipients().is_empty());
    assert_eq!(
        recipients(receipt.maybe_delivered_recipients()),
        ["bob@example.net"]
    );
}

#[tokio::test(start_paused = true)]
async fn a_recipient_maybe_delivered_when_the_attempts_run_out_stays_listed_as_maybe_delivered() {
    let provider = Provider::new([
        deliver_maybe(&["bob@example.net"], &[]),
        deliver_maybe(&["bob@example.net"], &[]),
    ]);
    let receipt = retry(&provider, 2)
        .send(&message_to_two())
        .await
        .expect("delivered to ann");
    assert_eq!(provider.sends().len(), 2);
    assert_eq!(
        recipients(receipt.maybe_delivered_recipients()),
        ["bob@example.net"]
    );
    assert!(receipt.deferred_recipients().is_empty());
}

/// Review 7: a retry that resent a deferred recipient through `send_or_queue` took its
/// queued answer for a delivery: the recipient left every list, and the receipt said the
/// message was delivered to everyone while the outbox held it for that one.
#[tokio::test(start_paused = true)]
async fn a_recipient_an_outbox_inside_queued_on_a_resend_stays_listed_as_owed_and_is_not_sent_again()
 {
    let provider = Provider::new([deliver_deferring(&["bob@example.net"]), Answer::Queue]);
    let receipt = retry(&provider, 3)
        .send(&message_to_two())
        .await
        .expect("delivered to ann");
    assert_eq!(
        provider.sends().len(),
        2,
        "the outbox sends to bob again, not the retry"
    );
    assert_eq!(
        recipients(receipt.deferred_recipients()),
        ["bob@example.net"]
    );
    assert!(receipt.is_kept_for_later(), "{receipt:?}");
}

/// The same when the outbox queued the resend after a failure that may have delivered: the
/// recipient is listed once, as maybe delivered, not also as deferred.
#[tokio::test(start_paused = true)]
async fn a_recipient_queued_on_a_resend_after_a_maybe_delivered_failure_is_listed_once_as_maybe_delivered()
 {
    let provider = Provider::new([deliver_deferring(&["bob@example.net"]), Answer::QueueMaybe]);
    let receipt = retry(&provider, 3)
        .send(&message_to_two())
        .await
        .expect("delivered to ann");
    assert_eq!(provider.sends().len(), 2);
    assert_eq!(
        recipients(receipt.maybe_delivered_recipients()),
        ["bob@example.net"]
    );
    assert!(receipt.deferred_recipients().is_empty(), "{receipt:?}");
}

/// A recipient deferred on the resend too is sent again after the next wait, and a receipt
/// whose resends delivered says nothing is kept for later.
#[tokio::test(start_paused = true)]
async fn a_recipient_deferred_twice_is_sent_a_third_time_and_nothing_is_kept_for_later() {
    let provider = Provider::new([
        deliver_deferring(&["bob@example.net"]),
        deliver_deferring(&["bob@example.net"]),
        deliver_all(),
    ]);
    let receipt = retry(&provider, 4)
        .send(&message_to_two())
        .await
        .expect("delivered");
    assert_eq!(provider.sends().len(), 3);
    assert!(receipt.deferred_recipients().is_empty(), "{receipt:?}");
    assert!(!receipt.is_kept_for_later(), "{receipt:?}");
}
