//! Where a store's files live, and the four things done to them: read (capped, with the version read),
//! write (unconditionally, only if absent, or only if still at the version read), remove, and hold the
//! store for one change.
//!
//! A directory ([`Store::Dir`]) is held by an advisory lock on the directory itself, so every write inside
//! the hold is safe by that lock; files are replaced by write-temp, fsync, rename. A bucket of an
//! S3-compatible object store ([`Store::Bucket`], `s3://bucket/prefix`) has no lock: a change of the channel
//! pointer is a conditional write (`If-Match` on the ETag read, `If-None-Match: *` for a first release), so of
//! two publishers of the same serial one wins and the other is told so. Credentials come from the usual
//! chain: the environment (`AWS_ACCESS_KEY_ID`, `AWS_REGION`, `AWS_ENDPOINT_URL`), the shared files' profile
//! (`aws_profile.rs`), then web identity, container or instance metadata (`object_store`'s S3 client).

use std::fs::{self, File, TryLockError};
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey, S3ConditionalPut};
use object_store::{
    BackoffConfig, ClientConfigKey, GetOptions, ObjectStore, ObjectStoreExt, PutMode, PutOptions,
    PutPayload, RetryConfig, UpdateVersion,
};

use crate::{BUNDLES_DIR, CHANNELS_DIR, Error, Result, read_capped_file, write_atomic};

/// A store that can be published to: a local directory or an S3 bucket with an optional prefix.
#[derive(Debug, Clone)]
pub enum Store {
    Dir(PathBuf),
    Bucket(Bucket),
}

/// A bucket of an S3-compatible object store and the prefix the store's files sit under.
#[derive(Debug, Clone)]
pub struct Bucket {
    client: Arc<dyn ObjectStore>,
    /// The store's prefix inside the bucket, without leading or trailing `/` (empty: the bucket's root).
    prefix: String,
    /// `s3://bucket/prefix`, for messages.
    url: String,
}

/// The version of a file that a read saw, to make a later write conditional on it.
#[derive(Debug, Clone)]
pub(crate) enum Version {
    /// A directory's files change only under its lock, which the reader holds.
    Locked,
    Object(UpdateVersion),
}

/// A file as read, with its version.
#[derive(Debug)]
pub(crate) struct Stored {
    pub bytes: Vec<u8>,
    pub version: Version,
}

/// How a write treats what is already there.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Put<'a> {
    /// Replace whatever is there (bundles, named by their digest).
    Overwrite,
    /// Only if the file is still as it was read: absent (`None`) or at that version.
    IfUnchanged(Option<&'a Version>),
}

/// The store held for one change. A directory's lock is released when it is dropped; directories it created
/// are removed again unless [`Hold::keep`] was called, so a failed first publish leaves nothing behind.
#[derive(Debug)]
pub(crate) struct Hold {
    _lock: Option<File>,
    created: Vec<PathBuf>,
    /// True when no one else can write while this is held, so a file written in it may be removed again.
    pub exclusive: bool,
}

impl Hold {
    pub fn keep(mut self) {
        self.created.clear();
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        for dir in self.created.iter().rev() {
            let _ = fs::remove_dir(dir);
        }
    }
}

impl Store {
    /// `s3://bucket[/prefix]` is a bucket; `http(s)://` is refused (a static host is read-only); anything else
    /// is a directory.
    pub fn parse(text: &str) -> Result<Self> {
        Self::parse_with(text, &[])
    }

    /// [`Store::parse`], with S3 client settings (`object_store`'s names, e.g. `aws_endpoint`) that take
    /// precedence over the environment's.
    pub fn parse_with(text: &str, settings: &[(String, String)]) -> Result<Self> {
        if let Some(rest) = text.strip_prefix("s3://") {
            return Bucket::connect(rest, settings).map(Store::Bucket);
        }
        let scheme = text.split_once("://").map(|(scheme, _)| scheme);
        match scheme {
            Some(scheme) if scheme.bytes().all(|b| b.is_ascii_alphanumeric()) => {
                Err(Error::UnsupportedStore {
                    location: text.to_owned(),
                })
            }
            _ => Ok(Store::Dir(PathBuf::from(text))),
        }
    }

    /// Where `relative` is, for messages: a path or an `s3://` URL.
    pub fn describe(&self, relative: &str) -> PathBuf {
        match self {
            Store::Dir(root) => root.join(relative),
            Store::Bucket(bucket) => PathBuf::from(format!("{}/{relative}", bucket.url)),
        }
    }

