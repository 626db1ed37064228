//! A DSN in Symfony's forms, turned into the tree a TOML document gives, so that one reader
//! checks both.
//!
//! ```text
//! smtp://user:pass@smtp.example.com:587?tls=required&breaker.threshold=5
//! failover(postmark://KEY@default ses://eu-west-1?rate=14/s)?retry.attempts=4
//! roundrobin(smtp://a.example.com smtp://b.example.com)
//! retry(failover(smtp://a.example.com smtp://b.example.com))?attempts=4
//! ```
//!
//! - A member is a provider's URL. Its query's `name`, `priority`, `timeout`, SMTP's
//!   connection settings, `breaker.*`, `rate` and `rate.*` are the member's settings; the
//!   rest stay in the URL for the provider.
//! - `failover(...)` and `roundrobin(...)` pool their members, separated by spaces; the
//!   options after the closing parenthesis are the stack's: `retry.*`, `outbox`,
//!   `outbox.*`, `redis`, `redis.*`, `suppression`, `suppression.*` and `webhooks.*`.
//! - `retry(...)` wraps one pool or one member; its options are the retry's (`attempts=4`).
//! - A lone member takes the stack's options in its own query.

use toml::{Table, Value};

use super::ConfigError;

/// Member settings a member's query may carry: these keys, and those under these prefixes.
const MEMBER_KEYS: [&str; 9] = [
    "name",
    "priority",
    "rate",
    "timeout",
    "max_connections",
    "idle_timeout",
    "max_messages_per_connection",
    "pipelining",
    "chunking",
];
const MEMBER_PREFIXES: [&str; 3] = ["breaker.", "rate.", "reputation."];
/// The stack's settings: these keys, and those under them.
const STACK_KEYS: [&str; 6] = [
    "retry",
    "outbox",
    "redis",
    "at_most_once",
    "suppression",
    "webhooks",
];

/// The tree of `dsn`: `strategy`, `member` (a list), and the stack's tables.
pub(crate) fn parse(dsn: &str) -> Result<Value, ConfigError> {
    let mut parser = Parser { text: dsn, at: 0 };
    parser.skip_spaces();
    let expression = parser.expression(0)?;
    parser.skip_spaces();
    if parser.at < dsn.len() {
        return Err(parser.error("expected the end of the DSN"));
    }
    let mut root = Table::new();
    match expression {
        Expression::Retry { inner, options } => {
            stack(&mut root, *inner)?;
            let retry = nested(options.iter().map(|(key, value)| {
                let key = key.strip_prefix("retry.").unwrap_or(key);
                (key.to_owned(), value.clone())
            }));
            let mut tree = Table::new();
            tree.insert("retry".to_owned(), Value::Table(retry));
            merge(&mut root, tree);
        }
        other => stack(&mut root, other)?,
    }
    Ok(Value::Table(root))
}

/// Puts a lone member or a pool, with its options, into the tree.
fn stack(root: &mut Table, expression: Expression) -> Result<(), ConfigError> {
    match expression {
        Expression::Member(url) => {
            let (member, stack) = split_member(&url, true).map_err(|why| dsn_error(0, why))?;
            root.insert(
                "member".to_owned(),
                Value::Array(vec![Value::Table(member)]),
            );
            merge(root, stack);
            Ok(())
        }
        Expression::Pool {
            strategy,
            members,
            options,
        } => pool(root, strategy, members, options),
        Expression::Retry { .. } => Err(dsn_error(0, "a retry inside a retry".to_owned())),
    }
}

fn pool(
    root: &mut Table,
    strategy: &'static str,
    members: Vec<Expression>,
    options: Vec<(String, String)>,
) -> Result<(), ConfigError> {
    root.insert("strategy".to_owned(), Value::String(strategy.to_owned()));
    let mut list = Vec::with_capacity(members.len());
    for member in members {
        let Expression::Member(url) = member else {
            return Err(dsn_error(
                0,
                format!("{strategy}(...) holds members' URLs, not another group"),
            ));
        };
        let (member, _) = split_member(&url, false).map_err(|why| dsn_error(0, why))?;
        list.push(Value::Table(member));
    }
    root.insert("member".to_owned(), Value::Array(list));
    let stack = nested(options);
    merge(root, stack);
    Ok(())
}

/// What the DSN says, before it is a tree.
enum Expression {
    Member(String),
    Pool {
        strategy: &'static str,
        members: Vec<Expression>,
        options: Vec<(String, String)>,
    },
    Retry {
        inner: Box<Expression>,
        options: Vec<(String, String)>,
    },
}

struct Parser<'a> {
    text: &'a str,
    at: usize,
}

