//! Names people give things (endpoints, tenants, API keys): one rule for what such a label
//! may be, so that every one of them is stored, listed and printed the same way.

use crate::error::{Error, Result};

/// The longest label, in characters.
pub const MAX_LABEL_CHARS: usize = 200;

/// A label: trimmed, 1 to [`MAX_LABEL_CHARS`] characters, no control characters (which
/// PostgreSQL refuses in text when it is NUL, and terminals interpret otherwise);
/// `BAD_USER_INPUT` otherwise.
pub fn validate(name: &str) -> Result<String> {
    let name = name.trim();
    if name.is_empty() || name.chars().count() > MAX_LABEL_CHARS {
        return Err(Error::bad_input(format!(
            "name must be 1 to {MAX_LABEL_CHARS} characters"
        )));
    }
    if name.chars().any(char::is_control) {
        return Err(Error::bad_input("name must not contain control characters"));
    }
    Ok(name.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_label_is_trimmed_bounded_and_free_of_control_characters() {
        assert_eq!(validate("  Acme  ").ok().as_deref(), Some("Acme"));
        assert!(validate("").is_err());
        assert!(validate("   ").is_err());
        assert!(validate(&"x".repeat(MAX_LABEL_CHARS)).is_ok());
        assert!(validate(&"x".repeat(MAX_LABEL_CHARS + 1)).is_err());
        assert!(validate("a\u{0}b").is_err());
        assert!(validate("a\u{1}b").is_err());
        assert!(validate("a\nb").is_err());
    }
}
