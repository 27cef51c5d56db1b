//! The files a user names on the command line, read and checked: the release signing key, the trusted public
//! keys, the server tokens and the age identities. Each comes from a path of an argument group (`args.rs`)
//! and goes to the verb as a typed key or text; a failure names the file and the flag it came from.

use std::path::{Path, PathBuf};

use ed25519_dalek::SigningKey;
use windvane_shared::crypto::keys::{self, TrustedKeys};
use windvane_shared::format::sops::Keyring;

use crate::error::{Error, Result};

/// Reads a file that must exist, naming it in the error.
pub fn read_text(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|source| Error::ReadFile {
        path: path.to_path_buf(),
        source,
    })
}

/// A bearer token from its file, trimmed; an empty file is refused (it would send no credential).
pub fn read_token(path: &Path) -> Result<String> {
    let token = read_text(path)?;
    let token = token.trim();
    if token.is_empty() {
        return Err(Error::EmptyToken {
            path: path.to_path_buf(),
        });
    }
    Ok(token.to_owned())
}

/// The token of `--read-token-file`, if one was given.
pub fn read_token_file(path: Option<&PathBuf>) -> Result<Option<String>> {
    path.map(|p| read_token(p)).transpose()
}

/// The release signing key of `--key`.
pub fn signing_key(path: &Path) -> Result<SigningKey> {
    let pem = read_text(path)?;
    keys::signing_key_from_pem(&pem, &path.display().to_string()).map_err(|source| {
        Error::SigningKey {
            path: path.to_path_buf(),
            source,
        }
    })
}

/// The public keys of `--trusted-key`; at least one when `required`.
pub fn trusted_keys(paths: &[PathBuf], required: bool) -> Result<TrustedKeys> {
    if required && paths.is_empty() {
        return Err(Error::NoTrustedKey);
    }
    let mut trusted = TrustedKeys::new();
    for path in paths {
        let pem = read_text(path)?;
        let invalid = |source| Error::TrustedKey {
            path: path.clone(),
            source,
        };
        let key =
            keys::verifying_key_from_pem(&pem, &path.display().to_string()).map_err(invalid)?;
        trusted.insert(key).map_err(invalid)?;
    }
    Ok(trusted)
}

/// A key that signs and the keys it trusts besides its own: what every verb that re-signs a channel holds.
#[derive(Debug)]
pub struct Signer {
    pub key: SigningKey,
    pub trusted: TrustedKeys,
}

impl Signer {
    pub fn load(key: &Path, trusted: &[PathBuf]) -> Result<Self> {
        Ok(Self {
            key: signing_key(key)?,
            trusted: trusted_keys(trusted, false)?,
        })
    }

    /// The trusted keys and the signer's own: what a pointer this signer or a trusted key signed verifies with.
    pub fn with_own_key(&self) -> Result<TrustedKeys> {
        let mut all = self.trusted.clone();
        all.insert(self.key.verifying_key())
            .map_err(|source| Error::OwnKey { source })?;
        Ok(all)
    }
}

/// Warns when a private key file can be read by other users.
pub fn warn_if_readable_by_others(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(meta) = std::fs::metadata(path)
        && meta.permissions().mode() & 0o077 != 0
    {
        eprintln!(
            "warning: {} is readable by other users; run chmod 600 on it",
            path.display()
        );
    }
}

/// The identities of an age identity file (`--age-key-file`).
pub fn keyring_file(path: &Path) -> Result<Keyring> {
    let mut keyring = Keyring::default();
    keyring
        .add_text(&read_text(path)?, &path.display().to_string())
        .map_err(|source| Error::AgeIdentities {
            path: path.to_path_buf(),
            source,
        })?;
    if keyring.is_empty() {
        return Err(Error::NoAgeIdentity {
            path: path.to_path_buf(),
        });
    }
    Ok(keyring)
}
