//! SOPS files with age recipients, as the `sops` tool writes them: read (verified and decrypted) and written
//! (sealed), written against the SOPS format's documentation.
//!
//! Where the data comes from: manifests of a fleet source tree that `sops encrypt --age …` (or `windvane seal`)
//! encrypted; they travel in the bundle exactly as written, encrypted, so that `windvane build`/`publish` never
//! need a key. Where it goes: the agent opens them with the age identities its operator installed in its
//! namespace ([`Keyring`]) just before rendering; `windvane render --reveal` does the same with a key file.
//!
//! The format, per document: every value that the metadata's rules select is replaced by
//! `ENC[AES256_GCM,data:<b64>,iv:<b64>,tag:<b64>,type:<str|int|float|bool|bytes|time>]`, AES-256-GCM with a
//! 32-byte nonce under the file's 32-byte data key, with the value's key path (`data:password:`: the mapping
//! keys from the root, each followed by `:`; list items add nothing) as additional data, so a value moved to
//! another key no longer decrypts. Empty strings stay empty. A top-level `sops` mapping holds the data key
//! wrapped by age for each recipient (`age: [{recipient: age1…, enc: <armored age file>}]`, or the same under
//! `key_groups`), `lastmodified` (RFC 3339), the selection rules (`encrypted_regex`, `unencrypted_regex`,
//! `encrypted_suffix`, `unencrypted_suffix`, `mac_only_encrypted`) and `mac`: the upper-case hex SHA-512 of
//! every value of every document of the file in order (only the encrypted ones, after a fixed prefix, when
//! `mac_only_encrypted`), encrypted like a value with `lastmodified` as its additional data. A file of several
//! YAML documents shares one data key and one MAC, so it is opened whole ([`open_file`]).
//!
//! Refused rather than guessed: Shamir key groups (several groups), comment-based rules
//! (`encrypted_comment_regex`, `unencrypted_comment_regex`: the YAML reader drops comments), a MAC or value
//! that does not verify. No error message holds a decrypted value.

use std::io::{Read, Write};
use std::str::FromStr;

use aes_gcm::aead::consts::U32;
use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::aes::Aes256;
use aes_gcm::{AesGcm, Nonce};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use regex::Regex;
use serde_json::{Map, Number, Value};
use sha2::{Digest, Sha512};
use subtle::ConstantTimeEq;

use crate::{Error, Result};

/// The top-level key holding a SOPS file's metadata.
pub const METADATA_KEY: &str = "sops";
/// The SOPS format version that [`seal`] writes (the `sops` release whose output it matches).
pub const SEAL_VERSION: &str = "3.13.3";
/// The `encrypted_regex` that [`seal`] uses for Kubernetes objects: only `data` and `stringData` are
/// encrypted, so that the object's identity (apiVersion, kind, metadata) stays readable by `windvane build`.
pub const KUBERNETES_ENCRYPTED_REGEX: &str = "^(data|stringData)$";
/// What starts the MAC of a `mac_only_encrypted` file, so that it never equals a MAC over all values.
const MAC_ONLY_ENCRYPTED_INIT: [u8; 32] = [
    0x8a, 0x3f, 0xd2, 0xad, 0x54, 0xce, 0x66, 0x52, 0x7b, 0x10, 0x34, 0xf3, 0xd1, 0x47, 0xbe, 0x0b,
    0x0b, 0x97, 0x5b, 0x3b, 0xf4, 0x4f, 0x72, 0xc6, 0xfd, 0xad, 0xec, 0x81, 0x76, 0xf2, 0x7d, 0x69,
];
const NONCE_BYTES: usize = 32;

type Cipher = AesGcm<Aes256, U32>;

/// The age identities a cluster (or `windvane render --reveal`) holds, read from `AGE-SECRET-KEY-1…` lines.
#[derive(Default)]
pub struct Keyring {
    identities: Vec<age::x25519::Identity>,
}

impl std::fmt::Debug for Keyring {
    /// The recipients only: an identity is never printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keyring")
            .field("recipients", &self.recipients())
            .finish()
    }
}

