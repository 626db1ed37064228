//! The secrets of a configuration, and every text shown with them as `***`.
//!
//! The crate's own errors and `Debug` already hide keys and passwords; this is the second
//! line: every byte the command prints (tables, JSON, errors, `--verbose` logs) goes through
//! [`Secrets::redact`], with the secrets read from the DSN or TOML text itself: a URL's
//! password (and the whole user part for API keys: `postmark://KEY@default`), a query or
//! TOML value whose name says secret, token, password or key (in any table, inline table or
//! dotted key, as written and as TOML decodes it), the value of each `${NAME}`
//! the text reads from the environment, and SES's keys from the environment.

use std::borrow::Cow;

use crate::stack::Source;

/// Schemes whose user part is a user name, not a key: only their password is secret.
const USER_SCHEMES: [&str; 7] = [
    "smtp",
    "smtps",
    "redis",
    "rediss",
    "postgres",
    "postgresql",
    "sqlite",
];

/// Names whose values are secret, in a query (`oauth2.client_secret=`) or a TOML key.
const SECRET_WORDS: [&str; 5] = ["secret", "token", "password", "pass", "key"];

/// Environment variables that hold SES's keys, read by the crate for `ses://`.
const SECRET_VARIABLES: [&str; 2] = ["AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"];

/// Shorter secrets are not hidden: replacing every "ab" of every output would say nothing.
const SHORTEST: usize = 3;

/// The secrets to hide, longest first.
#[derive(Debug, Default, Clone)]
pub struct Secrets {
    words: Vec<String>,
}

impl Secrets {
    /// The secrets of the configuration the command reads.
    pub fn from_source(source: &Source) -> Secrets {
        Secrets::from_texts([source.text()])
    }

    /// The secrets found in any of `texts`.
    pub fn from_texts<'a>(texts: impl IntoIterator<Item = &'a str>) -> Secrets {
        let mut found = Vec::new();
        for text in texts {
            url_secrets(text, &mut found);
            named_secrets(text, &mut found);
            toml_secrets(text, &mut found);
            environment_secrets(text, &mut found);
        }
        for name in SECRET_VARIABLES {
            if let Ok(value) = std::env::var(name) {
                found.push(value);
            }
        }
        let mut words: Vec<String> = Vec::new();
        for secret in found {
            if is_a_reference(&secret) {
                continue;
            }
            let decoded = percent_decode(&secret);
            for form in [
                json_escaped(&secret),
                json_escaped(&decoded),
                percent_encoded(&decoded, |byte| !is_userinfo(byte)),
                percent_encoded(&decoded, |byte| !is_unreserved(byte)),
                secret,
                decoded,
            ] {
                if form.chars().count() >= SHORTEST && !words.contains(&form) {
                    words.push(form);
                }
            }
        }
        words.sort_by_key(|word| std::cmp::Reverse(word.len()));
        Secrets { words }
    }

    /// The secrets of both.
    pub fn with(mut self, other: &Secrets) -> Secrets {
        for word in &other.words {
            if !self.words.contains(word) {
                self.words.push(word.clone());
            }
        }
        self.words.sort_by_key(|word| std::cmp::Reverse(word.len()));
        self
    }

    /// `text` with every secret as `***`.
    pub fn redact<'t>(&self, text: &'t str) -> Cow<'t, str> {
        if !self.words.iter().any(|word| text.contains(word.as_str())) {
            return Cow::Borrowed(text);
        }
        let mut shown = text.to_owned();
        for word in &self.words {
            if shown.contains(word.as_str()) {
                shown = shown.replace(word.as_str(), "***");
            }
        }
        Cow::Owned(shown)
    }
}

