//! Serving the static store from `--root`: channel pointers and bundles only, with strong ETags, `304 Not
//! Modified`, HEAD, gzip when the client accepts it, and `Cache-Control` (bundles are immutable, pointers must
//! be revalidated).
//!
//! Files are read from disk once per version and kept in memory ([`FileCache`]): a version is identified by
//! the file's device, inode, size and modification time, which `windvane publish` (write, fsync, rename)
//! always changes. A cached file is looked at again (one `stat`) at most every [`REVALIDATE_AFTER`], so the
//! hot path — an agent polling an unchanged pointer with `If-None-Match` — is one map lookup and a 304 built
//! from cached header values, with no system call; a publish is served within that time. A new version is
//! opened, checked to lie inside the store root (symlinks are resolved; anything that leads outside is refused), hashed for its
//! ETag, and cached with its gzip encoding. A bundle whose content does not hash to its name is refused.

use std::collections::HashMap;
use std::io::Write as _;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use flate2::Compression;
use flate2::write::GzEncoder;
use hyper::header::HeaderValue;
use windvane_shared::crypto::digest::sha256_hex;

use windvane_store::{BUNDLES_DIR, CHANNELS_DIR};

/// Which kind of store file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    Pointer,
    Bundle,
}

/// Largest file the server serves from the store (a bundle's default cap).
pub const MAX_FILE_BYTES: u64 = windvane_shared::format::release::DEFAULT_MAX_BUNDLE_BYTES;
/// When the cached bodies exceed this, the cache starts over.
const MAX_CACHE_BYTES: u64 = 512 * 1024 * 1024;
/// How long a cached file is served without looking at the disk again. Agents poll every 30 s, so a publish
/// seen this much later changes nothing for them, while a `stat` per request was a tenth of the CPU of a 304.
pub const REVALIDATE_AFTER: Duration = Duration::from_millis(100);

/// The identity of one version of a file on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Version {
    dev: u64,
    ino: u64,
    size: u64,
    mtime_ns: i128,
}

impl Version {
    fn of(meta: &std::fs::Metadata) -> Version {
        Version {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            mtime_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
        }
    }
}

/// One cached version of a store file: its bytes, validators and encodings.
#[derive(Debug)]
pub struct CachedFile {
    version: Version,
    pub kind: FileKind,
    pub body: Bytes,
    /// Strong ETag of the identity encoding, quoted.
    pub etag: HeaderValue,
    /// Strong ETag of the gzip encoding (a different representation, so a different tag).
    pub gzip_etag: HeaderValue,
    gzip: OnceLock<Option<Bytes>>,
    /// For pointers: the serial it names (read without verification, for display only).
    serial: OnceLock<Option<u64>>,
    /// When the file on disk was last seen to be this version: nanoseconds since the cache's epoch.
    checked_at: AtomicU64,
}

impl CachedFile {
    /// The gzip encoding, computed once; `None` when it would not be smaller.
    pub fn gzip(&self) -> Option<&Bytes> {
        self.gzip
            .get_or_init(|| {
                let mut encoder = GzEncoder::new(
                    Vec::with_capacity(self.body.len() / 3 + 64),
                    Compression::default(),
                );
                encoder.write_all(&self.body).ok()?;
                let compressed = encoder.finish().ok()?;
                (compressed.len() < self.body.len()).then(|| Bytes::from(compressed))
            })
            .as_ref()
    }

    /// The serial a pointer names, parsed from its (unverified) payload; the page shows it as "latest".
    pub fn serial(&self) -> Option<u64> {
        *self.serial.get_or_init(|| {
            let envelope =
                windvane_shared::crypto::dsse::Envelope::from_json_slice(&self.body).ok()?;
            let payload = envelope.payload_bytes().ok()?;
            let value: serde_json::Value = serde_json::from_slice(&payload).ok()?;
            value.get("serial")?.as_u64()
        })
    }
}

