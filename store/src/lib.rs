//! The static store that agents poll: `channels/<channel>.json`, a signed DSSE release pointer, and
//! `bundles/<sha256>.json`, immutable bundles named by their digest. Any static HTTP host can serve it.
//!
//! Publishing ([`publish`]) writes the bundle and then the pointer, so that agents never see a pointer to a
//! missing bundle. In a directory each file is replaced by write-temp, fsync, rename under a lock on the
//! directory, and a failure at any step leaves the store exactly as it was; in an S3 bucket ([`Store`]) the
//! pointer is replaced by a conditional write, so of two publishers of one serial exactly one wins. Reading
//! ([`StoreLocation`]) works from a directory, a bucket or an HTTP(S) URL, never reading more than a cap.

use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use ed25519_dalek::SigningKey;
use jiff::Timestamp;
use windvane_shared::crypto::digest::sha256_hex;
use windvane_shared::crypto::keys::TrustedKeys;
use windvane_shared::format::bundle::Bundle;
use windvane_shared::format::release::{self, BundleRef, ReleasePointer};

mod approval;
mod aws_profile;
mod control;
mod error;
mod files;
pub mod history;

pub use approval::approve;
pub use control::set_halted;

pub use error::{Error, Result};
pub use files::{Bucket, Store};
use files::{Hold, Put, Version};

/// Directory of channel pointers, relative to the store root.
pub const CHANNELS_DIR: &str = "channels";
/// Directory of bundles, relative to the store root.
pub const BUNDLES_DIR: &str = "bundles";

/// Checks that a channel name is safe as a file name and a URL path segment.
pub fn check_channel_name(channel: &str) -> Result<()> {
    let valid = (1..=63).contains(&channel.len())
        && channel
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        && channel.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'-' | b'_' | b'.')
        })
        && !channel.contains("..");
    if valid {
        Ok(())
    } else {
        Err(Error::InvalidChannel(channel.to_owned()))
    }
}

/// The channel pointer's path relative to the store root: `channels/<channel>.json`.
pub fn channel_path(channel: &str) -> String {
    format!("{CHANNELS_DIR}/{channel}.json")
}

/// A bundle's path relative to the store root: `bundles/<sha256>.json`.
pub fn bundle_path(sha256: &str) -> String {
    format!("{BUNDLES_DIR}/{sha256}.json")
}

/// What to publish, and with what.
#[derive(Debug)]
pub struct PublishRequest<'a> {
    pub channel: &'a str,
    pub bundle: &'a Bundle,
    pub key: &'a SigningKey,
    /// Keys besides `key` that may have signed the current pointer (the old key, during a rotation).
    pub also_trusted: &'a TrustedKeys,
    pub expires_in: Duration,
    pub allow_empty: bool,
    pub now: Timestamp,
}

/// What a successful publish wrote.
#[derive(Debug)]
pub struct Published {
    pub pointer: ReleasePointer,
    pub previous_serial: Option<u64>,
    /// False when a bundle with the same digest was already in the store.
    pub bundle_was_new: bool,
}

/// A release ready to be written: the current pointer verified, the next one signed, nothing written yet.
/// A directory stays locked until it is committed or dropped; a bucket is not held, and the commit's
/// conditional write of the pointer fails ([`Error::ChangedConcurrently`]) if another publisher got there
/// first.
#[derive(Debug)]
pub struct PreparedPublish<'s> {
    store: &'s Store,
    hold: Hold,
    pointer: ReleasePointer,
    envelope_bytes: Vec<u8>,
    bundle_bytes: Vec<u8>,
    current_version: Option<Version>,
    previous_serial: Option<u64>,
    /// The current pointer as read and verified, recorded in the signed history if it is not there yet (a
    /// store written before the history was kept gains it with its next publish).
    previous: Option<(ReleasePointer, Vec<u8>)>,
    /// The keys a pointer read back may be signed with.
    trusted: TrustedKeys,
}

