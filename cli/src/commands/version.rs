//! `windvane version` (and `--version`): the version, the git commit the binary was built from (`unknown`
//! when the build had no git checkout) and the target it was built for, all fixed at build time by
//! `build.rs`.

use clap::Args;
use serde::Serialize;

use crate::args::OutputArgs;
use crate::error::Result;
use crate::output;

/// What `--version` prints after the name.
pub const LONG_VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    "\ncommit: ",
    env!("WINDVANE_GIT_COMMIT"),
    "\ntarget: ",
    env!("WINDVANE_TARGET")
);

/// `windvane version`.
#[derive(Debug, Args)]
pub struct VersionArgs {
    #[command(flatten)]
    output: OutputArgs,
}

/// The build, as `-o json|yaml` print it.
#[derive(Debug, Serialize)]
struct Build {
    version: &'static str,
    commit: &'static str,
    target: &'static str,
}

pub fn version(args: VersionArgs) -> Result<()> {
    let build = Build {
        version: env!("CARGO_PKG_VERSION"),
        commit: env!("WINDVANE_GIT_COMMIT"),
        target: env!("WINDVANE_TARGET"),
    };
    output::print(args.output.output, &build, "the version", || {
        format!("windvane {LONG_VERSION}\n")
    })
}
