//! Helm charts and kustomizations, rendered at build time by their own engines.
//!
//! Where the data comes from: an app of `fleet.yaml` that is a Helm chart (`helm:`) or whose folder holds a
//! `kustomization.yaml`, and the customizations that change the engine's input (`helm:` values, another
//! `kustomize:` directory). Where it goes: a [`Rendered`] in the app of the bundle — one [`Variant`] per
//! distinct output — which agents pick from by their labels ([`App::manifests_for`]).
//!
//! The decisions here are pure: [`plan`] works out which engine inputs a cluster can end up with (every
//! subset of the render-changing customizations; identical inputs rendered once), [`helm_manifests`] and
//! [`kustomize_manifests`] read an engine's output into manifests and give Helm hooks their meaning, and
//! [`assemble`] folds identical outputs into one variant. Running the engines is the caller's, behind
//! [`Engines`] (the `windvane` command line runs the real `helm` and `kustomize` binaries).
//!
//! What a chart can branch on: its values (the app's, then each matching customization's, in order),
//! `.Release.Name`, `.Release.Namespace`, `.Capabilities.KubeVersion` (`helm.kubeVersion`) and
//! `.Capabilities.APIVersions` (`helm.apiVersions`). It cannot branch on a cluster's name or labels: a
//! `${cluster.name}` in values reaches the chart as that literal text and is filled in by the agent in the
//! output, so a chart may print it but not compare it. `lookup` sees no cluster (helm template has none), and
//! functions such as `randAlphaNum` or `now` change the bundle's digest on every build.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde_json::{Map, Value};

use windvane_shared::decide::desired::WAVE_ANNOTATION;
use windvane_shared::format::bundle::{Manifest, Rendered, Variant};
use windvane_shared::text::yaml::YamlWarning;
use windvane_shared::{Error, Result};

/// Most distinct engine inputs one app may need; each is one run of the engine at build time.
pub const MAX_RENDERS: usize = 64;

/// The Kubernetes version charts see as `.Capabilities.KubeVersion` unless `helm.kubeVersion` says another:
/// the oldest minor Windvane supports, so a chart never picks an API the oldest cluster lacks.
pub const DEFAULT_KUBE_VERSION: &str = "1.34.0";

/// How one app is rendered.
#[derive(Debug, Clone, PartialEq)]
pub enum EngineSpec {
    Helm(HelmSpec),
    /// `kustomize build` of this directory (absolute), unless a customization names another.
    Kustomize {
        directory: PathBuf,
        shown: String,
    },
}

/// A Helm app, from `fleet.yaml`.
#[derive(Debug, Clone, PartialEq)]
pub struct HelmSpec {
    pub chart: ChartSource,
    pub release_name: String,
    pub namespace: String,
    pub kube_version: String,
    pub api_versions: Vec<String>,
    /// The app's own values: files, then inline.
    pub values: Vec<ValuesLayer>,
}

/// Where a chart comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum ChartSource {
    /// A chart directory or `.tgz` in the fleet tree (absolute path, and as `fleet.yaml` names it).
    Path { path: PathBuf, shown: String },
    /// A chart repository (`https://…`) or OCI registry (`oci://…`), pulled at build time.
    Repository {
        repo: String,
        chart: String,
        version: String,
        /// `sha256:…` the pulled chart must have: its OCI manifest's digest (what `helm push` prints) or its
        /// archive's (what a repository's `index.yaml` lists); when absent the pulled digests are only recorded.
        digest: Option<String>,
        /// Pull from an `oci://` registry over plain HTTP (`helm pull --plain-http`); loopback hosts only.
        plain_http: bool,
    },
}

/// One layer of Helm values, merged in order by Helm itself.
#[derive(Debug, Clone, PartialEq)]
pub enum ValuesLayer {
    /// A values file in the fleet tree (absolute path).
    File(PathBuf),
    Inline(Map<String, Value>),
}

/// What one render-changing customization changes.
#[derive(Debug, Clone, PartialEq)]
pub enum RenderChange {
    /// Helm values layered over the app's.
    HelmValues(Vec<ValuesLayer>),
    /// Another kustomize directory (absolute, and as shown); the last matching one wins.
    KustomizeDirectory { directory: PathBuf, shown: String },
}

/// The render-changing customizations of an app: (index into its customizations, what it changes), ascending.
pub type RenderChanges = Vec<(usize, RenderChange)>;

/// One run of an engine: its input and every combination of customizations that leads to it.
#[derive(Debug, Clone, PartialEq)]
pub struct RenderJob {
    pub input: EngineInput,
    /// Ascending indices of the app's customizations, one set per way a cluster can get this input.
    pub combinations: Vec<Vec<usize>>,
}

/// What an engine is run on.
#[derive(Debug, Clone, PartialEq)]
pub enum EngineInput {
    Helm { values: Vec<ValuesLayer> },
    Kustomize { directory: PathBuf, shown: String },
}

/// A chart pulled from a repository or registry.
#[derive(Debug, Clone, PartialEq)]
pub struct PulledChart {
    /// The archive, on local disk for `helm template`.
    pub path: PathBuf,
    /// `sha256:` and the archive's SHA-256 in hex.
    pub digest: String,
    /// The digest of the OCI manifest that helm resolved the version to (`oci://` only).
    pub manifest_digest: Option<String>,
}

