//! Cryptography: signing secrets sealed at rest, and minting the secrets webhooks are signed with.

pub mod sealing;
pub mod signing;
