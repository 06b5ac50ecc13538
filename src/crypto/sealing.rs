//! Signing secrets at rest: sealed with XChaCha20-Poly1305 under the keys of
//! `COURIER_ENCRYPTION_KEY` (the first seals, every one opens) and bound to their endpoint
//! (`crate::service::sealing` brings stored ones under the first key at start-up). A secret
//! that cannot be opened is never used.

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use rand::RngCore as _;
use sha2::{Digest, Sha256};
use uuid::Uuid;

/// The setting that holds the keys, named in every error about them.
pub const ENV: &str = "COURIER_ENCRYPTION_KEY";

/// Stored form of a sealed secret: `enc:v1:<key id>:<base64 of nonce and ciphertext>`.
const SEALED_PREFIX: &str = "enc:v1:";

/// Bytes in a key.
const KEY_BYTES: usize = 32;

/// Bytes in an XChaCha20 nonce: random nonces this long never repeat in practice.
const NONCE_BYTES: usize = 24;

/// Why a secret could not be sealed or opened.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    /// The value of `COURIER_ENCRYPTION_KEY` is not one or more base64 32-byte keys.
    #[error("{ENV} must be base64 of 32 random bytes, or several separated by commas: {0}")]
    BadKey(String),
    /// A sealed secret was found but no key is configured.
    #[error("a stored signing secret is encrypted but {ENV} is not set")]
    NoKey,
    /// No configured key opens the secret (wrong key, or the key that sealed it was removed).
    #[error("a stored signing secret cannot be decrypted with any key of {ENV} (it was sealed by key {0})")]
    Undecryptable(String),
    /// The key that sealed the secret is configured, yet it does not open it: the value was
    /// sealed for another endpoint (copied between rows) or altered.
    #[error("a stored signing secret does not open with key {0}, which sealed it: it was sealed for another endpoint, or altered")]
    NotThisEndpoints(String),
    /// The stored value is neither a secret nor a sealed one.
    #[error("a stored signing secret is malformed")]
    Malformed,
    /// The cipher refused to seal (it never does for secrets this small).
    #[error("sealing a signing secret failed")]
    Seal,
}

/// One key and the short id stored beside what it seals.
#[derive(Clone)]
struct Key {
    id: String,
    cipher: XChaCha20Poly1305,
}

/// The configured keys: none (secrets stored as they are), or several, the first sealing.
#[derive(Clone, Default)]
pub struct SecretKeys {
    keys: Vec<Key>,
}

impl std::fmt::Debug for SecretKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ids: Vec<&str> = self.keys.iter().map(|key| key.id.as_str()).collect();
        f.debug_struct("SecretKeys").field("ids", &ids).finish()
    }
}

impl SecretKeys {
    /// Parses `COURIER_ENCRYPTION_KEY`: comma-separated base64 of 32 bytes each.
    pub fn parse(value: &str) -> Result<Self, SecretError> {
        let mut keys: Vec<Key> = Vec::new();
        for (n, part) in value.split(',').map(str::trim).enumerate() {
            // An empty entry is a list put together from a setting that was unset
            // (`$NEW,$OLD`): the keys meant are not the keys given.
            if part.is_empty() {
                return Err(SecretError::BadKey(format!("key {} is empty", n + 1)));
            }
            let bytes = STANDARD
                .decode(part)
                .map_err(|_| SecretError::BadKey(format!("key {} is not base64", n + 1)))?;
            if bytes.len() != KEY_BYTES {
                return Err(SecretError::BadKey(format!(
                    "key {} is {} bytes, not {KEY_BYTES}",
                    n + 1,
                    bytes.len()
                )));
            }
            let cipher = XChaCha20Poly1305::new_from_slice(&bytes)
                .map_err(|_| SecretError::BadKey(format!("key {} is unusable", n + 1)))?;
            let id = key_id(&bytes);
            if let Some(first) = keys.iter().position(|key| key.id == id) {
                return Err(SecretError::BadKey(format!(
                    "key {} repeats key {}",
                    n + 1,
                    first + 1
                )));
            }
            keys.push(Key { id, cipher });
        }
        Ok(SecretKeys { keys })
    }

    /// The stored form of `endpoint_id`'s `secret`: sealed under the first key, or the
    /// secret itself when no key is configured.
    pub fn seal(&self, endpoint_id: Uuid, secret: &str) -> Result<String, SecretError> {
        let Some(key) = self.keys.first() else {
            return Ok(secret.to_owned());
        };
        let mut nonce = [0u8; NONCE_BYTES];
        rand::rng().fill_bytes(&mut nonce);
        let sealed = key
            .cipher
            .encrypt(
                &XNonce::from(nonce),
                Payload {
                    msg: secret.as_bytes(),
                    aad: endpoint_id.as_bytes(),
                },
            )
            .map_err(|_| SecretError::Seal)?;
        let mut bytes = nonce.to_vec();
        bytes.extend_from_slice(&sealed);
        Ok(format!(
            "{SEALED_PREFIX}{}:{}",
            key.id,
            STANDARD.encode(bytes)
        ))
    }