/// Publishes `request.bundle` on a channel: verifies the current pointer, writes the bundle, then a pointer
/// with the next serial. On failure the channel is as it was.
pub async fn publish(store: &Store, request: &PublishRequest<'_>) -> Result<Published> {
    prepare_publish(store, request).await?.commit().await
}

/// [`publish`] to a directory, for callers without an async runtime. A directory's reads and writes are
/// plain file calls that never wait on a runtime, so polling the future to its end on this thread is exact.
pub fn publish_dir(root: &Path, request: &PublishRequest<'_>) -> Result<Published> {
    futures::executor::block_on(publish(&Store::Dir(root.to_path_buf()), request))
}

/// Checks the request, reads and verifies the channel's current pointer and signs the next one.
pub async fn prepare_publish<'s>(
    store: &'s Store,
    request: &PublishRequest<'_>,
) -> Result<PreparedPublish<'s>> {
    check_channel_name(request.channel)?;
    if request.expires_in.is_zero() {
        return Err(Error::Shared(windvane_shared::Error::InvalidDuration {
            value: "0s".to_owned(),
            detail: "--expires-in must be longer than zero".to_owned(),
        }));
    }
    let object_count: usize = request.bundle.apps.iter().map(|a| a.object_count()).sum();
    if object_count == 0 && !request.allow_empty {
        return Err(Error::EmptyWithoutAllow);
    }
    let hold = store.hold(true)?;
    let pointer_path = channel_path(request.channel);
    let current = store
        .get(
            &pointer_path,
            release::DEFAULT_MAX_POINTER_BYTES,
            "channel pointer",
        )
        .await?;
    let previous = match &current {
        Some(stored) => Some(verify_current(store, &stored.bytes, request).await?),
        None => None,
    };
    let bundle_bytes = request.bundle.to_json_bytes();
    let pointer = next_pointer(request, previous.as_ref(), &bundle_bytes)?;
    let (current_version, current_bytes) = current
        .map(|stored| (Some(stored.version), stored.bytes))
        .unwrap_or_default();
    let trusted = with_key(store, request.channel, request.key, request.also_trusted)?;
    Ok(PreparedPublish {
        store,
        hold,
        trusted,
        envelope_bytes: pointer.sign(request.key).to_json_bytes(),
        pointer,
        bundle_bytes,
        current_version,
        previous_serial: previous.as_ref().map(|p| p.serial),
        previous: previous.map(|p| (p, current_bytes)),
    })
}

impl PreparedPublish<'_> {
    /// The pointer that [`PreparedPublish::commit`] will write.
    pub fn pointer(&self) -> &ReleasePointer {
        &self.pointer
    }

    /// Writes the bundle (unless the store has it), then the pointer if the channel is still as read, then
    /// the history line.
    pub async fn commit(self) -> Result<Published> {
        let store = self.store;
        let channel = self.pointer.channel.as_str();
        let sha256 = self.pointer.bundle.sha256.as_str();
        let bundle_file = bundle_path(sha256);
        let bundle_was_new = !has_bundle(store, &bundle_file, sha256, &self.bundle_bytes).await?;
        if bundle_was_new {
            store
                .put(&bundle_file, &self.bundle_bytes, Put::Overwrite)
                .await?;
        }
        let pointer_put = Put::IfUnchanged(self.current_version.as_ref());
        if let Err(error) = store
            .put(&channel_path(channel), &self.envelope_bytes, pointer_put)
            .await
        {
            // Under a directory's lock no pointer names the new bundle, so removing it restores the store
            // exactly; in a bucket a concurrent publisher of the same content may now point at it.
            if bundle_was_new && self.hold.exclusive {
                let _ = store.remove(&bundle_file).await;
            }
            return Err(error);
        }
        self.read_back().await?;
        // The release is out once its pointer is written; a failure to record the signed history does not
        // undo it, but rollback cannot go back to a release that is not recorded, so it is said.
        let entries = self
            .previous
            .iter()
            .map(|(pointer, bytes)| (pointer, bytes.as_slice()))
            .chain([(&self.pointer, self.envelope_bytes.as_slice())]);
        for (pointer, bytes) in entries {
            if let Err(error) = history::record(store, pointer, bytes).await {
                eprintln!(
                    "warning: could not record serial {} in the channel's signed history: {error}",
                    pointer.serial
                );
            }
        }
        self.hold.keep();
        Ok(Published {
            pointer: self.pointer,
            previous_serial: self.previous_serial,
            bundle_was_new,
        })
    }
}

