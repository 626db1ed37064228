//! Metric handles taken from the recorder at their first use and kept, for the rooms that
//! record (the breaker, the pool, the retry, the rate limiter) under the `metrics` feature.
//!
//! A `counter!` with a label built per call allocates the label, builds and hashes a key and
//! asks the recorder for the handle, on every send. A kept handle is asked for once: each
//! send after that is the handle's own atomic add, through one load of a [`OnceLock`].
//!
//! Taken at the first use rather than when the transport is built, so that a recorder
//! installed after the stack was built, before its first send, receives everything. A
//! recorder installed after the first send does not: the handles are the first recorder's
//! (said in the operating chapter of the guide).

use std::fmt;
use std::sync::OnceLock;

/// One handle, taken at the first [`get`](Kept::get) and kept.
pub(crate) struct Kept<H>(OnceLock<H>);

impl<H> Kept<H> {
    pub(crate) const fn new() -> Self {
        Kept(OnceLock::new())
    }

    /// The handle, taken by `take` on the first call.
    #[inline]
    pub(crate) fn get(&self, take: impl FnOnce() -> H) -> &H {
        self.0.get_or_init(take)
    }
}

impl<H> Default for Kept<H> {
    fn default() -> Self {
        Kept::new()
    }
}

impl<H> fmt::Debug for Kept<H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let taken = self.0.get().is_some();
        f.debug_struct("Kept").field("taken", &taken).finish()
    }
}

/// A handle labelled with a name that may change (a transport's, which `inner_mut` can
/// rename): kept with the name it was taken under. A use under another name takes that
/// name's handle for the one use, as the `counter!` macro would.
pub(crate) struct Named<H>(OnceLock<(Box<str>, H)>);

impl<H> Named<H> {
    pub(crate) const fn new() -> Self {
        Named(OnceLock::new())
    }

    /// Applies `record` to the handle of `name`, taken by `take` when it is not the kept one.
    #[inline]
    pub(crate) fn record(&self, name: &str, take: impl Fn(&str) -> H, record: impl FnOnce(&H)) {
        let (kept_name, handle) = self.0.get_or_init(|| (Box::from(name), take(name)));
        if **kept_name == *name {
            record(handle);
        } else {
            record(&take(name));
        }
    }
}

impl<H> Default for Named<H> {
    fn default() -> Self {
        Named::new()
    }
}

impl<H> fmt::Debug for Named<H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = self.0.get().map(|(name, _)| &**name);
        f.debug_struct("Named").field("name", &name).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::{Kept, Named};

    #[test]
    fn a_kept_handle_says_in_debug_whether_it_was_taken() {
        let kept: Kept<u32> = Kept::new();
        assert_eq!(format!("{kept:?}"), "Kept { taken: false }");
        kept.get(|| 7);
        assert_eq!(format!("{kept:?}"), "Kept { taken: true }");
    }

    #[test]
    fn a_named_handle_shows_in_debug_the_name_it_was_taken_under() {
        let named: Named<u32> = Named::new();
        assert_eq!(format!("{named:?}"), "Named { name: None }");
        named.record("relay", |_| 7, |_| {});
        assert_eq!(format!("{named:?}"), r#"Named { name: Some("relay") }"#);
    }
}