/// The user part of each URL in `text`: its password, and its user name too unless the
/// scheme's user part is a user (`smtp://user:pass@`).
///
/// The user part runs to an `@`, and may hold every sub-delimiter as it is (`,` `'` `(` `)`
/// `;` `!` …), so the authority is read up to what no user part holds unescaped (white
/// space, `/ ? #`, a double quote); each `@` in it may end the user part (a password with
/// an unescaped `@` is read by some parsers), and each reading's secrets are hidden.
fn url_secrets(text: &str, found: &mut Vec<String>) {
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let scheme: String = rest[..at]
            .chars()
            .rev()
            .take_while(|c| c.is_ascii_alphanumeric() || "+-.".contains(*c))
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        let user_is_a_key = !USER_SCHEMES.contains(&scheme.to_ascii_lowercase().as_str());
        let after = &rest[at + 3..];
        let end = after
            .find(|c: char| c.is_whitespace() || c.is_control() || "/?#\"<>\\".contains(c))
            .unwrap_or(after.len());
        let authority = &after[..end];
        for (userinfo_end, _) in authority.match_indices('@') {
            let userinfo = &authority[..userinfo_end];
            let (user, password) = match userinfo.split_once(':') {
                Some((user, password)) => (user, Some(password)),
                None => (userinfo, None),
            };
            if let Some(password) = password.filter(|p| !p.is_empty()) {
                found.push(password.to_owned());
            }
            // An empty user is no secret: shorter than SHORTEST, it is dropped.
            if user_is_a_key {
                found.push(user.to_owned());
            }
        }
        rest = &after[end..];
    }
}

/// Whether a query option or TOML key named `name` holds a secret.
fn secret_name(name: &str) -> bool {
    let name = name.trim().trim_matches(['"', '\'']).to_ascii_lowercase();
    SECRET_WORDS.iter().any(|word| name.contains(word))
}

/// The string values of a TOML document under a key whose name says secret, at any depth
/// (tables, inline tables, dotted keys, arrays of tables), as TOML decodes them (escapes,
/// literal and multi-line strings): what a line-by-line reading misses. A URL is no secret
/// by its key's name (`token_url`): its password is found as any URL's.
fn toml_secrets(text: &str, found: &mut Vec<String>) {
    fn walk(value: &toml::Value, secret: bool, found: &mut Vec<String>) {
        match value {
            toml::Value::String(text) if secret && !text.contains("://") => {
                found.push(text.clone());
            }
            toml::Value::Array(items) => {
                for item in items {
                    walk(item, secret, found);
                }
            }
            toml::Value::Table(table) => {
                for (name, value) in table {
                    walk(value, secret || secret_name(name), found);
                }
            }
            _ => {}
        }
    }
    if let Ok(document) = text.parse::<toml::Table>() {
        walk(&toml::Value::Table(document), false, found);
    }
}

/// Values of query options and TOML keys whose name says they are secret.
fn named_secrets(text: &str, found: &mut Vec<String>) {
    // Query options: `name=value` after `?` or `&`.
    for piece in text.split(['?', '&']).skip(1) {
        if let Some((name, value)) = piece.split_once('=') {
            // A value may hold `)` and `'` (a DSN's group and a TOML string end with them
            // too): both readings are hidden.
            let value: &str = value
                .split(|c: char| c.is_whitespace() || "&\"".contains(c))
                .next()
                .unwrap_or_default();
            if secret_name(name) && !value.is_empty() {
                found.push(value.to_owned());
                found.push(value.trim_end_matches([')', '\'']).to_owned());
            }
        }
    }
    // TOML: `name = "value"` (or 'value').
    for line in text.lines() {
        if let Some((name, value)) = line.split_once('=') {
            let value = value.trim();
            let quoted = value
                .strip_prefix('"')
                .and_then(|v| v.split_once('"'))
                .or_else(|| value.strip_prefix('\'').and_then(|v| v.split_once('\'')))
                .map(|(inside, _)| inside);
            if let Some(value) = quoted
                && secret_name(name)
                && !name.contains(['?', '&'])
                && !value.contains("://")
            {
                found.push(value.to_owned());
            }
        }
    }
}

/// The value of each `${NAME}` in `text`, from the environment.
fn environment_secrets(text: &str, found: &mut Vec<String>) {
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        let after = &rest[start + 2..];
        let Some(end) = after.find('}') else { break };
        if let Ok(value) = std::env::var(&after[..end]) {
            found.push(value);
        }
        rest = &after[end..];
    }
}

/// Whether `secret` is a reference to the environment (`${NAME}`), whose value is the secret
/// (see [`environment_secrets`]), rather than a secret that starts with `${`.
fn is_a_reference(secret: &str) -> bool {
    secret
        .strip_prefix("${")
        .and_then(|rest| rest.strip_suffix('}'))
        .is_some_and(|name| {
            !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        })
}

/// RFC 3986's unreserved characters: what no encoder escapes.
fn is_unreserved(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || b"-._~".contains(&byte)
}

/// What a URL's user part holds unescaped: the unreserved characters and sub-delimiters.
fn is_userinfo(byte: u8) -> bool {
    is_unreserved(byte) || b"!$&'()*+,;=".contains(&byte)
}