impl PreparedPublish<'_> {
    /// Reads the pointer back after writing it: an object store that ignores `If-Match` lets two publishers
    /// of one serial both "win", and only what is there afterwards tells.
    async fn read_back(&self) -> Result<()> {
        let path = channel_path(&self.pointer.channel);
        let found = self
            .store
            .read(&path, release::DEFAULT_MAX_POINTER_BYTES, "channel pointer")
            .await?;
        read_back_verdict(
            &self.pointer,
            &self.envelope_bytes,
            found.as_deref(),
            &self.trusted,
            &self.store.describe(&path).display().to_string(),
        )
    }
}

/// Whether the pointer read back after writing `written` (`written_bytes`) shows the write held (pure):
/// the same bytes, or a pointer of a later serial (another publisher followed already). Anything else —
/// nothing, another pointer of the same or an earlier serial, bytes that are not a pointer — is an error that
/// says what is there instead, at `location` (the channel pointer as shown).
pub fn read_back_verdict(
    written: &ReleasePointer,
    written_bytes: &[u8],
    found: Option<&[u8]>,
    trusted: &TrustedKeys,
    location: &str,
) -> Result<()> {
    let location = location.to_owned();
    let Some(found) = found else {
        return Err(Error::PointerGoneAfterWrite { location });
    };
    if found == written_bytes {
        return Ok(());
    }
    let other = release::verify_signed_pointer(found, trusted, release::DEFAULT_MAX_POINTER_BYTES)
        .ok()
        .map(|accepted| accepted.pointer);
    match other {
        Some(other) if other.serial > written.serial && other.channel == written.channel => Ok(()),
        Some(other) => Err(Error::PointerOvertaken {
            location,
            found_serial: other.serial,
            found_bundle: other.bundle.sha256,
            written_serial: written.serial,
        }),
        None => Err(Error::PointerNotTrusted { location }),
    }
}

/// The pointer after `previous` (pure): the next serial, naming the bundle.
fn next_pointer(
    request: &PublishRequest<'_>,
    previous: Option<&ReleasePointer>,
    bundle_bytes: &[u8],
) -> Result<ReleasePointer> {
    let expires_at = request.now.checked_add(request.expires_in).map_err(|e| {
        Error::Shared(windvane_shared::Error::InvalidDuration {
            value: format!("{:?}", request.expires_in),
            detail: e.to_string(),
        })
    })?;
    Ok(ReleasePointer {
        fleet: request.bundle.fleet.clone(),
        channel: request.channel.to_owned(),
        serial: previous.map_or(1, |p| p.serial + 1),
        issued_at: request.now,
        expires_at,
        bundle: BundleRef {
            sha256: sha256_hex(bundle_bytes),
            size: bundle_bytes.len() as u64,
        },
        allow_empty: request.allow_empty,
        rollout: request.bundle.rollout.clone(),
    })
}

/// Verifies the channel's current pointer (expired is fine: publishing renews it) with the publishing key
/// and the keys trusted besides it, and checks it against the channel's signed history
/// ([`history::check_read`]): the next serial is numbered from it.
async fn verify_current(
    store: &Store,
    bytes: &[u8],
    request: &PublishRequest<'_>,
) -> Result<ReleasePointer> {
    let trusted = with_key(store, request.channel, request.key, request.also_trusted)?;
    let asked = history::Asked {
        channel: request.channel,
        fleet: None,
        now: request.now,
        expired_ok: true,
    };
    let pointer = history::read_current(store, bytes, &trusted, &asked).await?;
    if pointer.fleet != request.bundle.fleet {
        return Err(Error::OtherFleetInStore {
            channel: request.channel.to_owned(),
            current: pointer.fleet,
            offered: request.bundle.fleet.clone(),
        });
    }
    Ok(pointer)
}