/// Why a store file cannot be served.
#[derive(Debug, PartialEq, Eq)]
pub enum FileError {
    /// Absent, not a regular file, or outside the root: all look the same from outside.
    NotFound,
    /// Larger than [`MAX_FILE_BYTES`].
    TooLarge,
    /// A bundle whose bytes do not hash to its name.
    DigestMismatch,
    /// Reading failed.
    Io(String),
}

/// The store root and the cache of its files.
#[derive(Debug)]
pub struct FileCache {
    root: PathBuf,
    canonical_root: OnceLock<PathBuf>,
    entries: RwLock<HashMap<PathBuf, Arc<CachedFile>>>,
    cached_bytes: AtomicU64,
    /// A cached file checked less than this long ago is served without a `stat`.
    revalidate_after: Duration,
    /// The origin of the entries' `checked_at`.
    epoch: Instant,
}

impl FileCache {
    /// A cache of the store under `root` that looks at a cached file again after `revalidate_after`
    /// ([`REVALIDATE_AFTER`] in the server; zero looks at every request).
    pub fn new(root: PathBuf, revalidate_after: Duration) -> FileCache {
        FileCache {
            root,
            canonical_root: OnceLock::new(),
            entries: RwLock::new(HashMap::new()),
            cached_bytes: AtomicU64::new(0),
            revalidate_after,
            epoch: Instant::now(),
        }
    }