impl Parser<'_> {
    fn error(&self, what: &str) -> ConfigError {
        dsn_error(self.at, what.to_owned())
    }

    fn rest(&self) -> &str {
        &self.text[self.at..]
    }

    fn skip_spaces(&mut self) {
        let rest = self.rest();
        self.at += rest.len() - rest.trim_start().len();
    }

    /// A member's URL or a group, at `depth` groups in.
    fn expression(&mut self, depth: usize) -> Result<Expression, ConfigError> {
        for (word, strategy) in [
            ("failover(", Some("failover")),
            ("roundrobin(", Some("roundrobin")),
            ("retry(", None),
        ] {
            if !self.rest().starts_with(word) {
                continue;
            }
            if depth >= 2 {
                return Err(self.error("groups nest one level inside a retry, no deeper"));
            }
            self.at += word.len();
            let mut inner = Vec::new();
            loop {
                self.skip_spaces();
                if self.rest().starts_with(')') {
                    self.at += 1;
                    break;
                }
                if self.rest().is_empty() {
                    return Err(self.error("expected `)` to close the group"));
                }
                inner.push(self.expression(depth + 1)?);
            }
            let options = self.options()?;
            return match strategy {
                Some(strategy) => {
                    if inner.is_empty() {
                        return Err(self.error("a pool needs at least one member"));
                    }
                    Ok(Expression::Pool {
                        strategy,
                        members: inner,
                        options,
                    })
                }
                None => {
                    if inner.len() != 1 {
                        return Err(self.error("retry(...) wraps exactly one pool or member"));
                    }
                    Ok(Expression::Retry {
                        inner: Box::new(inner.remove(0)),
                        options,
                    })
                }
            };
        }
        let url = self.token();
        if url.is_empty() {
            return Err(self.error("expected a provider's URL or a group"));
        }
        if !url.contains("://") {
            return Err(self.error(
                "expected a provider's URL (smtp://, smtps://, ses://, postmark://, resend://, \
                 sendgrid://, mailgun://, graph://) or failover(...), roundrobin(...), retry(...)",
            ));
        }
        Ok(Expression::Member(url))
    }

    /// Text up to a space or a parenthesis that closes a group.
    fn token(&mut self) -> String {
        let rest = self.rest();
        let end = rest
            .find(|c: char| c.is_whitespace() || c == ')')
            .unwrap_or(rest.len());
        let token = rest[..end].to_owned();
        self.at += end;
        token
    }

    /// A group's options: `?key=value&...` right after its `)`.
    fn options(&mut self) -> Result<Vec<(String, String)>, ConfigError> {
        if !self.rest().starts_with('?') {
            return Ok(Vec::new());
        }
        self.at += 1;
        let start = self.at;
        let query = self.token();
        pairs(&query).map_err(|why| dsn_error(start, why))
    }
}

fn dsn_error(at: usize, why: String) -> ConfigError {
    ConfigError::new("dsn", format!("at character {at}: {why}"))
}

/// `key=value` pairs of a query, percent-decoded.
fn pairs(query: &str) -> Result<Vec<(String, String)>, String> {
    query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            Ok((decode(key)?, decode(value)?))
        })
        .collect()
}

fn decode(text: &str) -> Result<String, String> {
    percent_encoding::percent_decode_str(text)
        .decode_utf8()
        .map(|text| text.into_owned())
        .map_err(|_| "an option that is not UTF-8 once decoded".to_owned())
}

/// A member's URL split into the member's table (`url` without the member's settings, and
/// those settings) and, for a lone member, the stack's settings from its query.
pub(crate) fn split_member(url: &str, lone: bool) -> Result<(Table, Table), String> {
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let mut kept = Vec::new();
    let mut member = Vec::new();
    let mut stack = Vec::new();
    for raw in query.split('&').filter(|pair| !pair.is_empty()) {
        let key = decode(raw.split_once('=').map_or(raw, |(key, _)| key))?;
        let is_member = MEMBER_KEYS.contains(&key.as_str())
            || MEMBER_PREFIXES.iter().any(|prefix| key.starts_with(prefix));
        let is_stack = lone
            && STACK_KEYS
                .iter()
                .any(|stack_key| key == *stack_key || key.starts_with(&format!("{stack_key}.")));
        if is_member {
            member.extend(pairs(raw)?);
        } else if is_stack {
            stack.extend(pairs(raw)?);
        } else {
            kept.push(raw);
        }
    }
    let url = if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    let member = member.into_iter().map(|(key, value)| {
        // `rate=14/s` is the member's rate.
        let key = if key == "rate" {
            "rate.per_second".to_owned()
        } else {
            key
        };
        (key, value)
    });
    let mut table = nested(member);
    table.insert("url".to_owned(), Value::String(url));
    Ok((table, nested(stack)))
}