impl Keyring {
    /// Reads every identity of `text` (the format `age-keygen` writes: one `AGE-SECRET-KEY-1…` per line, `#`
    /// comments and blank lines ignored), added to those held. `source_name` names the file or Secret key.
    pub fn add_text(&mut self, text: &str, source_name: &str) -> Result<()> {
        for (index, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let identity = age::x25519::Identity::from_str(line).map_err(|_| Error::AgeKey {
                source_name: source_name.to_owned(),
                detail: format!(
                    "line {}: not an age identity (AGE-SECRET-KEY-1…)",
                    index + 1
                ),
            })?;
            self.identities.push(identity);
        }
        Ok(())
    }

    /// The public recipients (`age1…`) of the identities held, in the order read.
    pub fn recipients(&self) -> Vec<String> {
        self.identities
            .iter()
            .map(|identity| identity.to_public().to_string())
            .collect()
    }

    pub fn is_empty(&self) -> bool {
        self.identities.is_empty()
    }

    /// Adds the age identity that a cluster's Ed25519 identity key stands for (see [`cluster_recipient`]).
    pub fn add_cluster_key(&mut self, key: &ed25519_dalek::SigningKey) {
        let mut scalar = key.to_scalar_bytes();
        let encoded = bech32_text("AGE-SECRET-KEY-", &scalar).to_ascii_uppercase();
        scalar.fill(0);
        // The encoding of 32 bytes is always a valid identity; a failure would be a bug, not bad input.
        if let Ok(identity) = age::x25519::Identity::from_str(&encoded) {
            self.identities.push(identity);
        }
    }

    /// A new identity, as `age-keygen` makes one: its secret line and its public recipient.
    pub fn generate() -> (String, String) {
        use age::secrecy::ExposeSecret;
        let identity = age::x25519::Identity::generate();
        let secret = identity.to_string().expose_secret().to_owned();
        (secret, identity.to_public().to_string())
    }
}

/// The age recipient (`age1…`) of a cluster's enrolled Ed25519 identity key: the key's point on the
/// equivalent Montgomery curve, as X25519 — the conversion age's own `ssh-ed25519` recipients and
/// libsodium's `crypto_sign_ed25519_pk_to_curve25519` make. Anyone who knows the enrolled public key can seal
/// to it; only the cluster, holding the private key ([`Keyring::add_cluster_key`]), can open.
pub fn cluster_recipient(key: &ed25519_dalek::VerifyingKey) -> String {
    bech32_text("age", key.to_montgomery().as_bytes())
}

/// Whether `recipient` is the age recipient ([`cluster_recipient`]) of the Ed25519 key whose key id is
/// `keyid`: what a server shows as a cluster's recipient must be that of the key it says the cluster
/// enrolled. The Montgomery form names the key up to the sign of its x coordinate, so both points are tried.
pub fn recipient_of_keyid(recipient: &str, keyid: &str) -> bool {
    let Ok((hrp, data)) = bech32::decode(recipient) else {
        return false;
    };
    let Ok(u) = <[u8; 32]>::try_from(data.as_slice()) else {
        return false;
    };
    if hrp.as_str() != "age" {
        return false;
    }
    let point = curve25519_dalek::montgomery::MontgomeryPoint(u);
    [0u8, 1].into_iter().any(|sign| {
        point.to_edwards(sign).is_some_and(|edwards| {
            ed25519_dalek::VerifyingKey::from_bytes(&edwards.compress().to_bytes()).is_ok_and(
                |key| {
                    crate::crypto::keys::keyid(&key) == keyid
                        && cluster_recipient(&key) == recipient
                },
            )
        })
    })
}

fn bech32_text(prefix: &str, bytes: &[u8; 32]) -> String {
    let hrp = bech32::Hrp::parse(prefix).expect("a valid human-readable part");
    bech32::encode::<bech32::Bech32>(hrp, bytes).expect("32 bytes always encode")
}

