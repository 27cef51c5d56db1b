//! The argument groups that several verbs share, each written once and flattened into the verbs
//! (`#[command(flatten)]`): the store a verb signs in, the channel, the signing key, the trusted keys, the
//! fleet, how long a signed release lasts, the source server and its read token, the output format and the
//! strict YAML switch. Every flag has its `WINDVANE_…` environment fallback here, so that a flag and its
//! variable cannot drift apart between verbs; `cli/tests/cli_flags.rs` pins them all. A verb that needs its own
//! wording for a shared flag says so with `mut_arg` on its own struct.
//!
//! What the groups read (keys, tokens) is loaded by `inputs.rs`.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use windvane_shared::spec::selector::LabelSelector;
use windvane_shared::text::duration::parse_duration;
use windvane_shared::wire::fleet_api::ClusterState;
use windvane_store::Store;

use crate::error::Error;
use crate::output::Format;

/// The `--root` of commands that write to a store: a directory or `s3://BUCKET[/PREFIX]`.
const ROOT_HELP: &str = "The store: a directory (created if missing; sync it to any static host \
afterwards) or s3://BUCKET[/PREFIX] of an S3-compatible object store (credentials and region from the usual \
chain: AWS_* environment, the AWS_PROFILE of ~/.aws/credentials and ~/.aws/config, web identity, container or \
instance credentials; AWS_ENDPOINT_URL for a server other than AWS, with AWS_ALLOW_HTTP=true if it is plain \
HTTP)";

/// The store a verb signs in (`publish`, `promote`, `approve`, `rollback`, `rollout halt|resume`).
#[derive(Debug, Clone, Args)]
pub struct StoreArgs {
    #[arg(long, value_name = "STORE", env = "WINDVANE_ROOT", value_parser = Store::parse, help = ROOT_HELP)]
    pub root: Store,
}

/// The channel a verb acts on.
#[derive(Debug, Clone, Args)]
pub struct ChannelArgs {
    /// The channel, e.g. `stable`.
    #[arg(long, value_name = "CHANNEL", env = "WINDVANE_CHANNEL")]
    pub channel: String,
}

/// The release signing key.
#[derive(Debug, Clone, Args)]
pub struct SigningArgs {
    /// The release signing key (PKCS#8 PEM, from `windvane keygen` or `openssl genpkey -algorithm ed25519`).
    #[arg(long, value_name = "KEY", env = "WINDVANE_KEY")]
    pub key: PathBuf,
}

/// The release public keys a verb verifies pointers with.
#[derive(Debug, Clone, Args)]
pub struct TrustArgs {
    /// Trusted release public keys (SPKI PEM); repeat or separate with commas. Any one of them may sign.
    #[arg(
        long = "trusted-key",
        value_name = "PUB",
        value_delimiter = ',',
        env = "WINDVANE_TRUSTED_KEYS"
    )]
    pub trusted_keys: Vec<PathBuf>,
}

/// The fleet a command acts on, checked against every pointer it reads.
#[derive(Debug, Clone, Args)]
pub struct FleetArgs {
    /// The fleet the channel must belong to; default: the fleet of the channel's signed history.
    #[arg(long, value_name = "FLEET", env = "WINDVANE_FLEET")]
    pub fleet: Option<String>,
}

/// How long agents accept a release a verb signs.
#[derive(Debug, Clone, Args)]
pub struct ExpiryArgs {
    /// How long agents accept the release before treating it as frozen; re-publish before then.
    #[arg(long, value_name = "DURATION", default_value = "30d", value_parser = parse_duration, env = "WINDVANE_EXPIRES_IN")]
    pub expires_in: Duration,
}

/// The source server a verb reads from (required).
#[derive(Debug, Clone, Args)]
pub struct ServerArgs {
    /// The source server, e.g. https://windvane.example.com.
    #[arg(long, env = "WINDVANE_SERVER", value_name = "URL")]
    pub server: String,
}

/// The source server a verb may read from (for one of its options).
#[derive(Debug, Clone, Args)]
pub struct OptionalServerArgs {
    /// The source server, e.g. https://windvane.example.com.
    #[arg(long, env = "WINDVANE_SERVER", value_name = "URL")]
    pub server: Option<String>,
}

/// The source server's read token.
#[derive(Debug, Clone, Args)]
pub struct ReadTokenArgs {
    /// File with the server's read token, if it requires one.
    #[arg(long, env = "WINDVANE_READ_TOKEN_FILE", value_name = "FILE")]
    pub read_token_file: Option<PathBuf>,
}

