//! The fleet source tree, as a release engineer writes it, read into a [`Bundle`].
//!
//! Where the data comes from: a directory on disk (a git checkout) that `windvane build`, `publish` and
//! `render` are pointed at. Where it goes: the [`Bundle`] is written as JSON, signed and published; agents
//! render it per cluster ([`windvane_shared::decide::render`]).
//!
//! The tree is a `fleet.yaml` at its root and, for each app, a directory of Kubernetes manifests:
//!
//! ```yaml
//! fleet: acme                      # required: lower-case letters, digits and '-', at most 63 characters
//! apps:
//!   - name: monitoring             # required, unique, same form as the fleet name
//!     path: apps/monitoring        # required: a directory inside the root (no '..', not absolute,
//!                                  # no symbolic link out of the root)
//!     selector:                    # optional; absent = every cluster
//!       matchLabels: {env: prod}
//!       matchExpressions: [{key: region, operator: In, values: [eu, us]}]
//!     values: {retention: 15d, replicas: 2}   # optional mapping, used as ${values.retention}
//!     customizations:              # optional; applied in order for the clusters their selector matches
//!       - selector: {matchLabels: {region: eu}}
//!         values: {retention: 30d}
//!     policy:                      # optional; these are the defaults except driftGracePeriod
//!       selfHeal: true             # revert drift (false: only report it)
//!       prune: false               # delete objects that leave the release
//!       driftGracePeriod: 30s      # wait before reverting drift; absent = at once
//!       ignoreDifferences:         # fields owned by someone else, never sent
//!         - {group: apps, kind: Deployment, name: api, jsonPointers: [/spec/replicas]}
//!       prevent: false             # refuse changes to Windvane's fields at admission (break-glass aside)
//!   - name: web                    # a Helm chart: path is a chart directory or .tgz in the tree
//!     path: charts/web
//!     namespace: web
//!     helm:                        # or repo: https://… | oci://…, chart:, version:, digest: sha256:…
//!                                  # (plainHttp: true for an oci:// registry on loopback)
//!       releaseName: web           # default: the app's name
//!       kubeVersion: "1.34.0"      # .Capabilities.KubeVersion; default prerender::DEFAULT_KUBE_VERSION
//!       valuesFiles: [values/web.yaml]         # relative to the fleet root
//!       values: {image: {tag: "1.2"}}
//!     customizations:
//!       - selector: {matchLabels: {env: prod}}
//!         helm: {values: {replicas: 3}}     # layered over the app's values, in order
//!   - name: shop                   # a folder holding a kustomization.yaml is built by kustomize
//!     path: apps/shop/base
//!     customizations:
//!       - selector: {matchLabels: {env: prod}}
//!         kustomize: apps/shop/overlays/prod   # another kustomization; the last matching one wins
//! ```
//!
//! Helm charts and kustomizations are rendered at build time ([`crate::prerender`]) by the engines that
//! [`load_fleet_dir_with`] is given, once per combination of the customizations that change their input.
//!
//! Every `*.yaml`, `*.yml` and `*.json` file under an app's path is part of the app, recursively, in sorted
//! path order, so that the same tree always gives the same bundle (and the same digest). Hidden files and
//! directories (`.git`) are skipped; other files (`README.md`) are ignored; a `kustomization.yaml` below a plain
//! app's folder is refused, because the bundle would silently lack what kustomize would have generated. YAML files may hold several
//! documents; empty ones are skipped; a `kind: List` document is expanded into its items. Both `fleet.yaml` and
//! the manifests are read by [`windvane_shared::text::yaml`]: manifests as kubectl reads them, with a [`YamlWarning`] where a
//! YAML 1.2 reader would differ ([`LoadOptions::strict_yaml`] refuses them instead); `fleet.yaml` strictly.
//! A folder holding a `Chart.yaml` (and no kustomization) is a Helm chart even without `helm:`.
//!
//! ```no_run
//! use windvane_shared::format::bundle::BundleLimits;
//! use windvane_publisher::source::load_fleet_dir;
//!
//! let bundle = load_fleet_dir(std::path::Path::new("fleet"), BundleLimits::default())?;
//! println!("{} apps", bundle.apps.len());
//! # Ok::<(), windvane_shared::Error>(())
//! ```

use std::collections::{HashMap, HashSet};
use std::fs;
use std::io::Read;
use std::path::{Component, Path, PathBuf};

use serde_json::{Map, Value};

use crate::manifests::manifests_of;
use crate::prerender::{
    self, ChartSource, EngineSpec, Engines, HelmSpec, NoEngines, RenderChange, RenderChanges,
    ValuesLayer,
};
use windvane_shared::decide::render;
use windvane_shared::decide::variables::edit_distance;
use windvane_shared::format::bundle::{
    App, BUNDLE_API_VERSION, Bundle, BundleLimits, Customization, IgnoreDifference, Policy,
    check_name,
};
use windvane_shared::spec::rollout::{Gate, Rollout, Wave};
use windvane_shared::spec::selector::{LabelSelector, Operator, Requirement};
use windvane_shared::text::duration::parse_duration;
use windvane_shared::text::yaml::{self, YamlLimits, YamlWarning};
use windvane_shared::{Error, Result};

/// The name of the fleet configuration file at the root of a fleet source tree.
pub const FLEET_FILE: &str = "fleet.yaml";

/// Largest single file read from a fleet tree.
pub const MAX_FILE_BYTES: u64 = 8 << 20;

/// Most bytes read from a whole fleet tree, all files together.
pub const MAX_TREE_BYTES: u64 = 256 << 20;

/// Reads the fleet source tree at `root` into a validated [`Bundle`]: `fleet.yaml`, then every manifest of
/// every app. Errors name the file (relative to the root) and, for `fleet.yaml`, the field
/// (`apps[1].policy.driftGracePeriod`).
///
/// Helm and kustomize apps are refused here (this reads plain folders only); [`load_fleet_dir_with`] renders
/// them with the engines it is given.
pub fn load_fleet_dir(root: &Path, limits: BundleLimits) -> Result<Bundle> {
    load_fleet_dir_with(root, limits, &NoEngines)
}

/// [`load_fleet_dir`], rendering Helm charts and kustomizations with `engines` ([`crate::prerender`]).
pub fn load_fleet_dir_with(
    root: &Path,
    limits: BundleLimits,
    engines: &dyn Engines,
) -> Result<Bundle> {
    load_fleet_source(root, limits, engines, LoadOptions::default()).map(|loaded| loaded.bundle)
}

/// How a fleet tree is read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LoadOptions {
    /// Refuse manifests that kubectl (YAML 1.1) and a YAML 1.2 reader read differently, instead of reading
    /// them as kubectl does with a warning (`windvane build --strict`).
    pub strict_yaml: bool,
}

/// A fleet tree read into a bundle, with what `windvane build` tells its user about it.
#[derive(Debug)]
pub struct Loaded {
    pub bundle: Bundle,
    /// Every scalar of a manifest (a file or an engine's output) read as kubectl reads it where a YAML 1.2
    /// reader reads something else, in the order read.
    pub warnings: Vec<YamlWarning>,
    /// The apps whose manifests hold a Windvane variable (`${cluster.name}`, `${values.…}`), which each
    /// cluster's agent fills in, in the order of `fleet.yaml`.
    pub substituted: Vec<String>,
}

/// [`load_fleet_dir_with`], with the warnings and the apps whose manifests hold variables.
pub fn load_fleet_source(
    root: &Path,
    limits: BundleLimits,
    engines: &dyn Engines,
    options: LoadOptions,
) -> Result<Loaded> {
    let mut warnings = Vec::new();
    let bundle = load_bundle(root, limits, engines, &mut warnings)?;
    if options.strict_yaml
        && let Some(first) = warnings.first()
    {
        return Err(first.clone().into_error());
    }
    let substituted = bundle
        .apps
        .iter()
        .filter(|app| render::uses_variables(app))
        .map(|app| app.name.clone())
        .collect();
    Ok(Loaded {
        bundle,
        warnings,
        substituted,
    })
}

