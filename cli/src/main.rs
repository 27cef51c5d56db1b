//! `windvane`: the release engineer's and SRE's command line. Parses arguments, sets up logging, and hands
//! each verb to its file under `commands/`; every failure ends as one line on stderr (the step that failed
//! and each cause, `error::report`). The exit status follows one rule for every verb (`error::exit`): 0 done
//! and passed, 1 a check answered no, 2 a usage error or a failure.

mod args;
mod commands;
mod diff;
mod engines;
mod error;
mod http;
mod inputs;
mod kustomize_check;
mod output;
mod stored;
mod terminal;

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

use crate::commands::{
    approve, build, cluster, completion, get, history, keys, promote, publish, render, rollback,
    rollout, seal, status, verify, version, wait,
};
use crate::error::exit;

/// What every verb's exit status means, in `windvane --help`.
const EXIT_STATUS: &str = "\
Exit status (every command):
  0  done, and every check it makes passed
  1  a check answered no: a selected cluster not Synced (status), a rollout not
     complete (rollout status), the condition not met in time (wait), a release
     or history entry that does not verify (verify, render --root, history),
     promote --require-synced not met
  2  a usage error, or a failure that kept the command from deciding (a file,
     the server, the store)";

/// Windvane: pull-mode GitOps for Kubernetes fleets — sign, publish, verify and preview releases.
#[derive(Debug, Parser)]
#[command(
    name = "windvane",
    version,
    long_version = version::LONG_VERSION,
    about,
    long_about = None,
    propagate_version = true,
    after_help = EXIT_STATUS
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Generate an Ed25519 release key pair: PREFIX.key (private, mode 0600) and PREFIX.pub.
    Keygen(keys::KeygenArgs),
    /// Validate a fleet source tree and write an unsigned bundle (the CI lint step).
    Build(build::BuildArgs),
    /// Sign and publish a fleet tree or built bundle on a channel of a static store.
    Publish(publish::PublishArgs),
    /// Verify a channel's signed pointer and its bundle, as an agent would, and describe the release.
    Verify(verify::VerifyArgs),
    /// Print exactly what one cluster would get (rendered, as applied) as a YAML stream.
    Render(render::RenderArgs),
    /// Print the fleet's status from a source server; exit 0 only when every selected cluster is Synced.
    Status(status::StatusArgs),
    /// Admin actions on an enrolled cluster (rekey, forget) at a source server.
    Cluster(cluster::ClusterArgs),
    /// A channel's progressive rollout: status (exit 0 only when complete), halt, resume.
    Rollout(rollout::RolloutArgs),
    /// Publish the bundle the channel carried before the current one, as a new serial.
    Rollback(rollback::RollbackArgs),
    /// Sign the exact bundle of one channel's current release on another channel.
    Promote(promote::PromoteArgs),
    /// Sign an approval of a channel's current release with an approver key (two-person approval).
    Approve(approve::ApproveArgs),

    /// Encrypt a manifest file's data/stringData to clusters' or groups' age recipients (a SOPS file).
    Seal(seal::SealArgs),
    /// Generate an age identity file (for a cluster's or a group's key Secret) and print its recipient.
    AgeKeygen(keys::AgeKeygenArgs),

    /// Read the fleet from a source server: clusters, one cluster, apps, the drift log (-o table|json|yaml).
    Get(get::GetArgs),
    /// Wait until every selected cluster is synced or healthy; exit 1 if the timeout passes first.
    Wait(wait::WaitArgs),
    /// A channel's signed history: serials, bundle digests, signers, halts and repeated bundles, verified.
    History(history::HistoryArgs),
    /// Print the version, the git commit it was built from and the target.
    Version(version::VersionArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completion(completion::CompletionArgs),
    /// Write the man pages (windvane.1 and one per verb) into a directory.
    Man(completion::ManArgs),
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
            eprintln!("error: {}", terminal::clean(&error::report(&error)));
            ExitCode::from(error.exit_code())
        }
    }
}

/// Runs one verb. Verbs that report a verdict (`status`, `rollout status`, `wait`, `history`) choose their
/// exit status; the others succeed or fail, and a failure's status is [`error::Error::exit_code`].
fn run(cli: Cli) -> error::Result<ExitCode> {
    let done = |()| ExitCode::from(exit::OK);
    match cli.command {
        Command::Keygen(args) => keys::keygen(args).map(done),
        Command::Build(args) => build::build(args).map(done),
        Command::Publish(args) => publish::publish(args).map(done),
        Command::Verify(args) => verify::verify(args).map(done),
        Command::Render(args) => render::render(args).map(done),
        Command::Status(args) => status::status(args),
        Command::Cluster(args) => cluster::cluster(args).map(done),
        Command::Rollout(args) => rollout::rollout(args),
        Command::Rollback(args) => rollback::rollback(args).map(done),
        Command::Promote(args) => promote::promote(args).map(done),
        Command::Approve(args) => approve::approve(args).map(done),
        Command::Seal(args) => seal::seal(args).map(done),
        Command::AgeKeygen(args) => keys::age_keygen(args).map(done),
        Command::Get(args) => get::get(args).map(done),
        Command::Wait(args) => wait::wait(args),
        Command::History(args) => history::history(args),
        Command::Version(args) => version::version(args).map(done),
        Command::Completion(args) => completion::completion(args, Cli::command()).map(done),
        Command::Man(args) => completion::man(args, Cli::command()).map(done),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("windvane").chain(args.iter().copied()))
    }

    #[test]
    fn trusted_keys_are_repeated_or_separated_by_commas_in_every_verb() {
        let keys = ["--trusted-key", "a.pub,b.pub", "--trusted-key", "c.pub"];
        let store = ["--root", "/tmp/store", "--channel", "prod", "--key", "k"];
        let verbs: [Vec<&str>; 5] = [
            [&["publish", "tree"][..], &store, &keys].concat(),
            [&["rollout", "halt"][..], &store, &keys].concat(),
            [&["rollback"][..], &store, &keys].concat(),
            [&["approve", "--serial", "3"][..], &store, &keys].concat(),
            [
                &["verify", "--root", "/tmp/store", "--channel", "prod"][..],
                &keys,
            ]
            .concat(),
        ];
        for args in verbs {
            let cli = parse(&args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
            let text = format!("{cli:?}");
            assert!(
                text.contains(r#"trusted_keys: ["a.pub", "b.pub", "c.pub"]"#),
                "{args:?}: {text}"
            );
        }
    }

    #[test]
    fn approve_alone_requires_a_trusted_key() {
        let store = ["--root", "/tmp/store", "--channel", "prod", "--key", "k"];
        let err = parse(&[&["approve", "--serial", "3"][..], &store].concat())
            .expect_err("approve without --trusted-key");
        assert!(err.to_string().contains("--trusted-key"), "{err}");
        parse(&[&["rollout", "resume"][..], &store].concat()).expect("resume without one");
    }

    #[test]
    fn shared_value_parsers_refuse_bad_values_with_the_core_s_message() {
        let err = parse(&[
            "rollback",
            "--root",
            "/tmp/s",
            "--channel",
            "c",
            "--key",
            "k",
            "--expires-in",
            "soon",
        ])
        .expect_err("not a duration");
        assert!(err.to_string().contains("--expires-in"), "{err}");
        assert!(
            err.to_string().contains("invalid duration \"soon\""),
            "{err}"
        );
        let cli = parse(&["build", "tree", "-o", "-"]).expect("defaults");
        assert!(
            format!("{cli:?}").contains("engine_timeout: 120s"),
            "{cli:?}"
        );
    }
}
