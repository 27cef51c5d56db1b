//! `windvane cluster rekey|forget NAME`: admin actions on an enrolled cluster at the source server's admin
//! endpoints, with the admin token (the server's `--admin-token-file`; the registration token every cluster
//! holds never authorises them).

use std::path::PathBuf;

use clap::{Args, Subcommand};
use serde_json::Value;

use crate::args::ServerArgs;
use crate::error::Result;
use crate::{http, inputs};

/// `windvane cluster …`.
#[derive(Debug, Args)]
pub struct ClusterArgs {
    #[command(subcommand)]
    action: ClusterAction,
}

#[derive(Debug, Subcommand)]
enum ClusterAction {
    /// Allow the cluster's next enrolment to bind a new identity key (after a reinstall or key loss); until
    /// then the old key keeps reporting, and once a new key is bound the old one is refused.
    Rekey(AdminArgs),
    /// Remove the cluster and everything stored about it; its agent, if still running, enrols again afresh
    /// at its next heartbeat (so it reappears), and a stopped one stays gone.
    Forget(AdminArgs),
}

#[derive(Debug, Args)]
struct AdminArgs {
    /// The cluster's name.
    name: String,
    #[command(flatten)]
    server: ServerArgs,
    /// File with the server's admin token (what `windvane-server serve --admin-token-file` reads); the
    /// registration token does not authorise admin actions.
    #[arg(long, env = "WINDVANE_ADMIN_TOKEN_FILE", value_name = "FILE")]
    admin_token_file: PathBuf,
}

/// `windvane cluster rekey|forget NAME`.
pub fn cluster(args: ClusterArgs) -> Result<()> {
    let (action, admin) = match args.action {
        ClusterAction::Rekey(admin) => ("rekey", admin),
        ClusterAction::Forget(admin) => ("forget", admin),
    };
    let token = inputs::read_token(&admin.admin_token_file)?;
    let url = format!(
        "{}/api/v1/clusters/{}/{action}",
        admin.server.server.trim_end_matches('/'),
        admin.name
    );
    let body = http::post(&url, &token, &format!("{action} {}", admin.name))?;
    match action {
        "rekey" => println!("{}", rekey_allowed(&admin.name, &body)),
        _ => println!("cluster {}: forgotten", admin.name),
    }
    Ok(())
}

/// What a rekey allows, from the server's reply: until when (the server's `--rekey-ttl`), and that the
/// cluster's current key withdraws it by reporting.
fn rekey_allowed(cluster: &str, reply: &[u8]) -> String {
    let until = serde_json::from_slice::<Value>(reply)
        .ok()
        .and_then(|v| v["until"].as_str().map(str::to_owned));
    match until {
        Some(until) => format!(
            "cluster {cluster}: an enrolment with a new key is allowed until {until} (a heartbeat of its \
             current key withdraws it)"
        ),
        None => format!("cluster {cluster}: its next enrolment may bind a new key"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rekey_says_until_when() {
        assert_eq!(
            rekey_allowed(
                "edge-7",
                br#"{"cluster":"edge-7","result":"rekey_allowed","until":"2026-12-07T13:00:00Z"}"#
            ),
            "cluster edge-7: an enrolment with a new key is allowed until 2026-12-07T13:00:00Z (a heartbeat \
             of its current key withdraws it)"
        );
        assert_eq!(
            rekey_allowed("edge-7", b"{}"),
            "cluster edge-7: its next enrolment may bind a new key"
        );
    }
}