fn load_bundle(
    root: &Path,
    limits: BundleLimits,
    engines: &dyn Engines,
    warnings: &mut Vec<YamlWarning>,
) -> Result<Bundle> {
    let canonical_root = fs::canonicalize(root).map_err(|e| Error::io(root, e))?;
    let mut reader = TreeReader {
        root: canonical_root,
        total: 0,
    };

    let fleet_path = root.join(FLEET_FILE);
    reader.check_inside(&fleet_path, || {
        Error::io(
            &fleet_path,
            std::io::Error::other("a symbolic link out of the fleet root"),
        )
    })?;
    // The full path, so that "not found" says where it looked.
    let text = reader.read(&fleet_path, &fleet_path.display().to_string())?;
    let mut documents = yaml::documents_to_json(&text, FLEET_FILE, YamlLimits::default())?;
    if documents.len() > 1 {
        return Err(Error::Parse {
            file: FLEET_FILE.to_owned(),
            detail: format!(
                "holds {} YAML documents; write the whole fleet in one",
                documents.len()
            ),
        });
    }
    let config = match documents.pop() {
        Some((_, value)) => value,
        None => Value::Object(Map::new()),
    };
    let config = read_fleet_config(&config, limits)?;

    let mut apps = Vec::with_capacity(config.apps.len());
    let mut objects = 0usize;
    for (index, mut app) in config.apps.into_iter().enumerate() {
        // Selectors and pointers are checked before any manifest is read, so that a typo there is the first
        // thing reported.
        app.app.validate()?;
        if let Some((spec, changes)) = engine_spec(&reader, root, &app, index)? {
            let rendered = prerender::render(&app.app.name, &spec, &changes, engines, warnings)?;
            app.app.rendered = Some(rendered);
            objects += app.app.object_count();
            if objects > limits.max_objects {
                return Err(Error::TooMany {
                    what: "objects",
                    found: objects,
                    limit: limits.max_objects,
                });
            }
            apps.push(app.app);
            continue;
        }
        let field = format!("apps[{index}].path");
        let path = app.path.as_deref().unwrap_or_default();
        let files = reader.app_files(root, path, &field)?;
        for (relative, absolute) in files {
            let text = reader.read(&absolute, &relative)?;
            for manifest in manifests_of(&relative, &text, warnings)? {
                objects += 1;
                if objects > limits.max_objects {
                    return Err(Error::TooMany {
                        what: "objects",
                        found: objects,
                        limit: limits.max_objects,
                    });
                }
                app.app.manifests.push(manifest);
            }
        }
        apps.push(app.app);
    }
    let bundle = Bundle {
        api_version: BUNDLE_API_VERSION.to_owned(),
        fleet: config.fleet,
        apps,
        rollout: config.rollout,
    };
    bundle.validate(limits)?;
    for app in &bundle.apps {
        render::check_renders_somewhere(app)?;
    }
    Ok(bundle)
}

/// How an app is rendered by an engine, with its render-changing customizations; `None` for a plain folder
/// of manifests (whose customizations must then change values only).
fn engine_spec(
    reader: &TreeReader,
    root: &Path,
    app: &AppConfig,
    index: usize,
) -> Result<Option<(EngineSpec, RenderChanges)>> {
    let at = format!("apps[{index}]");
    let spec = match (&app.helm, app.path.as_deref()) {
        (Some(helm), path) => EngineSpec::Helm(helm_spec(reader, root, &app.app, helm, path, &at)?),
        (None, Some(path)) => {
            let (directory, shown) =
                reader.resolve(root, path, &format!("{at}.path"), Want::Directory)?;
            if has_kustomization(&directory) {
                EngineSpec::Kustomize { directory, shown }
            } else if directory.join(CHART_FILE).is_file() {
                // A chart as published: recognised by its Chart.yaml, as a kustomization is by its file.
                let helm = HelmConfig::defaults(&format!("{at}.helm"));
                EngineSpec::Helm(helm_spec(reader, root, &app.app, &helm, Some(path), &at)?)
            } else {
                if let Some((_, change)) = app.changes.first() {
                    return Err(config_error(
                        change.at(),
                        "this app is a plain folder of manifests (no helm:, no Chart.yaml and no \
                         kustomization.yaml), so a customization can change its values only",
                    ));
                }
                return Ok(None);
            }
        }
        (None, None) => unreachable!("an app without helm.repo has a path"),
    };
    let mut changes = Vec::with_capacity(app.changes.len());
    for (index, change) in &app.changes {
        let change = match (&spec, change) {
            (EngineSpec::Helm(_), ChangeConfig::Helm(values)) => {
                RenderChange::HelmValues(values_layers(reader, root, values)?)
            }
            (EngineSpec::Kustomize { .. }, ChangeConfig::Kustomize { at, path }) => {
                let (directory, shown) = reader.resolve(root, path, at, Want::Directory)?;
                if !has_kustomization(&directory) {
                    return Err(config_error(
                        at,
                        format!("{path:?} holds no kustomization.yaml"),
                    ));
                }
                RenderChange::KustomizeDirectory { directory, shown }
            }
            (EngineSpec::Helm(_), other @ ChangeConfig::Kustomize { .. }) => {
                return Err(config_error(
                    other.at(),
                    "this app is a Helm chart; customize it with helm: values",
                ));
            }
            (EngineSpec::Kustomize { .. }, other @ ChangeConfig::Helm(_)) => {
                return Err(config_error(
                    other.at(),
                    "this app is a kustomization; a customization may name another kustomize: directory",
                ));
            }
        };
        changes.push((*index, change));
    }
    Ok(Some((spec, changes)))
}

fn helm_spec(
    reader: &TreeReader,
    root: &Path,
    app: &App,
    helm: &HelmConfig,
    path: Option<&str>,
    at: &str,
) -> Result<HelmSpec> {
    let chart = match (&helm.repo, &helm.chart, &helm.version, path) {
        (Some(repo), Some(chart), Some(version), None) => ChartSource::Repository {
            repo: repo.clone(),
            chart: chart.clone(),
            version: version.clone(),
            digest: helm.digest.clone(),
            plain_http: helm.plain_http,
        },
        (Some(_), _, _, Some(_)) => {
            return Err(config_error(
                &format!("{at}.path"),
                "a chart from helm.repo has no path in the fleet tree; remove path: or helm.repo",
            ));
        }
        (None, _, _, Some(named)) => {
            let (path, shown) = reader.resolve(root, named, &format!("{at}.path"), Want::Either)?;
            ChartSource::Path { path, shown }
        }
        _ => unreachable!("read_helm and read_app check repo, chart, version and path together"),
    };
    Ok(HelmSpec {
        chart,
        release_name: helm
            .release_name
            .clone()
            .unwrap_or_else(|| app.name.clone()),
        namespace: app
            .namespace
            .clone()
            .unwrap_or_else(|| "default".to_owned()),
        kube_version: helm
            .kube_version
            .clone()
            .unwrap_or_else(|| prerender::DEFAULT_KUBE_VERSION.to_owned()),
        api_versions: helm.api_versions.clone(),
        values: values_layers(reader, root, &helm.values)?,
    })
}

