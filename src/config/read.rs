//! Reading a configuration tree (TOML's values; a DSN is turned into the same tree) with the
//! path of every value, so that each error names where it is: `member[1].breaker.threshold`.
//!
//! Every value may hold `${NAME}`, read from the environment when it is read. An error quotes
//! a value as it was written, never as the environment filled it in, and never one that
//! looks like a URL or an address, so that no secret is repeated in a message.

use std::time::Duration;

use toml::{Table, Value};

use super::ConfigError;

/// Quoted in an error, a value is cut to this many characters.
const QUOTED: usize = 40;

/// A value and where it is.
pub(crate) struct Node<'a> {
    path: String,
    value: &'a Value,
}

impl<'a> Node<'a> {
    /// The document itself, at the empty path.
    pub(crate) fn root(value: &'a Value) -> Node<'a> {
        Node {
            path: String::new(),
            value,
        }
    }

    /// `value`, at `path`: a table made from what the document wrote (a member's settings
    /// read from its URL's query, put beside the others).
    pub(crate) fn at(path: &str, value: &'a Value) -> Node<'a> {
        Node {
            path: path.to_owned(),
            value,
        }
    }

    /// The table as written, before the environment fills anything in: `None` if not a
    /// table.
    pub(crate) fn written_table(&self) -> Option<&'a Table> {
        self.value.as_table()
    }

    pub(crate) fn path(&self) -> &str {
        &self.path
    }

    pub(crate) fn error(&self, reason: impl Into<String>) -> ConfigError {
        let path = if self.path.is_empty() {
            "configuration".to_owned()
        } else {
            self.path.clone()
        };
        ConfigError::new(path, reason.into())
    }

    /// The value as written, quoted for an error, cut short if long.
    fn quoted(&self) -> String {
        match self.value {
            // A URL written into the wrong setting may carry a password: not quoted.
            Value::String(text) if may_hold_a_secret(text) => "a URL or an address".to_owned(),
            // The receivers' settings are secrets, written in place of a table or not.
            Value::String(_) if self.path.starts_with("webhooks") => {
                "a string (not shown: the webhooks' settings hold secrets)".to_owned()
            }
            Value::String(text) => {
                let cut: String = text.chars().take(QUOTED).collect();
                let more = if cut.len() < text.len() { "..." } else { "" };
                format!("{cut:?}{more}")
            }
            Value::Table(_) => "a table".to_owned(),
            Value::Array(_) => "a list".to_owned(),
            Value::Integer(number) => number.to_string(),
            Value::Float(number) => number.to_string(),
            Value::Boolean(flag) => flag.to_string(),
            Value::Datetime(_) => "a date".to_owned(),
        }
    }

    fn expected(&self, what: &str) -> ConfigError {
        self.error(format!("expected {what}, got {}", self.quoted()))
    }

    /// A table's settings, each taken once; [`Fields::finish`] refuses the rest.
    pub(crate) fn table(&self) -> Result<Fields<'a>, ConfigError> {
        match self.value {
            Value::Table(table) => Ok(Fields {
                path: self.path.clone(),
                table,
                taken: Vec::new(),
            }),
            _ => Err(self.expected("a table of settings")),
        }
    }