/// `also_trusted` with the signing key's own public key.
pub(crate) fn with_key(
    store: &Store,
    channel: &str,
    key: &SigningKey,
    also_trusted: &TrustedKeys,
) -> Result<TrustedKeys> {
    let mut trusted = also_trusted.clone();
    trusted
        .insert(key.verifying_key())
        .map_err(|source| Error::CurrentPointerUnverifiable {
            path: store.describe(&channel_path(channel)),
            source,
        })?;
    Ok(trusted)
}

/// Whether the store already holds exactly these bundle bytes (a file of another size or digest is not it,
/// and is replaced).
async fn has_bundle(store: &Store, path: &str, sha256: &str, bytes: &[u8]) -> Result<bool> {
    match store.get(path, bytes.len() as u64, "bundle").await {
        Ok(found) => Ok(found.is_some_and(|f| sha256_hex(&f.bytes) == sha256)),
        Err(Error::Shared(windvane_shared::Error::SizeCap { .. })) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Writes `bytes` to `path` so that readers see the old file or the new one, never a part: a temporary file
/// beside it, fsync, rename over, fsync the directory.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path
        .parent()
        .ok_or_else(|| Error::io(path, ErrorKind::InvalidInput.into()))?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let temp = dir.join(format!(".{name}.tmp"));
    let write = || -> std::io::Result<()> {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&temp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        fs::rename(&temp, path)
    };
    if let Err(e) = write() {
        if e.kind() != ErrorKind::AlreadyExists {
            let _ = fs::remove_file(&temp);
        }
        return Err(Error::io(&temp, e));
    }
    sync_dir(dir)
}

fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io(dir, e))
}

/// Reads a file, refusing it (without reading further) when it is larger than `cap` bytes.
pub fn read_capped_file(path: &Path, cap: u64, what: &'static str) -> Result<Vec<u8>> {
    let file = File::open(path).map_err(|e| Error::io(path, e))?;
    let mut bytes = Vec::new();
    file.take(cap + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| Error::io(path, e))?;
    if bytes.len() as u64 > cap {
        return Err(windvane_shared::Error::SizeCap { what, limit: cap }.into());
    }
    Ok(bytes)
}

/// Where a store is read from: a local directory, an S3 bucket, or the base URL of any static host.
#[derive(Debug, Clone)]
pub enum StoreLocation {
    Dir(PathBuf),
    Bucket(Store),
    Url(String),
}

impl StoreLocation {
    /// `http://…` and `https://…` are URLs, `s3://…` a bucket; anything else is a directory.
    pub fn parse(text: &str) -> Result<Self> {
        if text.starts_with("http://") || text.starts_with("https://") {
            return Ok(StoreLocation::Url(text.trim_end_matches('/').to_owned()));
        }
        match Store::parse(text)? {
            Store::Dir(dir) => Ok(StoreLocation::Dir(dir)),
            bucket => Ok(StoreLocation::Bucket(bucket)),
        }
    }

    /// Reads `relative` (a store path such as `channels/prod.json`), at most `cap` bytes.
    pub async fn read(&self, relative: &str, cap: u64, what: &'static str) -> Result<Vec<u8>> {
        match self {
            StoreLocation::Dir(root) => read_capped_file(&root.join(relative), cap, what),
            StoreLocation::Bucket(store) => match store.get(relative, cap, what).await? {
                Some(stored) => Ok(stored.bytes),
                None => Err(Error::io(
                    store.describe(relative),
                    ErrorKind::NotFound.into(),
                )),
            },
            StoreLocation::Url(base) => {
                http_get_capped(&format!("{base}/{relative}"), cap, what).await
            }
        }
    }

    /// Reads a channel's pointer, saying plainly when the channel has never been published.
    pub async fn read_pointer(&self, channel: &str) -> Result<Vec<u8>> {
        check_channel_name(channel)?;
        let not_found = || Error::NoSuchChannel {
            location: self.to_string(),
            channel: channel.to_owned(),
        };
        match self
            .read(
                &channel_path(channel),
                release::DEFAULT_MAX_POINTER_BYTES,
                "channel pointer",
            )
            .await
        {
            Err(Error::Io { source, .. }) if source.kind() == ErrorKind::NotFound => {
                Err(not_found())
            }
            Err(Error::Http { detail, .. }) if detail.starts_with("404") => Err(not_found()),
            other => other,
        }
    }
}

