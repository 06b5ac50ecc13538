//! Passwords kept out of what is shown: a URL as it may appear in a log line or an error.

/// Hides the passwords of a URL (a database's, a collector's) for error messages and
/// logs: the one in its user information, and the values of query parameters that hold
/// one (`?password=`, `?sslpassword=`, as libpq and sqlx read them).
pub fn redact(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut parsed) => {
            let in_user_info = parsed.password().is_some();
            if in_user_info {
                let _ = parsed.set_password(Some("***"));
            }
            let holds_password = |key: &str| key.to_ascii_lowercase().contains("password");
            let in_query = parsed.query_pairs().any(|(key, _)| holds_password(&key));
            if in_query {
                let pairs: Vec<(String, String)> = parsed
                    .query_pairs()
                    .map(|(key, value)| {
                        let value = if holds_password(&key) {
                            "***".to_owned()
                        } else {
                            value.into_owned()
                        };
                        (key.into_owned(), value)
                    })
                    .collect();
                parsed.query_pairs_mut().clear().extend_pairs(pairs);
            }
            if in_user_info || in_query {
                parsed.to_string()
            } else {
                url.to_owned()
            }
        }
        // Unreadable (a bad port, say), yet it may still hold a password: everything after
        // the user name up to the last `@` is hidden.
        Err(_) => match url.split_once("://") {
            Some((scheme, rest)) => match rest.rfind('@') {
                Some(at) => {
                    let (userinfo, host) = rest.split_at(at);
                    match userinfo.split_once(':') {
                        Some((user, _)) => format!("{scheme}://{user}:***{host}"),
                        None => url.to_owned(),
                    }
                }
                None => url.to_owned(),
            },
            None => url.to_owned(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_hidden_wherever_the_url_holds_them() {
        assert_eq!(
            redact("postgres://app:hunter2@db.internal/courier"),
            "postgres://app:***@db.internal/courier"
        );
        let query = redact("postgres://app@db/courier?password=hunter2&sslmode=disable");
        assert!(
            !query.contains("hunter2") && query.contains("sslmode=disable"),
            "{query}"
        );
        let ssl = redact("postgres://db/courier?sslpassword=hunter2");
        assert!(!ssl.contains("hunter2"), "{ssl}");
        let collector = redact("https://user:hunter2@collector.example.com:4318/v1/traces");
        assert!(!collector.contains("hunter2"), "{collector}");
        // Unreadable, yet hidden all the same.
        assert_eq!(
            redact("postgres://app:hunter2@db:99999/x"),
            "postgres://app:***@db:99999/x"
        );
        // Nothing to hide: shown exactly as given.
        let plain = "sqlite://courier.db?mode=rwc";
        assert_eq!(redact(plain), plain);
    }
}
