//! The locks and atomic words the memory store's lock-free paths are made of: the standard
//! library's, or loom's when the crate is built for its model check (`--cfg
//! mail_breaker_loom`, see `scripts/loom.sh`), which then runs every interleaving of them.

#[cfg(mail_breaker_loom)]
pub(crate) use loom::sync::atomic::{AtomicU64, Ordering};
#[cfg(mail_breaker_loom)]
pub(crate) use loom::sync::{Mutex, MutexGuard};
#[cfg(not(mail_breaker_loom))]
pub(crate) use std::sync::atomic::{AtomicU64, Ordering};
#[cfg(not(mail_breaker_loom))]
pub(crate) use std::sync::{Mutex, MutexGuard};
