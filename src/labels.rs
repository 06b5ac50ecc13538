//! Names people give things (endpoints, tenants, API keys): one rule for what such a label
//! may be, so that every one of them is stored, listed and printed the same way.

use crate::error::{Error, Result};

/// The longest label, in characters.
pub const MAX_LABEL_CHARS: usize = 200;

/// A label: trimmed, 1 to [`MAX_LABEL_CHARS`] characters, at least one of them visible, no
/// control characters (which PostgreSQL refuses in text when it is NUL, and terminals
/// interpret otherwise) and no bidirectional overrides or isolates (which make a listing
/// show text in another order than it is stored, "evil\u{202E}txt.exe" as "evilexe.txt");
/// `BAD_USER_INPUT` otherwise.
pub fn validate(name: &str) -> Result<String> {
    let name = name.trim();
    if name.is_empty() || name.chars().count() > MAX_LABEL_CHARS {
        return Err(Error::bad_input(format!(
            "name must be 1 to {MAX_LABEL_CHARS} characters"
        )));
    }
    if name
        .chars()
        .any(|c| c.is_control() || is_line_break_or_noncharacter(c))
    {
        return Err(Error::bad_input("name must not contain control characters"));
    }
    if name.chars().any(is_bidi_control) {
        return Err(Error::bad_input(
            "name must not contain bidirectional override or isolate characters",
        ));
    }
    if name.chars().all(|c| c.is_whitespace() || is_invisible(c)) {
        return Err(Error::bad_input("name must contain a visible character"));
    }
    Ok(name.to_owned())
}

/// `text` as a label made from another (a portal link's key is named after its tenant,
/// whose name may predate a rule): without control characters and bidirectional overrides
/// and isolates, cut to [`MAX_LABEL_CHARS`] characters, ending in "…" where it was cut.
pub fn fitted(text: &str) -> String {
    let text = printable(text).trim().to_owned();
    if text.chars().count() <= MAX_LABEL_CHARS {
        return text;
    }
    let mut cut: String = text.chars().take(MAX_LABEL_CHARS - 1).collect();
    cut.truncate(cut.trim_end().len());
    cut.push('…');
    cut
}

/// `label` safe to print on one line of a terminal, or to make another label from (a name
/// may have been stored before the rules above refused what it holds): control characters
/// as spaces, bidirectional overrides and isolates left out.
pub fn printable(label: &str) -> String {
    label
        .chars()
        .filter(|&c| !is_bidi_control(c))
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// The line and paragraph separators (which break a line as a control character does)
/// and Unicode's noncharacters.
fn is_line_break_or_noncharacter(c: char) -> bool {
    matches!(c, '\u{2028}' | '\u{2029}' | '\u{FDD0}'..='\u{FDEF}')
        || (u32::from(c) & 0xFFFE) == 0xFFFE
}

/// The explicit bidirectional embeddings, overrides and isolates.
fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}

/// Characters that show nothing by themselves: format characters (zero-width spaces and
/// joiners, marks of direction, the byte-order mark), fillers, variation selectors and tags.
fn is_invisible(c: char) -> bool {
    matches!(c,
        '\u{00AD}' | '\u{034F}' | '\u{061C}' | '\u{115F}' | '\u{1160}' | '\u{17B4}' | '\u{17B5}'
        | '\u{180B}'..='\u{180F}' | '\u{200B}'..='\u{200F}' | '\u{2060}'..='\u{206F}'
        | '\u{2800}' | '\u{3164}' | '\u{FE00}'..='\u{FE0F}' | '\u{FEFF}' | '\u{FFA0}'
        | '\u{1D173}'..='\u{1D17A}' | '\u{E0000}'..='\u{E0FFF}')
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

    #[test]
    fn a_label_shows_something_and_in_the_order_it_is_stored() {
        assert!(validate("\u{200B}").is_err());
        assert!(validate("\u{FEFF} \u{200B}").is_err());
        assert!(validate("evil\u{202E}txt.exe").is_err());
        assert!(validate("a\u{2066}b\u{2069}").is_err());
        assert!(
            validate("\u{2800}").is_err(),
            "a blank braille pattern shows nothing"
        );
        assert!(
            validate("a\u{2028}b").is_err(),
            "a line separator breaks the line"
        );
        assert!(validate("a\u{FFFE}").is_err(), "a noncharacter");
        assert_eq!(validate("שלום").ok().as_deref(), Some("שלום"));
        assert!(
            validate("👩\u{200D}💻 team").is_ok(),
            "joiners within visible text"
        );
    }

    #[test]
    fn a_label_made_from_another_fits() {
        assert_eq!(fitted("short"), "short");
        let long = format!("portal link for {}", "é".repeat(MAX_LABEL_CHARS));
        let fitted = fitted(&long);
        assert_eq!(fitted.chars().count(), MAX_LABEL_CHARS);
        assert!(fitted.ends_with('…'));
        assert!(validate(&fitted).is_ok());
        let older = crate::labels::fitted("portal link for evil\u{202E}txt\u{7}");
        assert_eq!(
            older, "portal link for eviltxt",
            "a name from before the rules"
        );
        assert_eq!(printable("a\tb\u{2066}c\u{2069}"), "a bc");
    }
}