/// The label selector of the clusters a verb reads from the server, checked here (a mistake is a usage error
/// before anything is sent) and sent as the server's `selector` query parameter.
#[derive(Debug, Clone, Args)]
pub struct SelectorArgs {
    /// Only clusters whose labels match this selector, e.g. "env=prod,region in (eu,us)".
    #[arg(long, env = "WINDVANE_SELECTOR", value_name = "SEL", value_parser = parse_selector)]
    pub selector: Option<String>,
}

impl SelectorArgs {
    /// The query string of `/api/v1/fleet` and `/api/v1/clusters` for this selector.
    pub fn query(&self) -> String {
        select_query(self.selector.as_deref(), &[])
    }
}

/// Which clusters a verb reads from the server: the selector and states (the server's names, any case), sent
/// as the `selector` and `state` query parameters.
#[derive(Debug, Clone, Args)]
pub struct SelectArgs {
    #[command(flatten)]
    pub selector: SelectorArgs,
    /// Only clusters in these states (comma-separated or repeated): Failed, Degraded, Contested,
    /// OutOfSync, Unknown, Held, Progressing, Synced, NeverSeen.
    #[arg(
        long = "state",
        env = "WINDVANE_STATE",
        value_name = "STATE",
        value_delimiter = ',',
        value_parser = parse_state
    )]
    pub states: Vec<ClusterState>,
}

impl SelectArgs {
    /// The query string of `/api/v1/fleet` and `/api/v1/clusters` for this selection.
    pub fn query(&self) -> String {
        select_query(self.selector.selector.as_deref(), &self.states)
    }
}

fn select_query(selector: Option<&str>, states: &[ClusterState]) -> String {
    let mut query = form_urlencoded::Serializer::new(String::new());
    if let Some(selector) = selector {
        query.append_pair("selector", selector);
    }
    for state in states {
        query.append_pair("state", state.as_str());
    }
    query.finish()
}

/// A label selector as kubectl writes it, checked by the shared core's parser; kept as written.
fn parse_selector(text: &str) -> Result<String, windvane_shared::Error> {
    LabelSelector::parse(text)?;
    Ok(text.to_owned())
}

/// A state name as the server writes it (any case).
pub fn parse_state(text: &str) -> Result<ClusterState, Error> {
    ClusterState::parse(text).ok_or_else(|| Error::UnknownState {
        given: text.to_owned(),
    })
}

/// How a verb prints the state it read (`output.rs`): the same flag, values and variable on every verb.
#[derive(Debug, Clone, Args)]
pub struct OutputArgs {
    /// Output format: an aligned table for people, or the objects themselves as JSON or YAML for programs.
    #[arg(
        short = 'o',
        long,
        env = "WINDVANE_OUTPUT",
        default_value = "table",
        value_enum
    )]
    pub output: Format,
}

/// How strictly a fleet tree's YAML is read.
#[derive(Debug, Clone, Args)]
pub struct StrictArgs {
    /// Refuse manifests that kubectl (YAML 1.1) and a YAML 1.2 reader read differently (`mode: 0644`, `on:`,
    /// `<<` merge keys), instead of reading them as kubectl does with a warning.
    #[arg(long, env = "WINDVANE_STRICT")]
    pub strict: bool,
}

/// What every verb that re-signs a channel's current pointer reads (`rollout halt|resume`, `rollback`): the
/// store, the channel, the signing key, the keys the current pointer may be signed with, and the fleet.
#[derive(Debug, Clone, Args)]
#[command(mut_args(|a| reword(a, "trusted_keys",
    "Public keys that may have signed the current pointer besides KEY"
)))]
pub struct SignArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    #[command(flatten)]
    pub channel: ChannelArgs,
    #[command(flatten)]
    pub key: SigningArgs,
    #[command(flatten)]
    pub trust: TrustArgs,
    #[command(flatten)]
    pub fleet: FleetArgs,
}

/// A verb's own wording for one of its shared flags, `help` for the flag `id` (for `mut_args`, which keeps the
/// flags in their order, where `mut_arg` would move the flag to the end of the help and the usage line).
pub fn reword(arg: clap::Arg, id: &str, help: &'static str) -> clap::Arg {
    if arg.get_id() == id {
        arg.help(help)
    } else {
        arg
    }
}