/// `text` with each byte `escape` says percent-encoded, as URL libraries write it (`%2C`).
fn percent_encoded(text: &str, escape: impl Fn(u8) -> bool) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if escape(byte) {
            out.push_str(&format!("%{byte:02X}"));
        } else {
            out.push(char::from(byte));
        }
    }
    out
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let Some(byte) = std::str::from_utf8(&bytes[i + 1..i + 3])
                .ok()
                .and_then(|hex| u8::from_str_radix(hex, 16).ok())
        {
            out.push(byte);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// How `text` looks inside a JSON string.
fn json_escaped(text: &str) -> String {
    let quoted = serde_json::to_string(text).unwrap_or_default();
    quoted
        .strip_prefix('"')
        .and_then(|q| q.strip_suffix('"'))
        .unwrap_or_default()
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_password_and_an_api_key_in_a_dsn_are_hidden_and_a_user_name_is_not() {
        let secrets = Secrets::from_texts([
            "failover(smtp://mailer:s3cret%20pass@relay:587 postmark://KEY-123@default)",
        ]);
        let shown = secrets.redact("mailer s3cret pass s3cret%20pass KEY-123 relay");
        assert_eq!(shown, "mailer *** *** *** relay");
    }

    #[test]
    fn a_secret_query_option_and_a_toml_token_are_hidden() {
        let secrets = Secrets::from_texts([
            "smtp://u@h?auth=xoauth2&oauth2.client_secret=abcdef&oauth2.scope=x",
            "[[member]]\nurl = \"smtp://h\"\napi_token = \"tok-999\"\n",
        ]);
        assert_eq!(secrets.redact("abcdef tok-999 xoauth2"), "*** *** xoauth2");
    }

    #[test]
    fn a_secret_in_an_inline_table_a_dotted_key_or_an_escaped_string_is_hidden() {
        let secrets = Secrets::from_texts([concat!(
            "[webhooks]\n",
            "resend = { secret = \"whsec_inline1\", other = 1 }\n",
            "postmark = { user = \"hooks\", password = 'pm-inline-2' }\n",
            "mailgun.signing_key = \"mg-dotted-3\"\n",
            "[webhooks.sendgrid]\n",
            "public_key = \"sg\\u0041-escaped\"\n",
            "[[member]]\n",
            "url = \"smtp://h\"\n",
            "oauth2 = { client_id = \"app\", client_secret = \"\"\"multi-line-4\"\"\" }\n",
        )]);
        assert_eq!(
            secrets
                .redact("whsec_inline1 pm-inline-2 mg-dotted-3 sgA-escaped multi-line-4 hooks app"),
            "*** *** *** *** *** hooks app"
        );
    }

    #[test]
    fn the_secrets_of_a_source_are_those_of_its_text() {
        let source = Source::Dsn("smtp://u:hunter2@relay?outbox=sqlite:///x.db".to_owned());
        assert_eq!(Secrets::from_source(&source).redact("hunter2"), "***");
    }

    #[test]
    fn a_secret_shorter_than_three_characters_is_not_hidden() {
        let secrets = Secrets::from_texts(["smtp://u:ab@relay"]);
        assert_eq!(secrets.redact("ab cab"), "ab cab");
    }

    #[test]
    fn a_secret_querys_value_ends_at_white_space_or_the_next_option() {
        let secrets = Secrets::from_texts(["smtp://h?token=tok-1 smtp://g?x=1&api_key=key-2&y=3"]);
        assert_eq!(
            secrets.redact("tok-1 key-2 smtp://g x=1 y=3"),
            "*** *** smtp://g x=1 y=3"
        );
    }

    #[test]
    fn a_value_the_text_reads_from_the_environment_is_hidden() {
        // PATH is set wherever the tests run, and longer than three characters.
        let path = std::env::var("PATH").expect("PATH is set");
        let secrets = Secrets::from_texts(["smtp://u:${PATH}@relay x${PATH}y"]);
        assert_eq!(secrets.redact(&format!("[{path}]")), "[***]");
    }

    #[test]
    fn a_secret_is_hidden_as_json_writes_it_too() {
        // The password `pa"ss\word`, percent-encoded in the URL.
        let secrets = Secrets::from_texts(["smtp://u:pa%22ss%5Cword@relay"]);
        let json = serde_json::json!({ "error": "login pa\"ss\\word refused" }).to_string();
        assert_eq!(secrets.redact(&json), r#"{"error":"login *** refused"}"#);
    }

    #[test]
    fn percent_escapes_decode_anywhere_and_a_cut_one_at_the_end_is_kept() {
        assert_eq!(percent_decode("%41b%20c"), "Ab c");
        assert_eq!(percent_decode("ab%4"), "ab%4");
        assert_eq!(percent_decode("ab%"), "ab%");
        assert_eq!(percent_decode("%zz"), "%zz");
    }
    #[test]
    fn a_password_with_commas_quotes_and_parentheses_is_hidden_whole() {
        // All of `,` `'` `(` `)` `;` `!` `*` are sub-delims: a URL's user part holds them as
        // they are.
        let secrets = Secrets::from_texts([
            "failover(smtp://u:pa,ss'wo)rd@relay:587 smtp://v:(x;y!z*)@backup)",
            "--dsn=smtp://w:it's,(me)@relay",
        ]);
        assert_eq!(
            secrets.redact("pa,ss'wo)rd (x;y!z*) it's,(me)"),
            "*** *** ***"
        );
    }
    #[test]
    fn a_password_is_hidden_as_url_libraries_percent_encode_it_too() {
        let secrets = Secrets::from_texts(["smtp://u:it's%20m%C3%A9,(x)@relay"]);
        let shown = secrets.redact(
            "it's mé,(x) | it's%20m%C3%A9,(x) | it%27s%20m%C3%A9%2C%28x%29 | \"it's mé,(x)\"",
        );
        assert_eq!(shown, "*** | *** | *** | \"***\"");
    }

    #[test]
    fn each_at_sign_may_end_the_user_part_and_each_reading_is_hidden() {
        let secrets = Secrets::from_texts(["smtp://u:abc@def@relay postmark://KEY@x@default"]);
        assert_eq!(secrets.redact("abc@def abc KEY@x KEY"), "*** *** *** ***");
    }

    #[test]
    fn a_user_part_ends_at_white_space_a_control_a_slash_a_query_a_fragment_or_a_quote() {
        let secrets = Secrets::from_texts([
            "smtp://relay/a:bcd@e smtp://relay?a:bcd@e smtp://relay#a:bcd@e",
            "smtp://relay\u{1}a:bcd@e smtp://relay\"a:bcd@e smtp://h<a:bcd@e smtp://h\\a:bcd@e",
        ]);
        assert!(secrets.words.is_empty(), "{:?}", secrets.words);
    }

    #[test]
    fn a_password_written_percent_encoded_whole_is_hidden_as_a_user_part_holds_it_too() {
        let secrets = Secrets::from_texts(["smtp://u:it%27s%20m%C3%A9%2C%28x%29@relay"]);
        assert_eq!(secrets.redact("it's%20m%C3%A9,(x)"), "***");
    }

    #[test]
    fn a_secret_query_value_is_hidden_with_and_without_the_parenthesis_or_quote_after_it() {
        let secrets = Secrets::from_texts([
            "failover(smtp://h?oauth2.client_secret=s3cr)t)",
            "url = 'smtp://h?token=t0ken'",
        ]);
        assert_eq!(
            secrets.redact("s3cr)t) s3cr)t t0ken' t0ken"),
            "*** *** *** ***"
        );
    }

    #[test]
    fn only_a_whole_reference_to_the_environment_is_not_a_secret() {
        assert!(is_a_reference("${SMTP_PASSWORD}"));
        assert!(!is_a_reference("${}"));
        assert!(!is_a_reference("${A}bc"));
        assert!(!is_a_reference("${A B}"));
        let secrets = Secrets::from_texts(["smtp://u:${SMTP_PASSWORD}@h smtp://v:${x-y}z@h"]);
        assert_eq!(
            secrets.redact("${SMTP_PASSWORD} ${x-y}z"),
            "${SMTP_PASSWORD} ***"
        );
    }

    #[test]
    fn the_secrets_of_two_texts_together_are_hidden_longest_first() {
        let argv = Secrets::from_texts(["smtp://u:secret@h"]);
        let source = Secrets::from_texts(["smtp://u:secret-longer@h"]);
        let both = argv.with(&source);
        assert_eq!(both.redact("secret-longer secret"), "*** ***");
        let count = both.words.len();
        assert_eq!(both.clone().with(&both).words.len(), count, "no word twice");
    }
}