/// Reads one age recipient (`age1…`).
pub fn parse_recipient(text: &str, source_name: &str) -> Result<age::x25519::Recipient> {
    age::x25519::Recipient::from_str(text.trim()).map_err(|detail| Error::AgeKey {
        source_name: source_name.to_owned(),
        detail: format!(
            "{:?} is not an age recipient (age1…): {detail}",
            text.trim()
        ),
    })
}

/// True when `object` carries SOPS metadata (a top-level `sops` mapping with a `mac`).
pub fn is_encrypted(object: &Value) -> bool {
    object
        .get(METADATA_KEY)
        .and_then(Value::as_object)
        .is_some_and(|metadata| metadata.contains_key("mac"))
}

/// The metadata of one SOPS file that decryption needs.
#[derive(Debug)]
struct Metadata {
    /// `(recipient, armored age file)` for every age master key.
    age: Vec<(String, String)>,
    last_modified: String,
    mac: String,
    rules: Rules,
}

/// Which values are encrypted: the SOPS selection rules, applied to a value's key path.
#[derive(Debug, Default)]
struct Rules {
    unencrypted_suffix: Option<String>,
    encrypted_suffix: Option<String>,
    unencrypted_regex: Option<Regex>,
    encrypted_regex: Option<Regex>,
    mac_only_encrypted: bool,
}

impl Rules {
    /// Whether the value at `path` is encrypted, as SOPS decides it: each rule that is set overrides the
    /// ones before it.
    fn encrypts(&self, path: &[String]) -> bool {
        let mut encrypted = true;
        if let Some(suffix) = &self.unencrypted_suffix
            && path.iter().any(|key| key.ends_with(suffix.as_str()))
        {
            encrypted = false;
        }
        if let Some(suffix) = &self.encrypted_suffix {
            encrypted = path.iter().any(|key| key.ends_with(suffix.as_str()));
        }
        if let Some(regex) = &self.unencrypted_regex
            && path.iter().any(|key| regex.is_match(key))
        {
            encrypted = false;
        }
        if let Some(regex) = &self.encrypted_regex {
            encrypted = path.iter().any(|key| regex.is_match(key));
        }
        encrypted
    }
}

fn format_error(file: &str, detail: impl Into<String>) -> Error {
    Error::SopsFormat {
        file: file.to_owned(),
        detail: detail.into(),
    }
}

fn read_metadata(object: &Value, file: &str) -> Result<Metadata> {
    let metadata = object
        .get(METADATA_KEY)
        .and_then(Value::as_object)
        .ok_or_else(|| format_error(file, "no sops metadata mapping"))?;
    let text = |key: &str| -> Result<Option<String>> {
        match metadata.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(text)) if text.is_empty() => Ok(None),
            Some(Value::String(text)) => Ok(Some(text.clone())),
            Some(_) => Err(format_error(file, format!("sops.{key} must be a string"))),
        }
    };
    for unsupported in ["encrypted_comment_regex", "unencrypted_comment_regex"] {
        if text(unsupported)?.is_some() {
            return Err(format_error(
                file,
                format!(
                    "sops.{unsupported} is not supported (comments are not read); use encrypted_regex"
                ),
            ));
        }
    }
    let regex = |key: &str| -> Result<Option<Regex>> {
        text(key)?
            .map(|pattern| {
                Regex::new(&pattern)
                    .map_err(|error| format_error(file, format!("sops.{key}: {error}")))
            })
            .transpose()
    };
    let rules = Rules {
        unencrypted_suffix: text("unencrypted_suffix")?,
        encrypted_suffix: text("encrypted_suffix")?,
        unencrypted_regex: regex("unencrypted_regex")?,
        encrypted_regex: regex("encrypted_regex")?,
        mac_only_encrypted: metadata
            .get("mac_only_encrypted")
            .and_then(Value::as_bool)
            .unwrap_or(false),
    };
    Ok(Metadata {
        age: age_keys(metadata, file)?,
        last_modified: text("lastmodified")?
            .ok_or_else(|| format_error(file, "sops.lastmodified is missing"))?,
        mac: text("mac")?.ok_or_else(|| format_error(file, "sops.mac is missing"))?,
        rules,
    })
}