/// Helm values files (checked to be files inside the root), then the inline values.
fn values_layers(
    reader: &TreeReader,
    root: &Path,
    values: &ValuesConfig,
) -> Result<Vec<ValuesLayer>> {
    let mut layers = Vec::new();
    for (index, file) in values.files.iter().enumerate() {
        let field = format!("{}.valuesFiles[{index}]", values.at);
        let (path, _) = reader.resolve(root, file, &field, Want::File)?;
        layers.push(ValuesLayer::File(path));
    }
    if !values.inline.is_empty() {
        layers.push(ValuesLayer::Inline(values.inline.clone()));
    }
    Ok(layers)
}

impl ChangeConfig {
    fn at(&self) -> &str {
        match self {
            ChangeConfig::Helm(values) => &values.at,
            ChangeConfig::Kustomize { at, .. } => at,
        }
    }
}

fn has_kustomization(directory: &Path) -> bool {
    KUSTOMIZATION_FILES
        .iter()
        .any(|name| directory.join(name).is_file())
}

/// Reads files under the fleet root, keeping the running total under [`MAX_TREE_BYTES`].
struct TreeReader {
    /// The canonical (symlink-free, absolute) root, against which every resolved path is checked.
    root: PathBuf,
    total: u64,
}

impl TreeReader {
    /// Fails with `escape()` when `path` exists and resolves (through symbolic links) outside the root.
    fn check_inside(&self, path: &Path, escape: impl FnOnce() -> Error) -> Result<()> {
        match fs::canonicalize(path) {
            Ok(resolved) if !resolved.starts_with(&self.root) => Err(escape()),
            // A missing file is reported by whoever reads it, with its own message.
            _ => Ok(()),
        }
    }

    /// Reads one file as UTF-8 text, at most [`MAX_FILE_BYTES`], counting toward [`MAX_TREE_BYTES`]. `shown`
    /// is the path as errors show it.
    fn read(&mut self, path: &Path, shown: &str) -> Result<String> {
        let too_big = |detail: String| {
            Error::io(
                shown,
                std::io::Error::new(std::io::ErrorKind::InvalidData, detail),
            )
        };
        let file = fs::File::open(path).map_err(|e| Error::io(shown, e))?;
        let mut bytes = Vec::new();
        // Read one byte past the cap, so that a file exactly at the cap passes and a larger one is caught
        // without reading all of it.
        file.take(MAX_FILE_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| Error::io(shown, e))?;
        let len = bytes.len() as u64;
        if len > MAX_FILE_BYTES {
            return Err(too_big(format!(
                "larger than the cap of {} MiB for one file",
                MAX_FILE_BYTES >> 20
            )));
        }
        self.total += len;
        if self.total > MAX_TREE_BYTES {
            return Err(too_big(format!(
                "the fleet tree is larger than the cap of {} MiB for all files together",
                MAX_TREE_BYTES >> 20
            )));
        }
        String::from_utf8(bytes).map_err(|e| Error::Parse {
            file: shown.to_owned(),
            detail: format!("not UTF-8 text: {e}"),
        })
    }

    /// The manifest files of an app, as (path relative to the root with `/`, path to open), sorted by the
    /// relative path. `field` names the app's `path` in `fleet.yaml`, for errors.
    fn app_files(
        &self,
        root: &Path,
        app_path: &str,
        field: &str,
    ) -> Result<Vec<(String, PathBuf)>> {
        let (directory, relative) = self.resolve(root, app_path, field, Want::Directory)?;
        let resolved = fs::canonicalize(&directory).map_err(|e| Error::io(&directory, e))?;
        let mut files = Vec::new();
        let mut visited = HashSet::new();
        visited.insert(resolved);
        self.walk(&directory, &relative, field, &mut visited, &mut files)?;
        files.sort();
        Ok(files)
    }

    /// A path that `fleet.yaml` names (relative to the root, no `..`, no link out of the root), as (path to
    /// open, path as shown with `/`); it must exist and be what `want` says. `field` names it for errors.
    fn resolve(
        &self,
        root: &Path,
        named: &str,
        field: &str,
        want: Want,
    ) -> Result<(PathBuf, String)> {
        let mut relative = Vec::new();
        for component in Path::new(named).components() {
            match component {
                Component::Normal(part) => match part.to_str() {
                    Some(part) => relative.push(part.to_owned()),
                    None => return Err(config_error(field, "not UTF-8")),
                },
                Component::CurDir => {}
                Component::ParentDir => {
                    return Err(config_error(
                        field,
                        format!(
                            "{named:?} must not contain '..'; it must stay inside the fleet root"
                        ),
                    ));
                }
                Component::RootDir | Component::Prefix(_) => {
                    return Err(config_error(
                        field,
                        format!("{named:?} must be relative to the fleet root, not absolute"),
                    ));
                }
            }
        }
        let path = relative
            .iter()
            .fold(root.to_path_buf(), |path, part| path.join(part));
        let resolved = match fs::canonicalize(&path) {
            Ok(resolved) => resolved,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(config_error(
                    field,
                    format!("{named:?}: no such {} in the fleet root", want.noun()),
                ));
            }
            Err(e) => return Err(Error::io(path, e)),
        };
        if !resolved.starts_with(&self.root) {
            return Err(config_error(
                field,
                format!("{named:?} leads outside the fleet root (through a symbolic link)"),
            ));
        }
        let fits = match want {
            Want::Directory => resolved.is_dir(),
            Want::File => resolved.is_file(),
            Want::Either => true,
        };
        if !fits {
            return Err(config_error(
                field,
                format!("{named:?} is not a {}", want.noun()),
            ));
        }
        Ok((path, relative.join("/")))
    }

    fn walk(
        &self,
        directory: &Path,
        relative: &str,
        field: &str,
        visited: &mut HashSet<PathBuf>,
        files: &mut Vec<(String, PathBuf)>,
    ) -> Result<()> {
        let entries = fs::read_dir(directory).map_err(|e| Error::io(directory, e))?;
        for entry in entries {
            let entry = entry.map_err(|e| Error::io(directory, e))?;
            let path = entry.path();
            let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
                return Err(Error::io(
                    &path,
                    std::io::Error::new(std::io::ErrorKind::InvalidData, "file name is not UTF-8"),
                ));
            };
            if name.starts_with('.') {
                continue;
            }
            let shown = if relative.is_empty() {
                name.clone()
            } else {
                format!("{relative}/{name}")
            };
            if shown == FLEET_FILE {
                // An app at the root (`path: .`) must not read the fleet configuration as a manifest.
                continue;
            }
            let kind = entry.file_type().map_err(|e| Error::io(&path, e))?;
            let target = if kind.is_symlink() {
                let resolved = fs::canonicalize(&path).map_err(|e| Error::io(&path, e))?;
                if !resolved.starts_with(&self.root) {
                    return Err(config_error(
                        field,
                        format!("{shown} is a symbolic link out of the fleet root"),
                    ));
                }
                resolved
            } else {
                path.clone()
            };
            let metadata = fs::metadata(&target).map_err(|e| Error::io(&path, e))?;
            if metadata.is_dir() {
                // A link back up the tree would otherwise be walked forever.
                let canonical = fs::canonicalize(&target).map_err(|e| Error::io(&path, e))?;
                if visited.insert(canonical) {
                    self.walk(&path, &shown, field, visited, files)?;
                }
            } else if metadata.is_file() {
                if is_kustomization(&name) {
                    return Err(config_error(
                        field,
                        format!(
                            "{shown}: a kustomization below the app's folder; point the app's path: at \
                             its directory (the app is then built by kustomize), or name it in a \
                             customization's kustomize:"
                        ),
                    ));
                }
                if [".yaml", ".yml", ".json"]
                    .iter()
                    .any(|ext| name.ends_with(ext))
                {
                    files.push((shown, path));
                }
            }
        }
        Ok(())
    }
}

