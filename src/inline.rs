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
    pub(crate) fn is(&self, text: &str) -> bool {
        match self {
            InlineStr::Short { len, bytes } => bytes[..usize::from(*len)] == *text.as_bytes(),
            InlineStr::Long(long) => **long == *text,
        }
    }
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