/// The age master keys of the metadata: `sops.age`, or those of its one key group.
fn age_keys(metadata: &Map<String, Value>, file: &str) -> Result<Vec<(String, String)>> {
    let groups = metadata.get("key_groups").and_then(Value::as_array);
    let lists: Vec<&Value> = match groups {
        Some(groups) if groups.len() > 1 => {
            return Err(format_error(
                file,
                "several sops.key_groups (Shamir secret sharing) are not supported",
            ));
        }
        Some(groups) => groups.iter().filter_map(|group| group.get("age")).collect(),
        None => metadata.get("age").into_iter().collect(),
    };
    let mut keys = Vec::new();
    for entry in lists.into_iter().filter_map(Value::as_array).flatten() {
        let field = |key: &str| entry.get(key).and_then(Value::as_str).map(str::to_owned);
        match (field("recipient"), field("enc")) {
            (Some(recipient), Some(enc)) => keys.push((recipient, enc)),
            _ => {
                return Err(format_error(
                    file,
                    "a sops.age entry needs recipient and enc",
                ));
            }
        }
    }
    if keys.is_empty() {
        return Err(format_error(
            file,
            "no age recipient in sops metadata (only age master keys are supported)",
        ));
    }
    Ok(keys)
}

/// The recipients a SOPS object was sealed to (empty when it is not one, or its metadata is unreadable).
pub fn recipients_of(object: &Value) -> Vec<String> {
    read_metadata(object, "")
        .map(|metadata| metadata.age.into_iter().map(|(r, _)| r).collect())
        .unwrap_or_default()
}

/// The data key, unwrapped by the first identity held that matches one of the file's recipients.
fn data_key(metadata: &Metadata, keyring: &Keyring, file: &str) -> Result<[u8; 32]> {
    for (_, armored) in &metadata.age {
        let reader = age::armor::ArmoredReader::new(armored.as_bytes());
        let Ok(decryptor) = age::Decryptor::new(reader) else {
            continue;
        };
        let identities = keyring.identities.iter().map(|i| i as &dyn age::Identity);
        let Ok(mut plain) = decryptor.decrypt(identities) else {
            continue;
        };
        let mut key = Vec::new();
        if plain.read_to_end(&mut key).is_ok()
            && let Ok(key) = <[u8; 32]>::try_from(key.as_slice())
        {
            return Ok(key);
        }
    }
    Err(Error::SopsNoKey {
        file: file.to_owned(),
        recipients: metadata.age.iter().map(|(r, _)| r.clone()).collect(),
        held: keyring.recipients(),
    })
}

/// Opens the documents of one SOPS file, in file order: each is verified and returned decrypted, without its
/// `sops` metadata. All documents must carry the same metadata (as `sops` writes them).
pub fn open_file(documents: &[&Value], keyring: &Keyring, file: &str) -> Result<Vec<Value>> {
    let first = documents
        .first()
        .ok_or_else(|| format_error(file, "no document"))?;
    if documents
        .iter()
        .any(|document| document.get(METADATA_KEY) != first.get(METADATA_KEY))
    {
        return Err(format_error(
            file,
            "its documents carry different sops metadata (each file must be encrypted whole by sops)",
        ));
    }
    let metadata = read_metadata(first, file)?;
    let key = data_key(&metadata, keyring, file)?;
    let mut walk = Walk {
        key: &key,
        rules: &metadata.rules,
        file,
        mac: Sha512::new(),
        path: Vec::new(),
        mode: Mode::Decrypt,
    };
    if metadata.rules.mac_only_encrypted {
        walk.mac.update(MAC_ONLY_ENCRYPTED_INIT);
    }
    let mut opened = Vec::with_capacity(documents.len());
    for document in documents {
        let mut body = (*document).clone();
        if let Some(fields) = body.as_object_mut() {
            fields.remove(METADATA_KEY);
        }
        walk.value(&mut body)?;
        opened.push(body);
    }
    let computed = hex_upper(&walk.mac.finalize());
    let stored = decrypt_value(&metadata.mac, &key, &metadata.last_modified).map_err(|_| {
        Error::SopsMac {
            file: file.to_owned(),
        }
    })?;
    if !bool::from(stored.as_bytes().ct_eq(computed.as_bytes())) {
        return Err(Error::SopsMac {
            file: file.to_owned(),
        });
    }
    Ok(opened)
}

