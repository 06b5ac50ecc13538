//! Standard Webhooks secrets: minting `whsec_` signing secrets.

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use rand::RngCore as _;

/// Prefix of every signing secret, as Standard Webhooks specifies.
pub const SECRET_PREFIX: &str = "whsec_";

/// Random bytes in a new secret (the spec allows 24 to 64).
const SECRET_BYTES: usize = 32;

/// A fresh `whsec_<base64 of 32 random bytes>` secret.
pub fn mint_secret() -> String {
    let mut key = [0u8; SECRET_BYTES];
    rand::rng().fill_bytes(&mut key);
    format!("{SECRET_PREFIX}{}", STANDARD.encode(key))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_prefixed_base64_of_32_bytes() {
        let secret = mint_secret();
        let encoded = secret.strip_prefix(SECRET_PREFIX);
        let decoded = encoded.and_then(|e| STANDARD.decode(e).ok());
        assert_eq!(decoded.map(|d| d.len()), Some(SECRET_BYTES));
        assert_ne!(mint_secret(), secret);
    }
}
