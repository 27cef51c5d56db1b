//! The release engineer's subcommands: `build`, `publish`, `verify` and `render`. They read a fleet source
//! tree (or a built bundle), a store (a directory or URL) and keys; the checks themselves live in
//! `windvane_shared`, and the store's layout and atomic publishing in `windvane_store`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;
use jiff::Timestamp;
use windvane_publisher::source;
use windvane_publisher::source::{LoadOptions, Loaded};
use windvane_shared::crypto::digest::sha256_hex;
use windvane_shared::crypto::keys::{self, TrustedKeys};
use windvane_shared::decide::desired::{all_or_first_error, cluster_share};
use windvane_shared::decide::render::ClusterIdentity;
use windvane_shared::format::bundle::{Bundle, BundleLimits};
use windvane_shared::format::release::{self, AcceptedRelease, PointerExpectations};
use windvane_shared::spec::selector::{Labels, parse_label_assignment};
use windvane_shared::text::duration::{format_duration, parse_duration};
use windvane_shared::text::yaml_out;
use windvane_store::{self as store, PublishRequest, StoreLocation};

use crate::engines::EngineArgs;

#[derive(Debug, Args)]
pub struct BuildArgs {
    /// The fleet source tree (the directory holding fleet.yaml).
    #[arg(value_name = "SOURCE")]
    source: PathBuf,
    /// Where to write the bundle; `-` for standard output.
    #[arg(short, long, value_name = "FILE")]
    output: PathBuf,
    /// Refuse manifests that kubectl (YAML 1.1) and a YAML 1.2 reader read differently (`mode: 0644`, `on:`,
    /// `<<` merge keys), instead of reading them as kubectl does with a warning.
    #[arg(long, env = "WINDVANE_STRICT")]
    strict: bool,
    #[command(flatten)]
    engines: EngineArgs,
}

#[derive(Debug, Args)]
pub struct PublishArgs {
    /// A fleet source tree (directory with fleet.yaml) or a bundle written by `windvane build`.
    #[arg(value_name = "SOURCE")]
    source: PathBuf,
    #[arg(long, value_name = "STORE", env = "WINDVANE_ROOT", value_parser = crate::parse_store_arg, help = crate::ROOT_HELP)]
    root: store::Store,
    /// The channel to publish on, e.g. `stable`.
    #[arg(long, value_name = "CHANNEL", env = "WINDVANE_CHANNEL")]
    channel: String,
    /// The release signing key (PKCS#8 PEM, from `windvane keygen` or `openssl genpkey -algorithm ed25519`).
    #[arg(long, value_name = "KEY", env = "WINDVANE_KEY")]
    key: PathBuf,
    /// How long agents accept this release before treating it as frozen; re-publish before then.
    #[arg(long, value_name = "DURATION", default_value = "30d", value_parser = parse_duration_arg, env = "WINDVANE_EXPIRES_IN")]
    expires_in: Duration,
    /// Allow publishing a release with no objects (clusters that prune will remove everything).
    #[arg(long, env = "WINDVANE_ALLOW_EMPTY")]
    allow_empty: bool,
    /// Public keys that may have signed the channel's current pointer besides KEY (the old key during a rotation).
    #[arg(
        long = "trusted-key",
        value_name = "PUB",
        value_delimiter = ',',
        env = "WINDVANE_TRUSTED_KEYS"
    )]
    trusted_keys: Vec<PathBuf>,
    /// As for `windvane build --strict`: refuse YAML that kubectl and a YAML 1.2 reader read differently.
    #[arg(long, env = "WINDVANE_STRICT")]
    strict: bool,
    #[command(flatten)]
    engines: EngineArgs,
}