/// What a [`Walk`] does to each selected value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Decrypt,
    Encrypt,
}

/// A walk over a document's values in order, decrypting or encrypting those the rules select and feeding
/// every value the MAC covers (as plaintext) into the MAC.
struct Walk<'a> {
    key: &'a [u8; 32],
    rules: &'a Rules,
    file: &'a str,
    mac: Sha512,
    path: Vec<String>,
    mode: Mode,
}

impl Walk<'_> {
    fn value(&mut self, value: &mut Value) -> Result<()> {
        match value {
            Value::Object(fields) => {
                for (key, child) in fields.iter_mut() {
                    self.path.push(key.clone());
                    let walked = self.value(child);
                    self.path.pop();
                    walked?;
                }
                Ok(())
            }
            Value::Array(items) => items.iter_mut().try_for_each(|item| self.value(item)),
            // A null is neither encrypted nor covered by the MAC.
            Value::Null => Ok(()),
            leaf => self.leaf(leaf),
        }
    }

    fn leaf(&mut self, leaf: &mut Value) -> Result<()> {
        let encrypted = self.rules.encrypts(&self.path);
        let additional = self.additional_data();
        if encrypted && self.mode == Mode::Decrypt {
            let Value::String(text) = &*leaf else {
                return Err(format_error(
                    self.file,
                    format!("the value at {additional} should be encrypted but is not a string"),
                ));
            };
            if !text.is_empty() {
                *leaf =
                    decrypt_typed(text, self.key, &additional).map_err(|_| Error::SopsValue {
                        file: self.file.to_owned(),
                        path: additional.clone(),
                    })?;
            }
        }
        if encrypted || !self.rules.mac_only_encrypted {
            self.mac.update(plain_bytes(leaf));
        }
        if encrypted && self.mode == Mode::Encrypt {
            let bytes = plain_bytes(leaf);
            if !bytes.is_empty() {
                *leaf = Value::String(encrypt_value(
                    &bytes,
                    type_name(leaf),
                    self.key,
                    &additional,
                )?);
            }
        }
        Ok(())
    }

    fn additional_data(&self) -> String {
        let mut text = String::new();
        for key in &self.path {
            text.push_str(key);
            text.push(':');
        }
        text
    }
}

/// A plain value's bytes as SOPS encrypts and MACs them: strings as they are, integers in decimal, floats
/// in the shortest form without exponent, booleans as `True`/`False`.
fn plain_bytes(value: &Value) -> Vec<u8> {
    match value {
        Value::String(text) => text.as_bytes().to_vec(),
        Value::Bool(true) => b"True".to_vec(),
        Value::Bool(false) => b"False".to_vec(),
        Value::Number(number) => match (number.as_i64(), number.as_u64(), number.as_f64()) {
            (Some(int), _, _) => int.to_string().into_bytes(),
            (_, Some(int), _) => int.to_string().into_bytes(),
            (_, _, Some(float)) => format!("{float}").into_bytes(),
            _ => number.to_string().into_bytes(),
        },
        Value::Null | Value::Array(_) | Value::Object(_) => Vec::new(),
    }
}

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Bool(_) => "bool",
        Value::Number(number) if number.is_f64() => "float",
        Value::Number(_) => "int",
        _ => "str",
    }
}

/// The parts of `ENC[AES256_GCM,data:…,iv:…,tag:…,type:…]`.
struct Encrypted {
    data: Vec<u8>,
    iv: Vec<u8>,
    tag: Vec<u8>,
    kind: String,
}