    /// Holds the store for one change: a directory is created if need be and locked.
    pub(crate) fn hold(&self, create: bool) -> Result<Hold> {
        let Store::Dir(root) = self else {
            return Ok(Hold {
                _lock: None,
                created: Vec::new(),
                exclusive: false,
            });
        };
        let created = if create {
            ensure_dirs(root)?
        } else {
            Vec::new()
        };
        let mut hold = Hold {
            _lock: None,
            created,
            exclusive: true,
        };
        hold._lock = Some(lock_dir(root)?);
        Ok(hold)
    }

    /// Reads `relative`, at most `cap` bytes; `None` when it does not exist.
    pub(crate) async fn get(
        &self,
        relative: &str,
        cap: u64,
        what: &'static str,
    ) -> Result<Option<Stored>> {
        match self {
            Store::Dir(root) => match read_capped_file(&root.join(relative), cap, what) {
                Ok(bytes) => Ok(Some(Stored {
                    bytes,
                    version: Version::Locked,
                })),
                Err(Error::Io { source, .. }) if source.kind() == ErrorKind::NotFound => Ok(None),
                Err(e) => Err(e),
            },
            Store::Bucket(bucket) => bucket.get(relative, cap, what).await,
        }
    }

    /// Reads `relative`, at most `cap` bytes; `None` when it does not exist.
    pub async fn read(
        &self,
        relative: &str,
        cap: u64,
        what: &'static str,
    ) -> Result<Option<Vec<u8>>> {
        Ok(self
            .get(relative, cap, what)
            .await?
            .map(|stored| stored.bytes))
    }

    /// Writes `relative`. [`Error::ChangedConcurrently`] when `put` asked for the file as read and another
    /// writer changed it since.
    pub(crate) async fn put(&self, relative: &str, bytes: &[u8], put: Put<'_>) -> Result<()> {
        match self {
            Store::Dir(root) => {
                let path = root.join(relative);
                if let Some(dir) = path.parent().filter(|dir| !dir.is_dir()) {
                    fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
                }
                write_atomic(&path, bytes)
            }
            Store::Bucket(bucket) => bucket.put(relative, bytes, put).await,
        }
    }

    /// Removes `relative`, if it is there.
    pub(crate) async fn remove(&self, relative: &str) -> Result<()> {
        match self {
            Store::Dir(root) => {
                let path = root.join(relative);
                match fs::remove_file(&path) {
                    Err(e) if e.kind() != ErrorKind::NotFound => Err(Error::io(&path, e)),
                    _ => Ok(()),
                }
            }
            Store::Bucket(bucket) => {
                bucket
                    .client
                    .delete(&bucket.key(relative))
                    .await
                    .or_else(|e| match e {
                        object_store::Error::NotFound { .. } => Ok(()),
                        e => Err(bucket.error(relative, e)),
                    })
            }
        }
    }
}

impl std::fmt::Display for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Store::Dir(dir) => write!(f, "{}", dir.display()),
            Store::Bucket(bucket) => f.write_str(&bucket.url),
        }
    }
}

