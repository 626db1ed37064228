//! [`InlineStr`]: a short string kept in place, for the names and keys that every send reads
//! or copies.

use std::sync::Arc;

/// A string of at most `N` bytes kept in place, or a longer one shared.
///
/// Copying a short one copies its bytes and touches nothing shared: no allocation, and no
/// atomic count, which a refusal naming its transport would otherwise pay twice (clone and
/// drop), more than the rest of the refusal. Reading one reads no other cache line.
#[derive(Clone)]
pub(crate) enum InlineStr<const N: usize> {
    Short { len: u8, bytes: [u8; N] },
    Long(Arc<str>),
}

impl<const N: usize> InlineStr<N> {
    /// `text`, in place if it fits, else copied into a new shared string.
    pub(crate) fn new(text: &str) -> Self {
        InlineStr::short(text).unwrap_or_else(|| InlineStr::Long(Arc::from(text)))
    }

    /// `text`, in place if it fits, else sharing it.
    pub(crate) fn shared(text: &Arc<str>) -> Self {
        InlineStr::short(text).unwrap_or_else(|| InlineStr::Long(Arc::clone(text)))
    }

    fn short(text: &str) -> Option<Self> {
        let len = u8::try_from(text.len())
            .ok()
            .filter(|&len| usize::from(len) <= N)?;
        let mut bytes = [0; N];
        bytes[..text.len()].copy_from_slice(text.as_bytes());
        Some(InlineStr::Short { len, bytes })
    }

    /// Makes it `text`, written over its own bytes when `text` fits in place.
    pub(crate) fn set(&mut self, text: &str) {
        match (self, u8::try_from(text.len())) {
            (InlineStr::Short { len, bytes }, Ok(new_len)) if text.len() <= N => {
                if let Some(room) = bytes.get_mut(..text.len()) {
                    room.copy_from_slice(text.as_bytes());
                    *len = new_len;
                }
            }
            (this, _) => *this = InlineStr::new(text),
        }
    }

    pub(crate) fn as_str(&self) -> &str {
        match self {
            // Made from a whole `&str` in `short`, so its bytes are valid UTF-8.
            InlineStr::Short { len, bytes } => {
                std::str::from_utf8(&bytes[..usize::from(*len)]).unwrap_or_default()
            }
            InlineStr::Long(long) => long,
        }
    }

    /// Whether it is `text`, without checking the bytes are UTF-8 again.
    #[inline]
    pub(crate) fn is(&self, text: &str) -> bool {
        match self {
            InlineStr::Short { len, bytes } => {
                usize::from(*len) == text.len()
                    && bytes
                        .get(..text.len())
                        .is_some_and(|mine| same_bytes(mine, text.as_bytes()))
            }
            InlineStr::Long(long) => **long == *text,
        }
    }
}

/// Whether `a` and `b`, of the same length, hold the same bytes. Every send compares its
/// key with the breaker's first key: a name or domain of 4 to 32 bytes is compared as two
/// overlapping words from each end, in a few instructions instead of a call to `memcmp`.
#[inline]
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    let n = a.len();
    if n != b.len() {
        return false;
    }
    match n {
        16..=32 => ends::<16>(a, n) == ends::<16>(b, n),
        8..=15 => ends::<8>(a, n) == ends::<8>(b, n),
        4..=7 => ends::<4>(a, n) == ends::<4>(b, n),
        _ => a == b,
    }
}

/// The first and the last `W` bytes of `bytes`, `n` long and at least `W`.
#[inline]
fn ends<const W: usize>(bytes: &[u8], n: usize) -> ([u8; W], [u8; W]) {
    let word = |at: usize| {
        bytes
            .get(at..at + W)
            .and_then(|word| <[u8; W]>::try_from(word).ok())
            .unwrap_or([0; W])
    };
    (word(0), word(n.saturating_sub(W)))
}

impl<const N: usize> std::fmt::Debug for InlineStr<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self.as_str(), f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_string_is_kept_in_place_and_read_back_whole() {
        let name = InlineStr::<8>::new("smtp://a");
        assert!(matches!(name, InlineStr::Short { .. }));
        assert_eq!(name.as_str(), "smtp://a");
        assert!(name.is("smtp://a"));
        assert!(!name.is("smtp://b"));
        assert!(!name.is("smtp://"));
    }

    #[test]
    fn a_string_set_again_reads_back_as_the_new_string_whatever_its_length() {
        let mut key = InlineStr::<8>::new("d1.examp");
        key.set("a.b");
        assert_eq!(key.as_str(), "a.b");
        assert!(key.is("a.b") && !key.is("a.b.") && !key.is("a.c"));
        key.set("longer.example");
        assert!(matches!(key, InlineStr::Long(_)));
        assert_eq!(key.as_str(), "longer.example");
        key.set("short");
        assert!(matches!(key, InlineStr::Short { .. }));
        assert_eq!(key.as_str(), "short");
    }

    #[test]
    fn strings_of_every_length_up_to_forty_are_told_apart_by_each_byte() {
        for len in 0..=40 {
            let text: String = (0..len)
                .map(|i| char::from(b'a' + (i % 26) as u8))
                .collect();
            let key = InlineStr::<46>::new(&text);
            assert!(key.is(&text), "{len} bytes");
            for at in 0..len {
                let mut other = text.clone().into_bytes();
                other[at] = b'-';
                let other = String::from_utf8(other).unwrap_or_default();
                assert!(!key.is(&other), "{len} bytes, byte {at} differs");
            }
            assert!(!key.is(&format!("{text}-")), "{len} bytes and one more");
        }
    }

    #[test]
    fn a_string_longer_than_its_room_is_shared() {
        let long: Arc<str> = Arc::from("smtp://relay.example.com:587");
        let name = InlineStr::<8>::shared(&long);
        assert!(matches!(&name, InlineStr::Long(shared) if Arc::ptr_eq(shared, &long)));
        assert_eq!(name.as_str(), &*long);
        assert!(name.is("smtp://relay.example.com:587"));
        assert!(!name.is("smtp://relay.example.com:58"));
    }

    #[test]
    fn a_string_of_exactly_its_room_or_empty_is_kept_in_place() {
        assert!(matches!(
            InlineStr::<4>::new("abcd"),
            InlineStr::Short { len: 4, .. }
        ));
        assert!(matches!(
            InlineStr::<4>::new(""),
            InlineStr::Short { len: 0, .. }
        ));
        assert!(matches!(InlineStr::<4>::new("abcde"), InlineStr::Long(_)));
    }

    #[test]
    fn a_room_past_255_bytes_still_shares_what_a_length_byte_cannot_count() {
        let text = "x".repeat(256);
        assert!(matches!(InlineStr::<300>::new(&text), InlineStr::Long(_)));
        assert_eq!(InlineStr::<300>::new(&text).as_str(), text);
    }

    #[test]
    fn multi_byte_text_reads_back_whole() {
        let name = InlineStr::<16>::new("relais-é.fr");
        assert_eq!(name.as_str(), "relais-é.fr");
        assert_eq!(format!("{name:?}"), "\"relais-é.fr\"");
    }
}