/// What an engine run failed with: the runner's own error (a missing binary, the engine's stderr, a deadline),
/// which [`render`] puts in context (the app and the step) as `Error::Engine`.
pub type EngineError = Box<dyn std::error::Error + Send + Sync>;

/// Runs the rendering engines; the `windvane` command line runs the real binaries.
pub trait Engines {
    /// Pulls a chart from a repository (`https://…`) or registry (`oci://…`, over plain HTTP when
    /// `plain_http`).
    fn helm_pull(
        &self,
        repo: &str,
        chart: &str,
        version: &str,
        plain_http: bool,
    ) -> std::result::Result<PulledChart, EngineError>;
    /// `helm template` of `chart` with the values layers in order; the YAML stream it prints.
    fn helm_template(
        &self,
        spec: &HelmSpec,
        chart: &std::path::Path,
        values: &[ValuesLayer],
    ) -> std::result::Result<String, EngineError>;
    /// `kustomize build DIRECTORY`; the YAML stream it prints.
    fn kustomize_build(
        &self,
        directory: &std::path::Path,
    ) -> std::result::Result<String, EngineError>;
}

/// Refuses every engine: for callers that only read plain folders of manifests (the fuzzer, tests), so that a
/// Helm or kustomize app says what is needed instead of being read as plain files.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoEngines;

/// What [`NoEngines`] answers every run with.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error(
    "this program does not run Helm or kustomize; build the fleet with the windvane command line (windvane \
     build/publish/render)"
)]
pub struct NoEnginesHere;

impl Engines for NoEngines {
    fn helm_pull(
        &self,
        _: &str,
        _: &str,
        _: &str,
        _: bool,
    ) -> std::result::Result<PulledChart, EngineError> {
        Err(NoEnginesHere.into())
    }
    fn helm_template(
        &self,
        _: &HelmSpec,
        _: &std::path::Path,
        _: &[ValuesLayer],
    ) -> std::result::Result<String, EngineError> {
        Err(NoEnginesHere.into())
    }
    fn kustomize_build(&self, _: &std::path::Path) -> std::result::Result<String, EngineError> {
        Err(NoEnginesHere.into())
    }
}

/// Renders an engine app: plans the inputs, runs the engine once per distinct input, and folds the outputs
/// into variants. `changes` as for [`plan`]. Scalars of the output read as kubectl reads them, where YAML 1.2
/// reads otherwise, are added to `warnings`.
pub fn render(
    app: &str,
    spec: &EngineSpec,
    changes: &[(usize, RenderChange)],
    engines: &dyn Engines,
    warnings: &mut Vec<YamlWarning>,
) -> Result<Rendered> {
    if let EngineSpec::Helm(helm) = spec {
        check_helm_arguments(app, helm)?;
    }
    let jobs = plan(app, spec, changes)?;
    let engine_error = |step: String, detail: String| Error::Engine {
        app: app.to_owned(),
        step,
        detail,
    };
    let (engine, chart, source) = match spec {
        EngineSpec::Helm(helm) => {
            let (chart, source) = chart_of(app, &helm.chart, engines)?;
            ("helm", Some((helm, chart)), source)
        }
        EngineSpec::Kustomize { shown, .. } => (
            "kustomize",
            None,
            BTreeMap::from([("directory".to_owned(), shown.clone())]),
        ),
    };
    let mut outputs = Vec::with_capacity(jobs.len());
    for job in jobs {
        let manifests = match (&job.input, &chart) {
            (EngineInput::Helm { values }, Some((helm, chart))) => {
                let template = |spec: &HelmSpec, warnings: &mut Vec<YamlWarning>| {
                    let output = engines.helm_template(spec, chart, values).map_err(|e| {
                        engine_error(
                            format!("helm template {}", chart_shown(spec)),
                            e.to_string(),
                        )
                    })?;
                    helm_manifests(app, &chart_shown(spec), &output, warnings)
                };
                let mut first_warnings = Vec::new();
                let manifests = template(helm, &mut first_warnings)?;
                // A chart that installs CRDs and checks `.Capabilities.APIVersions.Has` for them renders
                // as it would once they exist: again, told about its own CRDs (the same on every build).
                match own_api_versions(&helm.api_versions, &manifests) {
                    None => {
                        warnings.extend(first_warnings);
                        manifests
                    }
                    Some(api_versions) => {
                        let widened = HelmSpec {
                            api_versions,
                            ..(*helm).clone()
                        };
                        template(&widened, warnings)?
                    }
                }
            }
            (EngineInput::Kustomize { directory, shown }, _) => {
                let output = engines
                    .kustomize_build(directory)
                    .map_err(|e| engine_error(format!("kustomize build {shown}"), e.to_string()))?;
                kustomize_manifests(shown, &output, warnings)?
            }
            (EngineInput::Helm { .. }, None) => {
                unreachable!("helm inputs are planned for helm apps only")
            }
        };
        outputs.push((job.combinations, manifests));
    }
    let customizations = changes.iter().map(|(index, _)| *index).collect();
    Ok(assemble(engine, source, customizations, outputs))
}