/// What a path named in `fleet.yaml` must be.
#[derive(Debug, Clone, Copy)]
enum Want {
    Directory,
    File,
    /// A Helm chart: a directory or a `.tgz`.
    Either,
}

impl Want {
    fn noun(self) -> &'static str {
        match self {
            Want::Directory => "directory",
            Want::File => "file",
            Want::Either => "file or directory",
        }
    }
}

/// The file names kustomize reads as a kustomization.
/// The file that makes a folder a Helm chart.
const CHART_FILE: &str = "Chart.yaml";

const KUSTOMIZATION_FILES: [&str; 3] = ["kustomization.yaml", "kustomization.yml", "Kustomization"];

fn is_kustomization(name: &str) -> bool {
    KUSTOMIZATION_FILES.contains(&name)
}

fn config_error(field: &str, detail: impl Into<String>) -> Error {
    Error::FleetConfig {
        file: FLEET_FILE.to_owned(),
        field: field.to_owned(),
        detail: detail.into(),
    }
}

/// `fleet.yaml`, read: the fleet name and the apps (without manifests yet) with their paths.
struct FleetConfig {
    fleet: String,
    apps: Vec<AppConfig>,
    rollout: Option<Rollout>,
}

struct AppConfig {
    app: App,
    /// The app's folder (or Helm chart); absent only for a chart pulled from a repository.
    path: Option<String>,
    /// `helm:`, read.
    helm: Option<HelmConfig>,
    /// Customizations that change an engine's input, as (index, change), ascending.
    changes: Vec<(usize, ChangeConfig)>,
}

/// An app's `helm:` field, with paths still as `fleet.yaml` names them.
struct HelmConfig {
    repo: Option<String>,
    chart: Option<String>,
    version: Option<String>,
    digest: Option<String>,
    /// `plainHttp: true`: pull from an `oci://` registry on loopback over plain HTTP.
    plain_http: bool,
    release_name: Option<String>,
    kube_version: Option<String>,
    api_versions: Vec<String>,
    values: ValuesConfig,
}

impl HelmConfig {
    /// The `helm:` of an app that has none but whose folder is a chart: every default.
    fn defaults(at: &str) -> Self {
        Self {
            repo: None,
            chart: None,
            version: None,
            digest: None,
            plain_http: false,
            release_name: None,
            kube_version: None,
            api_versions: Vec::new(),
            values: ValuesConfig {
                at: at.to_owned(),
                files: Vec::new(),
                inline: Map::new(),
            },
        }
    }
}

/// Helm values as `fleet.yaml` gives them: `valuesFiles` (relative to the fleet root), then `values`.
struct ValuesConfig {
    at: String,
    files: Vec<String>,
    inline: Map<String, Value>,
}

/// A customization's `helm:` or `kustomize:` field.
enum ChangeConfig {
    Helm(ValuesConfig),
    Kustomize { at: String, path: String },
}

fn read_fleet_config(value: &Value, limits: BundleLimits) -> Result<FleetConfig> {
    let top = Object::new(value, "")?;
    top.only(&["fleet", "apps", "rollout"])?;
    let fleet = top.required_str("fleet")?;
    check_name(&fleet).map_err(|error| config_error("fleet", error.to_string()))?;
    let mut apps = Vec::new();
    let mut names: HashMap<String, usize> = HashMap::new();
    let items = top.optional_list("apps")?;
    if items.len() > limits.max_apps {
        return Err(Error::TooMany {
            what: "apps",
            found: items.len(),
            limit: limits.max_apps,
        });
    }
    for (index, item) in items.iter().enumerate() {
        let at = format!("apps[{index}]");
        let app = read_app(item, &at)?;
        if let Some(first) = names.insert(app.app.name.clone(), index) {
            return Err(config_error(
                &format!("{at}.name"),
                format!("app {:?} is already defined as apps[{first}]", app.app.name),
            ));
        }
        apps.push(app);
    }
    check_dependencies(&apps)?;
    let rollout = top
        .get("rollout")
        .map(|v| read_rollout(v, "rollout"))
        .transpose()?;
    Ok(FleetConfig {
        fleet,
        apps,
        rollout,
    })
}

/// An app's `windows:` (maintenance windows), each checked: its schedule, duration and time zone.
fn read_windows(fields: &Object<'_>) -> Result<Vec<windvane_shared::spec::window::Window>> {
    let Some(value) = fields.get("windows") else {
        return Ok(Vec::new());
    };
    let at = fields.path("windows");
    let windows: Vec<windvane_shared::spec::window::Window> = serde_json::from_value(value.clone())
        .map_err(|e| {
            config_error(
                &at,
                format!("{e} (each window: kind allow|deny, schedule, duration, timeZone, heal)"),
            )
        })?;
    windvane_shared::spec::window::validate_all(&windows)
        .map_err(|error| config_error(&at, error.to_string()))?;
    Ok(windows)
}

/// Every `dependsOn` names another app of the fleet, and following them never comes back to an app.
fn check_dependencies(apps: &[AppConfig]) -> Result<()> {
    let index: HashMap<&str, usize> = apps
        .iter()
        .enumerate()
        .map(|(i, a)| (a.app.name.as_str(), i))
        .collect();
    for (i, config) in apps.iter().enumerate() {
        let app = &config.app;
        for (d, dependency) in app.depends_on.iter().enumerate() {
            let at = format!("apps[{i}].dependsOn[{d}]");
            if dependency == &app.name {
                return Err(config_error(
                    &at,
                    format!("app {:?} cannot depend on itself", app.name),
                ));
            }
            if !index.contains_key(dependency.as_str()) {
                return Err(config_error(&at, format!("no app is named {dependency:?}")));
            }
        }
        if let Some(cycle) = dependency_cycle(apps, &index, i) {
            return Err(config_error(
                &format!("apps[{i}].dependsOn"),
                format!("dependency cycle: {}", cycle.join(" -> ")),
            ));
        }
    }
    Ok(())
}

/// A path of `dependsOn` from app `start` back to itself, if there is one (depth-first, each app once).
fn dependency_cycle(
    apps: &[AppConfig],
    index: &HashMap<&str, usize>,
    start: usize,
) -> Option<Vec<String>> {
    let mut stack = vec![(start, vec![apps[start].app.name.clone()])];
    let mut seen = HashSet::new();
    while let Some((at, path)) = stack.pop() {
        for dependency in &apps[at].app.depends_on {
            let Some(&next) = index.get(dependency.as_str()) else {
                continue;
            };
            let mut longer = path.clone();
            longer.push(dependency.clone());
            if next == start {
                return Some(longer);
            }
            if seen.insert(next) {
                stack.push((next, longer));
            }
        }
    }
    None
}

