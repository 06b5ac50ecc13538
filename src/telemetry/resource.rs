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
/// percent-decoded (a value that does not decode to UTF-8 is kept as written). An entry
/// without `=` or with an empty key is skipped.
pub fn parse_attributes(text: &str) -> Vec<(String, String)> {
    text.split(',')
        .filter_map(|entry| {
            let (key, value) = entry.split_once('=')?;
            let key = key.trim();
            if key.is_empty() {
                return None;
            }
            let value = value.trim();
            let decoded = percent_decode_str(value)
                .decode_utf8()
                .map_or_else(|_| value.to_owned(), |decoded| decoded.into_owned());
            Some((key.to_owned(), decoded))
        })
        .collect()
}

/// The attributes of `OTEL_RESOURCE_ATTRIBUTES` (none when it is unset or not UTF-8).
fn from_env() -> Vec<(String, String)> {
    std::env::var(ENV)
        .map(|text| parse_attributes(&text))
        .unwrap_or_default()
}

/// The `service.name` among `OTEL_RESOURCE_ATTRIBUTES`, if it names one.
pub fn service_name_in_env() -> Option<String> {
    from_env()
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
            " service.name = billing%20api ,deployment.environment=prod%2Ceu,bad,=x,raw=100%,",
        );
        let pairs: Vec<(&str, &str)> = parsed
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(
            pairs,
            [
                ("service.name", "billing api"),
                ("deployment.environment", "prod,eu"),
                ("raw", "100%"),
            ]
        );
    }
}
