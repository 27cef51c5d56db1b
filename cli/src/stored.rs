//! A bundle already in a store, read back to be signed again on another serial or channel (`rollback`,
//! `promote`). The digest a signed pointer named is the only thing trusted: the bytes must have it, must
//! parse as a bundle that serializes back to the same bytes, and must be the expected fleet's.

use windvane_shared::crypto::digest::sha256_hex;
use windvane_shared::format::bundle::{Bundle, BundleLimits};
use windvane_shared::format::release::DEFAULT_MAX_BUNDLE_BYTES;
use windvane_store::{self as store, Store};

use crate::error::{Error, Result};
use crate::http::block_on;

/// Reads the bundle `sha256` from the store, checking its digest and that it is `fleet`'s.
pub fn stored_bundle(root: &Store, sha256: &str, fleet: &str) -> Result<Bundle> {
    let relative = store::bundle_path(sha256);
    let path = root.describe(&relative);
    let bytes = block_on(root.read(&relative, DEFAULT_MAX_BUNDLE_BYTES, "bundle"))?
        .map_err(|source| Error::ReadStoredBundle {
            path: path.clone(),
            source,
        })?
        .ok_or_else(|| Error::BundleNotInStore { path: path.clone() })?;
    if sha256_hex(&bytes) != sha256 {
        return Err(Error::BundleDigest { path });
    }
    let bundle = Bundle::from_json_slice(&bytes, BundleLimits::default()).map_err(|source| {
        Error::BundleParse {
            path: path.clone(),
            source,
        }
    })?;
    if sha256_hex(&bundle.to_json_bytes()) != sha256 {
        return Err(Error::BundleNotCanonical { path });
    }
    if bundle.fleet != fleet {
        return Err(Error::BundleOtherFleet {
            path,
            found: bundle.fleet,
            fleet: fleet.to_owned(),
        });
    }
    Ok(bundle)
}
