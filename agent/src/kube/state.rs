//! The agent's memory, kept in Secrets in its own namespace so that it survives restarts and moves with the
//! leader: the last known good release (pointer and bundle, which is also the highest accepted serial) and
//! the inventory. Each is one "blob": gzip-compressed, stored inline in one Secret when small, otherwise in
//! chunk Secrets written first and switched to by rewriting the index Secret, so a crash mid-write leaves the
//! previous blob readable. Readers check the blob's SHA-256 before using it.
//!
//! A Secret the store knows to exist (it read or wrote it) is replaced, one it does not know is created; only
//! when the cluster disagrees (someone deleted or created it meanwhile) is the other request sent. A plain
//! create or replace costs the API server about half of a server-side apply of the same large Secret, and
//! these writes stand on a sync's path. Chunks that a save leaves unused are removed afterwards, by
//! [`StateStore::collect_garbage`], which the engine calls once a sync has finished.

use std::collections::{BTreeMap, HashSet};
use std::io::Read;
use std::sync::{Arc, Mutex};

use flate2::Compression;
use flate2::read::GzDecoder;
use flate2::write::GzEncoder;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, PostParams};
use serde::{Deserialize, Serialize};
use windvane_shared::crypto::digest::sha256_hex;
use windvane_shared::decide::desired::FIELD_MANAGER;

use crate::apply::inventory::Inventory;
use crate::{Error, Result};

/// Largest piece stored in one Secret (Secrets are capped at 1 MiB in total).
const CHUNK_BYTES: usize = 768 * 1024;
/// Label on every state Secret, naming the blob it belongs to.
const BLOB_LABEL: &str = "windvane.io/state";
/// Most bytes a blob may decompress to (a bundle is capped at 64 MiB, plus its pointer).
const MAX_BLOB_BYTES: u64 = 80 * 1024 * 1024;

/// The last known good release: the signed pointer and the bundle it names, both as received.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KnownGood {
    /// The DSSE envelope of the channel pointer, re-verified on every start.
    #[serde(with = "base64_bytes")]
    pub pointer: Vec<u8>,
    /// The bundle bytes, re-checked against the pointer's digest on every start.
    #[serde(with = "base64_bytes")]
    pub bundle: Vec<u8>,
}

/// Reads and writes the agent's state Secrets in one namespace.
#[derive(Clone)]
pub struct StateStore {
    secrets: Api<Secret>,
    namespace: String,
    prefix: String,
    /// Names of this store's Secrets known to exist, because it read or wrote them.
    existing: Arc<Mutex<HashSet<String>>>,
    /// Blobs saved since their unused chunks were last removed, by blob.
    uncollected: Arc<Mutex<BTreeMap<String, Saved>>>,
}

/// What a save left: the name of the blob's index Secret and the chunks that index names.
#[derive(Debug, Clone)]
struct Saved {
    index: String,
    chunks: Vec<String>,
}

impl std::fmt::Debug for StateStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateStore")
            .field("namespace", &self.namespace)
            .field("prefix", &self.prefix)
            .finish()
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct Index {
    sha256: String,
    /// Names of chunk Secrets, in order; empty when the blob is inline.
    chunks: Vec<String>,
}

impl StateStore {
    /// State Secrets named `<prefix>-…` in `namespace`.
    pub fn new(client: kube::Client, namespace: &str, prefix: &str) -> Self {
        Self {
            secrets: Api::namespaced(client, namespace),
            namespace: namespace.to_owned(),
            prefix: prefix.to_owned(),
            existing: Arc::default(),
            uncollected: Arc::default(),
        }
    }

    /// The last known good release, if any.
    pub async fn load_known_good(&self) -> Result<Option<KnownGood>> {
        self.load("release").await
    }

    /// Persists a newly accepted release as last known good.
    pub async fn save_known_good(&self, known_good: &KnownGood) -> Result<()> {
        self.save("release", known_good).await
    }

    /// The inventory, empty when none was saved.
    pub async fn load_inventory(&self) -> Result<Inventory> {
        Ok(self.load("inventory").await?.unwrap_or_default())
    }

    /// Persists the inventory.
    pub async fn save_inventory(&self, inventory: &Inventory) -> Result<()> {
        self.save("inventory", inventory).await
    }

    fn index_name(&self, blob: &str) -> String {
        format!("{}-{blob}", self.prefix)
    }