/// `rollout:`: `waves`, each with `name`, `selector`, `percent` (1–100), `soak` (a duration) and `gate`
/// (`healthy` or `none`).
fn read_rollout(value: &Value, at: &str) -> Result<Rollout> {
    let fields = Object::new(value, at)?;
    fields.only(&["waves", "approval"])?;
    let approval = match fields.get("approval") {
        Some(v) => Some(read_approval(v, &fields.path("approval"))?),
        None => None,
    };
    let items = fields.optional_list("waves")?;
    if items.is_empty() && approval.is_none() {
        return Err(config_error(
            &fields.path("waves"),
            "missing: list the waves, e.g. [{name: canary, selector: {matchLabels: {tier: canary}}, soak: 10m}]",
        ));
    }
    let mut waves = Vec::with_capacity(items.len());
    for (index, item) in items.iter().enumerate() {
        let wave = Object::new(item, &format!("{}[{index}]", fields.path("waves")))?;
        wave.only(&["name", "selector", "percent", "soak", "gate"])?;
        let selector = match wave.get("selector") {
            Some(v) => read_selector(v, &wave.path("selector"))?,
            None => LabelSelector::default(),
        };
        selector.validate(&format!("{}.selector", wave.at))?;
        let percent = match wave.get("percent") {
            None => None,
            Some(Value::Number(n)) if n.as_u64().is_some_and(|p| (1..=100).contains(&p)) => {
                n.as_u64().map(|p| p as u32)
            }
            Some(other) => {
                return Err(wrong_type(
                    &wave.path("percent"),
                    "a whole number from 1 to 100",
                    other,
                ));
            }
        };
        let soak = match wave.get("soak") {
            None => std::time::Duration::ZERO,
            Some(Value::String(text)) => {
                let soak = parse_duration(text)
                    .map_err(|e| config_error(&wave.path("soak"), e.to_string()))?;
                if soak > windvane_shared::spec::rollout::MAX_SOAK {
                    return Err(config_error(
                        &wave.path("soak"),
                        format!("{text} is longer than a wave may soak (365d); use a shorter soak"),
                    ));
                }
                soak
            }
            Some(other) => {
                return Err(wrong_type(
                    &wave.path("soak"),
                    "a duration such as 10m",
                    other,
                ));
            }
        };
        let gate = match wave.optional_str("gate")?.as_deref() {
            None | Some("none") => Gate::None,
            Some("healthy") => Gate::Healthy,
            Some(other) => {
                return Err(config_error(
                    &wave.path("gate"),
                    format!("{other:?} is not a gate; use healthy or none"),
                ));
            }
        };
        waves.push(Wave {
            name: wave.optional_str("name")?,
            selector,
            percent,
            soak,
            gate,
        });
    }
    Ok(Rollout {
        waves,
        approval,
        ..Rollout::default()
    })
}

/// `rollout.approval`: `threshold`, how many approver keys must sign (1 or more).
fn read_approval(
    value: &Value,
    at: &str,
) -> Result<windvane_shared::spec::rollout::ApprovalPolicy> {
    let fields = Object::new(value, at)?;
    fields.only(&["threshold"])?;
    match fields.get("threshold") {
        Some(Value::Number(n)) if n.as_u64().is_some_and(|t| (1..=100).contains(&t)) => {
            Ok(windvane_shared::spec::rollout::ApprovalPolicy {
                threshold: n.as_u64().map_or(1, |t| t as u32),
            })
        }
        None => Err(config_error(
            &fields.path("threshold"),
            "missing: how many approver keys must sign, e.g. threshold: 1",
        )),
        Some(other) => Err(wrong_type(
            &fields.path("threshold"),
            "a whole number from 1 to 100",
            other,
        )),
    }
}

fn read_app(value: &Value, at: &str) -> Result<AppConfig> {
    let fields = Object::new(value, at)?;
    fields.only(&[
        "name",
        "path",
        "selector",
        "values",
        "customizations",
        "policy",
        "substitute",
        "namespace",
        "createNamespace",
        "helm",
        "dependsOn",
        "windows",
    ])?;
    let name = fields.required_str("name")?;
    check_name(&name).map_err(|error| config_error(&fields.path("name"), error.to_string()))?;
    let helm = fields
        .get("helm")
        .map(|v| read_helm(v, &fields.path("helm")))
        .transpose()?;
    let path = match helm.as_ref().and_then(|h| h.repo.as_ref()) {
        Some(_) => fields.optional_str("path")?,
        None => Some(fields.required_str("path")?),
    };
    if path.as_deref() == Some("") {
        return Err(config_error(
            &fields.path("path"),
            "empty; name a directory such as apps/monitoring",
        ));
    }
    let selector = match fields.get("selector") {
        Some(v) => read_selector(v, &fields.path("selector"))?,
        None => LabelSelector::default(),
    };
    let values = fields.optional_map("values")?;
    let mut customizations = Vec::new();
    let mut changes = Vec::new();
    for (index, item) in fields.optional_list("customizations")?.iter().enumerate() {
        let custom = Object::new(item, &format!("{}[{index}]", fields.path("customizations")))?;
        custom.only(&["selector", "values", "helm", "kustomize"])?;
        let selector = match custom.get("selector") {
            Some(v) => read_selector(v, &custom.path("selector"))?,
            None => LabelSelector::default(),
        };
        customizations.push(Customization {
            selector,
            values: custom.optional_map("values")?,
        });
        if let Some(change) = read_change(&custom)? {
            changes.push((index, change));
        }
    }
    let policy = match fields.get("policy") {
        Some(v) => read_policy(v, &fields.path("policy"))?,
        None => Policy::default(),
    };
    let app = App {
        name,
        selector,
        values,
        customizations,
        policy,
        namespace: fields.optional_str("namespace")?,
        create_namespace: fields.optional_bool("createNamespace")?.unwrap_or(false),
        substitute: fields.optional_bool("substitute")?.unwrap_or(true),
        depends_on: fields.optional_strings("dependsOn")?,
        windows: read_windows(&fields)?,
        manifests: Vec::new(),
        rendered: None,
    };
    Ok(AppConfig {
        app,
        path,
        helm,
        changes,
    })
}

fn read_helm(value: &Value, at: &str) -> Result<HelmConfig> {
    let fields = Object::new(value, at)?;
    fields.only(&[
        "repo",
        "chart",
        "version",
        "digest",
        "plainHttp",
        "releaseName",
        "kubeVersion",
        "apiVersions",
        "valuesFiles",
        "values",
    ])?;
    let repo = fields.optional_str("repo")?;
    let chart = fields.optional_str("chart")?;
    let version = fields.optional_str("version")?;
    if repo.is_some() && (chart.is_none() || version.is_none()) {
        return Err(config_error(
            &fields.path("repo"),
            "a chart from a repository needs chart: and version: (an exact version, so the bundle is pinned)",
        ));
    }
    if repo.is_none() && (chart.is_some() || version.is_some()) {
        return Err(config_error(
            &fields.path("chart"),
            "chart: and version: name a chart in a repository; give repo: too, or use the app's path: for a \
             chart in the fleet tree",
        ));
    }
    let digest = fields.optional_str("digest")?;
    if let Some(digest) = &digest
        && !is_sha256_digest(digest)
    {
        return Err(config_error(
            &fields.path("digest"),
            format!("{digest:?} is not a digest; write sha256: and 64 lower-case hex digits"),
        ));
    }
    let plain_http = fields.optional_bool("plainHttp")?.unwrap_or(false);
    if plain_http && !repo.as_deref().is_some_and(|r| r.starts_with("oci://")) {
        return Err(config_error(
            &fields.path("plainHttp"),
            "plainHttp is for a chart pulled from an oci:// registry (helm.repo); an http:// repository says \
             so in its URL",
        ));
    }
    Ok(HelmConfig {
        repo,
        chart,
        version,
        digest,
        plain_http,
        release_name: fields.optional_str("releaseName")?,
        kube_version: fields.optional_str("kubeVersion")?,
        api_versions: fields.optional_strings("apiVersions")?,
        values: read_values(&fields)?,
    })
}

fn is_sha256_digest(text: &str) -> bool {
    text.strip_prefix("sha256:").is_some_and(|hex| {
        hex.len() == 64
            && hex
                .chars()
                .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c))
    })
}

fn read_values(fields: &Object) -> Result<ValuesConfig> {
    Ok(ValuesConfig {
        at: fields.at.clone(),
        files: fields.optional_strings("valuesFiles")?,
        inline: fields.optional_map("values")?,
    })
}