impl std::fmt::Display for StoreLocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreLocation::Dir(dir) => write!(f, "{}", dir.display()),
            StoreLocation::Bucket(store) => write!(f, "{store}"),
            StoreLocation::Url(url) => f.write_str(url),
        }
    }
}

async fn http_get_capped(url: &str, cap: u64, what: &'static str) -> Result<Vec<u8>> {
    let http = |detail: String| Error::Http {
        url: url.to_owned(),
        detail,
    };
    let client = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .timeout(Duration::from_secs(60))
        .build()
        .map_err(|e| http(e.to_string()))?;
    let mut response = client
        .get(url)
        .send()
        .await
        .map_err(|e| http(e.to_string()))?;
    let status = response.status();
    if !status.is_success() {
        return Err(http(status.to_string()));
    }
    if response.content_length().is_some_and(|len| len > cap) {
        return Err(windvane_shared::Error::SizeCap { what, limit: cap }.into());
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| http(e.to_string()))? {
        if (body.len() + chunk.len()) as u64 > cap {
            return Err(windvane_shared::Error::SizeCap { what, limit: cap }.into());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channel_names() {
        for good in ["prod", "staging-eu", "v1.2", "a_b"] {
            check_channel_name(good).unwrap();
        }
        for bad in ["", "../x", "Prod", "a/b", "-x", "a..b", &"x".repeat(64)] {
            assert!(
                matches!(check_channel_name(bad), Err(Error::InvalidChannel(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_pointer_read_back_must_be_the_one_written_or_a_later_one() {
        let key = windvane_shared::crypto::keys::signing_key_from_seed([5; 32]);
        let mut trusted = TrustedKeys::new();
        trusted.insert(key.verifying_key()).expect("key");
        let now = Timestamp::now();
        let pointer = |serial: u64, digit: char| ReleasePointer {
            fleet: "acme".to_owned(),
            channel: "prod".to_owned(),
            serial,
            issued_at: now,
            expires_at: now + jiff::SignedDuration::from_hours(1),
            bundle: BundleRef {
                sha256: digit.to_string().repeat(64),
                size: 1,
            },
            allow_empty: false,
            rollout: None,
        };
        let ours = pointer(4, 'a');
        let bytes = ours.sign(&key).to_json_bytes();
        assert!(read_back_verdict(&ours, &bytes, Some(&bytes), &trusted, "at").is_ok());
        let later = pointer(5, 'c').sign(&key).to_json_bytes();
        assert!(read_back_verdict(&ours, &bytes, Some(&later), &trusted, "at").is_ok());
        // What an object store that ignores If-Match leaves: the other publisher's serial 4.
        let theirs = pointer(4, 'b').sign(&key).to_json_bytes();
        let lost = read_back_verdict(&ours, &bytes, Some(&theirs), &trusted, "at")
            .expect_err("lost")
            .to_string();
        assert!(
            lost.contains("did not honour the conditional write (If-Match)"),
            "{lost}"
        );
        assert!(lost.contains(&"b".repeat(64)), "{lost}");
        let other_key = windvane_shared::crypto::keys::signing_key_from_seed([6; 32]);
        let forged = pointer(9, 'd').sign(&other_key).to_json_bytes();
        let error = read_back_verdict(&ours, &bytes, Some(&forged), &trusted, "at")
            .expect_err("forged")
            .to_string();
        assert!(
            error.contains("not a release pointer signed by a trusted key"),
            "{error}"
        );
        assert!(read_back_verdict(&ours, &bytes, None, &trusted, "at").is_err());
    }

    #[test]
    fn store_paths() {
        assert_eq!(channel_path("prod"), "channels/prod.json");
        assert_eq!(bundle_path("ab"), "bundles/ab.json");
    }
}