impl Bucket {
    /// Connects to `bucket[/prefix]` (the part after `s3://`) with the S3 client's environment chain.
    fn connect(rest: &str, settings: &[(String, String)]) -> Result<Self> {
        let (name, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        let prefix = prefix.trim_matches('/').to_owned();
        let url = if prefix.is_empty() {
            format!("s3://{name}")
        } else {
            format!("s3://{name}/{prefix}")
        };
        if name.is_empty() || prefix.split('/').any(|part| part == ".." || part == ".") {
            return Err(Error::UnsupportedStore { location: url });
        }
        // The workspace's TLS stack carries no provider of its own; the first caller installs ring.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut builder = AmazonS3Builder::from_env();
        let profile = crate::aws_profile::from_files(settings)?;
        for (key, value) in profile.iter().chain(settings) {
            let key: AmazonS3ConfigKey = key
                .parse()
                .map_err(|e: object_store::Error| Error::object(url.clone(), &e))?;
            builder = builder.with_config(key, value);
        }
        // Time limits unless the environment sets its own (AWS_TIMEOUT, AWS_CONNECT_TIMEOUT).
        for (key, default) in [
            (ClientConfigKey::ConnectTimeout, "10s"),
            (ClientConfigKey::Timeout, "120s"),
        ] {
            let key = AmazonS3ConfigKey::Client(key);
            if builder.get_config_value(&key).is_none() {
                builder = builder.with_config(key, default);
            }
        }
        let client = builder
            .with_bucket_name(name)
            // Windvane's monotonic serials rest on this: a pointer is replaced only if still as read.
            .with_conditional_put(S3ConditionalPut::ETagMatch)
            .with_retry(RetryConfig {
                backoff: BackoffConfig::default(),
                max_retries: 3,
                retry_timeout: Duration::from_secs(60),
            })
            .build()
            .map_err(|source| Error::object(url.clone(), &source))?;
        Ok(Bucket {
            client: Arc::new(client),
            prefix,
            url,
        })
    }

    fn key(&self, relative: &str) -> object_store::path::Path {
        if self.prefix.is_empty() {
            object_store::path::Path::from(relative)
        } else {
            object_store::path::Path::from(format!("{}/{relative}", self.prefix))
        }
    }

    fn error(&self, relative: &str, source: object_store::Error) -> Error {
        Error::object(format!("{}/{relative}", self.url), &source)
    }

    async fn get(&self, relative: &str, cap: u64, what: &'static str) -> Result<Option<Stored>> {
        let result = match self
            .client
            .get_opts(&self.key(relative), GetOptions::default())
            .await
        {
            Ok(result) => result,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(self.error(relative, e)),
        };
        let too_large = || windvane_shared::Error::SizeCap { what, limit: cap };
        if result.meta.size > cap {
            return Err(too_large().into());
        }
        let version = Version::Object(UpdateVersion {
            e_tag: result.meta.e_tag.clone(),
            version: result.meta.version.clone(),
        });
        let mut stream = result.into_stream();
        let mut bytes = Vec::new();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| self.error(relative, e))?;
            if (bytes.len() + chunk.len()) as u64 > cap {
                return Err(too_large().into());
            }
            bytes.extend_from_slice(&chunk);
        }
        Ok(Some(Stored { bytes, version }))
    }

    async fn put(&self, relative: &str, bytes: &[u8], put: Put<'_>) -> Result<()> {
        let mode = match put {
            Put::Overwrite => PutMode::Overwrite,
            Put::IfUnchanged(None) => PutMode::Create,
            Put::IfUnchanged(Some(Version::Object(version))) => PutMode::Update(version.clone()),
            // A version from a directory never meets a bucket; refuse rather than overwrite blindly.
            Put::IfUnchanged(Some(Version::Locked)) => PutMode::Create,
        };
        let options = PutOptions {
            mode,
            ..PutOptions::default()
        };
        let payload = PutPayload::from(bytes.to_vec());
        match self
            .client
            .put_opts(&self.key(relative), payload, options)
            .await
        {
            Ok(_) => Ok(()),
            Err(
                object_store::Error::AlreadyExists { .. }
                | object_store::Error::Precondition { .. },
            ) => Err(Error::ChangedConcurrently {
                location: format!("{}/{relative}", self.url),
            }),
            Err(e) => Err(self.error(relative, e)),
        }
    }
}

/// Creates the store's directories that are missing, returning those it created (to undo on failure).
fn ensure_dirs(root: &Path) -> Result<Vec<PathBuf>> {
    let mut created = Vec::new();
    for dir in [
        root.to_path_buf(),
        root.join(CHANNELS_DIR),
        root.join(BUNDLES_DIR),
    ] {
        match fs::create_dir(&dir) {
            Ok(()) => created.push(dir),
            Err(e) if e.kind() == ErrorKind::AlreadyExists && dir.is_dir() => {}
            Err(e) => {
                for dir in created.iter().rev() {
                    let _ = fs::remove_dir(dir);
                }
                return Err(Error::io(dir, e));
            }
        }
    }
    Ok(created)
}

/// An exclusive advisory lock on the store directory itself, so that no lock file is left behind and the
/// kernel releases it if the publisher dies.
fn lock_dir(root: &Path) -> Result<File> {
    let dir = File::open(root).map_err(|e| Error::io(root, e))?;
    match dir.try_lock() {
        Ok(()) => Ok(dir),
        Err(TryLockError::WouldBlock) => Err(Error::Locked {
            path: root.to_path_buf(),
        }),
        Err(TryLockError::Error(e)) => Err(Error::io(root, e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_parse_to_directories_and_buckets() {
        assert!(matches!(Store::parse("/srv/store"), Ok(Store::Dir(_))));
        assert!(matches!(Store::parse("relative/dir"), Ok(Store::Dir(_))));
        let Ok(Store::Bucket(bucket)) = Store::parse("s3://fleet-store/prod/") else {
            panic!("a bucket");
        };
        assert_eq!(bucket.url, "s3://fleet-store/prod");
        assert_eq!(
            bucket.key("channels/a.json").as_ref(),
            "prod/channels/a.json"
        );
        let Ok(Store::Bucket(root)) = Store::parse("s3://fleet-store") else {
            panic!("a bucket");
        };
        assert_eq!(root.key("bundles/x.json").as_ref(), "bundles/x.json");
        for refused in [
            "https://static.example.com/store",
            "gs://bucket/x",
            "s3:///x",
            "s3://b/../x",
        ] {
            assert!(
                matches!(Store::parse(refused), Err(Error::UnsupportedStore { .. })),
                "{refused}"
            );
        }
    }
}
