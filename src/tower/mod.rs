//! The breaker for every tower service, and the mail stack as one (feature `tower`,
//! DESIGN §22).
//!
//! - [`CircuitBreakerLayer`]: the mail breaker's rules, state machine and stores (memory,
//!   or Redis shared by a fleet: one probe across every process) as a [`tower::Layer`] for
//!   any [`tower::Service`], with a [`Classify`] from the service's result to success,
//!   failure or not counted, a [`BreakerHandle`] to read and operate it, and a choice of how
//!   to refuse ([`Refuse`]): in the call, so that `tower::buffer` keeps serving, or by not
//!   being ready, so that `tower::balance` sends elsewhere.
//! - [`TransportService`]: a [`Transport`](crate::Transport) (a provider, a pool, a whole
//!   [`Mailer`](crate::Mailer)) as a `Service<SendRequest>`, for tower's middleware and
//!   apalis's workers.
//! - [`ServiceTransport`]: a tower service as a `Transport`, to stand in a pool or behind
//!   the crate's breaker and retry.
//! - [`SendRequest`]: a message as a request (envelope and bytes), serializable, so that a
//!   job can carry it.
//!
//! ```
//! use std::time::Duration;
//! use mail_breaker::tower::{CircuitBreakerLayer, Refuse, SendErrors, SendRequest, TransportService};
//! use mail_breaker::LettreTransport;
//! use lettre::transport::stub::AsyncStubTransport;
//! use tower::{ServiceBuilder, ServiceExt};
//!
//! # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
//! let breaker = CircuitBreakerLayer::builder("relay")
//!     .failure_threshold(3)
//!     .classify(SendErrors)
//!     .when_open(Refuse::InCall)
//!     .build()?;
//! let provider = LettreTransport::new(AsyncStubTransport::new_ok(), |_| unreachable!());
//! let service = ServiceBuilder::new()
//!     .timeout(Duration::from_secs(10))
//!     .layer(breaker)
//!     .service(TransportService::new(provider));
//! let message = lettre::Message::builder()
//!     .from("app@example.com".parse().unwrap())
//!     .to("user@example.org".parse().unwrap())
//!     .body(String::from("hello"))
//!     .unwrap();
//! let receipt = service.oneshot(SendRequest::from(&message)).await;
//! assert!(receipt.is_ok());
//! # Ok::<(), mail_breaker::ConfigError>(())
//! # }).unwrap();
//! ```

mod layer;
mod request;
mod service;

pub use layer::{
    BreakerError, BreakerHandle, CircuitBreakerLayer, CircuitBreakerLayerBuilder,
    CircuitBreakerService, Classify, EveryError, Refuse, ResponseFuture, SendErrors, Verdict,
};
pub use request::SendRequest;
pub use service::{ServiceTransport, TransportService};