fn parse_encrypted(text: &str) -> Option<Encrypted> {
    let inner = text.strip_prefix("ENC[AES256_GCM,")?.strip_suffix(']')?;
    let mut parts = inner.split(',');
    let mut field = |name: &str| parts.next()?.strip_prefix(name).map(str::to_owned);
    let (data, iv, tag, kind) = (
        field("data:")?,
        field("iv:")?,
        field("tag:")?,
        field("type:")?,
    );
    Some(Encrypted {
        data: STANDARD.decode(data).ok()?,
        iv: STANDARD.decode(iv).ok()?,
        tag: STANDARD.decode(tag).ok()?,
        kind,
    })
}

/// Decrypts one value to its text; `Err(())` whatever failed (the caller names the value, never its content).
fn decrypt_value(text: &str, key: &[u8; 32], additional: &str) -> std::result::Result<String, ()> {
    let (plain, _) = decrypt_raw(text, key, additional)?;
    String::from_utf8(plain).map_err(|_| ())
}

fn decrypt_raw(
    text: &str,
    key: &[u8; 32],
    additional: &str,
) -> std::result::Result<(Vec<u8>, String), ()> {
    let encrypted = parse_encrypted(text).ok_or(())?;
    if encrypted.iv.len() != NONCE_BYTES || encrypted.tag.len() != 16 {
        return Err(());
    }
    let cipher = Cipher::new_from_slice(key).map_err(|_| ())?;
    let mut message = encrypted.data;
    message.extend_from_slice(&encrypted.tag);
    let plain = cipher
        .decrypt(
            Nonce::<U32>::from_slice(&encrypted.iv),
            Payload {
                msg: &message,
                aad: additional.as_bytes(),
            },
        )
        .map_err(|_| ())?;
    Ok((plain, encrypted.kind))
}

/// Decrypts one value to its JSON type, per its `type:`.
fn decrypt_typed(text: &str, key: &[u8; 32], additional: &str) -> std::result::Result<Value, ()> {
    let (plain, kind) = decrypt_raw(text, key, additional)?;
    let plain = String::from_utf8(plain).map_err(|_| ())?;
    Ok(match kind.as_str() {
        "str" | "bytes" | "time" => Value::String(plain),
        "int" => Value::Number(match plain.parse::<i64>() {
            Ok(int) => int.into(),
            Err(_) => plain.parse::<u64>().map_err(|_| ())?.into(),
        }),
        "float" => {
            Value::Number(Number::from_f64(plain.parse::<f64>().map_err(|_| ())?).ok_or(())?)
        }
        "bool" => Value::Bool(match plain.as_str() {
            "1" | "t" | "T" | "TRUE" | "true" | "True" => true,
            "0" | "f" | "F" | "FALSE" | "false" | "False" => false,
            _ => return Err(()),
        }),
        _ => return Err(()),
    })
}

fn encrypt_value(plain: &[u8], kind: &str, key: &[u8; 32], additional: &str) -> Result<String> {
    let mut iv = [0u8; NONCE_BYTES];
    getrandom::fill(&mut iv).map_err(|error| Error::Seal {
        file: String::new(),
        detail: format!("no randomness: {error}"),
    })?;
    let cipher = Cipher::new_from_slice(key).expect("a 32-byte key");
    let sealed = cipher
        .encrypt(
            Nonce::<U32>::from_slice(&iv),
            Payload {
                msg: plain,
                aad: additional.as_bytes(),
            },
        )
        .expect("AES-GCM encrypts any message this size");
    let (data, tag) = sealed.split_at(sealed.len() - 16);
    Ok(format!(
        "ENC[AES256_GCM,data:{},iv:{},tag:{},type:{kind}]",
        STANDARD.encode(data),
        STANDARD.encode(iv),
        STANDARD.encode(tag)
    ))
}

fn hex_upper(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02X}")).collect()
}

