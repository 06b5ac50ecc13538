//! Event type names (`order.paid`) and an endpoint's subscription to them: what is a valid
//! type, how a subscription list is stored (a JSON array; empty means every type), and
//! what a type looks like to a reader (its skeleton), so that a reserved prefix cannot be
//! imitated.

use serde_json::Value;
use unicode_normalization::UnicodeNormalization as _;
use unicode_properties::{GeneralCategory, UnicodeGeneralCategory as _};

use crate::error::{Error, Result};
use crate::service::operational;

/// Longest event type, in characters.
pub const MAX_EVENT_TYPE_CHARS: usize = 255;
/// Most event types one endpoint may subscribe to.
pub const MAX_SUBSCRIBED_TYPES: usize = 100;

/// Checks one event type: 1 to 255 characters, no whitespace or control characters
/// (invisible formatting characters included: a zero-width space, a direction override),
/// and gives it in Unicode's composed form (NFC), the form it is stored, matched and
/// filtered in: `café` typed with a combining accent is the same type as with `é`.
pub fn validate(event_type: &str) -> Result<String> {
    let event_type: String = event_type.nfc().collect();
    let chars = event_type.chars().count();
    if chars == 0 || chars > MAX_EVENT_TYPE_CHARS {
        return Err(Error::bad_input(format!(
            "an event type must be 1 to {MAX_EVENT_TYPE_CHARS} characters"
        )));
    }
    if event_type.chars().any(|c| {
        c.is_whitespace() || c.is_control() || c.general_category() == GeneralCategory::Format
    }) {
        return Err(Error::bad_input(
            "an event type must not contain whitespace or control characters",
        ));
    }
    Ok(event_type)
}

/// What `text` looks like to a reader, as a string to compare: each character replaced
/// by the one it is easily mistaken for (Unicode's confusable skeleton, UTS 39: a Greek
/// `ϲ` or a Cyrillic `с` for `c`, a digit `0` for an `o`), compatibility forms folded
/// (fullwidth and small-capital letters), case folded, and then the skeleton again (a
/// lowercase letter can look like another than its capital did), with the marks over
/// letters left out and every letter that reads as a stroke (`i`, `I`, `l`, `1`, `|`)
/// taken for one: a reserved word's look-alikes are caught, at the price of a few strings
/// that merely resemble it.
pub fn skeleton(text: &str) -> String {
    let once = unicode_security::confusable_detection::skeleton(text).collect::<String>();
    let folded = once.nfkc().collect::<String>().to_lowercase();
    unicode_security::confusable_detection::skeleton(&folded)
        .flat_map(char::to_lowercase)
        .filter(|c| c.general_category() != GeneralCategory::NonspacingMark)
        .map(|c| match small_capital(c).unwrap_or(c) {
            'i' | 'l' | '1' | '|' | 'ı' => 'i',
            other => other,
        })
        .collect()
}

/// The letter a small capital stands for (`ᴇ` for `e`): neither compatibility forms nor
/// the confusables table map all of them.
fn small_capital(c: char) -> Option<char> {
    Some(match c {
        '\u{1d00}' => 'a',
        '\u{0299}' => 'b',
        '\u{1d04}' => 'c',
        '\u{1d05}' => 'd',
        '\u{1d07}' => 'e',
        '\u{a730}' => 'f',
        '\u{0262}' => 'g',
        '\u{029c}' => 'h',
        '\u{026a}' => 'i',
        '\u{1d0a}' => 'j',
        '\u{1d0b}' => 'k',
        '\u{029f}' => 'l',
        '\u{1d0d}' => 'm',
        '\u{0274}' => 'n',
        '\u{1d0f}' => 'o',
        '\u{1d18}' => 'p',
        '\u{0280}' => 'r',
        '\u{a731}' => 's',
        '\u{1d1b}' => 't',
        '\u{1d1c}' => 'u',
        '\u{1d20}' => 'v',
        '\u{1d21}' => 'w',
        '\u{028f}' => 'y',
        '\u{1d22}' => 'z',
        _ => return None,
    })
}