fn read_change(custom: &Object) -> Result<Option<ChangeConfig>> {
    match (custom.get("helm"), custom.get("kustomize")) {
        (Some(_), Some(_)) => Err(config_error(
            &custom.path("kustomize"),
            "a customization changes either Helm values or the kustomize directory, not both",
        )),
        (Some(helm), None) => {
            let fields = Object::new(helm, &custom.path("helm"))?;
            fields.only(&["valuesFiles", "values"])?;
            Ok(Some(ChangeConfig::Helm(read_values(&fields)?)))
        }
        (None, Some(_)) => Ok(Some(ChangeConfig::Kustomize {
            at: custom.path("kustomize"),
            path: custom.required_str("kustomize")?,
        })),
        (None, None) => Ok(None),
    }
}

fn read_selector(value: &Value, at: &str) -> Result<LabelSelector> {
    let fields = Object::new(value, at)?;
    fields.only(&["matchLabels", "matchExpressions"])?;
    let mut selector = LabelSelector::default();
    for (key, value) in fields.optional_map("matchLabels")? {
        let field = format!("{}.{key}", fields.path("matchLabels"));
        let value = as_str(&value, &field)?;
        selector.match_labels.insert(key, value.to_owned());
    }
    for (index, item) in fields.optional_list("matchExpressions")?.iter().enumerate() {
        let expression = Object::new(
            item,
            &format!("{}[{index}]", fields.path("matchExpressions")),
        )?;
        expression.only(&["key", "operator", "values"])?;
        let key = expression.required_str("key")?;
        let operator = match expression.required_str("operator")?.as_str() {
            "In" => Operator::In,
            "NotIn" => Operator::NotIn,
            "Exists" => Operator::Exists,
            "DoesNotExist" => Operator::DoesNotExist,
            other => {
                return Err(config_error(
                    &expression.path("operator"),
                    format!("{other:?} is not an operator; use In, NotIn, Exists or DoesNotExist"),
                ));
            }
        };
        let values = expression.optional_strings("values")?;
        selector.match_expressions.push(Requirement {
            key,
            operator,
            values,
        });
    }
    Ok(selector)
}

fn read_policy(value: &Value, at: &str) -> Result<Policy> {
    let fields = Object::new(value, at)?;
    fields.only(&[
        "selfHeal",
        "prune",
        "driftGracePeriod",
        "ignoreDifferences",
        "prevent",
    ])?;
    let defaults = Policy::default();
    let self_heal = fields
        .optional_bool("selfHeal")?
        .unwrap_or(defaults.self_heal);
    let prune = fields.optional_bool("prune")?.unwrap_or(defaults.prune);
    let drift_grace_period = match fields.get("driftGracePeriod") {
        None => None,
        Some(value) => {
            let field = fields.path("driftGracePeriod");
            // A bare number gets the duration parser's own "missing unit" message rather than a type error.
            let text = match value {
                Value::String(s) => s.clone(),
                Value::Number(n) => n.to_string(),
                other => return Err(wrong_type(&field, "a duration such as 30s", other)),
            };
            Some(parse_duration(&text).map_err(|e| config_error(&field, e.to_string()))?)
        }
    };
    let mut ignore_differences = Vec::new();
    for (index, item) in fields
        .optional_list("ignoreDifferences")?
        .iter()
        .enumerate()
    {
        let entry = Object::new(
            item,
            &format!("{}[{index}]", fields.path("ignoreDifferences")),
        )?;
        entry.only(&["group", "kind", "name", "namespace", "jsonPointers"])?;
        let json_pointers = entry.optional_strings("jsonPointers")?;
        if json_pointers.is_empty() {
            return Err(config_error(
                &entry.path("jsonPointers"),
                "missing: name the fields to leave alone, such as [/spec/replicas]",
            ));
        }
        ignore_differences.push(IgnoreDifference {
            group: entry.optional_str("group")?.unwrap_or_default(),
            kind: entry.required_str("kind")?,
            name: entry.optional_str("name")?,
            namespace: entry.optional_str("namespace")?,
            json_pointers,
        });
    }
    Ok(Policy {
        self_heal,
        prune,
        drift_grace_period,
        ignore_differences,
        prevent: fields.optional_bool("prevent")?.unwrap_or(defaults.prevent),
    })
}

/// A mapping of `fleet.yaml` at a known field path, read field by field so that every error names its field.
struct Object<'v> {
    map: &'v Map<String, Value>,
    at: String,
}

impl<'v> Object<'v> {
    fn new(value: &'v Value, at: &str) -> Result<Self> {
        match value {
            Value::Object(map) => Ok(Self {
                map,
                at: at.to_owned(),
            }),
            other => Err(wrong_type(
                if at.is_empty() { "(top level)" } else { at },
                "a mapping",
                other,
            )),
        }
    }

    fn path(&self, key: &str) -> String {
        if self.at.is_empty() {
            key.to_owned()
        } else {
            format!("{}.{key}", self.at)
        }
    }

    /// Refuses any field not in `allowed`, suggesting the closest allowed one.
    fn only(&self, allowed: &[&str]) -> Result<()> {
        for key in self.map.keys() {
            if !allowed.contains(&key.as_str()) {
                let hint = allowed
                    .iter()
                    .map(|candidate| {
                        (
                            edit_distance(
                                &key.to_ascii_lowercase(),
                                &candidate.to_ascii_lowercase(),
                            ),
                            candidate,
                        )
                    })
                    .filter(|(distance, _)| *distance <= 2)
                    .min()
                    .map(|(_, candidate)| format!("did you mean {candidate}? "))
                    .unwrap_or_default();
                return Err(config_error(
                    &self.path(key),
                    format!(
                        "unknown field; {hint}expected one of: {}",
                        allowed.join(", ")
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The field's value; an explicit `null` (`selector:` with nothing after it) counts as absent.
    fn get(&self, key: &str) -> Option<&'v Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    fn required_str(&self, key: &str) -> Result<String> {
        match self.get(key) {
            Some(value) => as_str(value, &self.path(key)).map(str::to_owned),
            None => Err(config_error(&self.path(key), "missing")),
        }
    }

    fn optional_str(&self, key: &str) -> Result<Option<String>> {
        self.get(key)
            .map(|value| as_str(value, &self.path(key)).map(str::to_owned))
            .transpose()
    }

    fn optional_bool(&self, key: &str) -> Result<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(other) => Err(wrong_type(&self.path(key), "true or false", other)),
        }
    }

    fn optional_map(&self, key: &str) -> Result<Map<String, Value>> {
        match self.get(key) {
            None => Ok(Map::new()),
            Some(Value::Object(map)) => Ok(map.clone()),
            Some(other) => Err(wrong_type(&self.path(key), "a mapping", other)),
        }
    }

    fn optional_list(&self, key: &str) -> Result<&'v [Value]> {
        match self.get(key) {
            None => Ok(&[]),
            Some(Value::Array(items)) => Ok(items),
            Some(other) => Err(wrong_type(&self.path(key), "a list", other)),
        }
    }

    fn optional_strings(&self, key: &str) -> Result<Vec<String>> {
        let field = self.path(key);
        self.optional_list(key)?
            .iter()
            .enumerate()
            .map(|(index, value)| as_str(value, &format!("{field}[{index}]")).map(str::to_owned))
            .collect()
    }
}

fn as_str<'v>(value: &'v Value, field: &str) -> Result<&'v str> {
    match value {
        Value::String(s) => Ok(s),
        other => Err(wrong_type(field, "a string", other)),
    }
}

