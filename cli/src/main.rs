//! `windvane`: the release engineer's and SRE's command line. Parses arguments, sets up logging, and hands
//! each subcommand to its module; every failure ends as one line on stderr and a non-zero exit.

mod diff;
mod engines;
mod fleet;
mod keygen;
mod kustomize_check;
mod release;
mod rollout;
mod seal;
mod terminal;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Windvane: pull-mode GitOps for Kubernetes fleets — sign, publish, verify and preview releases.
#[derive(Debug, Parser)]
#[command(name = "windvane", version, about, long_about = None, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Generate an Ed25519 release key pair: PREFIX.key (private, mode 0600) and PREFIX.pub.
    Keygen(keygen::KeygenArgs),
    /// Validate a fleet source tree and write an unsigned bundle (the CI lint step).
    Build(release::BuildArgs),
    /// Sign and publish a fleet tree or built bundle on a channel of a static store.
    Publish(release::PublishArgs),
    /// Verify a channel's signed pointer and its bundle, as an agent would, and describe the release.
    Verify(release::VerifyArgs),
    /// Print exactly what one cluster would get (rendered, as applied) as a YAML stream.
    Render(release::RenderArgs),
    /// Print the fleet's status from a source server; exit 0 only when every selected cluster is Synced.
    Status(fleet::StatusArgs),
    /// Admin actions on an enrolled cluster (rekey, forget) at a source server.
    Cluster(fleet::ClusterArgs),
    /// A channel's progressive rollout: status (exit 0 only when complete), halt, resume.
    Rollout(rollout::RolloutArgs),
    /// Publish the bundle the channel carried before the current one, as a new serial.
    Rollback(rollout::RollbackArgs),
    /// Sign the exact bundle of one channel's current release on another channel.
    Promote(rollout::PromoteArgs),
    /// Sign an approval of a channel's current release with an approver key (two-person approval).
    Approve(rollout::ApproveArgs),

    /// Encrypt a manifest file's data/stringData to clusters' or groups' age recipients (a SOPS file).
    Seal(seal::SealArgs),
    /// Generate an age identity file (for a cluster's or a group's key Secret) and print its recipient.
    AgeKeygen(seal::AgeKeygenArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("WINDVANE_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match run(cli) {
        Ok(code) => code,
        Err(error) => {
            // An error may quote a server, a store or a cluster: shown, never interpreted.
            eprintln!("error: {}", terminal::clean(&format!("{error:#}")));
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Keygen(args) => keygen::run(args),
        Command::Build(args) => release::build(args),
        Command::Publish(args) => release::publish(args),
        Command::Verify(args) => release::verify(args),
        Command::Render(args) => release::render(args),
        Command::Status(args) => return fleet::status(args),
        Command::Cluster(args) => fleet::cluster(args),
        Command::Rollout(args) => return rollout::rollout(args),
        Command::Rollback(args) => rollout::rollback(args),
        Command::Promote(args) => rollout::promote(args),
        Command::Approve(args) => rollout::approve(args),

        Command::Seal(args) => seal::seal(args),
        Command::AgeKeygen(args) => seal::age_keygen(args),
    }
    .map(|()| ExitCode::SUCCESS)
}

/// The `--root` of commands that write to a store: a directory or `s3://BUCKET[/PREFIX]`.
pub(crate) const ROOT_HELP: &str = "The store: a directory (created if missing; sync it to any static host \
afterwards) or s3://BUCKET[/PREFIX] of an S3-compatible object store (credentials and region from the usual \
chain: AWS_* environment, the AWS_PROFILE of ~/.aws/credentials and ~/.aws/config, web identity, container or \
instance credentials; AWS_ENDPOINT_URL for a server other than AWS, with AWS_ALLOW_HTTP=true if it is plain \
HTTP)";

/// Parses `--root` into a store, connecting the S3 client for a bucket.
pub(crate) fn parse_store_arg(text: &str) -> Result<windvane_store::Store, String> {
    windvane_store::Store::parse(text).map_err(|e| e.to_string())
}

/// Runs one future to its end on a fresh single-threaded runtime (the store's and HTTP calls).
pub(crate) fn block_on<F: Future>(future: F) -> anyhow::Result<F::Output> {
    Ok(release::runtime()?.block_on(future))
}

/// Reads a file that must exist, naming it in the error.
fn read_text(path: &PathBuf) -> anyhow::Result<String> {
    std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}
