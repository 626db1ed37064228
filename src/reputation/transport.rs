//! [`ReputationTransport`]: a member's transport that its reputation breaker holds back.

use super::breaker::ReputationBreaker;
use crate::{Envelope, Receipt, SendError, Transport};

/// A [`Transport`] that sends through the member it wraps while its [`ReputationBreaker`]
/// is not open, and counts each message the provider accepted (one send per recipient
/// accepted, the rejected and deferred ones not counted). Open, it answers every send with
/// `reputation.open` (`ServiceUnavailable`, [not attempted](SendError::is_not_attempted),
/// [`is_reputation_hold`](SendError::is_reputation_hold)) without contacting the provider.
///
/// The refusal holds back every message handed to this transport: an outbox worker whose
/// whole stack is this member pauses as for an open breaker. In a
/// [`PoolTransport`](crate::PoolTransport) of several members the pool answers it for that
/// message alone, so that only this member's mail waits.
///
/// Put it directly around the provider (inside the circuit breaker and the rate limit):
/// it is the member's own.
///
/// # Example
/// ```
/// use mail_breaker::{LettreTransport, Transport};
/// use mail_breaker::reputation::ReputationBreaker;
/// use lettre::transport::stub::AsyncStubTransport;
///
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// let ses = LettreTransport::new(AsyncStubTransport::new_ok(), |_| unreachable!()).with_name("ses");
/// let breaker = ReputationBreaker::builder("ses").build()?;
/// let transport = breaker.wrap(ses);
/// let message = lettre::Message::builder()
///     .from("app@example.com".parse().unwrap())
///     .to("user@example.org".parse().unwrap())
///     .body(String::from("hello"))
///     .unwrap();
/// transport.send(&message).await?;
/// assert_eq!(breaker.standing().await?.window.sends, 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[derive(Debug)]
pub struct ReputationTransport<T> {
    inner: T,
    breaker: ReputationBreaker,
}

impl<T> ReputationTransport<T> {
    /// `inner` held back by `breaker`; the same as [`ReputationBreaker::wrap`].
    ///
    /// ```
    /// # use mail_breaker::LettreTransport;
    /// # use mail_breaker::reputation::{ReputationBreaker, ReputationTransport};
    /// # use lettre::transport::stub::AsyncStubTransport;
    /// # let ses = LettreTransport::new(AsyncStubTransport::new_ok(), |_| unreachable!()).with_name("ses");
    /// let breaker = ReputationBreaker::builder("ses").build()?;
    /// let mut transport = ReputationTransport::new(ses, breaker);
    /// assert_eq!(transport.breaker().member(), "ses");
    /// let _inner = transport.get_ref();
    /// let _inner = transport.get_mut();
    /// let _ses = transport.into_inner();
    /// # Ok::<(), mail_breaker::ConfigError>(())
    /// ```
    pub fn new(inner: T, breaker: ReputationBreaker) -> Self {
        ReputationTransport { inner, breaker }
    }

    /// The breaker that holds it back.
    pub fn breaker(&self) -> &ReputationBreaker {
        &self.breaker
    }

    /// The transport it wraps.
    pub fn get_ref(&self) -> &T {
        &self.inner
    }

    /// The transport it wraps, to change.
    pub fn get_mut(&mut self) -> &mut T {
        &mut self.inner
    }

    /// The transport it wraps, unwrapped.
    pub fn into_inner(self) -> T {
        self.inner
    }
}

/// How many recipients of `envelope` the provider took, as `receipt` says.
fn accepted(envelope: &Envelope, receipt: &Receipt) -> u64 {
    let refused = receipt.rejected_recipients().len() + receipt.deferred_recipients().len();
    envelope.to().len().saturating_sub(refused) as u64
}

#[async_trait::async_trait]
impl<T: Transport> Transport for ReputationTransport<T> {
    fn name(&self) -> &str {
        self.inner.name()
    }

    async fn send_raw(&self, envelope: &Envelope, raw: &[u8]) -> Result<Receipt, SendError> {
        self.breaker.admit(self.inner.name()).await?;
        let receipt = self.inner.send_raw(envelope, raw).await?;
        self.breaker.sent(accepted(envelope, &receipt)).await;
        Ok(receipt)
    }

    async fn verify(&self) -> Result<(), SendError> {
        self.inner.verify().await
    }
}

#[cfg(test)]
mod tests {
    use lettre::transport::stub::AsyncStubTransport;

    use super::*;
    use crate::reputation::Tier;
    // layers: the tests' stub provider, an adapter, stands in for a member.
    use crate::{LettreTransport, PoolTransport};

    fn stub(name: &str) -> impl Transport + 'static {
        let never = |_: &lettre::transport::stub::Error| -> SendError { unreachable!() };
        LettreTransport::new(AsyncStubTransport::new_ok(), never).with_name(name)
    }

    fn message() -> lettre::Message {
        lettre::Message::builder()
            .from("app@example.com".parse().expect("a sender"))
            .to("user@example.org".parse().expect("a recipient"))
            .body(String::from("hello"))
            .expect("a message")
    }

    /// A breaker for `name` opened by 41 hard bounces in 1,000 sends.
    async fn opened(name: &str) -> ReputationBreaker {
        let breaker = ReputationBreaker::builder(name)
            .build()
            .expect("default rules");
        breaker.sent(1_000).await;
        let heard: Vec<_> = (0..41)
            .map(|n| crate::reputation::Heard {
                id: format!("b{n}"),
                signal: crate::reputation::Signal::HardBounce,
            })
            .collect();
        breaker.store_record_for_tests(&heard).await;
        assert_eq!(breaker.tier(), Tier::Open);
        breaker
    }

    #[tokio::test]
    async fn a_hold_of_a_member_alone_holds_back_every_message() {
        let transport = opened("ses").await.wrap(stub("ses"));
        let error = transport.send(&message()).await.expect_err("held");
        assert!(error.refuses_every_message());
    }

    #[tokio::test]
    async fn a_hold_answered_by_a_pool_of_several_members_holds_back_that_message_alone() {
        let pool = PoolTransport::builder()
            .add(opened("ses").await.wrap(stub("ses")), 1)
            .add(stub("postmark"), 2)
            .build()
            .expect("two members");
        let error = pool.send(&message()).await.expect_err("held");
        assert!(error.is_reputation_hold());
        assert!(!error.refuses_every_message());
    }

    #[tokio::test]
    async fn a_hold_answered_by_a_pool_of_that_member_alone_still_holds_back_every_message() {
        let pool = PoolTransport::builder()
            .add(opened("ses").await.wrap(stub("ses")), 1)
            .build()
            .expect("one member");
        let error = pool.send(&message()).await.expect_err("held");
        assert!(error.refuses_every_message());
    }

    #[tokio::test]
    async fn only_the_recipients_the_provider_took_are_counted_as_sends() {
        let ann: lettre::Address = "ann@example.org".parse().expect("an address");
        let bob: lettre::Address = "bob@example.org".parse().expect("an address");
        let envelope = Envelope::new(None, vec![ann, bob.clone()]).expect("an envelope");
        let why = SendError::new(crate::Category::Rejected, "smtp.550", "no such user");
        let receipt = Receipt::new("smtp").with_rejected_recipient(bob, why);
        assert_eq!(accepted(&envelope, &receipt), 1);
    }
}