    /// The items of a list, each at `path[i]`.
    pub(crate) fn list(&self) -> Result<Vec<Node<'a>>, ConfigError> {
        match self.value {
            Value::Array(items) => Ok(items
                .iter()
                .enumerate()
                .map(|(i, value)| Node {
                    path: format!("{}[{i}]", self.path),
                    value,
                })
                .collect()),
            _ => Err(self.expected("a list")),
        }
    }

    /// Text, with `${NAME}` read from the environment.
    pub(crate) fn text(&self) -> Result<String, ConfigError> {
        match self.value {
            Value::String(text) => expand(text).map_err(|reason| self.error(reason)),
            _ => Err(self.expected("text")),
        }
    }

    /// Secret text (a key, a password), with `${NAME}` read from the environment; an error
    /// says what was expected, never what was written.
    pub(crate) fn secret_text(&self) -> Result<String, ConfigError> {
        match self.value {
            Value::String(text) => expand(text).map_err(|reason| self.error(reason)),
            _ => Err(self.error("expected text")),
        }
    }

    /// A URL, with `${NAME}` read from the environment: a value put in after the URL's
    /// `://` is percent-encoded, so that reading the URL gives it back exactly as the
    /// environment holds it (a secret holding `%41` stays `%41`), never decoded.
    pub(crate) fn url(&self) -> Result<String, ConfigError> {
        let text = match self.value {
            Value::String(text) => expand_url(text).map_err(|reason| self.error(reason))?,
            _ => return Err(self.expected("a URL")),
        };
        if text.trim().is_empty() {
            return Err(self.error("must not be empty"));
        }
        Ok(text)
    }

    /// Text that must not be empty.
    pub(crate) fn word(&self) -> Result<String, ConfigError> {
        let text = self.text()?;
        if text.trim().is_empty() {
            return Err(self.error("must not be empty"));
        }
        Ok(text)
    }

    /// URLs: a list, or one text of them separated by commas (as a DSN writes a list),
    /// each read as [`url`](Self::url) reads one.
    pub(crate) fn urls(&self) -> Result<Vec<String>, ConfigError> {
        match self.value {
            Value::String(_) => {
                let text = self.url()?;
                let words: Vec<String> = text
                    .split(',')
                    .map(str::trim)
                    .filter(|word| !word.is_empty())
                    .map(str::to_owned)
                    .collect();
                Ok(words)
            }
            Value::Array(_) => self.list()?.iter().map(Node::url).collect(),
            _ => Err(self.expected("a list")),
        }
    }

    /// A whole number from `min` to `max`, written as a number or as text.
    pub(crate) fn whole(&self, min: u64, max: u64) -> Result<u64, ConfigError> {
        let what = || {
            // The type's own limit goes unsaid: past it the number is simply too big.
            if max >= u64::from(u32::MAX) {
                format!("a whole number of at least {min}")
            } else {
                format!("a whole number from {min} to {max}")
            }
        };
        let number = match self.value {
            Value::Integer(number) => u64::try_from(*number).ok(),
            Value::String(_) => self.text()?.trim().parse::<u64>().ok(),
            _ => None,
        };
        number
            .filter(|number| (min..=max).contains(number))
            .ok_or_else(|| self.expected(&what()))
    }

    pub(crate) fn whole_u32(&self, min: u32) -> Result<u32, ConfigError> {
        let number = self.whole(u64::from(min), u64::from(u32::MAX))?;
        Ok(u32::try_from(number).unwrap_or(u32::MAX))
    }

    pub(crate) fn whole_usize(&self, min: usize) -> Result<usize, ConfigError> {
        let max = u64::try_from(usize::MAX).unwrap_or(u64::MAX);
        let number = self.whole(u64::try_from(min).unwrap_or(u64::MAX), max)?;
        Ok(usize::try_from(number).unwrap_or(usize::MAX))
    }

    /// A finite number above zero, written as a number or as text; `unit` may follow it
    /// (`14/s`).
    pub(crate) fn positive(&self, unit: &str) -> Result<f64, ConfigError> {
        let number = match self.value {
            Value::Integer(number) => Some(*number as f64),
            Value::Float(number) => Some(*number),
            Value::String(_) => {
                let text = self.text()?;
                let text = text.trim();
                let text = text.strip_suffix(unit).unwrap_or(text);
                text.trim().parse::<f64>().ok()
            }
            _ => None,
        };
        number
            .filter(|number| number.is_finite() && *number > 0.0)
            .ok_or_else(|| self.expected("a number above 0"))
    }

    /// A percentage from 1 to 100, written `50%` or `50`.
    pub(crate) fn percent(&self) -> Result<u8, ConfigError> {
        let number = match self.value {
            Value::Integer(number) => u8::try_from(*number).ok(),
            Value::String(_) => {
                let text = self.text()?;
                let text = text.trim();
                text.strip_suffix('%')
                    .unwrap_or(text)
                    .trim()
                    .parse::<u8>()
                    .ok()
            }
            _ => None,
        };
        number
            .filter(|percent| (1..=100).contains(percent))
            .ok_or_else(|| self.expected("a percentage from 1% to 100%"))
    }

    /// `true` or `false`, as TOML's or as text.
    pub(crate) fn flag(&self) -> Result<bool, ConfigError> {
        match self.value {
            Value::Boolean(flag) => Ok(*flag),
            Value::String(_) => match self.text()?.trim() {
                "true" => Ok(true),
                "false" => Ok(false),
                _ => Err(self.expected("true or false")),
            },
            _ => Err(self.expected("true or false")),
        }
    }

    /// A duration written with its unit: `250ms`, `30s`, `10m`, `1h`, `3d`.
    pub(crate) fn duration(&self) -> Result<Duration, ConfigError> {
        let parsed = match self.value {
            Value::String(_) => parse_duration(self.text()?.trim()),
            _ => None,
        };
        parsed.ok_or_else(|| {
            self.expected("a duration with its unit, such as 250ms, 30s, 10m, 1h or 3d")
        })
    }

    /// A duration above zero, written with its unit: a bound that could never be met is no
    /// bound.
    pub(crate) fn positive_duration(&self) -> Result<Duration, ConfigError> {
        match self.duration()? {
            zero if zero.is_zero() => Err(self.expected("a duration above zero")),
            duration => Ok(duration),
        }
    }

    /// One of `choices`.
    pub(crate) fn choice<'c>(&self, choices: &[&'c str]) -> Result<&'c str, ConfigError> {
        let text = match self.value {
            Value::String(_) => Some(self.text()?),
            _ => None,
        };
        text.and_then(|text| {
            choices
                .iter()
                .copied()
                .find(|choice| *choice == text.trim())
        })
        .ok_or_else(|| self.expected(&format!("one of {}", choices.join(", "))))
    }
}

