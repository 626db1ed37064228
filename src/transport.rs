//! The [`Transport`] trait every provider and every wrapper of this crate implements.

use std::sync::Arc;

use futures::StreamExt;

pub use lettre::{Message, address::Envelope};

use crate::{Category, Receipt, SendError};

/// Messages read lazily by [`Transport::send_many`].
pub type MessageStream<'a> = futures::stream::BoxStream<'a, Message>;

/// One answer per message read, in the order read.
pub type ReceiptStream<'a> = futures::stream::BoxStream<'a, Result<Receipt, SendError>>;

/// An async mail transport: a provider (SMTP, SES, your own) or a wrapper around one.
///
/// Implement [`name`](Transport::name) and [`send_raw`](Transport::send_raw); the other
/// methods have defaults. A transport that can send batches faster than one message at a
/// time overrides [`send_many`](Transport::send_many).
///
/// # Batch failures
/// A transport whose whole batch fails (the connection dropped, the bulk API call errored)
/// yields one `Err` made with [`SendError::batch_failure`] and ends its stream. Every wrapper
/// in this crate then answers each message of the batch that has no answer yet with a clone
/// of that error, so a caller always gets one item per message.
///
/// # Example
/// ```
/// use mail_breaker::{Envelope, Receipt, SendError, Transport};
///
/// struct Discard;
///
/// #[async_trait::async_trait]
/// impl Transport for Discard {
///     fn name(&self) -> &str {
///         "discard"
///     }
///     async fn send_raw(&self, _envelope: &Envelope, _raw: &[u8]) -> Result<Receipt, SendError> {
///         Ok(Receipt::new(self.name()))
///     }
/// }
///
/// # tokio_test(async {
/// let message = lettre::Message::builder()
///     .from("app@example.com".parse().unwrap())
///     .to("user@example.org".parse().unwrap())
///     .body(String::from("hello"))
///     .unwrap();
/// let receipt = Discard.send(&message).await.unwrap();
/// assert_eq!(receipt.transport(), "discard");
/// # });
/// # fn tokio_test(f: impl std::future::Future<Output = ()>) {
/// #     tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f)
/// # }
/// ```
#[async_trait::async_trait]
pub trait Transport: Send + Sync {
    /// A short name for logs, metrics and receipts: `"smtp://relay.example.com:587"`, `"ses:eu-west-1"`.
    fn name(&self) -> &str;

    /// Sends one formatted message.
    async fn send_raw(&self, envelope: &Envelope, raw: &[u8]) -> Result<Receipt, SendError>;

    /// Sends one message (default: formats it and calls [`send_raw`](Transport::send_raw)).
    async fn send(&self, message: &Message) -> Result<Receipt, SendError> {
        self.send_raw(message.envelope(), &message.formatted())
            .await
    }

    /// [`send_raw`](Transport::send_raw)'s future, unboxed where the transport can give it so:
    /// for a wrapper that boxes its own future and polls this one inside it, so that a send
    /// through both makes one allocation rather than two (the
    /// [`CircuitBreakerTransport`](crate::CircuitBreakerTransport) over this transport does).
    ///
    /// It must answer exactly as `send_raw` does. The default is `send_raw`'s boxed future;
    /// a transport whose send is an `async fn` of its own returns that function's future.
    ///
    /// # Example
    /// ```
    /// use std::future::Future;
    /// use mail_breaker::{Envelope, Receipt, SendError, Transport};
    ///
    /// struct Discard;
    ///
    /// impl Discard {
    ///     async fn deliver(&self) -> Result<Receipt, SendError> {
    ///         Ok(Receipt::new("discard"))
    ///     }
    /// }
    ///
    /// #[async_trait::async_trait]
    /// impl Transport for Discard {
    ///     fn name(&self) -> &str {
    ///         "discard"
    ///     }
    ///     async fn send_raw(&self, _envelope: &Envelope, _raw: &[u8]) -> Result<Receipt, SendError> {
    ///         self.deliver().await
    ///     }
    ///     fn send_raw_unboxed<'a>(
    ///         &'a self,
    ///         _envelope: &'a Envelope,
    ///         _raw: &'a [u8],
    ///     ) -> impl Future<Output = Result<Receipt, SendError>> + Send + 'a {
    ///         self.deliver()
    ///     }
    /// }
    /// ```
    fn send_raw_unboxed<'a>(
        &'a self,
        envelope: &'a Envelope,
        raw: &'a [u8],
    ) -> impl Future<Output = Result<Receipt, SendError>> + Send + 'a
    where
        Self: Sized,
    {
        self.send_raw(envelope, raw)
    }

    /// [`send`](Transport::send)'s future, unboxed where the transport can give it so, as
    /// [`send_raw_unboxed`](Transport::send_raw_unboxed) is `send_raw`'s. It must answer exactly
    /// as `send` does; the default is `send`'s boxed future.
    ///
    /// # Example
    /// ```
    /// use std::future::Future;
    /// use mail_breaker::{Envelope, Message, Receipt, SendError, Transport};
    ///
    /// struct Discard;
    ///
    /// impl Discard {
    ///     async fn deliver(&self) -> Result<Receipt, SendError> {
    ///         Ok(Receipt::new("discard"))
    ///     }
    /// }
    ///
    /// #[async_trait::async_trait]
    /// impl Transport for Discard {
    ///     fn name(&self) -> &str {
    ///         "discard"
    ///     }
    ///     async fn send_raw(&self, _envelope: &Envelope, _raw: &[u8]) -> Result<Receipt, SendError> {
    ///         self.deliver().await
    ///     }
    ///     fn send_unboxed<'a>(
    ///         &'a self,
    ///         _message: &'a Message,
    ///     ) -> impl Future<Output = Result<Receipt, SendError>> + Send + 'a {
    ///         self.deliver()
    ///     }
    /// }
    /// ```
    fn send_unboxed<'a>(
        &'a self,
        message: &'a Message,
    ) -> impl Future<Output = Result<Receipt, SendError>> + Send + 'a
    where
        Self: Sized,
    {
        self.send(message)
    }

    /// Sends a batch read lazily from `messages`; yields exactly one item per message it
    /// read, in the order read (default: one at a time through [`send`](Transport::send)).
    ///
    /// A `send` answers one message: an error it returns marked as a
    /// [batch failure](SendError::batch_failure) (a wrapper's `send` may pass one on) is
    /// yielded without the mark, since this batch goes on after it.
    fn send_many<'a>(&'a self, messages: MessageStream<'a>) -> ReceiptStream<'a> {
        messages
            .then(move |message| async move {
                self.send(&message)
                    .await
                    .map_err(SendError::for_one_message)
            })
            .boxed()
    }

    /// Checks that the provider can be reached (default: `Ok`). Never guarded by a breaker.
    async fn verify(&self) -> Result<(), SendError> {
        Ok(())
    }
}

