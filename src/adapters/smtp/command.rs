//! The command writer: SMTP commands and the message's octets as they go on the wire, put
//! into one buffer so that pipelined commands leave in one write.
//!
//! The message is made safe for the wire here (RFC 5321 §2.3.8, §4.5.2): every bare CR and
//! bare LF becomes CRLF, so no line can end where a receiver and this client disagree (SMTP
//! smuggling); for DATA a line that starts with `.` gets a second one, and the data ends with
//! exactly one `CRLF.CRLF`. For BDAT (RFC 3030) the length says where the data ends, so only
//! the line endings change. The EHLO name comes from the builder's check; an address is
//! checked here ([`check_envelope`]) before any command is written, since lettre's
//! `Address::new_dangerous` (or a caller's own unchecked source) may hold a line break, which
//! would turn a caller's input into a command of its own.

use std::fmt::Write as _;

use lettre::Address;
use lettre::transport::smtp::extension::ClientId;

use crate::{Category, Envelope, SendError};

/// Refuses an envelope whose sender or a recipient holds a control character (CR, LF, NUL
/// and the like): written into `MAIL FROM` or `RCPT TO`, a line break would end the command
/// early and make the rest a command of its own. `InvalidMessage`, `smtp.invalid_address`.
pub(super) fn check_envelope(envelope: &Envelope) -> Result<(), SendError> {
    let unsafe_address = |address: &Address| {
        AsRef::<str>::as_ref(address)
            .chars()
            .any(|c| c.is_ascii_control())
    };
    if envelope.from().is_some_and(unsafe_address) {
        return Err(SendError::fixed(
            Category::InvalidMessage,
            "smtp.invalid_address",
            "the sender's address holds a line break or another control character,              which no SMTP command may carry",
        ));
    }
    if envelope.to().iter().any(unsafe_address) {
        return Err(SendError::fixed(
            Category::InvalidMessage,
            "smtp.invalid_address",
            "a recipient's address holds a line break or another control character,              which no SMTP command may carry",
        ));
    }
    Ok(())
}

/// What MAIL FROM declares beside the sender.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct MailParameters {
    /// `SIZE=`: the octets of the message as sent, where the server offers SIZE.
    pub(super) size: Option<usize>,
    /// `BODY=8BITMIME`: the message is not ASCII.
    pub(super) eight_bit: bool,
    /// `SMTPUTF8`: an address, or the message's header, is not ASCII.
    pub(super) utf8: bool,
}

/// Commands waiting to be written together.
#[derive(Debug, Default)]
pub(super) struct Commands {
    out: Vec<u8>,
}

impl Commands {
    /// No command yet.
    pub(super) fn new() -> Self {
        Commands::default()
    }

    /// The octets to write, leaving none.
    pub(super) fn take(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.out)
    }

    fn line(&mut self, text: &str) -> &mut Self {
        self.out.extend_from_slice(text.as_bytes());
        self.out.extend_from_slice(b"\r\n");
        self
    }

    pub(super) fn ehlo(&mut self, name: &ClientId) -> &mut Self {
        self.line(&format!("EHLO {name}"))
    }

    pub(super) fn starttls(&mut self) -> &mut Self {
        self.line("STARTTLS")
    }

    /// `AUTH <mechanism>`, with the initial response (already base64) if there is one.
    pub(super) fn auth(&mut self, mechanism: &str, initial: Option<&str>) -> &mut Self {
        match initial {
            Some(response) => self.line(&format!("AUTH {mechanism} {response}")),
            None => self.line(&format!("AUTH {mechanism}")),
        }
    }

    /// A line answering an AUTH challenge (already base64).
    pub(super) fn auth_response(&mut self, response: &str) -> &mut Self {
        self.line(response)
    }

    pub(super) fn rset(&mut self) -> &mut Self {
        self.line("RSET")
    }

    pub(super) fn noop(&mut self) -> &mut Self {
        self.line("NOOP")
    }

    pub(super) fn quit(&mut self) -> &mut Self {
        self.line("QUIT")
    }

    pub(super) fn mail(&mut self, from: Option<&Address>, parameters: MailParameters) -> &mut Self {
        let mut command = String::from("MAIL FROM:<");
        if let Some(from) = from {
            command.push_str(from.as_ref());
        }
        command.push('>');
        if let Some(size) = parameters.size {
            let _ = write!(command, " SIZE={size}");
        }
        if parameters.eight_bit {
            command.push_str(" BODY=8BITMIME");
        }
        if parameters.utf8 {
            command.push_str(" SMTPUTF8");
        }
        self.line(&command)
    }

    pub(super) fn rcpt(&mut self, to: &Address) -> &mut Self {
        self.line(&format!("RCPT TO:<{}>", AsRef::<str>::as_ref(to)))
    }

    pub(super) fn data(&mut self) -> &mut Self {
        self.line("DATA")
    }

    /// The message after DATA's `354`: line endings made CRLF, dot-stuffed, ended by the one
    /// `CRLF.CRLF`.
    pub(super) fn data_body(&mut self, message: &[u8]) -> &mut Self {
        self.out.reserve(wire_length(message));
        for_each_line(message, |line| {
            if line.first() == Some(&b'.') {
                self.out.push(b'.');
            }
            self.out.extend_from_slice(line);
            self.out.extend_from_slice(b"\r\n");
        });
        self.out.extend_from_slice(b".\r\n");
        self
    }

    /// An empty message's end: what a client says after a `354` it should not have had.
    pub(super) fn data_end(&mut self) -> &mut Self {
        self.line(".")
    }

    /// `BDAT <n> LAST` and the message, its line endings made CRLF and its last line ended:
    /// exactly `n` octets.
    pub(super) fn bdat_last(&mut self, message: &[u8]) -> &mut Self {
        let length = wire_length(message);
        self.line(&format!("BDAT {length} LAST"));
        self.out.reserve(length);
        for_each_line(message, |line| {
            self.out.extend_from_slice(line);
            self.out.extend_from_slice(b"\r\n");
        });
        self
    }
}