/// Seals documents as one SOPS file (what `sops encrypt --age R… --encrypted-regex E` writes): the values the
/// rule selects encrypted under a fresh data key, which is wrapped by age for each recipient; every document
/// gets the same `sops` metadata. `last_modified` is an RFC 3339 UTC time (`2026-12-04T20:00:00Z`).
pub fn seal(
    documents: &[Value],
    recipients: &[age::x25519::Recipient],
    encrypted_regex: &str,
    last_modified: &str,
    file: &str,
) -> Result<Vec<Value>> {
    let seal_error = |detail: String| Error::Seal {
        file: file.to_owned(),
        detail,
    };
    if recipients.is_empty() {
        return Err(seal_error("no recipient".to_owned()));
    }
    let mut key = [0u8; 32];
    getrandom::fill(&mut key).map_err(|error| seal_error(format!("no randomness: {error}")))?;
    let rules = Rules {
        encrypted_regex: Some(
            Regex::new(encrypted_regex).map_err(|error| seal_error(format!("{error}")))?,
        ),
        ..Rules::default()
    };
    let mut walk = Walk {
        key: &key,
        rules: &rules,
        file,
        mac: Sha512::new(),
        path: Vec::new(),
        mode: Mode::Encrypt,
    };
    let mut sealed = Vec::with_capacity(documents.len());
    for document in documents {
        if document.get(METADATA_KEY).is_some() {
            return Err(seal_error(
                "it is already encrypted (it has sops metadata)".to_owned(),
            ));
        }
        let mut body = document.clone();
        walk.value(&mut body)?;
        sealed.push(body);
    }
    let mac = hex_upper(&walk.mac.finalize());
    let mut age_keys = Vec::new();
    for recipient in recipients {
        age_keys.push(serde_json::json!({
            "recipient": recipient.to_string(),
            "enc": wrap_key(&key, recipient, file)?,
        }));
    }
    let metadata = serde_json::json!({
        "age": age_keys,
        "encrypted_regex": encrypted_regex,
        "lastmodified": last_modified,
        "mac": encrypt_value(mac.as_bytes(), "str", &key, last_modified)?,
        "version": SEAL_VERSION,
    });
    for body in &mut sealed {
        body.as_object_mut()
            .ok_or_else(|| seal_error("a document is not a mapping".to_owned()))?
            .insert(METADATA_KEY.to_owned(), metadata.clone());
    }
    Ok(sealed)
}

/// The data key as an armored age file for one recipient, sealing `file`.
fn wrap_key(key: &[u8; 32], recipient: &age::x25519::Recipient, file: &str) -> Result<String> {
    let failed = |error: &dyn std::fmt::Display| Error::Seal {
        file: file.to_owned(),
        detail: format!("wrapping the data key for {recipient}: {error}"),
    };
    let encryptor =
        age::Encryptor::with_recipients(std::iter::once(recipient as &dyn age::Recipient))
            .map_err(|error| failed(&error))?;
    let mut armored = Vec::new();
    let writer =
        age::armor::ArmoredWriter::wrap_output(&mut armored, age::armor::Format::AsciiArmor)
            .map_err(|error| failed(&error))?;
    let mut writer = encryptor
        .wrap_output(writer)
        .map_err(|error| failed(&error))?;
    writer.write_all(key).map_err(|error| failed(&error))?;
    writer
        .finish()
        .and_then(|armor| armor.finish())
        .map_err(|error| failed(&error))?;
    let mut text = String::from_utf8(armored).map_err(|error| failed(&error))?;
    if !text.ends_with('\n') {
        text.push('\n');
    }
    Ok(text)
}

/// A SOPS object of an app that could not be opened: it is left out of the render, and reported (by the
/// agent, as a Failed object) with why.
#[derive(Debug)]
pub struct Sealed {
    pub app: String,
    pub file: String,
    pub document: usize,
    /// The object's identity, from its clear apiVersion/kind/metadata.
    pub id: Option<crate::format::bundle::ObjectRef>,
    pub error: Error,
}

