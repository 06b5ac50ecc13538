//! The collector's URL as used and as shown: credentials written into it
//! (`http://user:pass@collector/...`) are taken out and sent as an `Authorization: Basic`
//! header instead, so that neither the HTTP client's errors nor its connection pool, both of
//! which name the URL, ever hold the password; and in logs its password and query values
//! (a token may ride there) are masked.

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use percent_encoding::percent_decode_str;
use reqwest::header::HeaderValue;

/// A collector URL without its credentials, and those credentials as an `Authorization`
/// value (marked sensitive), if it held any.
#[derive(Debug, Clone)]
pub struct CollectorUrl {
    /// The URL to send to, without user name or password.
    pub url: String,
    /// `Basic base64(user:password)`, from the credentials the URL held.
    pub authorization: Option<HeaderValue>,
}

impl CollectorUrl {
    /// Splits `url`'s credentials off; a URL that does not parse is kept as it is (the
    /// exporter then refuses it by name).
    pub fn new(url: &str) -> CollectorUrl {
        let Ok(mut parsed) = url::Url::parse(url) else {
            return CollectorUrl {
                url: url.to_owned(),
                authorization: None,
            };
        };
        if parsed.username().is_empty() && parsed.password().is_none() {
            return CollectorUrl {
                url: url.to_owned(),
                authorization: None,
            };
        }
        let decoded = |text: &str| percent_decode_str(text).decode_utf8_lossy().into_owned();
        let user = decoded(parsed.username());
        let password = parsed.password().map(decoded).unwrap_or_default();
        let _ = parsed.set_username("");
        let _ = parsed.set_password(None);
        let authorization = HeaderValue::from_str(&format!(
            "Basic {}",
            STANDARD.encode(format!("{user}:{password}"))
        ))
        .ok()
        .map(|mut value| {
            value.set_sensitive(true);
            value
        });
        CollectorUrl {
            url: parsed.to_string(),
            authorization,
        }
    }
}

/// `url` as logs show it: a password and every query value masked.
pub fn shown(url: &str) -> String {
    let redacted = crate::db::redact(url);
    let Ok(mut parsed) = url::Url::parse(&redacted) else {
        return redacted;
    };
    if parsed.query().is_none() {
        return redacted;
    }
    let keys: Vec<String> = parsed
        .query_pairs()
        .map(|(key, _)| key.into_owned())
        .collect();
    parsed
        .query_pairs_mut()
        .clear()
        .extend_pairs(keys.iter().map(|key| (key.as_str(), "***")));
    parsed.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_leave_the_url_for_a_header() {
        let split = CollectorUrl::new("http://otel:S3CRET%21@collector:4318/v1/traces");
        assert_eq!(split.url, "http://collector:4318/v1/traces");
        let header = split.authorization.expect("a header");
        assert!(header.is_sensitive());
        assert_eq!(
            header.to_str().unwrap_or_default(),
            format!("Basic {}", STANDARD.encode("otel:S3CRET!"))
        );
        let plain = CollectorUrl::new("http://collector:4318/v1/traces");
        assert_eq!(plain.url, "http://collector:4318/v1/traces");
        assert!(plain.authorization.is_none());
    }

    #[test]
    fn logs_see_no_password_nor_query_value() {
        let shown = shown("http://otel:S3CRET@collector:4318/v1/traces?api_key=QSECRET&x=1");
        assert!(
            !shown.contains("S3CRET") && !shown.contains("QSECRET"),
            "{shown}"
        );
        assert!(shown.contains("api_key=***"), "{shown}");
        assert_eq!(
            super::shown("http://collector:4318/v1/traces"),
            "http://collector:4318/v1/traces"
        );
    }
}