/// Where a release comes from, verified, for `verify` and `render --root`.
#[derive(Debug, Args)]
pub struct StoreArgs {
    /// The store: a directory, s3://BUCKET[/PREFIX], or the base URL of a static host (e.g.
    /// https://releases.example.com/fleet).
    #[arg(long, value_name = "DIR|S3|URL", env = "WINDVANE_ROOT")]
    root: Option<String>,
    /// The channel to read.
    #[arg(long, value_name = "CHANNEL", env = "WINDVANE_CHANNEL")]
    channel: Option<String>,
    /// Trusted release public keys (SPKI PEM); repeat or separate with commas. Any one of them may sign.
    #[arg(
        long = "trusted-key",
        value_name = "PUB",
        value_delimiter = ',',
        env = "WINDVANE_TRUSTED_KEYS"
    )]
    trusted_keys: Vec<PathBuf>,
    /// The fleet the release must be for (an agent always knows its fleet); default: whatever the pointer says.
    #[arg(long, value_name = "FLEET", env = "WINDVANE_FLEET")]
    fleet: Option<String>,
}

#[derive(Debug, Args)]
pub struct VerifyArgs {
    #[command(flatten)]
    store: StoreArgs,
}

#[derive(Debug, Args)]
pub struct RenderArgs {
    /// A fleet source tree or built bundle; or leave it out and give --root and --channel.
    #[arg(
        value_name = "SOURCE",
        required_unless_present = "root",
        conflicts_with = "root"
    )]
    source: Option<PathBuf>,
    #[command(flatten)]
    store: StoreArgs,
    /// The cluster's name, as its agent is configured (`${cluster.name}`).
    #[arg(long, value_name = "NAME", env = "WINDVANE_CLUSTER")]
    cluster: String,
    /// A cluster label `key=value`; repeat for more. Selects apps and fills `${cluster.labels.KEY}`.
    #[arg(long = "label", value_name = "KEY=VALUE", value_parser = parse_label_arg)]
    labels: Vec<(String, String)>,
    #[command(flatten)]
    engines: EngineArgs,
    /// Show SOPS-encrypted objects decrypted, as the cluster gets them, with the identities of
    /// --age-key-file. Without it they are shown encrypted.
    #[arg(long, requires = "age_key_file")]
    reveal: bool,
    /// An age identity file (as age-keygen or `windvane age-keygen` writes it) for --reveal.
    #[arg(long, value_name = "FILE", env = "WINDVANE_AGE_KEY_FILE")]
    age_key_file: Option<PathBuf>,
}

pub(crate) fn parse_duration_arg(text: &str) -> Result<Duration, String> {
    parse_duration(text).map_err(|e| e.to_string())
}

fn parse_label_arg(text: &str) -> Result<(String, String), String> {
    parse_label_assignment(text).map_err(|e| e.to_string())
}

pub fn build(args: BuildArgs) -> anyhow::Result<()> {
    let engines = args.engines.engines(&args.source)?;
    let options = LoadOptions {
        strict_yaml: args.strict,
    };
    let loaded =
        source::load_fleet_source(&args.source, BundleLimits::default(), &engines, options)?;
    report_loaded(&loaded);
    let bundle = loaded.bundle;
    let bytes = bundle.to_json_bytes();
    let summary = summary_line(&bundle, &bytes);
    if args.output.as_os_str() == "-" {
        std::io::stdout()
            .write_all(&bytes)
            .context("writing the bundle to standard output")?;
        eprintln!("built {summary}");
    } else {
        store::write_atomic(&absolute(&args.output)?, &bytes)?;
        println!("built {}: {summary}", args.output.display());
    }
    Ok(())
}