/// Checks every value of a Helm app that becomes an argument of `helm` (pure): they come from the fleet
/// tree, which any pull request can change, so none may read as a flag or carry more than its own meaning.
/// The release name and namespace are DNS-1123 labels (a release name at most 53 characters, Helm's own
/// limit), the Kubernetes version `[v]MAJOR.MINOR[.PATCH]`, each API version `group/version[/Kind]`, a
/// pulled chart's name, version and repository plain names and URLs.
pub fn check_helm_arguments(app: &str, helm: &HelmSpec) -> Result<()> {
    let refuse = |field: &str, value: &str, rule: &str| {
        Err(Error::Engine {
            app: app.to_owned(),
            step: format!("checking helm.{field}"),
            detail: format!(
                "{value:?} is not {rule}; it becomes an argument of helm, so it is refused"
            ),
        })
    };
    if !is_dns_label(&helm.release_name, 53) {
        return refuse(
            "releaseName",
            &helm.release_name,
            "a DNS-1123 label (1-53 characters a-z, 0-9 and '-', starting and ending with a letter or digit)",
        );
    }
    if !is_dns_label(&helm.namespace, 63) {
        return refuse("namespace", &helm.namespace, "a DNS-1123 label");
    }
    if !is_kube_version(&helm.kube_version) {
        return refuse(
            "kubeVersion",
            &helm.kube_version,
            "a Kubernetes version such as 1.34.0 or v1.34",
        );
    }
    for api_version in &helm.api_versions {
        if !is_api_version(api_version) {
            return refuse(
                "apiVersions",
                api_version,
                "an API version such as apps/v1 or monitoring.coreos.com/v1/ServiceMonitor",
            );
        }
    }
    if let ChartSource::Repository {
        repo,
        chart,
        version,
        plain_http,
        ..
    } = &helm.chart
    {
        if !is_plain_name(chart) {
            return refuse(
                "chart",
                chart,
                "a chart name (letters, digits, '.', '_', '-')",
            );
        }
        let version_ok = !version.is_empty()
            && !version.starts_with('-')
            && version.bytes().all(|b| b.is_ascii_graphic());
        if !version_ok {
            return refuse(
                "version",
                version,
                "a chart version (or range) without spaces",
            );
        }
        let scheme = ["https://", "http://", "oci://"]
            .iter()
            .any(|s| repo.starts_with(s));
        if !scheme || repo.bytes().any(|b| !b.is_ascii_graphic()) {
            return refuse(
                "repo",
                repo,
                "an https://, http:// or oci:// URL without spaces",
            );
        }
        // Plain HTTP can be read and changed on the way; a registry on this machine's loopback is the only
        // one it is allowed for (Docker's rule too), so that the fleet tree cannot downgrade a remote one.
        if *plain_http && !is_loopback_registry(repo) {
            return refuse(
                "plainHttp",
                repo,
                "an oci:// registry on loopback (127.0.0.0/8, [::1] or localhost); plain HTTP is allowed only \
                 there: serve a remote registry over HTTPS",
            );
        }
    }
    Ok(())
}

/// `oci://HOST[:PORT]/…` whose host is a loopback address (127.0.0.0/8, `[::1]`) or `localhost`.
pub fn is_loopback_registry(repo: &str) -> bool {
    let Some(rest) = repo.strip_prefix("oci://") else {
        return false;
    };
    let authority = rest.split('/').next().unwrap_or_default();
    let host = match authority.strip_prefix('[') {
        Some(bracketed) => bracketed.split(']').next().unwrap_or_default(),
        None => authority.split(':').next().unwrap_or_default(),
    };
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// A DNS-1123 label of at most `max` characters.
fn is_dns_label(text: &str, max: usize) -> bool {
    let bytes = text.as_bytes();
    (1..=max).contains(&bytes.len())
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes[0] != b'-'
        && bytes[bytes.len() - 1] != b'-'
}

/// `[v]MAJOR.MINOR[.PATCH]`, each part digits.
fn is_kube_version(text: &str) -> bool {
    let parts: Vec<&str> = text.strip_prefix('v').unwrap_or(text).split('.').collect();
    (2..=3).contains(&parts.len())
        && parts
            .iter()
            .all(|p| (1..=9).contains(&p.len()) && p.bytes().all(|b| b.is_ascii_digit()))
}

/// `group/version[/Kind]` or `version`: letters, digits, '.', '-' in each part, none empty or starting with
/// '-'.
fn is_api_version(text: &str) -> bool {
    let parts: Vec<&str> = text.split('/').collect();
    text.len() <= 317
        && (1..=3).contains(&parts.len())
        && parts.iter().all(|p| {
            !p.is_empty()
                && !p.starts_with('-')
                && p.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-'))
        })
}

/// A name that cannot be read as a flag or a path: letters, digits, '.', '_', '-', not starting with '-' or
/// '.'.
fn is_plain_name(text: &str) -> bool {
    (1..=253).contains(&text.len())
        && !text.starts_with(['-', '.'])
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'+'))
}

