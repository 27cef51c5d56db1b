//! `load_fleet_dir`, the whole fleet-tree loader behind `windvane build`/`publish`/`render`: `fleet.yaml`
//! (fields, names, selectors, policies, paths) and the app manifests, on a real directory.
//!
//! The input is up to four NUL-separated files, written into a fixed tree in a temporary directory before
//! each run: `fleet.yaml`, `apps/api/objects.yaml`, `apps/monitoring/objects.yaml` and `apps/web/objects.json`
//! (a missing part leaves its file out). A tree that loads must give a bundle that an agent accepts, and
//! rendering it must not panic.
#![no_main]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use windvane_fuzz::cluster;
use windvane_shared::format::bundle::{Bundle, BundleLimits};
use windvane_shared::decide::desired::cluster_share;
use windvane_publisher::source::load_fleet_dir;

/// Where each NUL-separated part of an input goes, relative to the fleet root.
const FILES: [&str; 4] = [
    "fleet.yaml",
    "apps/api/objects.yaml",
    "apps/monitoring/objects.yaml",
    "apps/web/objects.json",
];

/// The fleet root, made once per process and kept (with its directory) until the process ends.
fn root() -> &'static Path {
    static ROOT: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    let (_, root) = ROOT.get_or_init(|| {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let root = dir.path().join("fleet");
        for file in FILES {
            let parent = root.join(file);
            std::fs::create_dir_all(parent.parent().expect("a parent")).expect("mkdir");
        }
        (dir, root)
    });
    root
}

fuzz_target!(|data: &[u8]| {
    let root = root();
    let mut parts = data.split(|b| *b == 0);
    for file in FILES {
        let path = root.join(file);
        match parts.next() {
            Some(part) => std::fs::write(&path, part).expect("write a fleet file"),
            None => match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => panic!("removing {}: {e}", path.display()),
            },
        }
    }

    let limits = BundleLimits::default();
    let Ok(bundle) = load_fleet_dir(root, limits) else {
        return;
    };
    // What `windvane build` produces, an agent must accept.
    let accepted = Bundle::from_json_slice(&bundle.to_json_bytes(), limits).unwrap_or_else(|e| {
        panic!("a loaded fleet's bundle is refused by the agent's parser: {e}")
    });
    assert_eq!(accepted.apps.len(), bundle.apps.len());
    let cluster = cluster();
    for share in cluster_share(&accepted, &cluster) {
        let _ = share.objects;
    }
});