macro_rules! forward_transport {
    ($([$($generics:tt)*] $pointer:ty),+) => {$(
        #[async_trait::async_trait]
        impl<$($generics)* T: Transport + ?Sized> Transport for $pointer {
            fn name(&self) -> &str {
                (**self).name()
            }
            async fn send_raw(&self, envelope: &Envelope, raw: &[u8]) -> Result<Receipt, SendError> {
                (**self).send_raw(envelope, raw).await
            }
            async fn send(&self, message: &Message) -> Result<Receipt, SendError> {
                (**self).send(message).await
            }
            fn send_many<'a>(&'a self, messages: MessageStream<'a>) -> ReceiptStream<'a> {
                (**self).send_many(messages)
            }
            async fn verify(&self) -> Result<(), SendError> {
                (**self).verify().await
            }
        }
    )+};
}

forward_transport!([] Arc<T>, [] Box<T>, ['r,] &'r T);

/// Implements `send_raw_unboxed` and `send_unboxed` inside a `Transport` impl through the
/// type's own `async fn deliver(&self, &Envelope, &[u8])`, which its `send_raw` awaits: a
/// breaker over the transport then polls the send inside its own future.
///
/// Not `async fn`s: `async_trait` would box those (and it rewrites only the `async fn`s it
/// sees, so `send_raw` itself stays in the impl).
macro_rules! unboxed_through_deliver {
    () => {
        fn send_raw_unboxed<'a>(
            &'a self,
            envelope: &'a $crate::Envelope,
            raw: &'a [u8],
        ) -> impl Future<Output = Result<$crate::Receipt, $crate::SendError>> + Send + 'a {
            self.deliver(envelope, raw)
        }

        #[allow(clippy::manual_async_fn)]
        fn send_unboxed<'a>(
            &'a self,
            message: &'a $crate::Message,
        ) -> impl Future<Output = Result<$crate::Receipt, $crate::SendError>> + Send + 'a {
            async move { self.deliver(message.envelope(), &message.formatted()).await }
        }
    };
}

pub(crate) use unboxed_through_deliver;

/// Implements `lettre::AsyncTransport<Ok = Receipt, Error = SendError>` for a wrapper of this
/// crate, so that it drops into code written against lettre.
macro_rules! lettre_async_transport {
    ($wrapper:ty $(, $inner:ident)?) => {
        #[async_trait::async_trait]
        impl$(<$inner: $crate::Transport>)? lettre::AsyncTransport for $wrapper {
            type Ok = $crate::Receipt;
            type Error = $crate::SendError;

            async fn send_raw(
                &self,
                envelope: &$crate::Envelope,
                email: &[u8],
            ) -> Result<$crate::Receipt, $crate::SendError> {
                $crate::Transport::send_raw(self, envelope, email).await
            }
        }
    };
}

pub(crate) use lettre_async_transport;

/// `send_many` for a transport whose sends may run side by side: up to `concurrency` at
/// once through `send`, answered in message order.
#[cfg_attr(not(feature = "ses"), allow(dead_code))]
pub(crate) fn send_concurrently<'a, T: Transport + ?Sized>(
    transport: &'a T,
    messages: MessageStream<'a>,
    concurrency: usize,
) -> ReceiptStream<'a> {
    messages
        .map(move |message| async move {
            transport
                .send(&message)
                .await
                .map_err(SendError::for_one_message)
        })
        .buffered(concurrency)
        .boxed()
}

/// The answer for a message a transport read but ended its batch without answering.
pub(crate) fn unanswered(transport: &str) -> SendError {
    SendError::fixed(
        Category::ServerError,
        "transport.unanswered",
        "the transport ended its batch without answering this message",
    )
    .with_transport(transport)
}