/// The `--api-versions` a chart is rendered again with when its output holds CustomResourceDefinitions whose
/// group/versions (`example.com/v1`, and `example.com/v1/Widget`, the two forms `APIVersions.Has` takes) are
/// not among `given`: `given` and those, sorted and without repeats, so the same chart always gets the same
/// list. `None` when the output adds nothing.
pub fn own_api_versions(given: &[String], manifests: &[Manifest]) -> Option<Vec<String>> {
    let mut own = Vec::new();
    for manifest in manifests {
        let object = &manifest.object;
        let is_crd = object.get("kind").and_then(Value::as_str) == Some("CustomResourceDefinition")
            && object
                .get("apiVersion")
                .and_then(Value::as_str)
                .is_some_and(|v| v.starts_with("apiextensions.k8s.io/"));
        if !is_crd {
            continue;
        }
        let spec = object.get("spec");
        let group = spec.and_then(|s| s.get("group")).and_then(Value::as_str);
        let kind = spec
            .and_then(|s| s.pointer("/names/kind"))
            .and_then(Value::as_str);
        let versions = spec
            .and_then(|s| s.get("versions"))
            .and_then(Value::as_array);
        let (Some(group), Some(kind), Some(versions)) = (group, kind, versions) else {
            continue;
        };
        for version in versions
            .iter()
            .filter_map(|v| v.get("name").and_then(Value::as_str))
        {
            own.push(format!("{group}/{version}"));
            own.push(format!("{group}/{version}/{kind}"));
        }
    }
    if own.iter().all(|version| given.contains(version)) {
        return None;
    }
    own.extend(given.iter().cloned());
    own.sort();
    own.dedup();
    Some(own)
}

/// How a chart is named in file names of its manifests.
fn chart_shown(helm: &HelmSpec) -> String {
    match &helm.chart {
        ChartSource::Path { shown, .. } => shown.clone(),
        ChartSource::Repository { chart, .. } => chart.clone(),
    }
}

/// The chart on local disk and what pins it in the bundle; a pulled chart must match its `digest`.
fn chart_of(
    app: &str,
    chart: &ChartSource,
    engines: &dyn Engines,
) -> Result<(PathBuf, BTreeMap<String, String>)> {
    match chart {
        ChartSource::Path { path, shown } => Ok((
            path.clone(),
            BTreeMap::from([("chart".to_owned(), shown.clone())]),
        )),
        ChartSource::Repository {
            repo,
            chart,
            version,
            digest,
            plain_http,
        } => {
            let pulled = engines
                .helm_pull(repo, chart, version, *plain_http)
                .map_err(|detail| Error::Engine {
                    app: app.to_owned(),
                    step: format!("helm pull {chart} {version} from {repo}"),
                    detail: with_plain_http_hint(repo, *plain_http, detail.to_string()),
                })?;
            if let Some(expected) = digest {
                check_pin(expected, &pulled).map_err(|mismatch| Error::Engine {
                    app: app.to_owned(),
                    step: format!("checking {chart} {version} from {repo} against helm.digest"),
                    detail: mismatch.to_string(),
                })?;
            }
            let mut source = BTreeMap::from([
                ("repo".to_owned(), repo.clone()),
                ("chart".to_owned(), chart.clone()),
                ("version".to_owned(), version.clone()),
                ("digest".to_owned(), pulled.digest),
            ]);
            if let Some(manifest) = pulled.manifest_digest {
                source.insert("manifestDigest".to_owned(), manifest);
            }
            Ok((pulled.path, source))
        }
    }
}

/// helm's words for a pull that failed, with what to do when a registry on loopback answered HTTPS with
/// plain HTTP (a test or development registry): say `plainHttp: true`.
fn with_plain_http_hint(repo: &str, plain_http: bool, detail: String) -> String {
    if !plain_http
        && is_loopback_registry(repo)
        && detail.contains("server gave HTTP response to HTTPS client")
    {
        format!(
            "{detail}; this registry serves plain HTTP: set helm.plainHttp: true (allowed for a registry on \
             loopback only)"
        )
    } else {
        detail
    }
}

/// A pulled chart that is not the one `helm.digest` pins: the pinned digest and what was pulled.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "fleet.yaml pins digest {expected}, but the pulled chart's digest is {actual}; the chart was not \
     rendered. If the new chart is intended, update helm.digest"
)]
pub struct PinMismatch {
    /// The digest `helm.digest` names.
    pub expected: String,
    /// The pulled chart's digests, in words: its OCI manifest's (when pulled from a registry) and its archive's.
    pub actual: String,
}

/// Whether a pulled chart is the one `helm.digest` pins (pure): its OCI manifest's digest (what `helm push`
/// and registries show) or its archive's (what `index.yaml` lists, and the manifest's chart layer) must be
/// `expected`. Else the refusal, with the expected and the actual digests.
pub fn check_pin(expected: &str, pulled: &PulledChart) -> std::result::Result<(), PinMismatch> {
    if pulled.digest == expected || pulled.manifest_digest.as_deref() == Some(expected) {
        return Ok(());
    }
    let actual = match &pulled.manifest_digest {
        Some(manifest) => format!(
            "{manifest} (its OCI manifest; the chart archive's is {})",
            pulled.digest
        ),
        None => format!("{} (the chart archive's)", pulled.digest),
    };
    Err(PinMismatch {
        expected: expected.to_owned(),
        actual,
    })
}

