//! `windvane build`: reads a fleet source tree (running helm and kustomize for the apps that need them, see
//! `engines.rs`), checks it, and writes the unsigned bundle to a file or standard output — the CI lint step.
//! Also how `publish` and `render` read their SOURCE: a tree is built the same way, a file is read as a
//! bundle built earlier. What reading the tree noticed goes to standard error.

use std::io::Write;
use std::path::{Path, PathBuf};

use clap::Args;
use windvane_publisher::source::{self, LoadOptions, Loaded};
use windvane_shared::crypto::digest::sha256_hex;
use windvane_shared::format::bundle::{Bundle, BundleLimits};
use windvane_shared::format::release;
use windvane_store as store;

use crate::args::StrictArgs;
use crate::engines::EngineArgs;
use crate::error::{Error, Result};

#[derive(Debug, Args)]
pub struct BuildArgs {
    /// The fleet source tree (the directory holding fleet.yaml).
    #[arg(value_name = "SOURCE")]
    source: PathBuf,
    /// Where to write the bundle; `-` for standard output.
    #[arg(short, long, value_name = "FILE")]
    output: PathBuf,
    #[command(flatten)]
    strict: StrictArgs,
    #[command(flatten)]
    engines: EngineArgs,
}

pub fn build(args: BuildArgs) -> Result<()> {
    let loaded = load_tree(&args.source, &args.engines, args.strict.strict)?;
    let bundle = loaded.bundle;
    let bytes = bundle.to_json_bytes();
    let summary = summary_line(&bundle, &bytes);
    if args.output.as_os_str() == "-" {
        std::io::stdout()
            .write_all(&bytes)
            .map_err(|source| Error::Stdout {
                what: "the bundle",
                source,
            })?;
        eprintln!("built {summary}");
    } else {
        let path = absolute(&args.output)?;
        store::write_atomic(&path, &bytes).map_err(|source| Error::WriteBundle { path, source })?;
        println!("built {}: {summary}", args.output.display());
    }
    Ok(())
}

/// A fleet tree (directory) is built, its warnings and variables reported on standard error; a file is
/// read as a bundle built earlier.
pub fn load_bundle_source(path: &Path, engines: &EngineArgs, strict: bool) -> Result<Bundle> {
    if path.is_dir() {
        return Ok(load_tree(path, engines, strict)?.bundle);
    }
    let bytes = store::read_capped_file(path, release::DEFAULT_MAX_BUNDLE_BYTES, "bundle")
        .map_err(|source| Error::ReadBundleFile {
            path: path.to_path_buf(),
            source,
        })?;
    Bundle::from_json_slice(&bytes, BundleLimits::default()).map_err(|source| {
        Error::NotTreeNorBundle {
            path: path.to_path_buf(),
            source,
        }
    })
}

/// Builds the fleet tree at `tree` with the real engines and reports what reading it noticed.
fn load_tree(tree: &Path, engines: &EngineArgs, strict: bool) -> Result<Loaded> {
    let engines = engines.engines(tree)?;
    let options = LoadOptions {
        strict_yaml: strict,
    };
    let loaded = source::load_fleet_source(tree, BundleLimits::default(), &engines, options)
        .map_err(|source| Error::LoadTree {
            tree: tree.to_path_buf(),
            source,
        })?;
    report_loaded(&loaded);
    Ok(loaded)
}

/// Most YAML warnings printed one by one; the rest are counted.
const MAX_WARNINGS_SHOWN: usize = 20;

/// Tells the user, on standard error, what reading the tree noticed: YAML read as kubectl reads it where a
/// YAML 1.2 reader would not (file and line), and which apps hold variables that each cluster fills in.
fn report_loaded(loaded: &Loaded) {
    for warning in loaded.warnings.iter().take(MAX_WARNINGS_SHOWN) {
        // File names come from the tree and from charts' `# Source:` lines: no control characters reach the
        // terminal.
        let text: String = warning
            .to_string()
            .chars()
            .map(|c| if c.is_control() { '?' } else { c })
            .collect();
        eprintln!("warning: {text}");
    }
    if let Some(more) = loaded.warnings.len().checked_sub(MAX_WARNINGS_SHOWN)
        && more > 0
    {
        eprintln!(
            "warning: {more} more YAML 1.1 forms read as kubectl reads them (--strict lists the first)"
        );
    }
    if loaded.substituted.is_empty() {
        eprintln!("variables: none (no app's manifests hold ${{cluster.…}} or ${{values.…}})");
    } else {
        eprintln!(
            "variables: substituted per cluster in app(s) {}",
            loaded.substituted.join(", ")
        );
    }
}

fn summary_line(bundle: &Bundle, bytes: &[u8]) -> String {
    let objects: usize = bundle.apps.iter().map(|a| a.object_count()).sum();
    format!(
        "fleet {}, {} apps, {objects} objects, {} bytes, sha256 {}",
        bundle.fleet,
        bundle.apps.len(),
        bytes.len(),
        sha256_hex(bytes)
    )
}

fn absolute(path: &Path) -> Result<PathBuf> {
    if path.is_absolute() {
        return Ok(path.to_path_buf());
    }
    let here = std::env::current_dir().map_err(|source| Error::CurrentDir { source })?;
    Ok(here.join(path))
}