/// The longest line SMTP carries, without its CRLF (RFC 5321 §4.5.3.1.6).
pub(super) const MAX_LINE: usize = 998;

/// What the client checks of a message before it sends it, read in one pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Shape {
    /// Its octets on the wire: [`wire_length`].
    pub(super) wire_length: usize,
    /// The first line over [`MAX_LINE`] octets: its number (from 1) and length.
    pub(super) too_long: Option<(usize, usize)>,
    /// Whether its header (up to the first empty line) holds octets that are not ASCII:
    /// raw UTF-8 in a `Subject` or a display name, which needs SMTPUTF8 (RFC 6531 §3.4).
    pub(super) utf8_header: bool,
}

/// The [`Shape`] of `message`.
pub(super) fn shape(message: &[u8]) -> Shape {
    let mut shape = Shape {
        wire_length: 0,
        too_long: None,
        utf8_header: false,
    };
    let mut in_header = true;
    let mut number = 0usize;
    for_each_line(message, |line| {
        number = number.saturating_add(1);
        shape.wire_length += line.len() + 2;
        if line.len() > MAX_LINE && shape.too_long.is_none() {
            shape.too_long = Some((number, line.len()));
        }
        if line.is_empty() {
            in_header = false;
        }
        if in_header && !line.is_ascii() {
            shape.utf8_header = true;
        }
    });
    shape
}

/// The octets of `message` on the wire without dot-stuffing: every line ending CRLF, the last
/// line ended. SIZE declares this, and BDAT sends exactly this many.
pub(super) fn wire_length(message: &[u8]) -> usize {
    let mut length = 0;
    for_each_line(message, |line| length += line.len() + 2);
    length
}

/// Hands each line of `message` to `line` as it goes on the wire, without its ending: a bare
/// CR, a bare LF and CRLF each end a line, and a last line without an ending counts as one.
/// A header line (before the first empty line) over [`MAX_LINE`] octets is folded (RFC 5322
/// §2.2.3: a line break put before a space or tab, which a reader takes out again), as lettre
/// writes a `To:` of many recipients on one line; one with no space to fold at stays long.
fn for_each_line(message: &[u8], mut line: impl FnMut(&[u8])) {
    let mut in_header = true;
    let mut each = |content: &[u8]| {
        if content.is_empty() {
            in_header = false;
        }
        if in_header {
            fold(content, &mut line);
        } else {
            line(content);
        }
    };
    let mut rest = message;
    while let Some(end) = rest
        .iter()
        .position(|&octet| octet == b'\r' || octet == b'\n')
    {
        let (content, after) = rest.split_at(end);
        each(content);
        let ending_length = if after.starts_with(b"\r\n") { 2 } else { 1 };
        rest = after.get(ending_length..).unwrap_or_default();
    }
    if !rest.is_empty() {
        each(rest);
    }
}