/// Every engine input a cluster can end up with. `changes` are the render-changing customizations as (index
/// into the app's customizations, change), ascending. Each subset of them is a combination a cluster's labels
/// may match; subsets that give the same input are rendered once.
pub fn plan(
    app: &str,
    spec: &EngineSpec,
    changes: &[(usize, RenderChange)],
) -> Result<Vec<RenderJob>> {
    if changes.len() > windvane_shared::format::bundle::MAX_RENDER_CUSTOMIZATIONS {
        return Err(too_many_renders(
            app,
            format!(
                "{} customizations change the engine's input; at most {} may",
                changes.len(),
                windvane_shared::format::bundle::MAX_RENDER_CUSTOMIZATIONS
            ),
        ));
    }
    let mut jobs: Vec<RenderJob> = Vec::new();
    for mask in 0u32..(1 << changes.len()) {
        let chosen: Vec<&(usize, RenderChange)> = changes
            .iter()
            .enumerate()
            .filter(|(bit, _)| mask & (1 << bit) != 0)
            .map(|(_, change)| change)
            .collect();
        let input = input_for(spec, &chosen);
        let combination = chosen.iter().map(|(index, _)| *index).collect();
        match jobs.iter_mut().find(|job| job.input == input) {
            Some(job) => job.combinations.push(combination),
            None => jobs.push(RenderJob {
                input,
                combinations: vec![combination],
            }),
        }
    }
    if jobs.len() > MAX_RENDERS {
        return Err(too_many_renders(
            app,
            format!(
                "its customizations lead to {} different engine inputs; at most {MAX_RENDERS} are rendered \
                 (merge customizations, or move per-cluster differences into ${{values.…}})",
                jobs.len()
            ),
        ));
    }
    Ok(jobs)
}

fn too_many_renders(app: &str, detail: String) -> Error {
    Error::Engine {
        app: app.to_owned(),
        step: "planning the renders".to_owned(),
        detail,
    }
}

fn input_for(spec: &EngineSpec, chosen: &[&(usize, RenderChange)]) -> EngineInput {
    match spec {
        EngineSpec::Helm(helm) => {
            let mut values = helm.values.clone();
            for (_, change) in chosen {
                if let RenderChange::HelmValues(layers) = change {
                    values.extend(layers.iter().cloned());
                }
            }
            EngineInput::Helm { values }
        }
        EngineSpec::Kustomize { directory, shown } => {
            let last = chosen.iter().rev().find_map(|(_, change)| match change {
                RenderChange::KustomizeDirectory { directory, shown } => Some((directory, shown)),
                RenderChange::HelmValues(_) => None,
            });
            let (directory, shown) = last.unwrap_or((directory, shown));
            EngineInput::Kustomize {
                directory: directory.clone(),
                shown: shown.clone(),
            }
        }
    }
}

/// Folds the outputs of the jobs into variants: identical manifests become one variant holding every
/// combination that leads to them, in the order first seen (so the same inputs give the same bundle).
pub fn assemble(
    engine: &str,
    source: BTreeMap<String, String>,
    customizations: Vec<usize>,
    outputs: Vec<(Vec<Vec<usize>>, Vec<Manifest>)>,
) -> Rendered {
    let mut variants: Vec<Variant> = Vec::new();
    for (combinations, manifests) in outputs {
        match variants.iter_mut().find(|v| v.manifests == manifests) {
            Some(variant) => variant.combinations.extend(combinations),
            None => variants.push(Variant {
                combinations,
                manifests,
            }),
        }
    }
    for variant in &mut variants {
        variant.combinations.sort();
    }
    Rendered {
        engine: engine.to_owned(),
        source,
        customizations,
        variants,
    }
}

/// The manifests of `helm template` output. Each document is named after the template it came from
/// (`charts/web (helm): web/templates/deployment.yaml`, from Helm's `# Source:` comments); hooks get their
/// meaning ([`hook_meaning`]): dropped, or kept in an earlier or later wave.
pub fn helm_manifests(
    app: &str,
    chart_shown: &str,
    output: &str,
    warnings: &mut Vec<YamlWarning>,
) -> Result<Vec<Manifest>> {
    let mut manifests = Vec::new();
    let mut documents_per_source: BTreeMap<String, usize> = BTreeMap::new();
    for chunk in split_documents(output) {
        let source = chunk
            .lines()
            .find_map(|line| line.strip_prefix("# Source: "))
            .unwrap_or("(no source)")
            .trim();
        let file = format!("{chart_shown} (helm): {source}");
        let chunk_manifests = crate::manifests::manifests_of(&file, chunk, warnings)?;
        windvane_shared::format::sops::refuse_in_engine_output(&chunk_manifests)?;
        for mut manifest in chunk_manifests {
            let count = documents_per_source.entry(source.to_owned()).or_default();
            manifest.document = *count;
            *count += 1;
            if let Some(object) = hook_meaning(app, &manifest)? {
                manifest.object = object;
                manifests.push(manifest);
            }
        }
    }
    Ok(manifests)
}

/// The manifests of `kustomize build` output, named `DIRECTORY (kustomize)` and numbered in order.
pub fn kustomize_manifests(
    shown: &str,
    output: &str,
    warnings: &mut Vec<YamlWarning>,
) -> Result<Vec<Manifest>> {
    let manifests =
        crate::manifests::manifests_of(&format!("{shown} (kustomize)"), output, warnings)?;
    windvane_shared::format::sops::refuse_in_engine_output(&manifests)?;
    Ok(manifests)
}

