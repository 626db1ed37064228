//! The reputation breaker (DESIGN §20): a provider that suspends the account is not
//! answered by failover, so each member keeps rolling rates of hard bounces and complaints
//! over its sends and acts before the provider's own thresholds.
//!
//! - [`Reputation`] (in `window.rs`): the pure core, counts in and a [`Tier`] out.
//! - [`ReputationStore`]: where the counts and the open flag are kept, atomically per
//!   member: [`MemoryReputation`], or a `RedisStore` (feature `redis`) for a fleet.
//! - [`ReputationBreaker`]: one member's breaker; an
//!   [`EventSink`](crate::events::EventSink) for the webhook receivers.
//! - [`ReputationTransport`]: the member's transport, held back while the breaker is open.
//!
//! ```
//! use mail_breaker::{LettreTransport, PoolTransport};
//! use mail_breaker::reputation::ReputationBreaker;
//! use lettre::transport::stub::AsyncStubTransport;
//!
//! # let stub = |name: &str| LettreTransport::new(AsyncStubTransport::new_ok(), |_| unreachable!()).with_name(name);
//! let ses = ReputationBreaker::builder("ses").build()?;
//! let postmark = ReputationBreaker::builder("postmark").failover(true).build()?;
//! let pool = PoolTransport::builder()
//!     .add(ses.wrap(stub("ses")), 1)
//!     .add(postmark.wrap(stub("postmark")), 2)
//!     .build()?;
//! // Hand `ses` and `postmark` to the webhook receivers as event sinks.
//! # Ok::<(), mail_breaker::ConfigError>(())
//! ```

mod breaker;
#[cfg(feature = "redis")]
mod redis;
mod rules;
mod store;
mod transport;
mod window;

pub use breaker::{ReputationBreaker, ReputationBuilder};
pub use rules::{Limits, MAX_BUCKETS, Ppm, ReputationRules};
pub use store::{Heard, MemoryReputation, Recorded, ReputationStore, SEEN_IDS, Signal};
pub use transport::ReputationTransport;
pub use window::{Counts, Reputation, Standing, Tier, TierChange};
