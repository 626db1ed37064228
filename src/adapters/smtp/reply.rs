//! The reply reader: SMTP replies (RFC 5321 §4.2) read from a stream with every size bounded,
//! so a hostile server can neither grow the client's memory nor make it panic.
//!
//! - A line is at most [`MAX_LINE`] octets with its line ending; a reply at most [`MAX_LINES`]
//!   lines and [`MAX_REPLY`] octets. A line that never ends is an error once it passes the
//!   line cap, after at most that many buffered octets plus one read.
//! - A line is a three-digit code (`2yz` to `5yz`), then `-` (more lines follow), a space, or
//!   nothing: `250\r\n` is a whole reply. Every line of a reply has the same code.
//! - Bytes after a reply stay buffered for the next (pipelined replies arrive together);
//!   [`ReplyReader::is_empty`] tells whether any are waiting, which STARTTLS must check.
//!
//! The parsing needs no stream ([`ReplyReader::feed`], [`ReplyReader::next_buffered`]), so a
//! fuzz test can feed it anything.

use std::fmt;
use std::io;

use tokio::io::{AsyncRead, AsyncReadExt};

/// The longest reply line, its line ending included.
pub(crate) const MAX_LINE: usize = 2048;
/// The most lines in one reply.
pub(crate) const MAX_LINES: usize = 100;
/// The most octets in one reply.
pub(crate) const MAX_REPLY: usize = 64 * 1024;

/// How much one read from the stream may add to the buffer.
const READ_CHUNK: usize = 4096;

/// One whole reply: its code and the text of each line (without code, separator or line
/// ending; empty for a line that is a code alone).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Reply {
    code: u16,
    lines: Vec<String>,
}

impl Reply {
    /// The three-digit reply code.
    pub(crate) fn code(&self) -> u16 {
        self.code
    }

    /// The text of each line.
    pub(crate) fn lines(&self) -> &[String] {
        &self.lines
    }

    /// The first digit of the code: 2 done, 3 go on, 4 try later, 5 failed.
    pub(crate) fn class(&self) -> u16 {
        self.code / 100
    }

    /// The code and the text of every line on one line: `250 2.0.0 Ok: queued as 4F2A1`.
    pub(crate) fn text(&self) -> String {
        let mut text = self.code.to_string();
        for line in self.lines.iter().filter(|line| !line.is_empty()) {
            text.push(' ');
            text.push_str(line);
        }
        text
    }
}

/// Why no reply could be read.
#[derive(Debug)]
pub(crate) enum ReplyError {
    /// A line, the line count or the reply passed its cap.
    TooLong(&'static str),
    /// Bytes that are not an SMTP reply.
    Malformed(&'static str),
    /// The server closed the connection before a whole reply.
    Closed,
    /// The stream failed.
    Io(io::Error),
}

impl fmt::Display for ReplyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReplyError::TooLong(what) => write!(f, "the server's reply is too long: {what}"),
            ReplyError::Malformed(what) => write!(f, "the server's reply is not SMTP: {what}"),
            ReplyError::Closed => f.write_str("the server closed the connection"),
            ReplyError::Io(error) => write!(f, "reading the server's reply failed: {error}"),
        }
    }
}

/// Reads replies from a stream, keeping what arrives after one reply for the next.
///
/// It reads incrementally: each octet is looked at once however the server splits its
/// replies into reads, so a server that drips a reply an octet at a time costs no more work
/// than one that sends it whole.
#[derive(Debug, Default)]
pub(crate) struct ReplyReader {
    /// Received octets; those before `start` are read (handed out, or lines of `partial`).
    buffer: Vec<u8>,
    start: usize,
    /// Octets after `start` already searched for a line end.
    scanned: usize,
    /// The lines read so far of a reply not yet whole.
    partial: Option<Partial>,
}

#[derive(Debug)]
struct Partial {
    code: u16,
    lines: Vec<String>,
    octets: usize,
}

impl ReplyReader {
    /// A reader with nothing buffered.
    pub(crate) fn new() -> Self {
        ReplyReader::default()
    }

