//! JSON that names a member twice in one object is refused, not read as its last value:
//! RFC 8259 leaves what such an object means to the reader, and a request that means two
//! things to two readers (a gateway that checks the first `Authorization`, Courier that
//! would use the last) is refused rather than guessed at. One pass over the text keeps only
//! each open object's names, borrowed from the text where no escape had to be decoded.

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::HashSet;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

/// The first member name that `json` repeats within one object, or `None` when every
/// object names each member once (or `json` does not parse: its reader tells why).
pub fn first_repeated_member(json: &str) -> Option<String> {
    let repeated = RefCell::new(None);
    let mut reader = serde_json::Deserializer::from_str(json);
    // Only a repeat ends the walk early; anything else is for the real reader to report.
    let _ = Walk {
        repeated: &repeated,
    }
    .deserialize(&mut reader);
    repeated.into_inner()
}

/// A walk over one JSON value that stops at the first repeated member name.
#[derive(Clone, Copy)]
struct Walk<'a> {
    repeated: &'a RefCell<Option<String>>,
}

impl<'de> DeserializeSeed<'de> for Walk<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Walk<'_> {
    type Value = ();

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("a JSON value")
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        Ok(())
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        Ok(())
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        Ok(())
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        Ok(())
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        Ok(())
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut items: A) -> Result<(), A::Error> {
        while items.next_element_seed(self)?.is_some() {}
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut members: A) -> Result<(), A::Error> {
        let mut names = Names::default();
        while let Some(name) = members.next_key_seed(NameSeed)? {
            if let Err(name) = names.add(name) {
                *self.repeated.borrow_mut() = Some(name.into_owned());
                return Err(de::Error::custom("a member named twice"));
            }
            members.next_value_seed(self)?;
        }
        Ok(())
    }
}

/// How many names an object gives before they are kept in a set rather than a list.
const FEW: usize = 8;

/// The names one object has given so far: a short list searched in order (most objects
/// have a few members), a set once it grows.
enum Names<'de> {
    Few(Vec<Cow<'de, str>>),
    Many(HashSet<Cow<'de, str>>),
}

impl Default for Names<'_> {
    fn default() -> Self {
        Names::Few(Vec::new())
    }
}

impl<'de> Names<'de> {
    /// Adds `name`, or gives it back if the object gave it before.
    fn add(&mut self, name: Cow<'de, str>) -> Result<(), Cow<'de, str>> {
        match self {
            Names::Few(list) if list.contains(&name) => Err(name),
            Names::Few(list) if list.len() < FEW => {
                list.push(name);
                Ok(())
            }
            Names::Few(list) => {
                let mut set: HashSet<_> = list.drain(..).collect();
                set.insert(name);
                *self = Names::Many(set);
                Ok(())
            }
            Names::Many(set) if set.contains(&name) => Err(name),
            Names::Many(set) => {
                set.insert(name);
                Ok(())
            }
        }
    }
}

/// Reads a member name, borrowed from the text when it holds no escape.
struct NameSeed;

impl<'de> DeserializeSeed<'de> for NameSeed {
    type Value = Cow<'de, str>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for NameSeed {
    type Value = Cow<'de, str>;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("a member name")
    }

    fn visit_borrowed_str<E: de::Error>(self, name: &'de str) -> Result<Self::Value, E> {
        Ok(Cow::Borrowed(name))
    }

    fn visit_str<E: de::Error>(self, name: &str) -> Result<Self::Value, E> {
        Ok(Cow::Owned(name.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_repeated_in_one_object_is_found_at_any_depth() {
        assert_eq!(
            first_repeated_member(r#"{"Authorization":"a","Authorization":"b"}"#).as_deref(),
            Some("Authorization")
        );
        assert_eq!(
            first_repeated_member(r#"{"v":{"p":[1,{"n":1,"m":{},"n":2}]}}"#).as_deref(),
            Some("n")
        );
        assert_eq!(
            first_repeated_member(r#"{"a\u0062":1,"ab":2}"#).as_deref(),
            Some("ab"),
            "names are compared as read, escapes decoded"
        );
    }

    #[test]
    fn a_repeat_is_found_in_an_object_of_many_members() {
        let members: Vec<String> = (0..40).map(|n| format!("\"m{n}\":{n}")).collect();
        let once = format!("{{{}}}", members.join(","));
        assert_eq!(first_repeated_member(&once), None);
        for repeated in ["m0", "m7", "m8", "m39"] {
            let twice = format!("{{{},\"{repeated}\":0}}", members.join(","));
            assert_eq!(first_repeated_member(&twice).as_deref(), Some(repeated));
        }
    }

    #[test]
    fn names_once_per_object_pass() {
        for json in [
            r#"{"a":{"a":1},"b":[{"a":1},{"a":2}],"n":1.50,"big":123456789012345678901234567890}"#,
            r#"{"authorization":"x","Authorization":"y"}"#,
            "[]",
            "null",
            "not json",
            r#"{"a":1,"b""#,
        ] {
            assert_eq!(first_repeated_member(json), None, "{json}");
        }
    }
}
