//! [`ApiKey`]: a provider's API key that never shows itself.

use std::fmt;
use std::sync::Arc;

/// A provider's API key (a Postmark server token, a Resend, SendGrid or Mailgun key). Its
/// `Debug` and `Display` print `***`, so a transport's `Debug`, a log line or an error that
/// formats it shows nothing of the key; [`expose`](Self::expose) gives the key itself, for the
/// request that needs it.
///
/// ```
/// use mail_breaker::adapters::http::ApiKey;
///
/// let key = ApiKey::new("re_live_123456");
/// assert_eq!(format!("{key} {key:?}"), "*** ***");
/// assert_eq!(key.expose(), "re_live_123456");
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(Arc<str>);

impl ApiKey {
    /// Keeps `key`.
    ///
    /// ```
    /// let key = mail_breaker::adapters::http::ApiKey::new(String::from("SG.abc"));
    /// assert_eq!(key.to_string(), "***");
    /// ```
    pub fn new(key: impl Into<String>) -> Self {
        ApiKey(Arc::from(key.into()))
    }

    /// The key itself: for the request's header, never for a log.
    ///
    /// ```
    /// let key = mail_breaker::adapters::http::ApiKey::new("key-123");
    /// assert_eq!(key.expose(), "key-123");
    /// ```
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// `text` with the key replaced wherever it stands, as it is or as a JSON string escapes
    /// it (`"` as `\"`, `/` as `\/`): what a provider that echoes the key back may write.
    pub(crate) fn redact(&self, text: &str) -> String {
        let mut text = text.to_owned();
        if self.0.is_empty() {
            return text;
        }
        for form in self.written_forms() {
            text = text.replace(&form, "[redacted]");
        }
        text
    }

    /// The key as it is, and as JSON writes it (with slashes escaped too, as some encoders
    /// do).
    fn written_forms(&self) -> Vec<String> {
        let quoted = serde_json::to_string(&*self.0).unwrap_or_default();
        let escaped = quoted
            .strip_prefix('"')
            .and_then(|q| q.strip_suffix('"'))
            .unwrap_or_default()
            .to_owned();
        let slashes = escaped.replace('/', "\\/");
        let mut forms = vec![escaped, slashes, self.0.to_string()];
        // Longest first, so that an escaped form is not cut up by the plain one first.
        forms.sort_by_key(|form| std::cmp::Reverse(form.len()));
        forms.dedup();
        forms.retain(|form| !form.is_empty());
        forms
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl fmt::Display for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl From<String> for ApiKey {
    fn from(key: String) -> Self {
        ApiKey::new(key)
    }
}

impl From<&str> for ApiKey {
    fn from(key: &str) -> Self {
        ApiKey::new(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_prints_as_stars() {
        let key = ApiKey::from("sk-123456");
        assert_eq!(
            format!("{key}|{key:?}|{:?}", Some(&key)),
            "***|***|Some(***)"
        );
    }

    #[test]
    fn a_key_is_redacted_as_it_is_and_as_json_escapes_it() {
        let key = ApiKey::new(r#"a/b"c\d"#);
        let json = serde_json::to_string(key.expose()).expect("a string");
        let text = format!(
            "plain {} json {json} slashes {}",
            key.expose(),
            json.replace('/', "\\/")
        );
        let redacted = key.redact(&text);
        assert!(!redacted.contains("b\\\"c"), "{redacted}");
        assert!(!redacted.contains(key.expose()), "{redacted}");
        assert_eq!(redacted.matches("[redacted]").count(), 3, "{redacted}");
        assert_eq!(ApiKey::new("").redact("text"), "text");
    }
}