    async fn load<T: serde::de::DeserializeOwned>(&self, blob: &str) -> Result<Option<T>> {
        let name = self.index_name(blob);
        let object = self.object_name(&name);
        let Some(secret) = self
            .secrets
            .get_opt(&name)
            .await
            .map_err(|e| self.state_error(&name, &e))?
        else {
            return Ok(None);
        };
        self.known_to_exist(&name);
        let data = secret.data.unwrap_or_default();
        let corrupt = |detail: String| Error::StateCorrupt {
            object: object.clone(),
            detail,
        };
        let index: Index = data
            .get("index")
            .ok_or_else(|| corrupt("no index".to_owned()))
            .and_then(|b| serde_json::from_slice(&b.0).map_err(|e| corrupt(e.to_string())))?;
        let compressed = if index.chunks.is_empty() {
            data.get("blob")
                .map(|b| b.0.clone())
                .ok_or_else(|| corrupt("no blob".to_owned()))?
        } else {
            let mut joined = Vec::new();
            for chunk in &index.chunks {
                let secret = self
                    .secrets
                    .get(chunk)
                    .await
                    .map_err(|e| self.state_error(chunk, &e))?;
                let part = secret
                    .data
                    .and_then(|mut d| d.remove("chunk"))
                    .ok_or_else(|| corrupt(format!("chunk {chunk} is empty")))?;
                joined.extend_from_slice(&part.0);
            }
            joined
        };
        if sha256_hex(&compressed) != index.sha256 {
            return Err(corrupt("digest mismatch".to_owned()));
        }
        let mut json = Vec::new();
        GzDecoder::new(compressed.as_slice())
            .take(MAX_BLOB_BYTES + 1)
            .read_to_end(&mut json)
            .map_err(|e| corrupt(format!("gzip: {e}")))?;
        if json.len() as u64 > MAX_BLOB_BYTES {
            return Err(corrupt("larger than the cap".to_owned()));
        }
        serde_json::from_slice(&json)
            .map(Some)
            .map_err(|e| corrupt(e.to_string()))
    }

    async fn save<T: Serialize>(&self, blob: &str, value: &T) -> Result<()> {
        let name = self.index_name(blob);
        let compressed = compress(value).map_err(|error| Error::State {
            object: self.object_name(&name),
            detail: error.to_string(),
        })?;
        let sha256 = sha256_hex(&compressed);

        let mut data = BTreeMap::new();
        let chunks: Vec<String> = if compressed.len() <= CHUNK_BYTES {
            data.insert("blob".to_owned(), ByteString(compressed));
            Vec::new()
        } else {
            let mut names = Vec::new();
            for (i, part) in compressed.chunks(CHUNK_BYTES).enumerate() {
                let chunk_name = format!("{name}-{}-{i}", &sha256[..12]);
                self.put(
                    &chunk_name,
                    blob,
                    BTreeMap::from([("chunk".to_owned(), ByteString(part.to_vec()))]),
                )
                .await?;
                names.push(chunk_name);
            }
            names
        };
        let index = Index {
            sha256,
            chunks: chunks.clone(),
        };
        data.insert(
            "index".to_owned(),
            ByteString(serde_json::to_vec(&index).unwrap_or_default()),
        );
        self.put(&name, blob, data).await?;
        self.uncollected.lock().expect("state store lock").insert(
            blob.to_owned(),
            Saved {
                index: name,
                chunks,
            },
        );
        Ok(())
    }

    /// Removes the Secrets of each blob saved since the last call that its index no longer names: chunks of
    /// an earlier save, or of a save cut short. Runs after a save rather than within it, so that the list it
    /// needs is off the sync's path; a blob whose removal failed is tried again on the next call. Must not
    /// run beside a save (the engine, the only writer, calls it between syncs).
    pub async fn collect_garbage(&self) -> Result<()> {
        let pending = std::mem::take(&mut *self.uncollected.lock().expect("state store lock"));
        let mut result = Ok(());
        for (blob, saved) in pending {
            let removed = match self.list_blob(&blob).await {
                Ok(listed) => {
                    self.remove_stale_chunks(&saved.index, &saved.chunks, listed)
                        .await
                }
                Err(error) => Err(error),
            };
            if let Err(error) = removed {
                // Unless a save since has a newer account of the blob.
                self.uncollected
                    .lock()
                    .expect("state store lock")
                    .entry(blob)
                    .or_insert(saved);
                result = Err(error);
            }
        }
        result
    }

    fn known_to_exist(&self, name: &str) {
        self.existing
            .lock()
            .expect("state store lock")
            .insert(name.to_owned());
    }

