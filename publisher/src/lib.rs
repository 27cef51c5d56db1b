//! Windvane's publisher side: turns a release engineer's fleet source tree into a bundle. It reads the tree
//! ([`source`]: `fleet.yaml`, plain manifests, Helm and kustomize apps), runs the build-time engines
//! ([`prerender`]: plans one `helm template` / `kustomize build` per distinct input, folds the outputs into
//! variants) and reads each file's manifests ([`manifests`]). Linked by the `windvane` command line (`build`,
//! `publish`, `render`, `diff`) and by the tests; never by the agent or the source server, which only verify
//! and apply what was published (`tests/links.rs` checks this).
//!
//! Layers: [`manifests`] < [`prerender`] < [`source`]; each uses only those before it.

pub mod manifests;
pub mod prerender;
pub mod source;

/// The layer table (module → rank): a module uses only modules of a lower rank; `tests/layers.rs` checks it.
pub const LAYERS: &[(&str, u8)] = &[("manifests", 0), ("prerender", 1), ("source", 2)];
