//! What a server offers, read from its EHLO reply: any text in any line gives a value, never
//! a panic (a line of one space, an empty keyword, a SIZE that is not a number).

use super::reply::Reply;

/// The extensions of RFC 5321's EHLO reply that the client uses.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Capabilities {
    pub(super) starttls: bool,
    pub(super) pipelining: bool,
    pub(super) chunking: bool,
    /// SIZE: `Some(0)` when offered without a limit, `Some(n)` with one.
    pub(super) size: Option<u64>,
    pub(super) eight_bit_mime: bool,
    pub(super) smtputf8: bool,
    pub(super) auth_plain: bool,
    pub(super) auth_login: bool,
    pub(super) auth_xoauth2: bool,
    pub(super) auth_oauthbearer: bool,
}

impl Capabilities {
    /// The capabilities an EHLO reply lists; its first line is the server's name, not one.
    pub(super) fn from_ehlo(reply: &Reply) -> Capabilities {
        let mut offered = Capabilities::default();
        for line in reply.lines().iter().skip(1) {
            let mut words = line.split_ascii_whitespace();
            let Some(keyword) = words.next() else {
                continue;
            };
            // The old form `AUTH=LOGIN PLAIN` names mechanisms as the current one does.
            let (keyword, first_parameter) = match keyword.split_once('=') {
                Some((keyword, parameter)) => (keyword, Some(parameter)),
                None => (keyword, None),
            };
            let mut parameters = first_parameter.into_iter().chain(words);
            match keyword.to_ascii_uppercase().as_str() {
                "STARTTLS" => offered.starttls = true,
                "PIPELINING" => offered.pipelining = true,
                "CHUNKING" => offered.chunking = true,
                "8BITMIME" => offered.eight_bit_mime = true,
                "SMTPUTF8" => offered.smtputf8 = true,
                // A limit that is not a number is read as none: the server still checks it.
                "SIZE" => {
                    offered.size =
                        Some(parameters.next().and_then(|n| n.parse().ok()).unwrap_or(0));
                }
                "AUTH" => {
                    for mechanism in parameters {
                        match mechanism.to_ascii_uppercase().as_str() {
                            "PLAIN" => offered.auth_plain = true,
                            "LOGIN" => offered.auth_login = true,
                            "XOAUTH2" => offered.auth_xoauth2 = true,
                            "OAUTHBEARER" => offered.auth_oauthbearer = true,
                            _ => {}
                        }
                    }
                }
                _ => {}
            }
        }
        offered
    }

    /// The server's SIZE limit, if it offers one (SIZE 0 means no limit).
    pub(super) fn size_limit(&self) -> Option<u64> {
        self.size.filter(|&limit| limit > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adapters::smtp::reply::ReplyReader;

    fn offered(octets: &[u8]) -> Capabilities {
        let mut reader = ReplyReader::new();
        reader.feed(octets);
        let reply = reader
            .next_buffered()
            .expect("a valid reply")
            .expect("a whole reply");
        Capabilities::from_ehlo(&reply)
    }

    #[test]
    fn every_extension_the_client_uses_is_read() {
        let all = offered(
            b"250-mx.test Hello\r\n250-PIPELINING\r\n250-CHUNKING\r\n250-SIZE 10240000\r\n\
              250-8BITMIME\r\n250-SMTPUTF8\r\n250-STARTTLS\r\n250 AUTH PLAIN LOGIN CRAM-MD5\r\n",
        );
        assert_eq!(
            all,
            Capabilities {
                starttls: true,
                pipelining: true,
                chunking: true,
                size: Some(10_240_000),
                eight_bit_mime: true,
                smtputf8: true,
                auth_plain: true,
                auth_login: true,
                auth_xoauth2: false,
                auth_oauthbearer: false,
            }
        );
        assert_eq!(all.size_limit(), Some(10_240_000));
    }

    #[test]
    fn the_first_line_is_the_servers_name_not_a_capability() {
        assert_eq!(offered(b"250 STARTTLS\r\n"), Capabilities::default());
    }

    #[test]
    fn the_oauth_mechanisms_are_read_from_auth() {
        let some = offered(b"250-mx\r\n250 AUTH LOGIN xoauth2 OAUTHBEARER\r\n");
        assert!(some.auth_xoauth2 && some.auth_oauthbearer && !some.auth_plain);
    }

    #[test]
    fn keywords_are_read_in_any_case_and_the_old_auth_form_too() {
        let some = offered(b"250-mx\r\n250-pipelining\r\n250 AUTH=login\r\n");
        assert!(some.pipelining);
        assert!(some.auth_login);
        assert!(!some.auth_plain);
    }

    #[test]
    fn size_without_a_limit_or_with_garbage_is_no_limit() {
        assert_eq!(offered(b"250-mx\r\n250 SIZE\r\n").size_limit(), None);
        assert_eq!(offered(b"250-mx\r\n250 SIZE lots\r\n").size_limit(), None);
        assert_eq!(offered(b"250-mx\r\n250 SIZE 0\r\n").size, Some(0));
    }

    #[test]
    fn blank_and_odd_lines_are_skipped() {
        let odd = offered(b"250-mx\r\n250- \r\n250-\r\n250-=\r\n250 PIPELINING\r\n");
        assert!(odd.pipelining);
    }
}