fn wrong_type(field: &str, expected: &str, found: &Value) -> Error {
    // `tier: 1` or `enabled: true` where a string is needed is almost always a missing pair of quotes.
    let hint = if expected == "a string" && (found.is_number() || found.is_boolean()) {
        " (quote it to make it a string)"
    } else {
        ""
    };
    let found = match found {
        Value::Null => "nothing".to_owned(),
        Value::Bool(b) => format!("the boolean {b}"),
        Value::Number(n) => format!("the number {n}"),
        Value::String(s) => format!("the string {s:?}"),
        Value::Array(_) => "a list".to_owned(),
        Value::Object(_) => "a mapping".to_owned(),
    };
    config_error(field, format!("expected {expected}, found {found}{hint}"))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn config(yaml_text: &str) -> Result<FleetConfig> {
        let docs = yaml::documents_to_json(yaml_text, FLEET_FILE, YamlLimits::default())?;
        let value = docs
            .into_iter()
            .next()
            .map_or(Value::Object(Map::new()), |(_, v)| v);
        read_fleet_config(&value, BundleLimits::default())
    }

    #[test]
    fn reads_the_rollout_waves_and_names_bad_fields() {
        let rollout = config(
            "fleet: acme\nrollout:\n  waves:\n    - name: canary\n      selector: {matchLabels: {tier: canary}}\n      soak: 20s\n      gate: healthy\n    - percent: 40\n      soak: 1m\n    - {}\n",
        )
        .expect("config")
        .rollout
        .expect("rollout");
        assert_eq!(rollout.waves.len(), 3);
        assert_eq!(rollout.waves[0].name.as_deref(), Some("canary"));
        assert_eq!(rollout.waves[0].gate, Gate::Healthy);
        assert_eq!(rollout.waves[0].soak, std::time::Duration::from_secs(20));
        assert_eq!(rollout.waves[1].percent, Some(40));
        assert_eq!(rollout.waves[1].gate, Gate::None);
        assert!(config("fleet: acme\n").expect("config").rollout.is_none());
        for (yaml_text, field, says) in [
            (
                "rollout: {waves: [{percent: 0}]}",
                "rollout.waves[0].percent",
                "1 to 100",
            ),
            (
                "rollout: {waves: [{percent: 101}]}",
                "rollout.waves[0].percent",
                "1 to 100",
            ),
            (
                "rollout: {waves: [{soak: 10}]}",
                "rollout.waves[0].soak",
                "duration",
            ),
            (
                "rollout: {waves: [{soak: 10 minutes}]}",
                "rollout.waves[0].soak",
                "",
            ),
            (
                "rollout: {waves: [{soak: 366d}]}",
                "rollout.waves[0].soak",
                "longer than a wave may soak",
            ),
            (
                "rollout: {waves: [{gate: green}]}",
                "rollout.waves[0].gate",
                "healthy or none",
            ),
            (
                "rollout: {waves: [{sok: 1m}]}",
                "rollout.waves[0].sok",
                "did you mean soak",
            ),
            ("rollout: {waves: []}", "rollout.waves", "missing"),
        ] {
            let (found, detail) = field_error(&format!("fleet: acme\n{yaml_text}\n"));
            assert_eq!(found, field, "{yaml_text}");
            assert!(detail.contains(says), "{yaml_text}: {detail}");
        }
    }

    #[test]
    fn reads_maintenance_windows_and_names_bad_fields() {
        let apps = "fleet: acme\napps:\n  - name: web\n    path: web\n    windows:\n      - {kind: deny, schedule: \"0 22 * * 1-5\", duration: 8h, timeZone: Europe/Berlin, heal: report}\n      - {kind: allow, schedule: \"*/30 * * * *\", duration: 10m}\n";
        let read = config(apps).expect("config");
        let windows = &read.apps[0].app.windows;
        assert_eq!(windows.len(), 2);
        assert_eq!(windows[0].time_zone, "Europe/Berlin");
        assert_eq!(
            windows[0].heal,
            windvane_shared::spec::window::HealInWindow::Report
        );
        assert_eq!(windows[1].time_zone, "UTC", "the default time zone");
        assert_eq!(windows[1].duration, std::time::Duration::from_secs(600));
        for (window, says) in [
            (
                "{kind: deny, schedule: \"0 25 * * *\", duration: 1h}",
                "hour 25 is out of range 0-23",
            ),
            (
                "{kind: deny, schedule: \"@daily\", duration: 1h}",
                "write \"0 0 * * *\"",
            ),
            (
                "{kind: deny, schedule: \"0 1 * * *\", duration: 1h, timeZone: Mars/Olympus}",
                "not a known IANA time zone",
            ),
            (
                "{kind: deny, schedule: \"0 1 * * *\", duration: 0s}",
                "must be more than 0",
            ),
            (
                "{kind: deny, schedule: \"0 1 * * *\", duration: 40d}",
                "at most",
            ),
            (
                "{kind: allow, schedule: \"0 1 * * *\", duration: 1h, heal: report}",
                "only a deny window",
            ),
            (
                "{kind: sometimes, schedule: \"0 1 * * *\", duration: 1h}",
                "kind allow|deny",
            ),
            (
                "{kind: deny, schedule: \"0 1 * * *\", duration: 1h, zone: UTC}",
                "unknown field",
            ),
        ] {
            let yaml_text = format!("apps: [{{name: web, path: web, windows: [{window}]}}]");
            let (found, detail) = field_error(&format!("fleet: acme\n{yaml_text}\n"));
            assert_eq!(found, "apps[0].windows", "{window}");
            assert!(detail.contains(says), "{window}: {detail}");
        }
    }

    #[test]
    fn depends_on_names_other_apps_without_a_cycle() {
        let apps = "fleet: acme\napps:\n  - {name: db, path: db}\n  - {name: web, path: web, dependsOn: [db]}\n";
        let read = config(apps).expect("config");
        assert_eq!(read.apps[1].app.depends_on, vec!["db".to_owned()]);
        assert!(read.apps[0].app.depends_on.is_empty());
        for (yaml_text, field, says) in [
            (
                "apps: [{name: web, path: web, dependsOn: [cache]}]",
                "apps[0].dependsOn[0]",
                "no app is named \"cache\"",
            ),
            (
                "apps: [{name: web, path: web, dependsOn: [web]}]",
                "apps[0].dependsOn[0]",
                "itself",
            ),
            (
                "apps: [{name: a, path: a, dependsOn: [b]}, {name: b, path: b, dependsOn: [c]}, {name: c, path: c, dependsOn: [a]}]",
                "apps[0].dependsOn",
                "dependency cycle: a -> b -> c -> a",
            ),
            (
                "apps: [{name: a, path: a, dependsOn: db}]",
                "apps[0].dependsOn",
                "",
            ),
        ] {
            let (found, detail) = field_error(&format!("fleet: acme\n{yaml_text}\n"));
            assert_eq!(found, field, "{yaml_text}");
            assert!(detail.contains(says), "{yaml_text}: {detail}");
        }
    }

    fn field_error(yaml_text: &str) -> (String, String) {
        match config(yaml_text) {
            Err(Error::FleetConfig {
                file,
                field,
                detail,
            }) => {
                assert_eq!(file, FLEET_FILE);
                (field, detail)
            }
            Err(other) => panic!("expected FleetConfig, got {other}"),
            Ok(_) => panic!("expected FleetConfig, got Ok"),
        }
    }

    #[test]
    fn reads_every_field() {
        let c = config(
            "fleet: acme\napps:\n  - name: mon\n    path: apps/mon\n    selector:\n      matchLabels: {env: prod}\n      \
             matchExpressions: [{key: region, operator: NotIn, values: [cn]}, {key: gpu, operator: Exists}]\n    \
             values: {retention: 15d, replicas: 2}\n    customizations:\n      - selector: {matchLabels: {region: eu}}\n        \
             values: {retention: 30d}\n    policy: {selfHeal: false, prune: true, prevent: true, driftGracePeriod: 30s, ignoreDifferences: \
             [{group: apps, kind: Deployment, name: api, jsonPointers: [/spec/replicas]}]}\n",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.fleet, "acme");
        let app = &c.apps[0].app;
        assert_eq!(c.apps[0].path.as_deref(), Some("apps/mon"));
        assert_eq!(app.selector.to_string(), "env=prod,region!=cn,gpu");
        assert_eq!(
            json!(app.values),
            json!({"retention": "15d", "replicas": 2})
        );
        assert_eq!(app.customizations[0].selector.to_string(), "region=eu");
        assert!(!app.policy.self_heal && app.policy.prune && app.policy.prevent);
        assert_eq!(
            app.policy.drift_grace_period,
            Some(std::time::Duration::from_secs(30))
        );
        assert_eq!(
            app.policy.ignore_differences[0].json_pointers,
            vec!["/spec/replicas"]
        );
        assert_eq!(
            app.policy.ignore_differences[0].name.as_deref(),
            Some("api")
        );
    }

    #[test]
    fn defaults() {
        let c = config("fleet: acme\napps:\n  - {name: a, path: a, selector: }\n")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.apps[0].app.policy, Policy::default());
        assert!(c.apps[0].app.selector.is_empty());
        assert!(
            config("fleet: acme\n")
                .unwrap_or_else(|e| panic!("{e}"))
                .apps
                .is_empty()
        );
    }

    #[test]
    fn field_errors_name_the_field() {
        let app = "fleet: acme\napps:\n  - {name: a, path: a}\n  - name: b\n    path: b\n";
        assert_eq!(field_error("apps: []\n").0, "fleet");
        assert_eq!(field_error("fleet: Acme\n").0, "fleet");
        assert_eq!(field_error("fleet: acme\nfleets: x\n").0, "fleets");
        assert_eq!(
            field_error(&format!("{app}    policy: {{driftGracePeriod: 30}}\n")).0,
            "apps[1].policy.driftGracePeriod"
        );
        let (field, detail) =
            field_error(&format!("{app}    policy: {{driftGracePeriod: soon}}\n"));
        assert_eq!(field, "apps[1].policy.driftGracePeriod");
        assert!(detail.contains("invalid duration"), "{detail}");
        let (field, detail) = field_error(&format!("{app}    polcy: {{}}\n"));
        assert_eq!(field, "apps[1].polcy");
        assert!(detail.contains("did you mean policy?"), "{detail}");
        let (field, detail) = field_error(&format!("{app}    policy: {{selfHeal: \"no\"}}\n"));
        assert_eq!(field, "apps[1].policy.selfHeal");
        assert!(detail.contains("expected true or false"), "{detail}");
        let (field, detail) = field_error(&format!(
            "{app}    selector: {{matchLabels: {{tier: 1}}}}\n"
        ));
        assert_eq!(field, "apps[1].selector.matchLabels.tier");
        assert!(detail.contains("quote it"), "{detail}");
        assert_eq!(
            field_error(&format!(
                "{app}    selector: {{matchExpressions: [{{key: a, operator: in, values: [x]}}]}}\n"
            ))
            .0,
            "apps[1].selector.matchExpressions[0].operator"
        );
        assert_eq!(
            field_error(&format!("{app}    values: [1]\n")).0,
            "apps[1].values"
        );
        assert_eq!(
            field_error(&format!(
                "{app}    customizations: [{{values: {{}}, selecter: {{}}}}]\n"
            ))
            .0,
            "apps[1].customizations[0].selecter"
        );
        assert_eq!(
            field_error("fleet: acme\napps:\n  - {path: a}\n").0,
            "apps[0].name"
        );
        assert_eq!(
            field_error("fleet: acme\napps:\n  - {name: a}\n").0,
            "apps[0].path"
        );
        assert_eq!(
            field_error("fleet: acme\napps:\n  - {name: a, path: \"\"}\n").0,
            "apps[0].path"
        );
        assert_eq!(
            field_error("fleet: acme\napps:\n  - {name: a_b, path: a}\n").0,
            "apps[0].name"
        );
        let (field, detail) =
            field_error("fleet: acme\napps:\n  - {name: a, path: a}\n  - {name: a, path: b}\n");
        assert_eq!(field, "apps[1].name");
        assert!(detail.contains("apps[0]"), "{detail}");
        assert_eq!(
            field_error(&format!(
                "{app}    policy: {{ignoreDifferences: [{{kind: Deployment}}]}}\n"
            ))
            .0,
            "apps[1].policy.ignoreDifferences[0].jsonPointers"
        );
        assert_eq!(
            field_error(&format!(
                "{app}    policy: {{ignoreDifferences: [{{jsonPointers: [/a]}}]}}\n"
            ))
            .0,
            "apps[1].policy.ignoreDifferences[0].kind"
        );
        assert_eq!(field_error("- a\n").0, "(top level)");
    }

    #[test]
    fn names() {
        for good in ["a", "acme", "team-1", &"x".repeat(63)] {
            check_name(good).unwrap();
        }
        for bad in ["", "-a", "a-", "A", "a.b", "a_b", &"x".repeat(64)] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn lists_expand_and_json_files_are_one_document() {
        let list = "apiVersion: v1\nkind: List\nitems:\n  - {apiVersion: v1, kind: ConfigMap, metadata: {name: a}}\n  \
                    - {apiVersion: v1, kind: ConfigMap, metadata: {name: b}}\n";
        let manifests = manifests_of("x.yaml", &format!("---\n{list}"), &mut Vec::new())
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(manifests.len(), 2);
        assert!(
            manifests
                .iter()
                .all(|m| m.document == 0 && m.file == "x.yaml")
        );
        assert!(matches!(
            manifests_of("x.yaml", "apiVersion: v1\nkind: List\n", &mut Vec::new()),
            Err(Error::Manifest { .. })
        ));
        let typed = "apiVersion: v1\nkind: ConfigMapList\nitems:\n  - {apiVersion: v1, kind: ConfigMap, metadata: {name: a}}\n  \
                     - {apiVersion: v1, kind: ConfigMap, metadata: {name: b}}\n";
        let names: Vec<_> = manifests_of("y.yaml", typed, &mut Vec::new())
            .unwrap_or_else(|e| panic!("{e}"))
            .iter()
            .map(|m| m.object["metadata"]["name"].clone())
            .collect();
        assert_eq!(names, ["a", "b"]);
        let bad = "apiVersion: v1\nkind: RoleBindingList\nitems:\n  - {apiVersion: v1, kind: ConfigMap, metadata: {name: a}}\n  \
                   - {metadata: {name: b}}\n";
        match manifests_of("z.yaml", bad, &mut Vec::new()) {
            Err(Error::Manifest { file, detail, .. }) => {
                assert_eq!(file, "z.yaml");
                assert!(
                    detail.contains("RoleBindingList item 1") && detail.contains("apiVersion"),
                    "{detail}"
                );
            }
            other => panic!("{other:?}"),
        }
        let json_manifest = manifests_of(
            "x.json",
            r#"{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}}"#,
            &mut Vec::new(),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(json_manifest[0].document, 0);
    }

    #[test]
    fn plain_http_is_read_for_oci_repositories_only() {
        let app = |helm: &str| format!("fleet: acme\napps:\n  - name: web\n    helm: {helm}\n");
        let read = config(&app(
            "{repo: oci://127.0.0.1:5000/charts, chart: web, version: 1.0.0, plainHttp: true}",
        ))
        .expect("config");
        assert!(read.apps[0].helm.as_ref().expect("helm").plain_http);
        let (field, detail) = field_error(&app(
            "{repo: https://charts.example.com, chart: web, version: 1.0.0, plainHttp: true}",
        ));
        assert_eq!(field, "apps[0].helm.plainHttp");
        assert!(detail.contains("oci://"), "{detail}");
    }

    #[test]
    fn edit_distances() {
        assert_eq!(edit_distance("polcy", "policy"), 1);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("same", "same"), 0);
    }
}
