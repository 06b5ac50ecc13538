//! The headers sent with each export (`OTEL_EXPORTER_OTLP_TRACES_HEADERS`, else
//! `OTEL_EXPORTER_OTLP_HEADERS`) checked the way the exporter reads them, so that an entry
//! it would leave out silently is told instead.

use http::{HeaderName, HeaderValue};
use percent_encoding::percent_decode_str;

/// The variables the exporter reads its headers from, the first set one winning.
const VARIABLES: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
    "OTEL_EXPORTER_OTLP_HEADERS",
];

/// Why each entry of `text` (comma-separated `key=value` pairs, values percent-decoded)
/// cannot be sent as a header, as the exporter reads them: it leaves such entries out.
/// Only the key of an entry is named, never its value (which may hold a credential).
pub fn unusable_entries(text: &str) -> Vec<String> {
    let mut unusable = Vec::new();
    for entry in text
        .split(',')
        .map(str::trim)
        .filter(|entry| !entry.is_empty())
    {
        let Some((key, value)) = entry.split_once('=') else {
            unusable.push("an entry is not key=value".to_owned());
            continue;
        };
        let (key, value) = (key.trim(), value.trim());
        if key.is_empty() {
            unusable.push("an entry has no key".to_owned());
        } else if HeaderName::from_bytes(key.as_bytes()).is_err() {
            unusable.push(format!("{key:?} is not a header name"));
        } else if value.is_empty() {
            unusable.push(format!("{key:?} has no value"));
        } else if percent_decode_str(value)
            .decode_utf8()
            .ok()
            .is_none_or(|decoded| HeaderValue::from_str(&decoded).is_err())
        {
            unusable.push(format!("the value of {key:?} is not a header value"));
        }
    }
    unusable
}

/// The variable the exporter takes its headers from, and why each entry of it that it
/// would leave out cannot be sent (nothing when neither is set).
pub fn unusable_in_env() -> Option<(&'static str, Vec<String>)> {
    VARIABLES.iter().find_map(|name| match std::env::var(name) {
        Ok(text) => Some((*name, unusable_entries(&text))),
        Err(std::env::VarError::NotPresent) => None,
        Err(std::env::VarError::NotUnicode(_)) => Some((*name, vec!["it is not UTF-8".into()])),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_the_exporter_would_leave_out_are_named_by_key_only() {
        assert!(unusable_entries("authorization=Bearer%20abc, x-team=payments,").is_empty());
        assert_eq!(
            unusable_entries("token,=v,bad name=v,x-empty=,x-ctl=a%0Ab,x-ok=1"),
            vec![
                "an entry is not key=value".to_owned(),
                "an entry has no key".to_owned(),
                "\"bad name\" is not a header name".to_owned(),
                "\"x-empty\" has no value".to_owned(),
                "the value of \"x-ctl\" is not a header value".to_owned(),
            ]
        );
    }
}