    fn nanos_since_epoch(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX)
    }

    /// The store root as given.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn canonical_root(&self) -> Option<&Path> {
        if let Some(root) = self.canonical_root.get() {
            return Some(root);
        }
        let canonical = std::fs::canonicalize(&self.root).ok()?;
        Some(self.canonical_root.get_or_init(|| canonical))
    }

    /// The current version of a channel pointer (at most [`REVALIDATE_AFTER`] old).
    pub fn pointer(&self, channel: &str) -> Result<Arc<CachedFile>, FileError> {
        self.pointer_at(channel, Instant::now())
    }

    fn pointer_at(&self, channel: &str, now: Instant) -> Result<Arc<CachedFile>, FileError> {
        self.get(
            Path::new(CHANNELS_DIR).join(format!("{channel}.json")),
            FileKind::Pointer,
            None,
            now,
        )
    }

    /// The approvals of a channel's release (revalidated like a pointer).
    pub fn approval(&self, channel: &str, serial: u64) -> Result<Arc<CachedFile>, FileError> {
        self.get(
            PathBuf::from(windvane_shared::decide::approval::approval_path(
                channel, serial,
            )),
            FileKind::Pointer,
            None,
            Instant::now(),
        )
    }

    /// The bundle with this digest.
    pub fn bundle(&self, sha256: &str) -> Result<Arc<CachedFile>, FileError> {
        self.get(
            Path::new(BUNDLES_DIR).join(format!("{sha256}.json")),
            FileKind::Bundle,
            Some(sha256),
            Instant::now(),
        )
    }

    /// `relative` must already be a validated store path (the router only builds those).
    fn get(
        &self,
        relative: PathBuf,
        kind: FileKind,
        digest: Option<&str>,
        now: Instant,
    ) -> Result<Arc<CachedFile>, FileError> {
        let now = self.nanos_since_epoch(now);
        let fresh_for = u64::try_from(self.revalidate_after.as_nanos()).unwrap_or(u64::MAX);
        let cached = self
            .entries
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&relative)
            .cloned();
        if let Some(entry) = &cached
            && now.saturating_sub(entry.checked_at.load(Ordering::Relaxed)) < fresh_for
        {
            return Ok(Arc::clone(entry));
        }
        let path = self.root.join(&relative);
        let meta = match std::fs::metadata(&path) {
            Ok(meta) => meta,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(FileError::NotFound),
            Err(e) if e.kind() == std::io::ErrorKind::NotADirectory => {
                return Err(FileError::NotFound);
            }
            Err(e) => return Err(FileError::Io(e.to_string())),
        };
        if !meta.is_file() {
            return Err(FileError::NotFound);
        }
        let version = Version::of(&meta);
        if let Some(entry) = cached
            && entry.version == version
        {
            entry.checked_at.fetch_max(now, Ordering::Relaxed);
            return Ok(entry);
        }
        let entry = Arc::new(self.load(&path, version, kind, digest, now)?);
        let mut entries = self.entries.write().unwrap_or_else(|p| p.into_inner());
        let added = entry.body.len() as u64;
        let total = self.cached_bytes.fetch_add(added, Ordering::Relaxed) + added;
        if total > MAX_CACHE_BYTES {
            entries.clear();
            self.cached_bytes.store(added, Ordering::Relaxed);
        }
        entries.insert(relative, Arc::clone(&entry));
        Ok(entry)
    }

    fn load(
        &self,
        path: &Path,
        version: Version,
        kind: FileKind,
        digest: Option<&str>,
        checked_at: u64,
    ) -> Result<CachedFile, FileError> {
        // A new version: make sure the path (after symlinks) still lies inside the root.
        let root = self.canonical_root().ok_or(FileError::NotFound)?;
        let canonical = std::fs::canonicalize(path).map_err(|_| FileError::NotFound)?;
        if !canonical.starts_with(root) {
            tracing::warn!(path = %path.display(), "refusing a store file that resolves outside the root");
            return Err(FileError::NotFound);
        }
        if version.size > MAX_FILE_BYTES {
            return Err(FileError::TooLarge);
        }
        let body = windvane_store::read_capped_file(&canonical, MAX_FILE_BYTES, "store file")
            .map_err(|e| match e {
                windvane_store::Error::Shared(_) => FileError::TooLarge,
                other => FileError::Io(other.to_string()),
            })?;
        let sha256 = sha256_hex(&body);
        if let Some(expected) = digest
            && expected != sha256
        {
            tracing::error!(path = %path.display(), actual = %sha256, "bundle content does not match its name");
            return Err(FileError::DigestMismatch);
        }
        // Keyed by the version seen before reading: if the file was replaced meanwhile, the next request sees a
        // newer version and reloads.
        let etag = format!("\"{sha256}\"");
        let gzip_etag = format!("\"{sha256}.gz\"");
        Ok(CachedFile {
            version,
            kind,
            body: Bytes::from(body),
            etag: HeaderValue::from_str(&etag).map_err(|e| FileError::Io(e.to_string()))?,
            gzip_etag: HeaderValue::from_str(&gzip_etag)
                .map_err(|e| FileError::Io(e.to_string()))?,
            gzip: OnceLock::new(),
            serial: OnceLock::new(),
            checked_at: AtomicU64::new(checked_at),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> (tempfile::TempDir, FileCache) {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(dir.path().join("channels")).expect("mkdir");
        std::fs::create_dir_all(dir.path().join("bundles")).expect("mkdir");
        let cache = FileCache::new(dir.path().to_path_buf(), Duration::ZERO);
        (dir, cache)
    }

    #[test]
    fn pointers_are_cached_per_version() {
        let (dir, cache) = store();
        let file = dir.path().join("channels/prod.json");
        std::fs::write(&file, b"{\"a\":1}").expect("write");
        let first = cache.pointer("prod").expect("served");
        assert_eq!(
            first.etag.to_str().expect("ascii"),
            format!("\"{}\"", sha256_hex(b"{\"a\":1}"))
        );
        let again = cache.pointer("prod").expect("served");
        assert!(
            Arc::ptr_eq(&first, &again),
            "unchanged file comes from the cache"
        );
        windvane_store::write_atomic(&file, b"{\"a\":2}").expect("publish");
        let changed = cache.pointer("prod").expect("served");
        assert_eq!(&changed.body[..], b"{\"a\":2}");
        assert_ne!(changed.etag, first.etag);
    }

    #[test]
    fn a_cached_file_is_looked_at_again_only_after_the_revalidation_period() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(dir.path().join("channels")).expect("mkdir");
        let period = Duration::from_millis(100);
        let cache = FileCache::new(dir.path().to_path_buf(), period);
        let file = dir.path().join("channels/prod.json");
        std::fs::write(&file, b"{\"a\":1}").expect("write");
        let start = Instant::now();
        let first = cache.pointer_at("prod", start).expect("served");
        windvane_store::write_atomic(&file, b"{\"a\":2}").expect("publish");
        let within = cache
            .pointer_at("prod", start + period - Duration::from_millis(1))
            .expect("served");
        assert!(
            Arc::ptr_eq(&first, &within),
            "within the period the cached version is served without a look at the disk"
        );
        let after = cache.pointer_at("prod", start + period).expect("served");
        assert_eq!(
            &after.body[..],
            b"{\"a\":2}",
            "after it, the publish is seen"
        );
        // An unchanged file, looked at again, is kept (and fresh for another period).
        let unchanged = cache
            .pointer_at("prod", start + period * 3)
            .expect("served");
        assert!(Arc::ptr_eq(&after, &unchanged));
        std::fs::remove_file(&file).expect("remove");
        assert!(
            cache
                .pointer_at("prod", start + period * 3 + period / 2)
                .is_ok()
        );
        assert_eq!(
            cache.pointer_at("prod", start + period * 4).unwrap_err(),
            FileError::NotFound,
            "a removed file is gone once the period has passed"
        );
    }

    #[test]
    fn bundles_must_match_their_name() {
        let (dir, cache) = store();
        let body = b"{\"bundle\":true}".repeat(50);
        let digest = sha256_hex(&body);
        std::fs::write(dir.path().join(format!("bundles/{digest}.json")), &body).expect("write");
        let bundle = cache.bundle(&digest).expect("served");
        assert!(bundle.gzip().expect("compressible").len() < body.len());
        let wrong = sha256_hex(b"other");
        std::fs::write(dir.path().join(format!("bundles/{wrong}.json")), &body).expect("write");
        assert_eq!(cache.bundle(&wrong).unwrap_err(), FileError::DigestMismatch);
        assert_eq!(
            cache.bundle(&sha256_hex(b"absent")).unwrap_err(),
            FileError::NotFound
        );
    }

    #[test]
    fn symlinks_out_of_the_root_and_directories_are_not_served() {
        let (dir, cache) = store();
        let outside = tempfile::tempdir().expect("tempdir");
        std::fs::write(outside.path().join("secret.json"), b"secret").expect("write");
        std::os::unix::fs::symlink(
            outside.path().join("secret.json"),
            dir.path().join("channels/leak.json"),
        )
        .expect("symlink");
        assert_eq!(cache.pointer("leak").unwrap_err(), FileError::NotFound);
        std::fs::create_dir(dir.path().join("channels/dir.json")).expect("mkdir");
        assert_eq!(cache.pointer("dir").unwrap_err(), FileError::NotFound);
        // A symlink that stays inside the root is fine.
        std::fs::write(dir.path().join("channels/real.json"), b"{}").expect("write");
        std::os::unix::fs::symlink(
            dir.path().join("channels/real.json"),
            dir.path().join("channels/alias.json"),
        )
        .expect("symlink");
        assert!(cache.pointer("alias").is_ok());
    }

    #[test]
    fn a_symlinked_channels_directory_leading_out_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let outside = tempfile::tempdir().expect("tempdir");
        std::fs::write(outside.path().join("prod.json"), b"{}").expect("write");
        std::os::unix::fs::symlink(outside.path(), dir.path().join("channels")).expect("symlink");
        let cache = FileCache::new(dir.path().to_path_buf(), Duration::ZERO);
        assert_eq!(cache.pointer("prod").unwrap_err(), FileError::NotFound);
    }
}