    /// Whether nothing received is waiting to be read as (part of) a reply.
    pub(crate) fn is_empty(&self) -> bool {
        self.start == self.buffer.len() && self.partial.is_none()
    }

    /// Adds received octets (what [`read`](Self::read) does with each read from the stream).
    pub(crate) fn feed(&mut self, octets: &[u8]) {
        // What was read leaves the buffer only now, not line by line.
        self.buffer.drain(..self.start);
        self.start = 0;
        self.buffer.extend_from_slice(octets);
    }

    /// The next reply if the buffer holds the rest of a whole one (then its octets are
    /// read), `None` if more octets are needed, or the error if the octets can never become
    /// a reply within the caps.
    pub(crate) fn next_buffered(&mut self) -> Result<Option<Reply>, ReplyError> {
        loop {
            let rest = self.buffer.get(self.start..).unwrap_or_default();
            // Only the first MAX_LINE octets of a line may hold its end.
            let window = rest.get(..MAX_LINE).unwrap_or(rest);
            let unsearched = window.get(self.scanned..).unwrap_or_default();
            let Some(found) = unsearched.iter().position(|&octet| octet == b'\n') else {
                if rest.len() >= MAX_LINE {
                    return Err(ReplyError::TooLong("a line of over 2,048 octets"));
                }
                self.scanned = window.len();
                return Ok(None);
            };
            let newline = self.scanned + found;
            let line = window.get(..newline).unwrap_or_default();
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            let (code, more, text) = parse_line(line)?;
            let partial = self.partial.get_or_insert(Partial {
                code,
                lines: Vec::new(),
                octets: 0,
            });
            partial.octets += newline + 1;
            if partial.octets > MAX_REPLY {
                return Err(ReplyError::TooLong("a reply of over 64 KiB"));
            }
            if partial.code != code {
                return Err(ReplyError::Malformed(
                    "lines of one reply with different codes",
                ));
            }
            if partial.lines.len() == MAX_LINES {
                return Err(ReplyError::TooLong("a reply of over 100 lines"));
            }
            partial
                .lines
                .push(String::from_utf8_lossy(text).into_owned());
            self.start += newline + 1;
            self.scanned = 0;
            if !more {
                return Ok(self
                    .partial
                    .take()
                    .map(|Partial { code, lines, .. }| Reply { code, lines }));
            }
        }
    }

    /// Reads the next whole reply from `stream`. The buffer never holds more than
    /// [`MAX_REPLY`] plus one read of octets of an unfinished reply.
    pub(crate) async fn read<S>(&mut self, stream: &mut S) -> Result<Reply, ReplyError>
    where
        S: AsyncRead + Unpin + ?Sized,
    {
        let mut chunk = [0_u8; READ_CHUNK];
        loop {
            if let Some(reply) = self.next_buffered()? {
                return Ok(reply);
            }
            let read = stream.read(&mut chunk).await.map_err(ReplyError::Io)?;
            if read == 0 {
                return Err(ReplyError::Closed);
            }
            self.feed(chunk.get(..read).unwrap_or_default());
        }
    }
}