/// Checks a subscription list and gives its stored form: each type valid, duplicates
/// dropped, sorted; `[]` subscribes to every type. A reserved type (see
/// [`operational::is_reserved`]) must be one of the operational events Courier publishes:
/// any other (a typo such as `courier.endpoint.disable`, or a look-alike) would never be
/// heard.
pub fn subscription(types: Vec<String>) -> Result<Value> {
    if types.len() > MAX_SUBSCRIBED_TYPES {
        return Err(Error::bad_input(format!(
            "an endpoint may subscribe to at most {MAX_SUBSCRIBED_TYPES} event types"
        )));
    }
    let mut valid = types
        .iter()
        .map(|event_type| validate(event_type))
        .collect::<Result<Vec<_>>>()?;
    if let Some(unknown) = valid
        .iter()
        .find(|t| operational::is_reserved(t) && !operational::is_operational(t))
    {
        return Err(Error::bad_input(format!(
            "`{unknown}` is reserved and Courier publishes no such event; its operational \
             events are {}",
            operational::OPERATIONAL_TYPES.join(", ")
        )));
    }
    valid.sort();
    valid.dedup();
    Ok(Value::Array(valid.into_iter().map(Value::String).collect()))
}

/// The subscription list as stored, read back (anything that is not a string is ignored).
pub fn subscribed(stored: &Value) -> Vec<String> {
    stored
        .as_array()
        .map(|types| {
            types
                .iter()
                .filter_map(|item| item.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_subscription_lists_only_reserved_types_courier_publishes() {
        let listed = subscription(vec![
            "courier.delivery.failed".into(),
            "courier.endpoint.disabled".into(),
            "order.paid".into(),
        ]);
        assert!(listed.is_ok(), "{listed:?}");
        for unknown in [
            "courier.endpoint.disable",
            "courier.test",
            "Courier.Delivery.Failed",
            "\u{441}ourier.delivery.failed",
        ] {
            let refused = subscription(vec!["order.paid".into(), unknown.into()]);
            let message = refused.expect_err(unknown).to_string();
            assert!(message.contains("courier.delivery.failed"), "{message}");
        }
    }

    #[test]
    fn types_are_short_names_without_spaces() {
        assert!(validate("order.paid").is_ok());
        assert!(validate(&"x".repeat(255)).is_ok());
        for bad in [
            "",
            "order paid",
            "tab\there",
            "nl\n",
            "nul\0",
            &"x".repeat(256),
        ] {
            assert!(validate(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn invisible_formatting_characters_are_refused() {
        for bad in [
            "\u{200b}order.paid",
            "order\u{feff}",
            "a\u{200d}b",
            "soft\u{ad}hyphen",
            "\u{202e}rtl",
        ] {
            assert!(validate(bad).is_err(), "{bad:?}");
        }
        assert!(validate("commande.payée").is_ok());
        assert!(validate("注文.支払い").is_ok());
    }

    #[test]
    fn skeletons_see_through_case_compatibility_forms_and_look_alikes() {
        let plain = skeleton("courier.");
        for imitation in [
            "Courier.",
            "COURIER.",
            "\u{ff43}ourier.",
            "courier\u{ff0e}",
            "courier\u{2024}",
            "\u{441}ourier.",
            "c\u{43e}urier.",
            "c0urier.",
            "cour\u{131}er.",
            "COUR\u{130}ER.",
            "\u{3f2}ourier.",
            "\u{3f9}ourier.",
            "COURI\u{395}R.",
            "COUR\u{4c0}ER.",
            "COURlER.",
            "COUR1ER.",
            "COU\u{1a6}IER.",
            "\u{1d04}\u{1d0f}\u{1d1c}\u{280}\u{26a}\u{1d07}\u{280}.",
        ] {
            assert!(skeleton(imitation).starts_with(&plain), "{imitation:?}");
        }
        assert!(!skeleton("couriers.x").starts_with(&plain));
        assert!(!skeleton("order.paid").starts_with(&plain));
    }

    #[test]
    fn types_are_kept_composed() {
        assert_eq!(validate("cafe\u{301}.paid").unwrap(), "caf\u{e9}.paid");
        assert_eq!(validate("caf\u{e9}.paid").unwrap(), "caf\u{e9}.paid");
        // Only canonical equivalents are one type: a fullwidth letter stays itself.
        assert_eq!(validate("\u{ff41}").unwrap(), "\u{ff41}");
        let stored = subscription(vec!["cafe\u{301}".into(), "caf\u{e9}".into()]).unwrap();
        assert_eq!(subscribed(&stored), vec!["caf\u{e9}"]);
    }

    #[test]
    fn subscriptions_are_sorted_and_deduplicated() {
        let stored = subscription(vec!["b".into(), "a".into(), "b".into()]).unwrap();
        assert_eq!(subscribed(&stored), vec!["a", "b"]);
        assert_eq!(
            subscribed(&subscription(Vec::new()).unwrap()),
            Vec::<String>::new()
        );
        assert!(subscription(vec!["ok".into(), "not ok".into()]).is_err());
    }
}