/// `a.b=v` pairs as nested tables (`{a = {b = "v"}}`); `outbox=URL` and `redis=URL` as their
/// table's `url`, `suppression=FLAG` as its table's `enabled`. A key given twice keeps its last value.
fn nested(pairs: impl IntoIterator<Item = (String, String)>) -> Table {
    let mut root = Table::new();
    for (key, value) in pairs {
        let key = match key.as_str() {
            "outbox" | "redis" => format!("{key}.url"),
            // `suppression=true` beside `suppression.store=redis`: both in one table.
            "suppression" => "suppression.enabled".to_owned(),
            _ => key,
        };
        let mut parts: Vec<&str> = key.split('.').collect();
        let last = parts.pop().unwrap_or_default();
        let mut table = &mut root;
        for part in parts {
            let entry = table
                .entry(part.to_owned())
                .or_insert_with(|| Value::Table(Table::new()));
            if !entry.is_table() {
                *entry = Value::Table(Table::new());
            }
            let Value::Table(inner) = entry else {
                unreachable!("made a table above")
            };
            table = inner;
        }
        table.insert(last.to_owned(), Value::String(value));
    }
    root
}

/// Adds `from`'s settings to `into`, table into table.
fn merge(into: &mut Table, from: Table) {
    for (key, value) in from {
        match (into.get_mut(&key), value) {
            (Some(Value::Table(inner)), Value::Table(from)) => merge(inner, from),
            (_, value) => {
                into.insert(key, value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(dsn: &str) -> Value {
        parse(dsn).unwrap_or_else(|error| panic!("{dsn}: {error}"))
    }

    fn toml(text: &str) -> Value {
        Value::Table(text.parse::<Table>().unwrap())
    }

    #[test]
    fn a_lone_member_keeps_its_providers_options_and_gives_up_its_own() {
        assert_eq!(
            tree(
                "smtp://u:p@smtp.example.com:587?tls=required&breaker.threshold=5&rate=14/s&retry.attempts=4"
            ),
            toml(
                r#"
                retry = { attempts = "4" }
                [[member]]
                url = "smtp://u:p@smtp.example.com:587?tls=required"
                breaker = { threshold = "5" }
                rate = { per_second = "14/s" }
                "#
            )
        );
    }

    #[test]
    fn failover_lists_its_members_and_its_options_are_the_stacks() {
        assert_eq!(
            tree(
                "failover(postmark://KEY@default ses://eu-west-1?rate=14/s)?retry.attempts=4&outbox=sqlite:///var/lib/app/outbox.db"
            ),
            toml(
                r#"
                strategy = "failover"
                retry = { attempts = "4" }
                outbox = { url = "sqlite:///var/lib/app/outbox.db" }
                [[member]]
                url = "postmark://KEY@default"
                [[member]]
                url = "ses://eu-west-1"
                rate = { per_second = "14/s" }
                "#
            )
        );
    }

    #[test]
    fn roundrobin_nested_in_a_retry_gives_the_retry_its_options() {
        assert_eq!(
            tree("retry(roundrobin(smtp://a.example.com  smtp://b.example.com))?attempts=3"),
            toml(
                r#"
                strategy = "roundrobin"
                retry = { attempts = "3" }
                [[member]]
                url = "smtp://a.example.com"
                [[member]]
                url = "smtp://b.example.com"
                "#
            )
        );
    }

    #[test]
    fn groups_deeper_than_a_pool_in_a_retry_are_refused() {
        for dsn in [
            "failover(failover(smtp://a smtp://b))",
            "retry(retry(smtp://a))",
            "retry(failover(retry(smtp://a)))",
        ] {
            let error = parse(dsn).unwrap_err();
            assert_eq!(error.setting(), "dsn", "{dsn}");
        }
    }

    #[test]
    fn a_dsn_nested_thousands_deep_is_refused_without_running_out_of_stack() {
        let deep = format!(
            "{}smtp://a{}",
            "failover(".repeat(100_000),
            ")".repeat(100_000)
        );
        let error = parse(&deep).unwrap_err();
        assert_eq!(error.setting(), "dsn");
        assert!(error.reason().contains("one level"), "{error}");
    }

    #[test]
    fn a_broken_dsn_says_where() {
        let error = parse("failover(smtp://a smtp://b").unwrap_err();
        assert_eq!(error.setting(), "dsn");
        assert!(error.reason().starts_with("at character 26:"), "{error}");
        assert!(parse("").is_err());
        assert!(parse("failover()").is_err());
        assert!(parse("not a url").is_err());
        assert!(parse("smtp://a )").is_err());
    }
}
