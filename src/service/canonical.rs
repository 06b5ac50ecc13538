//! The canonical form of a JSON value and its hash: "same content" for idempotency,
//! whatever the key order, whitespace or number spelling.

use serde_json::Value;
use sha2::{Digest, Sha256};

/// SHA-256 (hex) of the value's canonical form.
pub fn payload_hash(value: &Value) -> String {
    let mut canonical = String::new();
    write_canonical(value, &mut canonical);
    let digest = Sha256::digest(canonical.as_bytes());
    digest
        .iter()
        .fold(String::with_capacity(64), |mut hex, byte| {
            hex.push(char::from(HEX[usize::from(byte >> 4)]));
            hex.push(char::from(HEX[usize::from(byte & 0x0f)]));
            hex
        })
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// Writes `value` with object keys sorted, no whitespace, and numbers in one spelling
/// (integral floats as integers), in the spirit of RFC 8785.
fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Null | Value::Bool(_) | Value::String(_) => out.push_str(&value.to_string()),
        Value::Number(number) => match (number.as_i64(), number.as_u64(), number.as_f64()) {
            (Some(i), _, _) => out.push_str(&i.to_string()),
            (None, Some(u), _) => out.push_str(&u.to_string()),
            (None, None, Some(f)) if f.fract() == 0.0 && f.abs() < 9.0e15 => {
                out.push_str(&format!("{}", f as i64));
            }
            _ => out.push_str(&number.to_string()),
        },
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            out.push('{');
            for (i, (key, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                write_canonical(item, out);
            }
            out.push('}');
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn key_order_whitespace_and_number_spelling_do_not_matter() {
        let a: Value =
            serde_json::from_str(r#"{"b": [1, 2.0, {"y": 1, "x": 2}], "a": "s"}"#).unwrap();
        let b: Value = serde_json::from_str(r#"{"a":"s","b":[1,2,{"x":2,"y":1}]}"#).unwrap();
        assert_eq!(payload_hash(&a), payload_hash(&b));
    }

    #[test]
    fn different_values_hash_differently() {
        for (a, b) in [
            (json!({"a": 1}), json!({"a": 2})),
            (json!([1, 2]), json!([2, 1])),
            (json!("1"), json!(1)),
            (json!(null), json!({})),
            (json!(1.5), json!(1)),
        ] {
            assert_ne!(payload_hash(&a), payload_hash(&b), "{a} vs {b}");
        }
    }
}