/// Hands a header line to `line` in pieces of at most [`MAX_LINE`] octets, each cut before a
/// space or tab, while there is one to cut at.
fn fold(mut header: &[u8], line: &mut impl FnMut(&[u8])) {
    while header.len() > MAX_LINE {
        // The last space or tab that leaves a piece of at most MAX_LINE octets with more
        // than white space in it.
        let cut = (1..=MAX_LINE).rev().find(|&at| {
            matches!(header.get(at), Some(b' ' | b'\t'))
                && header[..at]
                    .iter()
                    .any(|&octet| octet != b' ' && octet != b'\t')
        });
        let Some(cut) = cut else {
            break;
        };
        let (piece, rest) = header.split_at(cut);
        line(piece);
        header = rest;
    }
    line(header);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(message: &[u8]) -> Vec<u8> {
        Commands::new().data_body(message).take()
    }

    fn bdat(message: &[u8]) -> Vec<u8> {
        Commands::new().bdat_last(message).take()
    }

    #[test]
    fn bare_lf_and_bare_cr_become_crlf_and_no_line_can_end_the_data_early() {
        let wire = data(b"a\n.\r\nMAIL FROM:<x@evil.test>\rb");
        assert_eq!(wire, b"a\r\n..\r\nMAIL FROM:<x@evil.test>\r\nb\r\n.\r\n");
    }

    #[test]
    fn a_dot_at_the_start_of_the_message_is_stuffed() {
        assert_eq!(data(b".hidden\r\n"), b"..hidden\r\n.\r\n");
    }

    #[test]
    fn a_dot_inside_a_line_is_left_alone() {
        assert_eq!(data(b"a.b\r\n"), b"a.b\r\n.\r\n");
    }

    #[test]
    fn the_data_ends_with_exactly_one_crlf_dot_crlf() {
        assert_eq!(data(b"hello"), b"hello\r\n.\r\n");
        assert_eq!(data(b"hello\r\n"), b"hello\r\n.\r\n");
        assert_eq!(data(b""), b".\r\n");
        assert_eq!(data(b"x\r\n\r\n"), b"x\r\n\r\n.\r\n");
    }

    #[test]
    fn a_cr_lf_pair_is_one_line_ending_and_lf_cr_is_two() {
        assert_eq!(data(b"a\r\nb\n\rc"), b"a\r\nb\r\n\r\nc\r\n.\r\n");
    }

    #[test]
    fn bdat_counts_exactly_the_octets_it_sends() {
        let wire = bdat(b"a\nb");
        assert_eq!(wire, b"BDAT 6 LAST\r\na\r\nb\r\n");
        assert_eq!(bdat(b"x\r\n"), b"BDAT 3 LAST\r\nx\r\n");
        assert_eq!(bdat(b""), b"BDAT 0 LAST\r\n");
    }

    #[test]
    fn bdat_does_not_stuff_dots() {
        assert_eq!(bdat(b".\r\n"), b"BDAT 3 LAST\r\n.\r\n");
    }

    #[test]
    fn shape_finds_the_first_line_over_998_octets_and_counts_as_wire_length_does() {
        let message = format!("a\r\n{}\n{}\r\n", "x".repeat(998), "y".repeat(1200));
        let found = shape(message.as_bytes());
        assert_eq!(found.too_long, Some((3, 1200)));
        assert_eq!(found.wire_length, wire_length(message.as_bytes()));
        assert_eq!(shape(b"a\r\nb").too_long, None);
    }

    #[test]
    fn a_header_line_over_998_octets_is_folded_before_a_space_and_a_body_line_is_not() {
        let to = format!("To: {}", vec!["r@example.org"; 150].join(", "));
        let message = format!("{to}\r\n\r\n{}\r\n", "x".repeat(1200));
        let wire = data(message.as_bytes());
        let header_end = wire
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .expect("a header");
        let header = &wire[..header_end];
        for piece in header.split(|&octet| octet == b'\n') {
            assert!(piece.len() <= MAX_LINE + 1, "{} octets", piece.len());
        }
        // Unfolded (each CRLF before a space taken out), the header is as it was.
        let unfolded = String::from_utf8_lossy(header).replace("\r\n ", " ");
        assert_eq!(unfolded, to);
        let found = shape(message.as_bytes());
        assert_eq!(
            found.too_long.map(|(_, octets)| octets),
            Some(1200),
            "the body line stays long"
        );
        assert_eq!(found.wire_length, wire.len() - 3);
        let unbreakable = format!("Subject: {}\r\n\r\nhi", "x".repeat(1000));
        // Folded after "Subject:", the rest has no space to fold at.
        assert_eq!(shape(unbreakable.as_bytes()).too_long, Some((2, 1001)));
    }

    #[test]
    fn a_header_line_of_exactly_998_octets_is_not_folded() {
        let subject = format!("Subject: {}", "x".repeat(MAX_LINE - "Subject: ".len()));
        let message = format!("{subject}\r\n\r\nhi\r\n");
        assert_eq!(
            data(message.as_bytes()),
            format!("{message}.\r\n").as_bytes()
        );
    }

    #[test]
    fn a_long_header_line_is_never_folded_into_a_line_of_only_white_space() {
        // A continuation line whose only spaces lead it: a cut there would leave a line of
        // white space alone, which RFC 5322 (§3.2.2) forbids, so it stays long.
        let message = format!("Subject: hi\r\n  {}\r\n\r\nbody\r\n", "x".repeat(1000));
        assert_eq!(
            data(message.as_bytes()),
            format!("{message}.\r\n").as_bytes()
        );
    }

    #[test]
    fn only_non_ascii_before_the_first_empty_line_is_a_utf8_header() {
        assert!(shape("Subject: Grüße\r\n\r\nhi".as_bytes()).utf8_header);
        assert!(!shape("Subject: x\r\n\r\nGrüße".as_bytes()).utf8_header);
        assert!(!shape("Subject: x\n\nGrüße".as_bytes()).utf8_header);
        assert!(shape("Subject: x\r\nFrom: Jöran <a@b.c>".as_bytes()).utf8_header);
    }

    #[test]
    fn wire_length_is_the_length_with_crlf_line_endings() {
        assert_eq!(wire_length(b""), 0);
        assert_eq!(wire_length(b"a"), 3);
        assert_eq!(wire_length(b"a\n"), 3);
        assert_eq!(wire_length(b"a\r"), 3);
        assert_eq!(wire_length(b"a\r\nb\n\r"), 8);
    }

    #[test]
    fn mail_declares_size_body_and_smtputf8_where_asked() {
        let from: Address = "app@example.com".parse().expect("an address");
        let all = MailParameters {
            size: Some(1234),
            eight_bit: true,
            utf8: true,
        };
        assert_eq!(
            Commands::new().mail(Some(&from), all).take(),
            b"MAIL FROM:<app@example.com> SIZE=1234 BODY=8BITMIME SMTPUTF8\r\n"
        );
        assert_eq!(
            Commands::new().mail(None, MailParameters::default()).take(),
            b"MAIL FROM:<>\r\n"
        );
    }

    #[test]
    fn pipelined_commands_are_written_in_order_in_one_buffer() {
        let to: Address = "bob@example.org".parse().expect("an address");
        let mut commands = Commands::new();
        commands
            .rset()
            .mail(None, MailParameters::default())
            .rcpt(&to)
            .data();
        assert_eq!(
            commands.take(),
            b"RSET\r\nMAIL FROM:<>\r\nRCPT TO:<bob@example.org>\r\nDATA\r\n"
        );
    }

    #[test]
    fn an_address_with_a_line_break_or_another_control_character_is_refused() {
        let plain = |text: &str| -> Address { text.parse().expect("a valid address") };
        let refused = |from: Option<Address>, to: Address| {
            let envelope = Envelope::new(from, vec![to]).expect("an envelope");
            check_envelope(&envelope).map_err(|error| (error.category(), error.code().to_owned()))
        };
        let invalid = Err((Category::InvalidMessage, "smtp.invalid_address".to_owned()));
        let from = Some(plain("app@example.com"));
        assert_eq!(
            refused(
                from.clone(),
                Address::new_dangerous("bob>\r\nRCPT TO:<eve", "example.org")
            ),
            invalid
        );
        assert_eq!(
            refused(from.clone(), Address::new_dangerous("bob", "example.org\0")),
            invalid
        );
        assert_eq!(
            refused(
                Some(Address::new_dangerous("app\n", "example.com")),
                plain("bob@example.org")
            ),
            invalid
        );
        assert_eq!(refused(from, plain("bob@example.org")), Ok(()));
        assert_eq!(refused(None, plain("bob@example.org")), Ok(()));
    }

    #[test]
    fn each_command_is_one_line_ended_by_crlf() {
        let written = |command: fn(&mut Commands) -> &mut Commands| {
            let mut commands = Commands::new();
            command(&mut commands);
            commands.take()
        };
        assert_eq!(written(Commands::starttls), b"STARTTLS\r\n");
        assert_eq!(written(Commands::rset), b"RSET\r\n");
        assert_eq!(written(Commands::noop), b"NOOP\r\n");
        assert_eq!(written(Commands::quit), b"QUIT\r\n");
        assert_eq!(written(Commands::data), b"DATA\r\n");
        assert_eq!(written(Commands::data_end), b".\r\n");
        assert_eq!(
            Commands::new().auth_response("dXNlcg==").take(),
            b"dXNlcg==\r\n"
        );
        assert_eq!(
            Commands::new()
                .ehlo(&ClientId::Domain("client.test".to_owned()))
                .take(),
            b"EHLO client.test\r\n"
        );
    }

    #[test]
    fn a_taken_buffer_leaves_none_behind() {
        let mut commands = Commands::new();
        commands.noop();
        assert_eq!(commands.take(), b"NOOP\r\n");
        assert_eq!(commands.take(), b"");
    }

    #[test]
    fn auth_carries_its_initial_response_on_the_same_line() {
        assert_eq!(
            Commands::new().auth("PLAIN", Some("AGEAYg==")).take(),
            b"AUTH PLAIN AGEAYg==\r\n"
        );
        assert_eq!(
            Commands::new().auth("LOGIN", None).take(),
            b"AUTH LOGIN\r\n"
        );
    }
}