/// Splits a YAML stream at its `---` lines, as Helm writes one template's document after another.
fn split_documents(output: &str) -> Vec<&str> {
    let mut chunks = Vec::new();
    let mut start = 0;
    let mut offset = 0;
    for line in output.split_inclusive('\n') {
        if line.trim_end() == "---" {
            chunks.push(&output[start..offset]);
            start = offset + line.len();
        }
        offset += line.len();
    }
    chunks.push(&output[start..]);
    chunks.retain(|chunk| !chunk.trim().is_empty());
    chunks
}

/// The annotation Helm marks hooks with.
pub const HELM_HOOK_ANNOTATION: &str = "helm.sh/hook";

/// What a Helm hook means to an agent that applies everything declaratively: test hooks and hooks that only
/// run on delete or rollback are dropped (`None`); `pre-install`/`pre-upgrade` objects go in wave -1 and
/// `post-install`/`post-upgrade` ones in wave 1, unless the object names its own `windvane.io/wave`. Any other
/// hook is refused: silently applying it at the wrong moment would be worse.
pub fn hook_meaning(app: &str, manifest: &Manifest) -> Result<Option<Value>> {
    let pointer = "/metadata/annotations/helm.sh~1hook";
    let Some(hooks) = manifest.object.pointer(pointer).and_then(Value::as_str) else {
        return Ok(Some(manifest.object.clone()));
    };
    let hooks: Vec<&str> = hooks.split(',').map(str::trim).collect();
    let mut wave = None;
    for hook in &hooks {
        match *hook {
            "test" | "test-success" | "test-failure" => return Ok(None),
            "pre-install" | "pre-upgrade" => wave = Some(-1),
            "post-install" | "post-upgrade" => wave = wave.or(Some(1)),
            "pre-delete" | "post-delete" | "pre-rollback" | "post-rollback" => {}
            other => {
                return Err(Error::Engine {
                    app: app.to_owned(),
                    step: format!("reading {} document {}", manifest.file, manifest.document),
                    detail: format!(
                        "Helm hook {other:?} has no meaning for a declarative agent; Windvane takes \
                         pre-/post-install and -upgrade hooks (as waves -1 and 1) and drops test, delete and \
                         rollback hooks"
                    ),
                });
            }
        }
    }
    let Some(wave) = wave else {
        return Ok(None);
    };
    let mut object = manifest.object.clone();
    let annotations = object
        .pointer_mut("/metadata/annotations")
        .and_then(Value::as_object_mut)
        .expect("a hook's annotations are a mapping: the hook was read from them");
    annotations
        .entry(WAVE_ANNOTATION)
        .or_insert_with(|| Value::String(wave.to_string()));
    Ok(Some(object))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn kustomize(shown: &str) -> EngineSpec {
        EngineSpec::Kustomize {
            directory: PathBuf::from(format!("/fleet/{shown}")),
            shown: shown.to_owned(),
        }
    }

    fn overlay(shown: &str) -> RenderChange {
        RenderChange::KustomizeDirectory {
            directory: PathBuf::from(format!("/fleet/{shown}")),
            shown: shown.to_owned(),
        }
    }

    fn inline(value: Value) -> ValuesLayer {
        ValuesLayer::Inline(value.as_object().cloned().unwrap())
    }

    fn helm(values: Vec<ValuesLayer>) -> EngineSpec {
        EngineSpec::Helm(HelmSpec {
            chart: ChartSource::Path {
                path: PathBuf::from("/fleet/charts/web"),
                shown: "charts/web".to_owned(),
            },
            release_name: "web".to_owned(),
            namespace: "web".to_owned(),
            kube_version: DEFAULT_KUBE_VERSION.to_owned(),
            api_versions: Vec::new(),
            values,
        })
    }

    #[test]
    fn kustomize_overlays_last_match_wins_and_each_directory_is_built_once() {
        let jobs = plan(
            "web",
            &kustomize("apps/web/base"),
            &[(0, overlay("apps/web/prod")), (2, overlay("apps/web/eu"))],
        )
        .unwrap();
        let shown: Vec<(String, Vec<Vec<usize>>)> = jobs
            .into_iter()
            .map(|job| match job.input {
                EngineInput::Kustomize { shown, .. } => (shown, job.combinations),
                EngineInput::Helm { .. } => panic!("a kustomize app planned a helm render"),
            })
            .collect();
        assert_eq!(
            shown,
            vec![
                ("apps/web/base".to_owned(), vec![vec![]]),
                ("apps/web/prod".to_owned(), vec![vec![0]]),
                ("apps/web/eu".to_owned(), vec![vec![2], vec![0, 2]]),
            ]
        );
    }

    #[test]
    fn helm_values_layer_in_customization_order() {
        let jobs = plan(
            "web",
            &helm(vec![inline(json!({"replicas": 1}))]),
            &[
                (
                    1,
                    RenderChange::HelmValues(vec![inline(json!({"replicas": 3}))]),
                ),
                (
                    3,
                    RenderChange::HelmValues(vec![inline(json!({"tier": "gold"}))]),
                ),
            ],
        )
        .unwrap();
        assert_eq!(jobs.len(), 4);
        let both = jobs
            .iter()
            .find(|job| job.combinations == vec![vec![1, 3]])
            .unwrap();
        assert_eq!(
            both.input,
            EngineInput::Helm {
                values: vec![
                    inline(json!({"replicas": 1})),
                    inline(json!({"replicas": 3})),
                    inline(json!({"tier": "gold"})),
                ]
            }
        );
    }

    #[test]
    fn too_many_render_changing_customizations_are_refused() {
        let changes: Vec<(usize, RenderChange)> = (0..11)
            .map(|i| (i, overlay(&format!("apps/web/o{i}"))))
            .collect();
        let error = plan("web", &kustomize("apps/web"), &changes).unwrap_err();
        assert!(error.to_string().contains("at most 10"), "{error}");
        let changes: Vec<(usize, RenderChange)> = (0..7)
            .map(|i| {
                (
                    i,
                    RenderChange::HelmValues(vec![inline(json!({format!("k{i}"): i}))]),
                )
            })
            .collect();
        let error = plan("web", &helm(Vec::new()), &changes).unwrap_err();
        assert!(
            error.to_string().contains("128 different engine inputs"),
            "{error}"
        );
    }

    fn manifest(name: &str) -> Manifest {
        Manifest {
            file: "x".to_owned(),
            document: 0,
            object: json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}}),
        }
    }

    #[test]
    fn identical_outputs_become_one_variant() {
        let rendered = assemble(
            "kustomize",
            BTreeMap::new(),
            vec![0, 1],
            vec![
                (vec![vec![]], vec![manifest("a")]),
                (vec![vec![0]], vec![manifest("b")]),
                (vec![vec![0, 1], vec![1]], vec![manifest("a")]),
            ],
        );
        assert_eq!(rendered.variants.len(), 2);
        assert_eq!(
            rendered.variants[0].combinations,
            vec![vec![], vec![0, 1], vec![1]]
        );
        assert_eq!(rendered.variants[1].combinations, vec![vec![0]]);
    }

    const HELM_OUTPUT: &str = "---
