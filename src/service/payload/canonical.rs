//! The canonical form of a JSON value and its hash: "same content" for idempotency,
//! whatever the key order, whitespace or number spelling.
//!
//! The hash is stored and decides idempotency for as long as a submission exists, so this
//! form is frozen (the golden hashes below pin it). It is RFC 8785 (JCS) for object keys,
//! strings, literals and whitespace, with one deliberate difference: a number is written
//! as its exact decimal value in plain form ([`crate::service::payload::decimal`]), not converted to
//! a double, which would make distinct large integers or long decimals the same content.

use std::cmp::Ordering;

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::service::payload::decimal::{Decimal, NumberError};

/// SHA-256 (lowercase hex) of the value's canonical form. Fails only for a number whose
/// plain form is too long to write (see [`crate::service::payload::decimal::MAX_NUMBER_DIGITS`]).
pub fn payload_hash(value: &Value) -> Result<String, NumberError> {
    let canonical = canonical(value)?;
    Ok(hex::encode(Sha256::digest(canonical.as_bytes())))
}

/// The canonical form: no whitespace; object members sorted by their keys' UTF-16 code
/// units; strings escaped as RFC 8785 says; numbers as exact plain decimals.
pub fn canonical(value: &Value) -> Result<String, NumberError> {
    let mut out = String::new();
    write_value(value, &mut out)?;
    Ok(out)
}

fn write_value(value: &Value, out: &mut String) -> Result<(), NumberError> {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(true) => out.push_str("true"),
        Value::Bool(false) => out.push_str("false"),
        Value::Number(number) => out.push_str(&Decimal::parse(number.as_str())?.to_string()),
        Value::String(text) => write_string(text, out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_value(item, out)?;
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut members: Vec<(&String, &Value)> = map.iter().collect();
            members.sort_by(|a, b| utf16_order(a.0, b.0));
            out.push('{');
            for (i, (key, item)) in members.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(key, out);
                out.push(':');
                write_value(item, out)?;
            }
            out.push('}');
        }
    }
    Ok(())
}

/// RFC 8785 §3.2.3: keys compare as arrays of UTF-16 code units (which differs from
/// UTF-8 byte order for characters above U+FFFF against U+E000..U+FFFF).
fn utf16_order(a: &str, b: &str) -> Ordering {
    a.encode_utf16().cmp(b.encode_utf16())
}

/// RFC 8785 §3.2.2.2: only `"`, `\` and control characters are escaped; `\b \t \n \f \r`
/// use their short forms, other controls `\u00xx` in lowercase hex; everything else,
/// non-ASCII included, is written as itself (UTF-8).
fn write_string(text: &str, out: &mut String) {
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{08}' => out.push_str("\\b"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\u{0c}' => out.push_str("\\f"),
            '\r' => out.push_str("\\r"),
            c if u32::from(c) < 0x20 => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Value {
        serde_json::from_str(text).unwrap()
    }

    /// Canonical form and hash of JSON text.
    fn pinned(text: &str) -> (String, String) {
        let value = parse(text);
        (canonical(&value).unwrap(), payload_hash(&value).unwrap())
    }

    // Golden hashes: computed once and frozen. A change here changes which stored
    // submissions count as "the same content"; it is never a routine test update.

    #[test]
    fn golden_key_order_and_whitespace() {
        let (form, hash) =
            pinned(r#" { "b" : [1, {"y": true, "x": null}], "a": "s", "": false } "#);
        assert_eq!(form, r#"{"":false,"a":"s","b":[1,{"x":null,"y":true}]}"#);
        assert_eq!(
            hash,
            "834ed322fcaac06472c9b750260f740883f8cab25370557014851bb6b74a2fb7"
        );
    }

    #[test]
    fn golden_keys_sort_by_utf16_code_units() {
        // U+1F600 is D83D DE00 in UTF-16, below U+FB01; in UTF-8 bytes it sorts after it.
        let (form, hash) = pinned(r#"{"\ufb01": 1, "\ud83d\ude00": 2, "é": 3, "z": 4}"#);
        assert_eq!(form, "{\"z\":4,\"é\":3,\"\u{1f600}\":2,\"\u{fb01}\":1}");
        assert_eq!(
            hash,
            "cb6d99f11a1a44e3300bce4b4865f20c76dcf64fa252976e73bcd1cb8f9698b9"
        );
    }

    #[test]
    fn golden_string_escapes() {
        let (form, hash) =
            pinned(r#"["\"\\\/", "\b\t\n\f\r", "\u0000\u001f\u007f", "\u00e9\u20ac\ud83d\ude00"]"#);
        assert_eq!(
            form,
            "[\"\\\"\\\\/\",\"\\b\\t\\n\\f\\r\",\"\\u0000\\u001f\u{7f}\",\"é€\u{1f600}\"]"
        );
        assert_eq!(
            hash,
            "eb47cabad4d9c7d974d57bc66d21e0b0be316c9d799021415e81fe8dfd946569"
        );
    }

    #[test]
    fn golden_number_spellings_of_one_value_agree() {
        let (form, hash) = pinned("[100, 1E2, 1e+2, 100.0, 10000e-2]");
        assert_eq!(form, "[100,100,100,100,100]");
        assert_eq!(
            hash,
            "88c94384db97660aeed5107ecbaaf08301a0bab1157b69e146f7a17131216e5b"
        );
        assert_eq!(pinned("1E2").1, pinned("100").1);
        assert_eq!(pinned("-0").1, pinned("0").1);
        assert_eq!(pinned("-0.0").0, "0");
        assert_eq!(pinned("1.50").1, pinned("1.5").1);
    }

    #[test]
    fn golden_exact_numbers() {
        let (form, hash) = pinned(
            r#"{"big": 18446744073709551617, "huge": -123456789012345678901234567890,
                "dec": 0.1000000000000000055511151231257827, "small": 1e-7, "neg": -0}"#,
        );
        assert_eq!(
            form,
            r#"{"big":18446744073709551617,"dec":0.1000000000000000055511151231257827,"huge":-123456789012345678901234567890,"neg":0,"small":0.0000001}"#
        );
        assert_eq!(
            hash,
            "9a038e5f9c29c3641324795761a937f0a5bfa933949ba3ec77fb96a538b45e62"
        );
    }

    #[test]
    fn values_a_double_would_merge_hash_differently() {
        for (a, b) in [
            ("18446744073709551617", "18446744073709551616"),
            ("0.1000000000000000055511151231257827", "0.1"),
            ("9007199254740993", "9007199254740992"),
            (r#"{"a": 1}"#, r#"{"a": 2}"#),
            ("[1, 2]", "[2, 1]"),
            (r#""1""#, "1"),
            ("null", "{}"),
            ("1.5", "1"),
        ] {
            assert_ne!(pinned(a).1, pinned(b).1, "{a} vs {b}");
        }
    }

    #[test]
    fn numbers_too_long_to_write_have_no_hash() {
        assert_eq!(
            payload_hash(&parse("[1e999999999]")),
            Err(NumberError::TooLong)
        );
    }
}
