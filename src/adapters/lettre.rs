//! [`LettreTransport`]: any of lettre's async transports (file, sendmail, stub) as a [`Transport`].

use std::fmt;

use crate::{Envelope, Receipt, SendError, Transport};

/// Wraps one of lettre's async transports, turning its errors into [`SendError`]s with `classify`.
///
/// The receipt's response is the transport's own answer, printed with `Debug`, unless that
/// answer is `()`. For SMTP use [`SmtpTransport`](crate::SmtpTransport), which knows SMTP's
/// reply codes.
///
/// ```
/// use lettre::transport::stub::AsyncStubTransport;
/// use mail_breaker::{Category, LettreTransport, SendError, Transport};
///
/// let stub = LettreTransport::new(AsyncStubTransport::new_error(), |err| {
///     SendError::new(Category::ServerError, "stub.error", err.to_string())
/// })
/// .with_name("stub:failing");
/// assert_eq!(stub.name(), "stub:failing");
/// ```
pub struct LettreTransport<L, C> {
    inner: L,
    classify: C,
    name: String,
}

impl<L, C> LettreTransport<L, C>
where
    L: lettre::AsyncTransport + Send + Sync,
    L::Ok: fmt::Debug,
    C: Fn(&L::Error) -> SendError + Send + Sync,
{
    /// Wraps `inner`; `classify` turns each of its errors into a [`SendError`].
    pub fn new(inner: L, classify: C) -> Self {
        let type_name = std::any::type_name::<L>();
        let short = type_name.rsplit("::").next().unwrap_or(type_name);
        LettreTransport {
            inner,
            classify,
            name: format!("lettre:{short}"),
        }
    }

    /// Sets the name used in logs, receipts and breaker keys (default `lettre:<type>`).
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// The wrapped lettre transport.
    pub fn inner(&self) -> &L {
        &self.inner
    }
}

#[async_trait::async_trait]
impl<L, C> Transport for LettreTransport<L, C>
where
    L: lettre::AsyncTransport + Send + Sync,
    L::Ok: fmt::Debug,
    C: Fn(&L::Error) -> SendError + Send + Sync,
{
    fn name(&self) -> &str {
        &self.name
    }

    async fn send_raw(&self, envelope: &Envelope, raw: &[u8]) -> Result<Receipt, SendError> {
        self.deliver(envelope, raw).await
    }

    crate::transport::unboxed_through_deliver!();
}

impl<L, C> LettreTransport<L, C>
where
    L: lettre::AsyncTransport + Send + Sync,
    L::Ok: fmt::Debug,
    C: Fn(&L::Error) -> SendError + Send + Sync,
{
    /// Sends one formatted message through lettre: `send_raw`, as a future of its own.
    async fn deliver(&self, envelope: &Envelope, raw: &[u8]) -> Result<Receipt, SendError> {
        match self.inner.send_raw(envelope, raw).await {
            Ok(answer) => {
                let receipt = Receipt::new(&self.name);
                let text = format!("{answer:?}");
                Ok(if text == "()" {
                    receipt
                } else {
                    receipt.with_response(text)
                })
            }
            Err(error) => Err((self.classify)(&error).with_transport(&self.name)),
        }
    }
}

impl<L, C> fmt::Debug for LettreTransport<L, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LettreTransport")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}