/// A line's code, whether more lines follow, and its text.
fn parse_line(line: &[u8]) -> Result<(u16, bool, &[u8]), ReplyError> {
    let (digits, rest) = line
        .split_at_checked(3)
        .ok_or(ReplyError::Malformed("a line shorter than a reply code"))?;
    let code = match digits {
        [
            first @ b'2'..=b'5',
            second @ b'0'..=b'9',
            third @ b'0'..=b'9',
        ] => {
            u16::from(first - b'0') * 100 + u16::from(second - b'0') * 10 + u16::from(third - b'0')
        }
        _ => return Err(ReplyError::Malformed("a line without a reply code")),
    };
    match rest.split_first() {
        None => Ok((code, false, rest)),
        Some((b' ', text)) => Ok((code, false, text)),
        Some((b'-', text)) => Ok((code, true, text)),
        Some(_) => Err(ReplyError::Malformed(
            "a reply code followed by neither a space nor a dash",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(octets: &[u8]) -> Result<Option<Reply>, ReplyError> {
        let mut reader = ReplyReader::new();
        reader.feed(octets);
        reader.next_buffered()
    }

    fn whole(octets: &[u8]) -> Reply {
        one(octets).expect("a valid reply").expect("a whole reply")
    }

    #[test]
    fn a_one_line_reply_gives_its_code_and_text() {
        let reply = whole(b"250 2.0.0 Ok: queued as 4F2A1\r\n");
        assert_eq!(reply.code(), 250);
        assert_eq!(reply.lines(), ["2.0.0 Ok: queued as 4F2A1"]);
        assert_eq!(reply.text(), "250 2.0.0 Ok: queued as 4F2A1");
        assert_eq!(reply.class(), 2);
    }

    #[test]
    fn a_code_without_text_is_a_whole_reply() {
        let reply = whole(b"250\r\n");
        assert_eq!(reply.code(), 250);
        assert_eq!(reply.lines(), [""]);
        assert_eq!(reply.text(), "250");
    }

    #[test]
    fn a_multi_line_reply_ends_at_the_line_without_a_dash() {
        let reply = whole(b"250-mx.test\r\n250-PIPELINING\r\n250 CHUNKING\r\n");
        assert_eq!(reply.lines(), ["mx.test", "PIPELINING", "CHUNKING"]);
    }

    #[test]
    fn a_reply_not_yet_whole_asks_for_more() {
        assert!(
            one(b"250-mx.test\r\n250 CHUN")
                .expect("valid so far")
                .is_none()
        );
        assert!(one(b"").expect("valid so far").is_none());
    }

    #[test]
    fn octets_after_a_reply_stay_for_the_next() {
        let mut reader = ReplyReader::new();
        reader.feed(b"250 a\r\n354 b\r\n");
        assert_eq!(
            reader
                .next_buffered()
                .expect("valid")
                .expect("whole")
                .code(),
            250
        );
        assert!(!reader.is_empty());
        assert_eq!(
            reader
                .next_buffered()
                .expect("valid")
                .expect("whole")
                .code(),
            354
        );
        assert!(reader.is_empty());
    }

    #[test]
    fn a_bare_lf_ends_a_line_too() {
        assert_eq!(whole(b"220 ready\n").lines(), ["ready"]);
    }

    #[test]
    fn a_line_of_exactly_the_cap_is_read_and_one_octet_more_is_too_long() {
        let mut line = b"250 ".to_vec();
        line.resize(MAX_LINE - 2, b'x');
        line.extend_from_slice(b"\r\n");
        assert_eq!(line.len(), MAX_LINE);
        assert_eq!(whole(&line).code(), 250);

        let mut longer = b"250 ".to_vec();
        longer.resize(MAX_LINE - 1, b'x');
        longer.extend_from_slice(b"\r\n");
        assert!(matches!(one(&longer), Err(ReplyError::TooLong(_))));
    }

    #[test]
    fn a_line_that_never_ends_is_too_long_once_it_passes_the_cap() {
        assert!(one(&vec![b'2'; MAX_LINE - 1]).expect("not yet").is_none());
        assert!(matches!(
            one(&vec![b'2'; MAX_LINE]),
            Err(ReplyError::TooLong(_))
        ));
    }

    #[test]
    fn a_reply_of_a_hundred_lines_is_read_and_of_a_hundred_and_one_is_too_long() {
        let reply = |lines: usize| {
            let mut octets = b"250-x\r\n".repeat(lines - 1);
            octets.extend_from_slice(b"250 x\r\n");
            octets
        };
        assert_eq!(whole(&reply(MAX_LINES)).lines().len(), MAX_LINES);
        assert!(matches!(
            one(&reply(MAX_LINES + 1)),
            Err(ReplyError::TooLong(_))
        ));
    }

    #[test]
    fn a_reply_of_over_64_kib_is_too_long() {
        let line = {
            let mut line = b"250-".to_vec();
            line.resize(1022, b'x');
            line.extend_from_slice(b"\r\n");
            line
        };
        // 64 lines of 1,024 octets are exactly 64 KiB, and a 65th passes it.
        let mut octets = line.repeat(64);
        assert!(one(&octets).expect("within the cap").is_none());
        octets.extend_from_slice(b"250 end\r\n");
        assert!(matches!(one(&octets), Err(ReplyError::TooLong(_))));
    }

    #[test]
    fn lines_of_one_reply_must_share_a_code() {
        assert!(matches!(
            one(b"250-a\r\n251 b\r\n"),
            Err(ReplyError::Malformed(_))
        ));
    }

    #[test]
    fn a_code_outside_2yz_to_5yz_is_malformed() {
        for octets in [
            &b"199 x\r\n"[..],
            b"600 x\r\n",
            b"25x x\r\n",
            b"ab\r\n",
            b"\r\n",
        ] {
            assert!(
                matches!(one(octets), Err(ReplyError::Malformed(_))),
                "{octets:?}"
            );
        }
    }

    #[test]
    fn a_code_followed_by_another_character_is_malformed() {
        assert!(matches!(one(b"250x\r\n"), Err(ReplyError::Malformed(_))));
    }

    #[test]
    fn each_reason_for_no_reply_says_what_went_wrong() {
        let said = |error: ReplyError| error.to_string();
        assert_eq!(
            said(ReplyError::TooLong("a line of over 2,048 octets")),
            "the server's reply is too long: a line of over 2,048 octets"
        );
        assert_eq!(
            said(ReplyError::Malformed("a line without a reply code")),
            "the server's reply is not SMTP: a line without a reply code"
        );
        assert_eq!(said(ReplyError::Closed), "the server closed the connection");
        assert_eq!(
            said(ReplyError::Io(io::Error::other("reset"))),
            "reading the server's reply failed: reset"
        );
    }

    #[test]
    fn text_that_is_not_utf8_is_kept_lossily() {
        assert_eq!(whole(b"250 caf\xe9\r\n").lines(), ["caf\u{fffd}"]);
    }

    /// The fuzz target of the reader: any octets from a server, split into reads of any size,
    /// end in a reply or an error, never a panic, and never hold more than the caps.
    mod fuzz {
        use std::pin::Pin;
        use std::task::{Context, Poll};

        use proptest::prelude::*;
        use tokio::io::ReadBuf;

        use super::*;

        /// The most a reader may have taken from the stream when it gives up on a reply: a
        /// whole reply's worth of lines, a line short of its cap, and one read more.
        const MOST_READ: usize = MAX_REPLY + MAX_LINE + READ_CHUNK;

        /// A stream that hands out `octets` in reads of the given sizes, and counts them.
        struct Chunked {
            octets: Vec<u8>,
            sizes: Vec<usize>,
            read: usize,
            reads: usize,
        }

        impl AsyncRead for Chunked {
            fn poll_read(
                mut self: Pin<&mut Self>,
                _: &mut Context<'_>,
                buf: &mut ReadBuf<'_>,
            ) -> Poll<io::Result<()>> {
                let this = &mut *self;
                let size = this
                    .sizes
                    .get(this.reads % this.sizes.len().max(1))
                    .copied()
                    .unwrap_or(1);
                let rest = this.octets.get(this.read..).unwrap_or_default();
                let take = rest.len().min(size.max(1)).min(buf.remaining());
                buf.put_slice(&rest[..take]);
                this.read += take;
                this.reads += 1;
                Poll::Ready(Ok(()))
            }
        }

        fn read_all(octets: Vec<u8>, sizes: Vec<usize>) -> (Vec<Result<Reply, String>>, usize) {
            let mut stream = Chunked {
                octets,
                sizes,
                read: 0,
                reads: 0,
            };
            let mut reader = ReplyReader::new();
            let mut answers = Vec::new();
            let runtime = tokio::runtime::Builder::new_current_thread()
                .build()
                .expect("a runtime");
            loop {
                match runtime.block_on(reader.read(&mut stream)) {
                    Ok(reply) => answers.push(Ok(reply)),
                    Err(error) => {
                        answers.push(Err(error.to_string()));
                        break;
                    }
                }
            }
            (answers, stream.read)
        }

        fn check_caps(reply: &Reply) {
            assert!(reply.lines().len() <= MAX_LINES);
            assert!(reply.lines().iter().all(|line| line.len() <= MAX_LINE * 3));
            assert!((200..600).contains(&reply.code()));
        }

        /// Octets a server might send: replies, near-replies and garbage.
        fn server_octets() -> impl Strategy<Value = Vec<u8>> {
            let piece = prop_oneof![
                Just(b"250-mx.test\r\n".to_vec()),
                Just(b"250 OK\r\n".to_vec()),
                Just(b"250\r\n".to_vec()),
                Just(b"354 go\r\n".to_vec()),
                Just(b"\r\n".to_vec()),
                Just(b"\n".to_vec()),
                Just(b"-".to_vec()),
                Just(vec![b'x'; 700]),
                Just(b"250-".repeat(300)),
                proptest::collection::vec(any::<u8>(), 0..64),
                "[2-5][0-9][0-9][ -]?[ -~]{0,40}\r\n".prop_map(String::into_bytes),
            ];
            proptest::collection::vec(piece, 0..150).prop_map(|pieces| pieces.concat())
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(
                std::env::var("PROPTEST_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(256)
            ))]

            #[test]
            fn any_octets_end_in_replies_or_an_error_within_the_caps(
                octets in server_octets(),
                sizes in proptest::collection::vec(1_usize..5000, 1..8),
            ) {
                let (answers, read) = read_all(octets.clone(), sizes);
                for reply in answers.iter().flatten() {
                    check_caps(reply);
                }
                // Every answer but the last is a reply; the last is the error that ended it.
                prop_assert!(answers.last().is_some_and(Result::is_err));
                prop_assert!(read <= octets.len());
            }

            #[test]
            fn a_reply_that_never_ends_is_given_up_after_a_bounded_read(
                filler in prop_oneof![Just(b'x'), Just(b'\r')],
                lines in 0_usize..150,
                sizes in proptest::collection::vec(1_usize..5000, 1..8),
            ) {
                let mut octets = b"250-ok\r\n".repeat(lines);
                octets.extend(std::iter::repeat_n(filler, 2 * MOST_READ));
                let (answers, read) = read_all(octets, sizes);
                prop_assert_eq!(answers.len(), 1);
                prop_assert!(answers[0].is_err());
                prop_assert!(read <= MOST_READ, "read {} octets", read);
            }

            #[test]
            fn a_valid_reply_reads_back_as_written(
                code in 200_u16..600,
                lines in proptest::collection::vec("[ -~]{0,80}", 1..20),
                sizes in proptest::collection::vec(1_usize..100, 1..8),
            ) {
                let mut octets = Vec::new();
                for (index, line) in lines.iter().enumerate() {
                    let separator = if index + 1 == lines.len() { " " } else { "-" };
                    octets.extend_from_slice(format!("{code}{separator}{line}\r\n").as_bytes());
                }
                let (answers, _) = read_all(octets, sizes);
                let reply = answers[0].as_ref().expect("a reply");
                prop_assert_eq!(reply.code(), code);
                prop_assert_eq!(reply.lines(), &lines[..]);
            }
        }
    }

    #[tokio::test]
    async fn a_stream_that_closes_mid_reply_is_closed() {
        let mut reader = ReplyReader::new();
        let mut stream: &[u8] = b"250-a\r\n250 b";
        assert!(matches!(
            reader.read(&mut stream).await,
            Err(ReplyError::Closed)
        ));
    }

    #[tokio::test]
    async fn replies_split_across_reads_are_put_together() {
        let mut reader = ReplyReader::new();
        let (mut client, mut server) = tokio::io::duplex(64);
        let write = async {
            use tokio::io::AsyncWriteExt;
            server.write_all(b"250-mx\r").await.expect("written");
            server.write_all(b"\n250 OK\r\n").await.expect("written");
        };
        let (_, reply) = tokio::join!(write, reader.read(&mut client));
        assert_eq!(reply.expect("a reply").lines(), ["mx", "OK"]);
    }
}
