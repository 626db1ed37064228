//! Reading the providers' JSON without trusting its shape: a missing field, or one of
//! another type, is `None`, never a panic.

use serde_json::Value;

/// The text at `path` in `value`.
pub(crate) fn text<'a>(value: &'a Value, path: &[&str]) -> Option<&'a str> {
    at(value, path)?.as_str()
}

/// The texts of the array at `path`; anything else there reads as none.
pub(crate) fn texts(value: &Value, path: &[&str]) -> Vec<String> {
    at(value, path)
        .and_then(Value::as_array)
        .map(|items| {
            items
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// The value at `path` in `value`.
pub(crate) fn at<'a>(value: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter().try_fold(value, |value, key| value.get(key))
}

/// A field that is a text or a number, as text (SendGrid's and Postmark's ids and codes
/// come either way).
pub(crate) fn text_or_number(value: &Value, path: &[&str]) -> Option<String> {
    match at(value, path)? {
        Value::String(text) => Some(text.clone()),
        Value::Number(number) => Some(number.to_string()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_or_mistyped_field_is_none() {
        let value: Value = serde_json::json!({"a": {"b": "x", "n": 7, "list": ["p", 1, "q"]}});
        assert_eq!(text(&value, &["a", "b"]), Some("x"));
        assert_eq!(text(&value, &["a", "n"]), None);
        assert_eq!(text(&value, &["a", "b", "c"]), None);
        assert_eq!(texts(&value, &["a", "list"]), vec!["p", "q"]);
        assert_eq!(texts(&value, &["a", "b"]), Vec::<String>::new());
        assert_eq!(text_or_number(&value, &["a", "n"]), Some("7".to_owned()));
    }
}
