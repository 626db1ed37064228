//! The reputation breaker (DESIGN §20): a member's rolling rates of hard bounces and
//! complaints over sends, and the tier they put it in.

mod rules;
mod window;

pub use rules::{Limits, MAX_BUCKETS, Ppm, ReputationRules};
pub use window::{Counts, Reputation, Standing, Tier, TierChange};
