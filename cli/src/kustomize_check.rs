//! What the build-time engines may read of a fleet tree, checked before they run: no symbolic link in a
//! chart or kustomize directory may lead outside the fleet tree, and a kustomization (and every local
//! kustomization it names, followed through `resources`, `bases` and `components`) may name a remote
//! resource only when the command line allows it and the reference is pinned to a commit. The data comes
//! from the fleet tree (untrusted: any pull request changes it); the verdict goes to `engines.rs`, which
//! runs nothing when it is an error.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use windvane_shared::text::yaml::{YamlLimits, documents_to_json};

use crate::error::{Error, Result};

/// The file names kustomize reads as a kustomization, in its order.
const KUSTOMIZATION_FILES: [&str; 3] = ["kustomization.yaml", "kustomization.yml", "Kustomization"];

/// The fields of a kustomization that name other files, directories or remote resources.
const REFERENCE_FIELDS: [&str; 3] = ["resources", "bases", "components"];

/// Most directory entries walked, and kustomizations followed, for one build.
const MAX_ENTRIES: usize = 100_000;
const MAX_KUSTOMIZATIONS: usize = 256;

/// Largest kustomization file read.
const MAX_KUSTOMIZATION_BYTES: u64 = 1 << 20;

/// Refuses a symbolic link under `dir` (recursively) that does not resolve to a path inside `root`.
pub fn check_links(dir: &Path, root: &Path) -> Result<()> {
    let mut pending = vec![dir.to_path_buf()];
    let mut seen = 0usize;
    while let Some(current) = pending.pop() {
        let unreadable = |source| Error::ReadFile {
            path: current.clone(),
            source,
        };
        for entry in std::fs::read_dir(&current).map_err(unreadable)? {
            let entry = entry.map_err(unreadable)?;
            seen += 1;
            if seen > MAX_ENTRIES {
                return Err(Error::TooManyFiles {
                    dir: dir.to_path_buf(),
                    max: MAX_ENTRIES,
                });
            }
            let path = entry.path();
            let kind = entry.file_type().map_err(|source| Error::ReadFile {
                path: path.clone(),
                source,
            })?;
            if kind.is_symlink() {
                inside(&path, root)?;
            } else if kind.is_dir() {
                pending.push(path);
            }
        }
    }
    Ok(())
}

/// Checks that `path` resolves (through any links) to a path inside `root`; the path it resolves to.
pub fn inside(path: &Path, root: &Path) -> Result<PathBuf> {
    match path.canonicalize() {
        Ok(real) if real.starts_with(root) => Ok(real),
        Ok(real) => Err(Error::LinkOutside {
            path: path.to_path_buf(),
            target: real,
        }),
        Err(source) => Err(Error::LinkUnresolved {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Whether a kustomization entry names a remote resource (pure): a URL, a git SSH address, or a host path
/// such as `github.com/org/repo//dir` that is not a file or directory of the tree (`exists_locally`).
pub fn is_remote(entry: &str, exists_locally: bool) -> bool {
    if entry.contains("://") || entry.starts_with("git@") {
        return true;
    }
    let first = entry.split('/').next().unwrap_or_default();
    !exists_locally && entry.contains('/') && first.contains('.') && !first.starts_with('.')
}

/// Whether a remote entry is pinned to a commit: a `ref=` (or `version=`) query of 40 hex digits.
pub fn is_pinned(entry: &str) -> bool {
    let Some((_, query)) = entry.split_once('?') else {
        return false;
    };
    query.split('&').any(|pair| {
        pair.split_once('=').is_some_and(|(key, value)| {
            matches!(key, "ref" | "version")
                && value.len() == 40
                && value.bytes().all(|b| b.is_ascii_hexdigit())
        })
    })
}

/// Checks the kustomization in `directory` and every local kustomization it leads to: links confined to
/// `root`, local references inside `root`, remote ones only when `allow_remote` and pinned.
pub fn check_tree(directory: &Path, root: &Path, allow_remote: bool) -> Result<()> {
    let mut pending = vec![inside(directory, root)?];
    let mut visited = BTreeSet::new();
    while let Some(dir) = pending.pop() {
        if !visited.insert(dir.clone()) {
            continue;
        }
        if visited.len() > MAX_KUSTOMIZATIONS {
            return Err(Error::TooManyKustomizations {
                dir: directory.to_path_buf(),
                max: MAX_KUSTOMIZATIONS,
            });
        }
        check_links(&dir, root)?;
        let Some(file) = KUSTOMIZATION_FILES
            .iter()
            .map(|name| dir.join(name))
            .find(|path| path.is_file())
        else {
            continue;
        };
        for entry in references(&file)? {
            let local = dir.join(&entry);
            if is_remote(&entry, local.exists()) {
                check_remote(&file, entry, allow_remote)?;
                continue;
            }
            if local.exists() {
                let real = inside(&local, root)?;
                if real.is_dir() {
                    pending.push(real);
                }
            }
        }
    }
    Ok(())
}

/// A remote resource `entry` of the kustomization `file`: allowed only by `--kustomize-remote`, and pinned.
fn check_remote(file: &Path, entry: String, allow_remote: bool) -> Result<()> {
    if !allow_remote {
        return Err(Error::RemoteResource {
            file: file.to_path_buf(),
            entry,
        });
    }
    if !is_pinned(&entry) {
        return Err(Error::RemoteNotPinned {
            file: file.to_path_buf(),
            entry,
        });
    }
    Ok(())
}

/// The entries of a kustomization's reference fields.
fn references(file: &Path) -> Result<Vec<String>> {
    let bytes = windvane_store::read_capped_file(file, MAX_KUSTOMIZATION_BYTES, "kustomization")
        .map_err(|source| Error::ReadKustomization {
            file: file.to_path_buf(),
            source,
        })?;
    let text = String::from_utf8(bytes).map_err(|source| Error::KustomizationNotUtf8 {
        file: file.to_path_buf(),
        source,
    })?;
    let shown = file.display().to_string();
    let documents = documents_to_json(&text, &shown, YamlLimits::default()).map_err(|source| {
        Error::ParseKustomization {
            file: file.to_path_buf(),
            source,
        }
    })?;
    let mut out = Vec::new();
    for (_, document) in documents {
        for field in REFERENCE_FIELDS {
            if let Some(list) = document.get(field).and_then(|v| v.as_array()) {
                out.extend(list.iter().filter_map(|v| v.as_str()).map(str::to_owned));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_resources_are_told_from_local_paths() {
        for remote in [
            "https://github.com/org/repo//deploy?ref=v1",
            "github.com/org/repo//deploy",
            "git@github.com:org/repo.git",
            "ssh://git@example.com/repo",
            "example.com/org/repo/base",
        ] {
            assert!(is_remote(remote, false), "{remote}");
        }
        for local in ["../base", "deployment.yaml", "./overlays/prod", "base"] {
            assert!(!is_remote(local, false), "{local}");
        }
        assert!(
            !is_remote("v1.2/base", true),
            "a local directory with a dot"
        );
    }

    #[test]
    fn only_a_commit_pins_a_remote_resource() {
        let sha = "0123456789abcdef0123456789abcdef01234567";
        assert!(is_pinned(&format!("github.com/org/repo//deploy?ref={sha}")));
        assert!(is_pinned(&format!("https://x/y?timeout=1&ref={sha}")));
        assert!(!is_pinned("github.com/org/repo//deploy?ref=main"));
        assert!(!is_pinned("github.com/org/repo//deploy"));
    }
}
