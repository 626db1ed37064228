//! Text from a request (its path, a header, a name it carries) as it may be written to a log:
//! every control character (C0, DEL, C1, U+009B being CSI) and every bidirectional control
//! written as a `\u{...}` escape, so that a log read in a terminal or a viewer shows what was
//! sent and is not rewritten by it.

use std::fmt;

/// `text` as [`Display`](fmt::Display) writes it to a log: see the [module docs](self).
pub(crate) struct Escaped<'a>(pub(crate) &'a str);

impl fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for c in self.0.chars() {
            if is_escaped(c) {
                write!(f, "\\u{{{:x}}}", u32::from(c))?;
            } else {
                fmt::Write::write_char(f, c)?;
            }
        }
        Ok(())
    }
}

/// Whether `c` is written escaped: a control character, or one that changes the direction
/// of the text around it (the embeddings and overrides U+202A–U+202E, the isolates
/// U+2066–U+2069, and the marks U+200E, U+200F and U+061C).
fn is_escaped(c: char) -> bool {
    c.is_control()
        || ('\u{202a}'..='\u{202e}').contains(&c)
        || ('\u{2066}'..='\u{2069}').contains(&c)
        || matches!(c, '\u{200e}' | '\u{200f}' | '\u{061c}')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_control_and_bidi_character_is_written_escaped_and_the_rest_as_it_is() {
        let hostile = "/a\u{1b}]52;c;x\u{7}\r\n\u{7f}\u{80}\u{9b}\u{9f}\u{202a}\u{202e}\u{2066}\u{2069}\u{200e}\u{200f}\u{61c}é→z";
        assert_eq!(
            Escaped(hostile).to_string(),
            r"/a\u{1b}]52;c;x\u{7}\u{d}\u{a}\u{7f}\u{80}\u{9b}\u{9f}\u{202a}\u{202e}\u{2066}\u{2069}\u{200e}\u{200f}\u{61c}é→z"
        );
    }

    #[test]
    fn the_characters_beside_the_bidi_ranges_are_written_as_they_are() {
        for c in [
            '\u{2029}', '\u{202f}', '\u{2065}', '\u{206a}', '\u{200d}', '\u{2010}',
        ] {
            assert_eq!(Escaped(&c.to_string()).to_string(), c.to_string(), "{c:?}");
        }
    }
}