# Source: web/templates/config.yaml
apiVersion: v1
kind: ConfigMap
metadata:
  name: web-a
---
# Source: web/templates/config.yaml
apiVersion: v1
kind: ConfigMap
metadata:
  name: web-b
---
# Source: web/charts/db/templates/job.yaml
apiVersion: batch/v1
kind: Job
metadata:
  name: web-migrate
  annotations:
    helm.sh/hook: pre-install,pre-upgrade
    helm.sh/hook-weight: \"-5\"
spec: {}
---
# Source: web/templates/tests/ping.yaml
apiVersion: v1
kind: Pod
metadata:
  name: web-test
  annotations:
    helm.sh/hook: test
---
# Source: web/templates/notify.yaml
apiVersion: batch/v1
kind: Job
metadata:
  name: web-notify
  annotations:
    helm.sh/hook: post-install
    windvane.io/wave: \"5\"
";

    #[test]
    fn helm_output_is_named_by_template_and_hooks_get_waves_or_are_dropped() {
        let manifests = helm_manifests("web", "charts/web", HELM_OUTPUT, &mut Vec::new()).unwrap();
        let named: Vec<(String, usize)> = manifests
            .iter()
            .map(|m| (m.file.clone(), m.document))
            .collect();
        assert_eq!(
            named,
            vec![
                ("charts/web (helm): web/templates/config.yaml".to_owned(), 0),
                ("charts/web (helm): web/templates/config.yaml".to_owned(), 1),
                (
                    "charts/web (helm): web/charts/db/templates/job.yaml".to_owned(),
                    0
                ),
                ("charts/web (helm): web/templates/notify.yaml".to_owned(), 0),
            ]
        );
        let wave =
            |i: usize| manifests[i].object["metadata"]["annotations"][WAVE_ANNOTATION].clone();
        assert_eq!(wave(2), json!("-1"));
        assert_eq!(wave(3), json!("5"), "an object's own wave is kept");
    }

    #[test]
    fn unknown_and_delete_only_hooks() {
        let hooked = |hook: &str| Manifest {
            file: "x".to_owned(),
            document: 0,
            object: json!({"apiVersion": "v1", "kind": "Pod", "metadata": {
                "name": "p", "annotations": {HELM_HOOK_ANNOTATION: hook}}}),
        };
        assert_eq!(hook_meaning("web", &hooked("pre-delete")).unwrap(), None);
        let error = hook_meaning("web", &hooked("crd-install")).unwrap_err();
        assert!(error.to_string().contains("\"crd-install\""), "{error}");
        assert_eq!(error.reason(), "engine");
    }

    #[test]
    fn helm_values_that_become_arguments_are_checked() {
        let EngineSpec::Helm(good) = helm(Vec::new()) else {
            panic!("helm");
        };
        assert!(check_helm_arguments("web", &good).is_ok());
        let refused = |change: &dyn Fn(&mut HelmSpec), field: &str| {
            let mut spec = good.clone();
            change(&mut spec);
            let error = check_helm_arguments("web", &spec)
                .expect_err(field)
                .to_string();
            assert!(
                error.starts_with(&format!("app web: checking helm.{field}: ")),
                "{error}"
            );
        };
        refused(
            &|s| s.release_name = "--set-file=leak=/proc/self/environ".to_owned(),
            "releaseName",
        );
        refused(&|s| s.release_name = "a".repeat(54), "releaseName");
        refused(&|s| s.release_name = "Web".to_owned(), "releaseName");
        refused(&|s| s.kube_version = "--debug".to_owned(), "kubeVersion");
        refused(&|s| s.kube_version = "1.34.0 --x".to_owned(), "kubeVersion");
        refused(
            &|s| s.api_versions = vec!["--post-renderer=/bin/sh".to_owned()],
            "apiVersions",
        );
        let repository = |chart: &str, repo: &str| ChartSource::Repository {
            repo: repo.to_owned(),
            chart: chart.to_owned(),
            version: "1.0.0".to_owned(),
            digest: None,
            plain_http: false,
        };
        refused(
            &|s| s.chart = repository("--set-file=x=/etc/passwd", "https://charts.example.com"),
            "chart",
        );
        refused(&|s| s.chart = repository("web", "--repo=file:///"), "repo");
        let mut ok = good.clone();
        ok.kube_version = "v1.31".to_owned();
        ok.api_versions = vec![
            "monitoring.coreos.com/v1/ServiceMonitor".to_owned(),
            "v1".to_owned(),
        ];
        ok.chart = repository("web", "oci://registry.example.com/charts");
        assert!(check_helm_arguments("web", &ok).is_ok());
        // Plain HTTP only to a registry on loopback.
        let plain = |repo: &str| ChartSource::Repository {
            repo: repo.to_owned(),
            chart: "web".to_owned(),
            version: "1.0.0".to_owned(),
            digest: None,
            plain_http: true,
        };
        for repo in [
            "oci://registry.example.com/charts",
            "oci://127.0.0.1.example.com/charts",
            "oci://10.0.0.1:5000/charts",
            "https://127.0.0.1/charts",
        ] {
            refused(&|s| s.chart = plain(repo), "plainHttp");
        }
        for repo in [
            "oci://127.0.0.1:5000/charts",
            "oci://127.3.2.1/charts",
            "oci://[::1]:5000/charts",
            "oci://LocalHost:5000",
        ] {
            ok.chart = plain(repo);
            assert!(check_helm_arguments("web", &ok).is_ok(), "{repo}");
        }
    }

    #[test]
    fn a_pulled_chart_matches_its_pin_by_manifest_or_archive_digest() {
        let digest = |c: char| format!("sha256:{}", c.to_string().repeat(64));
        let pulled = PulledChart {
            path: PathBuf::from("/scratch/web-1.0.0.tgz"),
            digest: digest('a'),
            manifest_digest: Some(digest('b')),
        };
        assert_eq!(check_pin(&digest('a'), &pulled), Ok(()));
        assert_eq!(check_pin(&digest('b'), &pulled), Ok(()));
        let refusal = check_pin(&digest('c'), &pulled).unwrap_err().to_string();
        for expected in [digest('a'), digest('b'), digest('c')] {
            assert!(refusal.contains(&expected), "{refusal}");
        }
        assert!(refusal.contains("update helm.digest"), "{refusal}");
        let from_index = PulledChart {
            manifest_digest: None,
            ..pulled
        };
        assert_eq!(check_pin(&digest('a'), &from_index), Ok(()));
        let refusal = check_pin(&digest('b'), &from_index)
            .unwrap_err()
            .to_string();
        assert!(
            refusal.contains(&digest('a')) && refusal.contains(&digest('b')),
            "{refusal}"
        );
    }

    #[test]
    fn a_charts_own_crds_become_its_api_versions_sorted() {
        let crd = |group: &str, kind: &str, versions: &[&str]| Manifest {
            file: "crds/x.yaml".to_owned(),
            document: 0,
            object: json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                "metadata": {"name": "x"}, "spec": {"group": group, "names": {"kind": kind},
                "versions": versions.iter().map(|v| json!({"name": v})).collect::<Vec<_>>()}}),
        };
        let manifests = vec![
            manifest("a"),
            crd("z.example.com", "Zed", &["v1"]),
            crd("a.example.com", "Ay", &["v2", "v1"]),
        ];
        let given = vec!["policy/v1".to_owned()];
        assert_eq!(
            own_api_versions(&given, &manifests).unwrap(),
            [
                "a.example.com/v1",
                "a.example.com/v1/Ay",
                "a.example.com/v2",
                "a.example.com/v2/Ay",
                "policy/v1",
                "z.example.com/v1",
                "z.example.com/v1/Zed"
            ]
        );
        // Nothing new (or no CRD): render once.
        let all = own_api_versions(&given, &manifests).unwrap();
        assert_eq!(own_api_versions(&all, &manifests), None);
        assert_eq!(own_api_versions(&given, &[manifest("a")]), None);
    }

    #[test]
    fn documents_split_at_separator_lines_only() {
        let chunks = split_documents("a: 1\n---\nb: |\n  ---\n  x\n--- \n\n---\n");
        assert_eq!(chunks, vec!["a: 1\n", "b: |\n  ---\n  x\n"]);
    }
}
