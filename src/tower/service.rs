//! [`TransportService`] (a transport as a tower service) and [`ServiceTransport`] (a tower
//! service as a transport).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use ::tower::{Service, ServiceExt};

use super::SendRequest;
use crate::{Envelope, Receipt, SendError, Transport};

/// A [`Transport`] (a provider, a breaker, a pool, a whole [`Mailer`](crate::Mailer)) as a
/// tower [`Service`], so that tower's middleware (a timeout, a concurrency limit, load
/// shedding) and apalis's workers compose with it. It is always ready (the stack answers
/// each send, a refusal included, with its own answer) and cheap to clone: clones share the
/// transport and send concurrently.
///
/// ```
/// use std::time::Duration;
/// use mail_breaker::tower::{SendRequest, TransportService};
/// use mail_breaker::LettreTransport;
/// use lettre::transport::stub::AsyncStubTransport;
/// use tower::{ServiceBuilder, ServiceExt};
///
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// let provider = LettreTransport::new(AsyncStubTransport::new_ok(), |_| unreachable!());
/// let service = ServiceBuilder::new()
///     .timeout(Duration::from_secs(10))
///     .service(TransportService::new(provider));
/// let message = lettre::Message::builder()
///     .from("app@example.com".parse().unwrap())
///     .to("user@example.org".parse().unwrap())
///     .body(String::from("hello"))
///     .unwrap();
/// let receipt = service.oneshot(SendRequest::from(&message)).await.unwrap();
/// assert!(receipt.transport().starts_with("lettre"));
/// # });
/// ```
pub struct TransportService<T> {
    transport: Arc<T>,
}

impl<T: Transport> TransportService<T> {
    /// `transport` as a service.
    pub fn new(transport: T) -> TransportService<T> {
        TransportService::from_arc(Arc::new(transport))
    }

    /// A transport shared with other owners, as a service.
    pub fn from_arc(transport: Arc<T>) -> TransportService<T> {
        TransportService { transport }
    }

    /// The transport it sends through.
    pub fn transport(&self) -> &T {
        &self.transport
    }
}

impl<T> Clone for TransportService<T> {
    fn clone(&self) -> Self {
        TransportService {
            transport: Arc::clone(&self.transport),
        }
    }
}

impl<T: Transport> fmt::Debug for TransportService<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TransportService")
            .field("transport", &self.transport.name())
            .finish()
    }
}

impl<T: Transport + 'static> Service<SendRequest> for TransportService<T> {
    type Response = Receipt;
    type Error = SendError;
    type Future = Pin<Box<dyn Future<Output = Result<Receipt, SendError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), SendError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: SendRequest) -> Self::Future {
        let transport = Arc::clone(&self.transport);
        Box::pin(async move { transport.send_raw(&request.envelope, &request.raw).await })
    }
}

/// A tower [`Service`] of [`SendRequest`]s that answers [`Receipt`]s, as a [`Transport`]: it
/// stands in a pool, behind a breaker or a retry, in the outbox's worker. Each send drives
/// `ready` and `call` on a clone of the service, so sends run concurrently (as far as the
/// service lets them: a `ConcurrencyLimit` inside still limits). `classify` turns the
/// service's error (a `tower::timeout` elapsed, a load-shed refusal, your own) into a
/// [`SendError`] of the right [`Category`](crate::Category), which decides what a breaker,
/// a pool and a retry do with it.
///
/// ```
/// use mail_breaker::tower::{SendRequest, ServiceTransport};
/// use mail_breaker::{Category, Receipt, SendError, Transport};
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let service = tower::service_fn(|request: SendRequest| async move {
///     let _ = request.raw; // hand it to your own client
///     Ok::<_, std::io::Error>(Receipt::new("my-api"))
/// });
/// let transport = ServiceTransport::new("my-api", service, |error: std::io::Error| {
///     SendError::new(Category::Network, "my-api.io", error.to_string())
/// });
/// let message = lettre::Message::builder()
///     .from("app@example.com".parse().unwrap())
///     .to("user@example.org".parse().unwrap())
///     .body(String::from("hello"))
///     .unwrap();
/// assert_eq!(transport.send(&message).await.unwrap().transport(), "my-api");
/// # });
/// ```
pub struct ServiceTransport<S, F> {
    name: String,
    service: Mutex<S>,
    classify: F,
}

impl<S, F> ServiceTransport<S, F> {
    /// `service` as a transport named `name`, its errors turned into [`SendError`]s by
    /// `classify` (which should say the category; its transport is set to `name`).
    pub fn new(name: impl Into<String>, service: S, classify: F) -> ServiceTransport<S, F> {
        ServiceTransport {
            name: name.into(),
            service: Mutex::new(service),
            classify,
        }
    }
}

impl<S, F> fmt::Debug for ServiceTransport<S, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServiceTransport")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

#[async_trait::async_trait]
impl<S, F> Transport for ServiceTransport<S, F>
where
    S: Service<SendRequest, Response = Receipt> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Send,
    F: Fn(S::Error) -> SendError + Send + Sync + 'static,
{
    fn name(&self) -> &str {
        &self.name
    }

    async fn send_raw(&self, envelope: &Envelope, raw: &[u8]) -> Result<Receipt, SendError> {
        let service = self
            .service
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let request = SendRequest::new(envelope.clone(), bytes::Bytes::copy_from_slice(raw));
        let tag = |error: S::Error| match (self.classify)(error) {
            error if error.transport().is_some() => error,
            error => error.with_transport(&self.name),
        };
        service.oneshot(request).await.map_err(tag)
    }
}