    /// The secret `stored` holds for `endpoint_id`. A sealed value opens only with a key that
    /// authenticates it for this very endpoint; anything else is an error, never a guess.
    pub fn open(&self, endpoint_id: Uuid, stored: &str) -> Result<String, SecretError> {
        let Some(sealed) = stored.strip_prefix(SEALED_PREFIX) else {
            return Ok(stored.to_owned());
        };
        let (id, data) = sealed.split_once(':').ok_or(SecretError::Malformed)?;
        if self.keys.is_empty() {
            return Err(SecretError::NoKey);
        }
        let bytes = STANDARD.decode(data).map_err(|_| SecretError::Malformed)?;
        if bytes.len() <= NONCE_BYTES {
            return Err(SecretError::Malformed);
        }
        let (nonce, ciphertext) = bytes.split_at(NONCE_BYTES);
        let nonce: [u8; NONCE_BYTES] = nonce.try_into().map_err(|_| SecretError::Malformed)?;
        let nonce = XNonce::from(nonce);
        // The key the id names first; then the others, in case two keys share an id.
        let mut keys: Vec<&Key> = self.keys.iter().filter(|key| key.id == id).collect();
        keys.extend(self.keys.iter().filter(|key| key.id != id));
        for key in keys {
            let opened = key.cipher.decrypt(
                &nonce,
                Payload {
                    msg: ciphertext,
                    aad: endpoint_id.as_bytes(),
                },
            );
            if let Ok(plain) = opened {
                return String::from_utf8(plain).map_err(|_| SecretError::Malformed);
            }
        }
        if self.keys.iter().any(|key| key.id == id) {
            return Err(SecretError::NotThisEndpoints(id.to_owned()));
        }
        Err(SecretError::Undecryptable(id.to_owned()))
    }

    /// Whether `stored` should be sealed again: plaintext while a key is configured, or
    /// sealed under a key that is no longer the first.
    pub fn needs_resealing(&self, stored: &str) -> bool {
        let Some(first) = self.keys.first() else {
            return false;
        };
        match stored.strip_prefix(SEALED_PREFIX) {
            None => true,
            Some(sealed) => !sealed.starts_with(&format!("{}:", first.id)),
        }
    }
}

/// A clap value parser for `COURIER_ENCRYPTION_KEY`.
pub fn parse_keys(value: &str) -> Result<SecretKeys, String> {
    SecretKeys::parse(value).map_err(|err| err.to_string())
}

/// A short, non-secret name for a key: the first 4 bytes of a hash of it, in hex.
fn key_id(key: &[u8]) -> String {
    let digest = Sha256::new()
        .chain_update(b"courier secret key id\0")
        .chain_update(key)
        .finalize();
    hex::encode(&digest[..4])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> String {
        let mut bytes = [0u8; KEY_BYTES];
        rand::rng().fill_bytes(&mut bytes);
        STANDARD.encode(bytes)
    }

    #[test]
    fn sealed_secrets_open_only_for_their_endpoint_and_with_a_listed_key() {
        let (first, second) = (key(), key());
        let keys = SecretKeys::parse(&format!("{first}, {second}")).unwrap();
        let endpoint = Uuid::now_v7();
        let secret = crate::crypto::signing::mint_secret();
        let sealed = keys.seal(endpoint, &secret).unwrap();
        assert!(sealed.starts_with(SEALED_PREFIX));
        assert!(!sealed.contains(&secret));
        assert_ne!(keys.seal(endpoint, &secret).unwrap(), sealed, "fresh nonce");
        assert_eq!(keys.open(endpoint, &sealed).unwrap(), secret);
        // Copied to another endpoint: the key that sealed it is known, and says so.
        let copied = keys.open(Uuid::now_v7(), &sealed);
        assert!(
            matches!(copied, Err(SecretError::NotThisEndpoints(_))),
            "{copied:?}"
        );
        // Any listed key opens; only the first seals.
        let rotated = SecretKeys::parse(&format!("{},{first}", key())).unwrap();
        assert_eq!(rotated.open(endpoint, &sealed).unwrap(), secret);
        assert!(rotated.needs_resealing(&sealed));
        assert!(!keys.needs_resealing(&sealed));
        let stranger = SecretKeys::parse(&second).unwrap();
        assert!(matches!(
            stranger.open(endpoint, &sealed),
            Err(SecretError::Undecryptable(_))
        ));
        assert!(matches!(
            SecretKeys::default().open(endpoint, &sealed),
            Err(SecretError::NoKey)
        ));
        assert_eq!(
            SecretKeys::default().seal(endpoint, &secret).unwrap(),
            secret
        );
        assert!(keys.needs_resealing(&secret));
        assert!(!SecretKeys::default().needs_resealing(&secret));
    }

    #[test]
    fn bad_keys_are_refused_naming_the_setting() {
        for bad in ["", "not base64!", "c2hvcnQ=", ","] {
            let err = SecretKeys::parse(bad).unwrap_err().to_string();
            assert!(err.contains(ENV), "{bad:?}: {err}");
        }
        let debug = format!("{:?}", SecretKeys::parse(&key()).unwrap());
        assert!(debug.contains("ids"), "{debug}");
    }

    /// A list put together from an unset setting (`$NEW,$OLD`), or naming one key twice,
    /// is not the list meant: refused, saying which entry, never echoing a key.
    #[test]
    fn empty_and_repeated_entries_are_refused() {
        let (first, second) = (key(), key());
        for (list, says) in [
            (format!("{first},"), "key 2 is empty"),
            (format!(",{first}"), "key 1 is empty"),
            (format!("{first}, ,{second}"), "key 2 is empty"),
            (format!("{first},{first}"), "key 2 repeats key 1"),
            (format!("{first}, {second}, {first}"), "key 3 repeats key 1"),
        ] {
            let err = SecretKeys::parse(&list).unwrap_err().to_string();
            assert!(err.contains(says), "{list:?}: {err}");
            assert!(!err.contains(&first[..8]), "{err}");
        }
        assert!(SecretKeys::parse(&format!(" {first} , {second} ")).is_ok());
    }
}
