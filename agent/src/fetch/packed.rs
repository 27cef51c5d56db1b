//! A verified bundle's bytes as the engine keeps them while it enforces the release: as received until the
//! release has rendered, then gzip-compressed (on a blocking thread, while the sync applies). They are
//! needed again only to render the release once more (a retried sync), and a bundle of several MB held as
//! it came would cost its whole size for as long as it is enforced.

use std::borrow::Cow;
use std::io::{Read, Write};
use std::sync::Arc;

use flate2::Compression;
use flate2::read::GzDecoder;
use flate2::write::GzEncoder;

/// The bytes of a bundle, as received or compressed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackedBundle {
    bytes: Vec<u8>,
    /// Length of the bytes as received, when `bytes` holds them compressed.
    packed_from: Option<usize>,
}

impl PackedBundle {
    /// The bytes as received.
    pub fn new(bytes: Vec<u8>) -> Self {
        Self {
            bytes,
            packed_from: None,
        }
    }

    /// Compresses the bytes (once; a failure to compress keeps them as they are), on a blocking thread:
    /// beside the caller's other work (a sync's applies), not before it.
    pub async fn pack_aside(&mut self) {
        if self.packed_from.is_some() {
            return;
        }
        let received = Arc::new(std::mem::take(&mut self.bytes));
        let reading = Arc::clone(&received);
        let packed = tokio::task::spawn_blocking(move || compress(&reading)).await;
        match packed {
            Ok(Ok(packed)) => {
                self.packed_from = Some(received.len());
                self.bytes = packed;
            }
            // The blocking task is over (done, failed or never run): its handle on the bytes is gone.
            _ => self.bytes = Arc::try_unwrap(received).unwrap_or_else(|shared| shared.to_vec()),
        }
    }

    /// The bytes as received. Compressed ones are read back whole; `None` only if they no longer decompress
    /// to their length (they were written here, so they do).
    pub fn bytes(&self) -> Option<Cow<'_, [u8]>> {
        let Some(length) = self.packed_from else {
            return Some(Cow::Borrowed(&self.bytes));
        };
        let mut bytes = Vec::with_capacity(length);
        GzDecoder::new(self.bytes.as_slice())
            .take(length as u64 + 1)
            .read_to_end(&mut bytes)
            .ok()?;
        (bytes.len() == length).then_some(Cow::Owned(bytes))
    }

    /// Bytes held now.
    pub fn held(&self) -> usize {
        self.bytes.len()
    }
}

fn compress(bytes: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut encoder = GzEncoder::new(Vec::new(), Compression::fast());
    encoder.write_all(bytes)?;
    encoder.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn packed_bytes_come_back_as_received() {
        let received: Vec<u8> = (0..100_000u32)
            .flat_map(|i| (i % 251).to_le_bytes())
            .collect();
        let mut bundle = PackedBundle::new(received.clone());
        assert_eq!(bundle.bytes().as_deref(), Some(received.as_slice()));
        bundle.pack_aside().await;
        assert!(bundle.held() < received.len() / 4);
        assert_eq!(bundle.bytes().as_deref(), Some(received.as_slice()));
        bundle.pack_aside().await;
        assert_eq!(bundle.bytes().as_deref(), Some(received.as_slice()));
    }
}