pub fn publish(args: PublishArgs) -> anyhow::Result<()> {
    let bundle = load_bundle_source(&args.source, &args.engines, args.strict)?;
    let key_pem = super::read_text(&args.key)?;
    warn_if_readable_by_others(&args.key);
    let key = keys::signing_key_from_pem(&key_pem, &args.key.display().to_string())?;
    let also_trusted = load_trusted_keys(&args.trusted_keys, false)?;
    let request = PublishRequest {
        channel: &args.channel,
        bundle: &bundle,
        key: &key,
        also_trusted: &also_trusted,
        expires_in: args.expires_in,
        allow_empty: args.allow_empty,
        now: Timestamp::now(),
    };
    let published = crate::block_on(store::publish(&args.root, &request))?
        .with_context(|| format!("publishing on channel {:?} in {}", args.channel, args.root))?;
    let pointer = &published.pointer;
    let previous = published
        .previous_serial
        .map_or("first release".to_owned(), |s| format!("was {s}"));
    println!(
        "published fleet {} on channel {}: serial {} ({previous})",
        pointer.fleet, pointer.channel, pointer.serial
    );
    println!(
        "bundle:  {} ({} bytes{})",
        store::bundle_path(&pointer.bundle.sha256),
        pointer.bundle.size,
        if published.bundle_was_new {
            ""
        } else {
            ", already in the store"
        }
    );
    println!("signed:  key {}", keys::keyid(&key.verifying_key()));
    println!("expires: {} (re-publish before then)", pointer.expires_at);
    Ok(())
}

pub fn verify(args: VerifyArgs) -> anyhow::Result<()> {
    let (accepted, bundle) = runtime()?.block_on(fetch_verified(&args.store))?;
    let pointer = &accepted.pointer;
    let now = Timestamp::now();
    let left = pointer.expires_at.duration_since(now).unsigned_abs();
    println!(
        "verified: fleet {} channel {}",
        pointer.fleet, pointer.channel
    );
    println!("serial:   {}", pointer.serial);
    println!(
        "bundle:   sha256 {} ({} bytes)",
        pointer.bundle.sha256, pointer.bundle.size
    );
    println!("signed:   key {}", accepted.keyid);
    println!("issued:   {}", pointer.issued_at);
    println!(
        "expires:  {} (in {})",
        pointer.expires_at,
        format_duration(Duration::from_secs(left.as_secs()))
    );
    println!("allow_empty: {}", pointer.allow_empty);
    println!("apps:");
    for app in &bundle.apps {
        let selector = app.selector.to_string();
        let selector = if selector.is_empty() {
            "every cluster".to_owned()
        } else {
            selector
        };
        println!(
            "  {:<24} {:>5} objects  selector: {selector}",
            app.name,
            app.object_count()
        );
    }
    Ok(())
}

pub fn render(args: RenderArgs) -> anyhow::Result<()> {
    let mut bundle = match &args.source {
        Some(path) => load_bundle_source(path, &args.engines, false)?,
        None => runtime()?.block_on(fetch_verified(&args.store))?.1,
    };
    let labels: Labels = args.labels.into_iter().collect();
    let cluster = ClusterIdentity {
        name: args.cluster,
        labels,
    };
    if args.reveal
        && let Some(path) = &args.age_key_file
    {
        let keyring = crate::seal::keyring_file(path)?;
        for app in bundle
            .apps
            .iter_mut()
            .filter(|app| app.selector.matches(&cluster.labels))
        {
            if let Some(sealed) = windvane_shared::format::sops::open_app(app, &keyring)
                .into_iter()
                .next()
            {
                bail!("app {}: {}", sealed.app, sealed.error);
            }
        }
    }
    let shares: Vec<_> = cluster_share(&bundle, &cluster).collect();
    if shares.is_empty() {
        eprintln!(
            "no app of fleet {} selects cluster {} with these labels",
            bundle.fleet, cluster.name
        );
    }
    let mut out = std::io::stdout().lock();
    // Exactly what the agent sends: Windvane's labels added, fields left to others removed.
    for object in all_or_first_error(shares)? {
        writeln!(
            out,
            "---\n# app: {} ({} document {})",
            object.app, object.file, object.document
        )?;
        // Only the agent knows (from discovery) whether a kind is namespaced; say where it would go.
        if let Some(namespace) = &object.default_namespace
            && object.body.pointer("/metadata/namespace").is_none()
        {
            writeln!(
                out,
                "# namespace: {namespace} (the app's, if the kind is namespaced)"
            )?;
        }
        out.write_all(yaml_out::to_yaml_string(&object.body).as_bytes())?;
    }
    Ok(())
}