/// A table's settings as they are taken.
pub(crate) struct Fields<'a> {
    path: String,
    table: &'a Table,
    taken: Vec<&'static str>,
}

impl<'a> Fields<'a> {
    /// The setting `key`, if there.
    pub(crate) fn get(&mut self, key: &'static str) -> Option<Node<'a>> {
        self.taken.push(key);
        let value = self.table.get(key)?;
        let path = if self.path.is_empty() {
            key.to_owned()
        } else {
            format!("{}.{key}", self.path)
        };
        Some(Node { path, value })
    }

    /// Reads the setting `key` with `read`, if there.
    pub(crate) fn read<T>(
        &mut self,
        key: &'static str,
        read: impl FnOnce(&Node<'a>) -> Result<T, ConfigError>,
    ) -> Result<Option<T>, ConfigError> {
        self.get(key).map(|node| read(&node)).transpose()
    }

    /// The setting `key`, which must be there.
    pub(crate) fn required(&mut self, key: &'static str) -> Result<Node<'a>, ConfigError> {
        self.get(key).ok_or_else(|| {
            let path = if self.path.is_empty() {
                key.to_owned()
            } else {
                format!("{}.{key}", self.path)
            };
            ConfigError::new(path, "is required")
        })
    }

    /// Refuses a setting that was not taken: a typo is an error, never a setting ignored.
    pub(crate) fn finish(self) -> Result<(), ConfigError> {
        let Some(unknown) = self
            .table
            .keys()
            .find(|key| !self.taken.contains(&key.as_str()))
        else {
            return Ok(());
        };
        let expected = self.taken.join(", ");
        // A key that holds a URL or an address (a setting whose `=` went missing) may carry a
        // password, and an empty one names nothing: each is named by where it is.
        let nameless = if unknown.is_empty() {
            Some("an empty name")
        } else if may_hold_a_secret(unknown) {
            Some("a URL or an address (is an `=` missing?)")
        } else {
            None
        };
        if let Some(what) = nameless {
            let path = if self.path.is_empty() {
                "configuration".to_owned()
            } else {
                self.path
            };
            return Err(ConfigError::new(
                path,
                format!("{what} is not a setting here; expected one of {expected}"),
            ));
        }
        let cut: String = unknown.chars().take(QUOTED).collect();
        let path = if self.path.is_empty() {
            cut
        } else {
            format!("{}.{cut}", self.path)
        };
        Err(ConfigError::new(
            path,
            format!("not a setting here; expected one of {expected}"),
        ))
    }
}

/// Whether `text` looks like a URL or an address, which may carry a password or a key: such
/// text is never quoted in an error.
pub(crate) fn may_hold_a_secret(text: &str) -> bool {
    text.contains("://") || text.contains('@')
}

/// `text` with each `${NAME}` replaced by the environment's `NAME`.
pub(crate) fn expand(text: &str) -> Result<String, String> {
    substitute(text, false)
}

/// Everything but the characters a URL never reads as anything else (RFC 3986's
/// unreserved): what a value put into a URL is percent-encoded with.
const IN_A_URL: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// A URL's `text` with each `${NAME}` replaced by the environment's `NAME`; a value put in
/// after the `://` is percent-encoded, so that the URL's reader, which decodes its parts,
/// gives back the value exactly as the environment holds it. A value before the `://` (the
/// whole URL in one variable) goes in as it is.
pub(crate) fn expand_url(text: &str) -> Result<String, String> {
    substitute(text, true)
}

fn substitute(text: &str, in_a_url: bool) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find('}') else {
            return Err("has `${` without its closing `}`".to_owned());
        };
        let name = &after[..end];
        let valid = name
            .chars()
            .next()
            .is_some_and(|first| first.is_ascii_alphabetic() || first == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            // Not quoted: a password may hold `${` and `}` as its own characters.
            return Err(
                "a `${...}` in it does not name an environment variable (letters, digits and _)"
                    .to_owned(),
            );
        }
        match std::env::var(name) {
            Ok(value) if in_a_url && out.contains("://") => {
                out.extend(percent_encoding::utf8_percent_encode(&value, IN_A_URL));
            }
            Ok(value) => out.push_str(&value),
            Err(std::env::VarError::NotPresent) => {
                return Err(format!("the environment variable {name} is not set"));
            }
            Err(std::env::VarError::NotUnicode(_)) => {
                return Err(format!("the environment variable {name} is not UTF-8"));
            }
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// `250ms`, `30s`, `10m`, `1h`, `3d`: a whole number and its unit.
fn parse_duration(text: &str) -> Option<Duration> {
    let split = text.find(|c: char| !c.is_ascii_digit())?;
    let (number, unit) = text.split_at(split);
    let number: u64 = number.parse().ok()?;
    let unit_secs = match unit.trim() {
        "ms" => return Some(Duration::from_millis(number)),
        "s" => 1,
        "m" | "min" => 60,
        "h" => 3_600,
        "d" => 86_400,
        _ => return None,
    };
    number.checked_mul(unit_secs).map(Duration::from_secs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(value: &Value) -> Node<'_> {
        Node {
            path: "member[0].breaker.threshold".to_owned(),
            value,
        }
    }

    #[test]
    fn a_whole_number_out_of_range_names_its_path_and_the_value_written() {
        let value = Value::String("five".to_owned());
        let error = at(&value).whole_u32(1).unwrap_err();
        assert_eq!(error.setting(), "member[0].breaker.threshold");
        assert_eq!(
            error.reason(),
            "expected a whole number of at least 1, got \"five\""
        );
        assert_eq!(
            at(&Value::Integer(0)).whole_u32(1).unwrap_err().reason(),
            "expected a whole number of at least 1, got 0"
        );
        assert_eq!(at(&Value::String("7".into())).whole_u32(1), Ok(7));
    }

    /// The names and reasons of the errors for a table of `keys` (each set to 1) at `path`,
    /// where only `known` is a setting.
    fn unknown_key(path: &str, keys: &[&str]) -> (String, String) {
        let table: Table = keys
            .iter()
            .map(|key| ((*key).to_owned(), Value::Integer(1)))
            .collect();
        let value = Value::Table(table);
        let node = Node {
            path: path.to_owned(),
            value: &value,
        };
        let mut fields = node.table().unwrap();
        fields.read("known", Node::flag).ok();
        let error = fields.finish().unwrap_err();
        (error.setting().to_owned(), error.reason().to_owned())
    }

    #[test]
    fn an_unknown_key_is_named_in_its_path() {
        assert_eq!(
            unknown_key("redis", &["nmespace"]),
            (
                "redis.nmespace".to_owned(),
                "not a setting here; expected one of known".to_owned()
            )
        );
        assert_eq!(unknown_key("", &["stratgy"]).0, "stratgy");
    }

    #[test]
    fn an_empty_key_is_named_by_where_it_is() {
        let (setting, reason) = unknown_key("redis", &[""]);
        assert_eq!(setting, "redis");
        assert!(
            reason.starts_with("an empty name is not a setting here"),
            "{reason}"
        );
        assert_eq!(unknown_key("", &[""]).0, "configuration");
    }

    #[test]
    fn an_unknown_key_that_holds_a_url_or_an_address_is_named_by_where_it_is_never_shown() {
        for key in ["redisredis://user:pw@host", "app:pw@host"] {
            let (setting, reason) = unknown_key("redis", &[key]);
            assert_eq!(setting, "redis");
            assert!(!reason.contains("pw"), "{reason}");
            assert!(reason.contains("expected one of known"), "{reason}");
            assert_eq!(unknown_key("", &[key]).0, "configuration");
        }
    }

    #[test]
    fn a_value_is_quoted_cut_short_when_long_and_never_when_it_may_hold_a_secret() {
        let got = |text: &str| {
            at(&Value::String(text.to_owned()))
                .whole_u32(1)
                .unwrap_err()
                .reason()
                .to_owned()
        };
        assert_eq!(
            got("five"),
            r#"expected a whole number of at least 1, got "five""#
        );
        let long = "x".repeat(QUOTED + 1);
        let cut = "x".repeat(QUOTED);
        assert_eq!(
            got(&long),
            format!(r#"expected a whole number of at least 1, got "{cut}"..."#)
        );
        assert!(!got(&cut).ends_with("..."), "{}", got(&cut));
        for secret in ["app:pw@relay.example.com", "redis://relay.example.com"] {
            assert_eq!(
                got(secret),
                "expected a whole number of at least 1, got a URL or an address"
            );
        }
    }

    fn text(text: &str) -> Value {
        Value::String(text.to_owned())
    }

    #[test]
    fn a_whole_count_is_read_as_written_from_its_minimum() {
        assert_eq!(at(&Value::Integer(7)).whole_usize(1), Ok(7));
        assert_eq!(at(&text("8")).whole_usize(1), Ok(8));
        assert!(at(&Value::Integer(0)).whole_usize(1).is_err());
        assert_eq!(at(&Value::Integer(0)).whole_usize(0), Ok(0));
    }

    #[test]
    fn a_positive_number_is_a_finite_number_above_zero_with_or_without_its_unit() {
        let read = |value: Value| at(&value).positive("/s").ok();
        assert_eq!(read(Value::Integer(14)), Some(14.0));
        assert_eq!(read(Value::Float(2.5)), Some(2.5));
        assert_eq!(read(text("14/s")), Some(14.0));
        assert_eq!(read(text(" 0.5 /s ")), Some(0.5));
        assert_eq!(read(text("3")), Some(3.0));
        for refused in [
            Value::Integer(0),
            Value::Float(0.0),
            Value::Float(-1.0),
            Value::Float(f64::INFINITY),
            Value::Float(f64::NAN),
            text("0/s"),
            text("inf"),
            text("fast"),
            Value::Boolean(true),
        ] {
            assert_eq!(read(refused.clone()), None, "{refused:?}");
        }
    }

    #[test]
    fn a_percentage_is_from_1_to_100_with_or_without_its_sign() {
        let read = |value: Value| at(&value).percent().ok();
        assert_eq!(read(Value::Integer(30)), Some(30));
        assert_eq!(read(text("40%")), Some(40));
        assert_eq!(read(text(" 1 ")), Some(1));
        assert_eq!(read(text("100%")), Some(100));
        for refused in [
            Value::Integer(0),
            Value::Integer(101),
            Value::Integer(-5),
            text("0%"),
            text("250%"),
            Value::Float(50.0),
        ] {
            assert_eq!(read(refused.clone()), None, "{refused:?}");
        }
    }

    #[test]
    fn a_flag_is_true_or_false_as_toml_or_as_text() {
        let read = |value: Value| at(&value).flag().ok();
        assert_eq!(read(Value::Boolean(true)), Some(true));
        assert_eq!(read(Value::Boolean(false)), Some(false));
        assert_eq!(read(text("true")), Some(true));
        assert_eq!(read(text(" false ")), Some(false));
        assert_eq!(read(text("yes")), None);
        assert_eq!(read(Value::Integer(1)), None);
    }

    #[test]
    fn a_list_is_a_toml_list_or_text_separated_by_commas() {
        let read = |value: Value| at(&value).urls().ok();
        let list = Value::Array(vec![text("a"), text("b")]);
        assert_eq!(read(list), Some(vec!["a".to_owned(), "b".to_owned()]));
        assert_eq!(
            read(text("a, b,,")),
            Some(vec!["a".to_owned(), "b".to_owned()])
        );
        assert_eq!(read(text(",")), Some(Vec::new()));
        assert_eq!(read(Value::Integer(1)), None);
    }

    #[test]
    fn a_choice_is_one_of_its_words_as_written() {
        let choices = ["failover", "roundrobin"];
        let read = |value: Value| at(&value).choice(&choices).ok();
        assert_eq!(read(text("roundrobin")), Some("roundrobin"));
        assert_eq!(read(text(" failover ")), Some("failover"));
        assert_eq!(read(text("random")), None);
        assert_eq!(read(text("")), None);
        assert_eq!(read(Value::Integer(1)), None);
    }

    #[test]
    fn a_variables_name_is_letters_digits_and_underscores_not_starting_with_a_digit() {
        for name in ["A-B", "1A", "", "A B"] {
            let error = expand(&format!("x${{{name}}}y")).unwrap_err();
            assert!(
                error.ends_with("does not name an environment variable (letters, digits and _)"),
                "{name:?}: {error}"
            );
        }
        // What stands between `${` and `}` may be a password that holds them: never shown.
        let error = expand("smtp://u:ab${c!d}ef@relay").unwrap_err();
        assert!(!error.contains("c!d"), "{error}");
        let unset = expand("${MAIL_BREAKER_READ_TEST_UNSET_2}").unwrap_err();
        assert_eq!(
            unset,
            "the environment variable MAIL_BREAKER_READ_TEST_UNSET_2 is not set"
        );
    }

    #[test]
    fn a_variables_name_may_start_with_an_underscore() {
        // SAFETY: no other test of this binary reads or writes this variable.
        unsafe { std::env::set_var("_MAIL_BREAKER_READ_TEST_UNDERSCORE", "k3y") };
        assert_eq!(
            expand("a${_MAIL_BREAKER_READ_TEST_UNDERSCORE}b"),
            Ok("ak3yb".to_owned())
        );
    }

    #[test]
    fn durations_are_written_with_their_unit() {
        let read = |text: &str| at(&Value::String(text.to_owned())).duration().ok();
        assert_eq!(read("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(read("30s"), Some(Duration::from_secs(30)));
        assert_eq!(read("10m"), Some(Duration::from_secs(600)));
        assert_eq!(read("1h"), Some(Duration::from_secs(3_600)));
        assert_eq!(read("3d"), Some(Duration::from_secs(259_200)));
        assert_eq!(read("30"), None);
        assert_eq!(read("s"), None);
        assert_eq!(read("99999999999999999999d"), None);
        assert_eq!(read(&format!("{}d", u64::MAX)), None);
    }

    #[test]
    fn an_environment_variable_fills_in_a_value_and_a_missing_one_is_named() {
        // SAFETY: no other test of this binary reads or writes this variable.
        unsafe { std::env::set_var("MAIL_BREAKER_READ_TEST_KEY", "s3cret") };
        assert_eq!(
            expand("smtp://u:${MAIL_BREAKER_READ_TEST_KEY}@h").unwrap(),
            "smtp://u:s3cret@h"
        );
        assert_eq!(
            expand("${MAIL_BREAKER_READ_TEST_MISSING}").unwrap_err(),
            "the environment variable MAIL_BREAKER_READ_TEST_MISSING is not set"
        );
        assert!(expand("${unclosed").is_err());
        assert!(expand("${1abc}").is_err());
        assert_eq!(
            expand("a $ sign and $HOME stay").unwrap(),
            "a $ sign and $HOME stay"
        );
    }

    #[test]
    fn a_value_put_into_a_url_after_its_scheme_is_percent_encoded_and_a_whole_url_is_not() {
        // SAFETY: no other test of this binary reads or writes these variables.
        unsafe {
            std::env::set_var("MAIL_BREAKER_READ_TEST_URL_SECRET", "%41 b/");
            std::env::set_var(
                "MAIL_BREAKER_READ_TEST_WHOLE_URL",
                "redis://:pw@host:6379/0",
            );
        }
        assert_eq!(
            expand_url("smtp://u:${MAIL_BREAKER_READ_TEST_URL_SECRET}@h").unwrap(),
            "smtp://u:%2541%20b%2F@h"
        );
        assert_eq!(
            expand_url("${MAIL_BREAKER_READ_TEST_WHOLE_URL}").unwrap(),
            "redis://:pw@host:6379/0"
        );
        assert_eq!(
            expand("x${MAIL_BREAKER_READ_TEST_URL_SECRET}").unwrap(),
            "x%41 b/"
        );
    }

    #[test]
    fn an_error_quotes_the_value_as_written_not_as_the_environment_filled_it_in() {
        // SAFETY: no other test of this binary reads or writes this variable.
        unsafe { std::env::set_var("MAIL_BREAKER_READ_TEST_SECRET", "hunter2") };
        let value = Value::String("${MAIL_BREAKER_READ_TEST_SECRET}".to_owned());
        let error = at(&value).whole_u32(1).unwrap_err();
        assert!(!error.to_string().contains("hunter2"), "{error}");
        assert!(error.to_string().contains("MAIL_BREAKER_READ_TEST_SECRET"));
    }
}