    /// Writes the Secret `name` whole: replaced when known to exist, else created; the other when the
    /// cluster disagrees.
    async fn put(&self, name: &str, blob: &str, data: BTreeMap<String, ByteString>) -> Result<()> {
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some(self.namespace.clone()),
                labels: Some(BTreeMap::from([
                    (BLOB_LABEL.to_owned(), format!("{}-{blob}", self.prefix)),
                    (
                        "app.kubernetes.io/managed-by".to_owned(),
                        "windvane-agent".to_owned(),
                    ),
                ])),
                ..ObjectMeta::default()
            },
            data: Some(data),
            type_: Some("Opaque".to_owned()),
            ..Secret::default()
        };
        let params = PostParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..PostParams::default()
        };
        let exists = self
            .existing
            .lock()
            .expect("state store lock")
            .contains(name);
        let written = if exists {
            match self.secrets.replace(name, &params, &secret).await {
                Err(kube::Error::Api(status)) if status.code == 404 => {
                    self.secrets.create(&params, &secret).await
                }
                other => other,
            }
        } else {
            match self.secrets.create(&params, &secret).await {
                Err(kube::Error::Api(status)) if status.code == 409 => {
                    self.secrets.replace(name, &params, &secret).await
                }
                other => other,
            }
        };
        written.map_err(|e| self.state_error(name, &e))?;
        self.known_to_exist(name);
        Ok(())
    }

    /// The names of the Secrets of `blob`, as the API server's cache has them: a consistent list waits for that
    /// cache to catch up with etcd (tens of milliseconds on a busy control plane, on every save), and a
    /// name this list misses is a stale chunk that the next save removes; one it still has that is gone
    /// already is skipped when deleting.
    async fn list_blob(&self, blob: &str) -> Result<Vec<String>> {
        let selector = format!("{BLOB_LABEL}={}-{blob}", self.prefix);
        let list = self
            .secrets
            .list_metadata(&ListParams::default().labels(&selector).match_any())
            .await
            .map_err(|e| self.state_error(&self.index_name(blob), &e))?;
        Ok(list
            .items
            .into_iter()
            .filter_map(|s| s.metadata.name)
            .collect())
    }

    /// Deletes the Secrets of a blob other than its index and the chunks it now uses.
    async fn remove_stale_chunks(
        &self,
        index: &str,
        keep: &[String],
        listed: Vec<String>,
    ) -> Result<()> {
        for name in listed {
            if name == index || keep.contains(&name) {
                continue;
            }
            match self.secrets.delete(&name, &DeleteParams::default()).await {
                Ok(_) => {
                    self.existing
                        .lock()
                        .expect("state store lock")
                        .remove(&name);
                }
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(error) => return Err(self.state_error(&name, &error)),
            }
        }
        Ok(())
    }

    fn object_name(&self, name: &str) -> String {
        format!("Secret {}/{name}", self.namespace)
    }

    fn state_error(&self, name: &str, error: &kube::Error) -> Error {
        Error::State {
            object: self.object_name(name),
            detail: crate::kube::cluster::api_message(error),
        }
    }
}

/// `value` as gzip-compressed JSON, written into the compressor through a buffer: a blob as large as a bundle
/// is never held whole as JSON text, and the compressor is not called once per JSON token. The fastest level:
/// a save after a sync is on the sync's path while the control plane is busiest. With the buffer it took a
/// 1,000-object inventory from 42–64 ms to 2–6 ms (46 KB stored against 45 KB); a release, kept as base64,
/// compresses less at this level (86 KB against 45 KB for 1,000 objects, in 3–6 ms against 9–14 ms).
fn compress<T: Serialize>(value: &T) -> std::io::Result<Vec<u8>> {
    const BUFFER_BYTES: usize = 64 * 1024;
    let encoder = GzEncoder::new(Vec::new(), Compression::fast());
    let mut buffered = std::io::BufWriter::with_capacity(BUFFER_BYTES, encoder);
    serde_json::to_writer(&mut buffered, value)?;
    let encoder = buffered
        .into_inner()
        .map_err(std::io::IntoInnerError::into_error)?;
    encoder.finish()
}

mod base64_bytes {
    use base64::Engine;
    use base64::engine::general_purpose::STANDARD;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
        // Written through as it is encoded, not built as one string first.
        serializer.collect_str(&base64::display::Base64Display::new(bytes, &STANDARD))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(deserializer)?;
        STANDARD.decode(text).map_err(serde::de::Error::custom)
    }
}