/// Fetches a channel's pointer and bundle and verifies both, as an agent with no history would.
async fn fetch_verified(args: &StoreArgs) -> anyhow::Result<(AcceptedRelease, Bundle)> {
    let (Some(root), Some(channel)) = (&args.root, &args.channel) else {
        bail!("--root and --channel are required to read a published release");
    };
    let trusted = load_trusted_keys(&args.trusted_keys, true)?;
    let location = StoreLocation::parse(root)?;
    let pointer_bytes = location.read_pointer(channel).await?;
    let now = Timestamp::now();
    let fleet = match &args.fleet {
        Some(fleet) => fleet.clone(),
        None => signed_fleet(&pointer_bytes, &trusted)?,
    };
    let expectations = PointerExpectations::new(&trusted, &fleet, channel, now);
    let accepted = release::verify_pointer(&pointer_bytes, &expectations)
        .with_context(|| format!("refusing {location} channel {channel}"))?;
    let bundle_bytes = location
        .read(
            &store::bundle_path(&accepted.pointer.bundle.sha256),
            release::DEFAULT_MAX_BUNDLE_BYTES,
            "bundle",
        )
        .await?;
    let bundle = release::verify_bundle(
        &bundle_bytes,
        &accepted.pointer,
        release::DEFAULT_MAX_BUNDLE_BYTES,
        BundleLimits::default(),
    )
    .with_context(|| format!("refusing the bundle of {location} channel {channel}"))?;
    Ok((accepted, bundle))
}

/// The fleet named by a pointer whose signature checks out, for when the caller did not say which fleet.
fn signed_fleet(pointer_bytes: &[u8], trusted: &TrustedKeys) -> anyhow::Result<String> {
    Ok(
        release::verify_signed_pointer(pointer_bytes, trusted, release::DEFAULT_MAX_POINTER_BYTES)?
            .pointer
            .fleet,
    )
}

fn load_trusted_keys(paths: &[PathBuf], required: bool) -> anyhow::Result<TrustedKeys> {
    if required && paths.is_empty() {
        bail!("no --trusted-key given: name the release public key(s) that may sign this channel");
    }
    let pems = paths
        .iter()
        .map(|path| Ok((path.display().to_string(), super::read_text(path)?)))
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(TrustedKeys::from_pems(
        pems.iter().map(|(name, pem)| (name.as_str(), pem.as_str())),
    )?)
}

/// A fleet tree (directory) is built, its warnings and variables reported on standard error; a file is
/// read as a bundle built earlier.
fn load_bundle_source(path: &Path, engines: &EngineArgs, strict: bool) -> anyhow::Result<Bundle> {
    if path.is_dir() {
        let engines = engines.engines(path)?;
        let options = LoadOptions {
            strict_yaml: strict,
        };
        let loaded = source::load_fleet_source(path, BundleLimits::default(), &engines, options)?;
        report_loaded(&loaded);
        return Ok(loaded.bundle);
    }
    let bytes = store::read_capped_file(path, release::DEFAULT_MAX_BUNDLE_BYTES, "bundle")?;
    Bundle::from_json_slice(&bytes, BundleLimits::default()).with_context(|| {
        format!(
            "{}: not a fleet tree (no directory) nor a bundle",
            path.display()
        )
    })
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

fn absolute(path: &Path) -> anyhow::Result<PathBuf> {
    if path.is_absolute() {
        return Ok(path.to_path_buf());
    }
    Ok(std::env::current_dir()
        .context("reading the current directory")?
        .join(path))
}

fn warn_if_readable_by_others(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(meta) = std::fs::metadata(path)
        && meta.permissions().mode() & 0o077 != 0
    {
        eprintln!(
            "warning: {} is readable by other users; run chmod 600 on it",
            path.display()
        );
    }
}

pub(crate) fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    // reqwest is built without a bundled crypto provider; ring is the one provider in the whole workspace.
    let _ = rustls::crypto::ring::default_provider().install_default();
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}
