#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

pub mod adapters;
pub mod breaker;
mod config;
mod receipt;
pub mod store;
mod transport;

pub use adapters::lettre::LettreTransport;
#[cfg(feature = "smtp")]
pub use adapters::smtp::{SmtpTransport, classify_smtp_error};
pub use breaker::{CircuitBreakerTransport, ErrorRate, Scope, State, StateChange};
pub use config::ConfigError;
pub use receipt::{Category, Receipt, SendError};
#[cfg(feature = "redis")]
pub use store::RedisStore;
pub use store::{BreakerStore, MemoryStore};
pub use transport::{Envelope, Message, MessageStream, ReceiptStream, Transport};