/// Opens, in place, every SOPS file among an app's own manifests (a folder app's: engines' output is not
/// read for SOPS), each file whole. A file that does not open is taken out of the app and returned.
pub fn open_app(app: &mut crate::format::bundle::App, keyring: &Keyring) -> Vec<Sealed> {
    let mut sealed = Vec::new();
    if !app.manifests.iter().any(|m| is_encrypted(&m.object)) {
        return sealed;
    }
    let manifests = std::mem::take(&mut app.manifests);
    let mut kept = Vec::with_capacity(manifests.len());
    let mut group: Vec<crate::format::bundle::Manifest> = Vec::new();
    for manifest in manifests {
        if group
            .first()
            .is_some_and(|first| first.file != manifest.file)
        {
            open_group(
                &app.name,
                std::mem::take(&mut group),
                keyring,
                &mut kept,
                &mut sealed,
            );
        }
        if is_encrypted(&manifest.object) {
            group.push(manifest);
        } else {
            kept.push(manifest);
        }
    }
    open_group(&app.name, group, keyring, &mut kept, &mut sealed);
    kept.sort_by(|a, b| (&a.file, a.document).cmp(&(&b.file, b.document)));
    app.manifests = kept;
    sealed
}

fn open_group(
    app: &str,
    mut group: Vec<crate::format::bundle::Manifest>,
    keyring: &Keyring,
    kept: &mut Vec<crate::format::bundle::Manifest>,
    sealed: &mut Vec<Sealed>,
) {
    let Some(first) = group.first() else {
        return;
    };
    let file = first.file.clone();
    let documents: Vec<&Value> = group.iter().map(|m| &m.object).collect();
    match open_file(&documents, keyring, &file) {
        Ok(opened) => {
            for (manifest, object) in group.iter_mut().zip(opened) {
                manifest.object = object;
            }
            kept.extend(group);
        }
        Err(error) => {
            for manifest in group {
                sealed.push(Sealed {
                    app: app.to_owned(),
                    file: manifest.file.clone(),
                    document: manifest.document,
                    id: crate::format::bundle::ObjectRef::of(&manifest.object),
                    error: clone_error(&error),
                });
            }
        }
    }
}

/// The SOPS errors again (they hold only strings), one per object of a file that failed.
fn clone_error(error: &Error) -> Error {
    match error {
        Error::SopsNoKey {
            file,
            recipients,
            held,
        } => Error::SopsNoKey {
            file: file.clone(),
            recipients: recipients.clone(),
            held: held.clone(),
        },
        Error::SopsMac { file } => Error::SopsMac { file: file.clone() },
        Error::SopsValue { file, path } => Error::SopsValue {
            file: file.clone(),
            path: path.clone(),
        },
        other => Error::SopsFormat {
            file: String::new(),
            detail: other.to_string(),
        },
    }
}

/// The build-time check of a SOPS document: its identity (apiVersion, kind, metadata.name and namespace)
/// must be in clear, so that every tool can place it without the key.
pub fn check_identity_in_clear(file: &str, document: usize, object: &Value) -> Result<()> {
    for pointer in [
        "/apiVersion",
        "/kind",
        "/metadata/name",
        "/metadata/namespace",
    ] {
        if object
            .pointer(pointer)
            .and_then(Value::as_str)
            .is_some_and(|text| text.starts_with("ENC["))
        {
            return Err(Error::Manifest {
                file: file.to_owned(),
                document,
                detail: format!(
                    "SOPS encrypted {pointer}: encrypt only the secret values, with \
                     sops encrypt --encrypted-regex '{KUBERNETES_ENCRYPTED_REGEX}' (or windvane seal)"
                ),
            });
        }
    }
    Ok(())
}

/// Refuses SOPS documents in what Helm or kustomize wrote: engines' output is not opened by agents (an
/// engine may have changed the file, so its MAC could not hold), and must not reach a cluster encrypted.
pub fn refuse_in_engine_output(manifests: &[crate::format::bundle::Manifest]) -> Result<()> {
    match manifests.iter().find(|m| is_encrypted(&m.object)) {
        Some(manifest) => Err(Error::Manifest {
            file: manifest.file.clone(),
            document: manifest.document,
            detail: "a SOPS-encrypted document in Helm or kustomize output is not supported; put \
                     encrypted Secrets in a plain folder app"
                .to_owned(),
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests;
