//! The resource every span is reported under: the SDK's own attributes, those of
//! `OTEL_RESOURCE_ATTRIBUTES` (read as the specification says, values percent-decoded), and
//! the service name.

use opentelemetry::KeyValue;
use opentelemetry_sdk::resource::TelemetryResourceDetector;
use opentelemetry_sdk::Resource;
use percent_encoding::percent_decode_str;

/// The variable resource attributes are read from.
const ENV: &str = "OTEL_RESOURCE_ATTRIBUTES";

/// The attributes in `text`: comma-separated `key=value` pairs, each trimmed, values
/// percent-decoded. As the specification asks, a value that cannot be decoded (a `%` not
/// followed by two hexadecimal digits, or bytes that are not UTF-8), an entry without `=`
/// or with an empty key makes the whole variable unreadable: the reason is returned, and
/// none of it is used. Empty entries (a trailing comma) are skipped.
pub fn parse_attributes(text: &str) -> Result<Vec<(String, String)>, String> {
    let mut attributes = Vec::new();
    for entry in text.split(',').filter(|entry| !entry.trim().is_empty()) {
        let Some((key, value)) = entry.split_once('=') else {
            return Err(format!("{:?} is not key=value", entry.trim()));
        };
        let key = key.trim();
        if key.is_empty() {
            return Err(format!("{:?} has no key", entry.trim()));
        }
        let value = value.trim();
        if !well_escaped(value) {
            return Err(format!(
                "the value of {key:?} has a % not followed by two hexadecimal digits"
            ));
        }
        let decoded = percent_decode_str(value)
            .decode_utf8()
            .map_err(|_| format!("the value of {key:?} does not decode to UTF-8"))?;
        attributes.push((key.to_owned(), decoded.into_owned()));
    }
    Ok(attributes)
}

/// Whether every `%` in `value` starts an escape of two hexadecimal digits.
fn well_escaped(value: &str) -> bool {
    let bytes = value.as_bytes();
    bytes.iter().enumerate().all(|(at, byte)| {
        *byte != b'%'
            || bytes
                .get(at + 1..at + 3)
                .is_some_and(|hex| hex.iter().all(u8::is_ascii_hexdigit))
    })
}

/// `OTEL_RESOURCE_ATTRIBUTES` read: its attributes (none when it is unset, not UTF-8, or
/// unreadable), and why it could not be read, if so.
pub fn from_env() -> (Vec<(String, String)>, Option<String>) {
    match std::env::var(ENV) {
        Ok(text) => match parse_attributes(&text) {
            Ok(attributes) => (attributes, None),
            Err(reason) => (Vec::new(), Some(reason)),
        },
        Err(std::env::VarError::NotPresent) => (Vec::new(), None),
        Err(std::env::VarError::NotUnicode(_)) => (Vec::new(), Some("it is not UTF-8".into())),
    }
}

/// The `service.name` among `OTEL_RESOURCE_ATTRIBUTES`, if it names one.
pub fn service_name_in_env() -> Option<String> {
    from_env()
        .0
        .into_iter()
        .rev()
        .find(|(key, _)| key == "service.name")
        .map(|(_, value)| value)
}

/// The resource for `service_name`: the SDK's attributes, then `OTEL_RESOURCE_ATTRIBUTES`,
/// then the service name, each later one winning.
pub fn resource(service_name: &str) -> Resource {
    Resource::builder_empty()
        .with_detector(Box::new(TelemetryResourceDetector))
        .with_attributes(
            from_env()
                .0
                .into_iter()
                .map(|(key, value)| KeyValue::new(key, value)),
        )
        .with_service_name(service_name.to_owned())
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_percent_decoded_and_entries_trimmed() {
        let parsed = parse_attributes(
            " service.name = billing%20api ,deployment.environment=prod%2Ceu,,team=a%3Db,",
        )
        .unwrap();
        let pairs: Vec<(&str, &str)> = parsed
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(
            pairs,
            [
                ("service.name", "billing api"),
                ("deployment.environment", "prod,eu"),
                ("team", "a=b"),
            ]
        );
        assert_eq!(parse_attributes("").unwrap(), Vec::new());
    }

    #[test]
    fn a_value_that_cannot_be_decoded_makes_the_whole_variable_unreadable() {
        for unreadable in [
            "service.name=%ZZ",
            "service.name=ok,x=100%",
            "x=%4",
            "service.name=%FF%FE",
            "garbage",
            "service.name=ok,=x",
        ] {
            assert!(parse_attributes(unreadable).is_err(), "{unreadable}");
        }
    }
}
