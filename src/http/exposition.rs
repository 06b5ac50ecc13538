//! The two text formats `/metrics` answers in, chosen by the scraper's `Accept`: OpenMetrics
//! when it asks for it (as Prometheus does), the Prometheus text format (0.0.4) otherwise.

use axum::http::HeaderMap;

/// The `Content-Type` of OpenMetrics text.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// The `Content-Type` of the Prometheus text format.
pub const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Whether `headers` ask for OpenMetrics rather than the Prometheus text format: its media
/// type is offered, with a quality above zero and no lower than plain text's.
pub fn wants_openmetrics(headers: &HeaderMap) -> bool {
    let (mut openmetrics, mut text) = (0.0f32, 0.0f32);
    for (media, quality) in super::negotiate::accepted(headers) {
        match media.as_str() {
            "application/openmetrics-text" => openmetrics = openmetrics.max(quality),
            "text/plain" | "text/*" | "*/*" => text = text.max(quality),
            _ => {}
        }
    }
    openmetrics > 0.0 && openmetrics >= text
}

/// OpenMetrics text (as the registry encodes it) in the Prometheus text format: a counter's
/// family is named by its samples (`<name>_total`), an info metric becomes a gauge named
/// `<name>_info`, a type the older format lacks is `untyped`, and `# UNIT` and `# EOF`
/// lines go.
pub fn to_prometheus_text(openmetrics: &str) -> String {
    let mut text = String::with_capacity(openmetrics.len());
    // Each family's metadata comes before its samples: `# HELP`, `# TYPE`, `# UNIT`.
    let mut lines = openmetrics.lines().peekable();
    while let Some(line) = lines.next() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            // The family's type follows its help.
            let kind = lines
                .peek()
                .and_then(|next| next.strip_prefix("# TYPE "))
                .and_then(|typed| typed.split_once(' '))
                .filter(|(typed, _)| *typed == name)
                .map_or("", |(_, kind)| kind);
            text.push_str("# HELP ");
            text.push_str(&family_name(name, kind));
            text.push(' ');
            text.push_str(&help.replace("\\\"", "\""));
            text.push('\n');
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, ""));
            let older = match kind {
                "counter" | "gauge" | "histogram" | "summary" => kind,
                "info" => "gauge",
                _ => "untyped",
            };
            text.push_str("# TYPE ");
            text.push_str(&family_name(name, kind));
            text.push(' ');
            text.push_str(older);
            text.push('\n');
            continue;
        }
        text.push_str(line);
        text.push('\n');
    }
    text
}

/// A family's name in the Prometheus text format, given its OpenMetrics `name` and `kind`.
fn family_name(name: &str, kind: &str) -> String {
    match kind {
        "counter" => format!("{name}_total"),
        "info" => format!("{name}_info"),
        _ => name.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::{header, HeaderValue};

    fn accepting(accept: Option<&str>) -> HeaderMap {
        let mut headers = HeaderMap::new();
        if let Some(accept) = accept {
            headers.insert(header::ACCEPT, HeaderValue::from_str(accept).unwrap());
        }
        headers
    }

    #[test]
    fn openmetrics_only_when_asked_for() {
        let prometheus = "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8,\
            application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert!(wants_openmetrics(&accepting(Some(prometheus))));
        assert!(wants_openmetrics(&accepting(Some(
            "application/openmetrics-text"
        ))));
        for plain in [
            None,
            Some("*/*"),
            Some("text/plain"),
            Some("text/plain;version=0.0.4"),
            Some("application/openmetrics-text;q=0"),
            Some("application/openmetrics-text;q=0.2, text/plain"),
        ] {
            assert!(!wants_openmetrics(&accepting(plain)), "{plain:?}");
        }
    }

    #[test]
    fn counters_are_named_by_their_samples_and_the_openmetrics_lines_go() {
        let openmetrics = "\
# HELP courier_http_requests HTTP requests, \\\"quoted\\\".
# TYPE courier_http_requests counter
courier_http_requests_total{method=\"GET\"} 3
# HELP courier_deliveries_due Deliveries due.
# TYPE courier_deliveries_due gauge
courier_deliveries_due 7
# HELP courier_latency_seconds Latency.
# TYPE courier_latency_seconds histogram
# UNIT courier_latency_seconds seconds
courier_latency_seconds_sum 1.5
courier_latency_seconds_count 2
courier_latency_seconds_bucket{le=\"+Inf\"} 2
# HELP courier_build Build.
# TYPE courier_build info
courier_build_info{version=\"1\"} 1
# EOF
";
        let expected = "\
# HELP courier_http_requests_total HTTP requests, \"quoted\".
# TYPE courier_http_requests_total counter
courier_http_requests_total{method=\"GET\"} 3
# HELP courier_deliveries_due Deliveries due.
# TYPE courier_deliveries_due gauge
courier_deliveries_due 7
# HELP courier_latency_seconds Latency.
# TYPE courier_latency_seconds histogram
courier_latency_seconds_sum 1.5
courier_latency_seconds_count 2
courier_latency_seconds_bucket{le=\"+Inf\"} 2
# HELP courier_build_info Build.
# TYPE courier_build_info gauge
courier_build_info{version=\"1\"} 1
";
        assert_eq!(to_prometheus_text(openmetrics), expected);
    }
}
