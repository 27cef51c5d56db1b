//! The agent's configuration from flags, environment variables (`WINDVANE_…`) and an optional config file
//! (YAML or JSON, the DaemonSet mounts it from a ConfigMap). Flags and environment win over the file; the
//! file wins over defaults. Everything is checked here, so a bad setting stops the agent at start with a
//! message naming it, never later.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use serde::Deserialize;
use windvane_shared::duration::parse_duration;
use windvane_shared::keys::TrustedKeys;
use windvane_shared::render::ClusterIdentity;
use windvane_shared::selector::parse_label_assignment;

use crate::allowlist::Allowlist;
use crate::apply::ApplyOptions;
use crate::engine::EngineConfig;
use crate::source::SourceLimits;
use crate::{Error, Result};

/// Flags shared by `run` and `diff`: where releases come from and who this cluster is.
#[derive(Debug, Clone, Args)]
pub struct AgentArgs {
    /// Config file (YAML or JSON) with the same settings as the flags; flags and environment override it.
    #[arg(long, value_name = "FILE", env = "WINDVANE_CONFIG")]
    pub config: Option<PathBuf>,
    /// Base URL of the static store, e.g. https://releases.example.com/acme.
    #[arg(long, value_name = "URL", env = "WINDVANE_SOURCE")]
    pub source: Option<String>,
    /// The channel to follow.
    #[arg(long, value_name = "CHANNEL", env = "WINDVANE_CHANNEL")]
    pub channel: Option<String>,
    /// Trusted release public keys (SPKI PEM files); repeat or separate with commas.
    #[arg(
        long = "trusted-key",
        value_name = "PUB",
        value_delimiter = ',',
        env = "WINDVANE_TRUSTED_KEYS"
    )]
    pub trusted_keys: Vec<PathBuf>,
    /// The fleet this cluster belongs to; releases of other fleets are refused.
    #[arg(long, value_name = "FLEET", env = "WINDVANE_FLEET")]
    pub fleet: Option<String>,
    /// This cluster's name (`${cluster.name}`).
    #[arg(long, value_name = "NAME", env = "WINDVANE_CLUSTER")]
    pub cluster: Option<String>,
    /// A cluster label `key=value`; repeat or separate with commas. Selects apps and fills `${cluster.labels.KEY}`.
    #[arg(
        long = "label",
        value_name = "KEY=VALUE",
        value_delimiter = ',',
        env = "WINDVANE_LABELS"
    )]
    pub labels: Vec<String>,
    /// Kubeconfig file; default: $KUBECONFIG, then ~/.kube/config, then the in-cluster service account.
    #[arg(long, value_name = "FILE", env = "WINDVANE_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Namespace of the agent's own state (Secrets, Lease). [default: windvane-system]
    #[arg(long, value_name = "NS", env = "WINDVANE_NAMESPACE")]
    pub namespace: Option<String>,
    /// Kinds the agent may apply: `*`, `Kind`, `group/Kind`, `group/*` (core group: `core/Kind`). [default: *]
    #[arg(
        long = "allow-kinds",
        value_name = "KINDS",
        value_delimiter = ',',
        env = "WINDVANE_ALLOW_KINDS"
    )]
    pub allow_kinds: Vec<String>,
    /// Namespaces the agent may touch, or `*`. [default: *]
    #[arg(
        long = "allow-namespaces",
        value_name = "NAMESPACES",
        value_delimiter = ',',
        env = "WINDVANE_ALLOW_NAMESPACES"
    )]
    pub allow_namespaces: Vec<String>,
}

/// Flags of `run` only.
#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub agent: AgentArgs,
    /// How often to poll the channel pointer (±20 % jitter). [default: 30s]
    #[arg(long, value_name = "DURATION", env = "WINDVANE_POLL_INTERVAL")]
    pub poll_interval: Option<String>,
    /// Address of the admin server (/livez, /readyz, /metrics). [default: 0.0.0.0:8481]
    #[arg(long, value_name = "ADDR", env = "WINDVANE_ADMIN_LISTEN")]
    pub admin_listen: Option<SocketAddr>,
    /// Largest fraction of the inventory one release may prune (0–1). [default: 0.5]
    #[arg(long, value_name = "FRACTION", env = "WINDVANE_PRUNE_BUDGET")]
    pub prune_budget: Option<f64>,
    /// This replica's identity in leader election. [default: $POD_NAME, else the host name]
    #[arg(long, value_name = "ID", env = "WINDVANE_IDENTITY")]
    pub identity: Option<String>,
    /// Log format: text or json. [default: text]
    #[arg(long, value_name = "FORMAT", env = "WINDVANE_LOG_FORMAT")]
    pub log_format: Option<String>,
    /// Longest an operator's `windvane.io/hold-until` annotation is honoured. [default: 24h]
    #[arg(long, value_name = "DURATION", env = "WINDVANE_HOLD_CAP")]
    pub hold_cap: Option<String>,
    /// The source server that receives heartbeats, e.g. https://windvane.example.com. Without it the agent
    /// runs standalone and reports only through its admin endpoints and Events.
    #[arg(long, value_name = "URL", env = "WINDVANE_SERVER")]
    pub server: Option<String>,
    /// File holding the fleet registration token, used once to enrol this cluster's identity key.
    #[arg(long, value_name = "FILE", env = "WINDVANE_REGISTRATION_TOKEN_FILE")]
    pub registration_token_file: Option<PathBuf>,
    /// How often to send a heartbeat (±20 % jitter; at once on a state change). [default: 30s]
    #[arg(long, value_name = "DURATION", env = "WINDVANE_HEARTBEAT_INTERVAL")]
    pub heartbeat_interval: Option<String>,
    /// How often to dry-run every object and compare with live state, catching drift the watches missed
    /// (±20 % jitter). [default: 1h]
    #[arg(long, value_name = "DURATION", env = "WINDVANE_BACKSTOP_INTERVAL")]
    pub backstop_interval: Option<String>,
}

/// Flags of `diff`: the same source and identity as `run`.
#[derive(Debug, Clone, Args)]
pub struct DiffArgs {
    #[command(flatten)]
    pub agent: AgentArgs,
}

/// The resolved configuration of `diff`.
#[derive(Debug, Clone)]
pub struct DiffConfig {
    pub source_url: String,
    pub channel: String,
    pub fleet: String,
    pub trusted: TrustedKeys,
    pub identity: ClusterIdentity,
    pub allowlist: Allowlist,
    pub kubeconfig: Option<PathBuf>,
}

impl DiffArgs {
    /// Resolves and checks the settings of `diff`.
    pub fn resolve(&self) -> Result<DiffConfig> {
        let file = read_file_config(&self.agent.config)?;
        let (source_url, channel, fleet, trusted, identity, allowlist, _) =
            self.agent.resolve(&file)?;
        Ok(DiffConfig {
            source_url,
            channel,
            fleet,
            trusted,
            identity,
            allowlist,
            kubeconfig: self.agent.kubeconfig.clone(),
        })
    }
}

/// The config file: every setting, all optional, in camelCase.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FileConfig {
    source: Option<String>,
    channel: Option<String>,
    #[serde(default)]
    trusted_keys: Vec<PathBuf>,
    fleet: Option<String>,
    cluster: Option<String>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    namespace: Option<String>,
    #[serde(default)]
    allow_kinds: Vec<String>,
    #[serde(default)]
    allow_namespaces: Vec<String>,
    poll_interval: Option<String>,
    admin_listen: Option<SocketAddr>,
    prune_budget: Option<f64>,
    log_format: Option<String>,
    hold_cap: Option<String>,
    backstop_interval: Option<String>,
    server: Option<String>,
    registration_token_file: Option<PathBuf>,
    heartbeat_interval: Option<String>,
}

/// The resolved configuration of `run`.
#[derive(Debug, Clone)]
pub struct RunConfig {
    pub engine: EngineConfig,
    pub kubeconfig: Option<PathBuf>,
    pub admin_listen: SocketAddr,
    pub identity: String,
    pub json_logs: bool,
    /// Heartbeats, when a server is configured.
    pub reporter: Option<crate::reporter::ReporterConfig>,
}

fn read_file_config(path: &Option<PathBuf>) -> Result<FileConfig> {
    let Some(path) = path else {
        return Ok(FileConfig::default());
    };
    let name = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| Error::ConfigFile {
        path: name.clone(),
        detail: e.to_string(),
    })?;
    let documents = windvane_shared::yaml::documents_to_json(&text, &name, Default::default())?;
    let value = documents
        .into_iter()
        .next()
        .map(|(_, v)| v)
        .unwrap_or(serde_json::Value::Object(Default::default()));
    serde_json::from_value(value).map_err(|e| Error::ConfigFile {
        path: name,
        detail: e.to_string(),
    })
}

fn required(value: Option<String>, flag: &str) -> Result<String> {
    value.filter(|v| !v.is_empty()).ok_or_else(|| {
        let env = format!(
            "WINDVANE_{}",
            flag.trim_start_matches("--")
                .to_uppercase()
                .replace('-', "_")
        );
        Error::Config(format!(
            "{flag} is required (or {env}, or `{}` in the config file)",
            camel(flag)
        ))
    })
}

fn camel(flag: &str) -> String {
    let mut out = String::new();
    let mut upper = false;
    for c in flag.trim_start_matches("--").chars() {
        if c == '-' {
            upper = true;
        } else if upper {
            out.push(c.to_ascii_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

/// Loads trusted keys from PEM files, naming the file that fails.
pub fn load_trusted_keys(paths: &[PathBuf]) -> Result<TrustedKeys> {
    if paths.is_empty() {
        return Err(Error::Config(
            "--trusted-key is required: name the release public key(s) that may sign".to_owned(),
        ));
    }
    let mut pems = Vec::new();
    for path in paths {
        let name = path.display().to_string();
        let pem = std::fs::read_to_string(path).map_err(|e| Error::ConfigFile {
            path: name.clone(),
            detail: e.to_string(),
        })?;
        pems.push((name, pem));
    }
    Ok(TrustedKeys::from_pems(
        pems.iter().map(|(n, p)| (n.as_str(), p.as_str())),
    )?)
}

impl AgentArgs {
    /// Resolves the source and identity settings shared by `run` and `diff`.
    fn resolve(
        &self,
        file: &FileConfig,
    ) -> Result<(
        String,
        String,
        String,
        TrustedKeys,
        ClusterIdentity,
        Allowlist,
        String,
    )> {
        let source = required(self.source.clone().or(file.source.clone()), "--source")?;
        if !(source.starts_with("http://") || source.starts_with("https://")) {
            return Err(Error::Config(format!(
                "--source {source:?} must be an http:// or https:// URL"
            )));
        }
        let channel = required(self.channel.clone().or(file.channel.clone()), "--channel")?;
        let fleet = required(self.fleet.clone().or(file.fleet.clone()), "--fleet")?;
        let cluster = required(self.cluster.clone().or(file.cluster.clone()), "--cluster")?;
        let key_paths = if self.trusted_keys.is_empty() {
            file.trusted_keys.clone()
        } else {
            self.trusted_keys.clone()
        };
        let trusted = load_trusted_keys(&key_paths)?;
        let mut labels = file.labels.clone();
        for assignment in &self.labels {
            let (key, value) = parse_label_assignment(assignment)?;
            labels.insert(key, value);
        }
        let pick = |flags: &Vec<String>, file: &Vec<String>| {
            if flags.is_empty() {
                file.clone()
            } else {
                flags.clone()
            }
        };
        let allowlist = Allowlist::new(
            pick(&self.allow_kinds, &file.allow_kinds),
            pick(&self.allow_namespaces, &file.allow_namespaces),
        );
        let namespace = self
            .namespace
            .clone()
            .or(file.namespace.clone())
            .unwrap_or_else(|| "windvane-system".to_owned());
        Ok((
            source,
            channel,
            fleet,
            trusted,
            ClusterIdentity {
                name: cluster,
                labels,
            },
            allowlist,
            namespace,
        ))
    }
}

impl RunArgs {
    /// Resolves and checks every setting of `run`.
    pub fn resolve(&self) -> Result<RunConfig> {
        let file = read_file_config(&self.agent.config)?;
        let (source_url, channel, fleet, trusted, identity, allowlist, namespace) =
            self.agent.resolve(&file)?;
        let poll_text = self
            .poll_interval
            .clone()
            .or(file.poll_interval.clone())
            .unwrap_or_else(|| "30s".to_owned());
        let poll_interval = parse_duration(&poll_text)?;
        if poll_interval < Duration::from_secs(1) {
            return Err(Error::Config(format!(
                "--poll-interval {poll_text} is below the minimum of 1s"
            )));
        }
        let prune_budget = self.prune_budget.or(file.prune_budget).unwrap_or(0.5);
        if !(0.0..=1.0).contains(&prune_budget) {
            return Err(Error::Config(format!(
                "--prune-budget {prune_budget} must be between 0 and 1"
            )));
        }
        let log_format = self
            .log_format
            .clone()
            .or(file.log_format.clone())
            .unwrap_or_else(|| "text".to_owned());
        let json_logs = match log_format.as_str() {
            "text" => false,
            "json" => true,
            other => {
                return Err(Error::Config(format!(
                    "--log-format {other:?} must be text or json"
                )));
            }
        };
        let hold_text = self
            .hold_cap
            .clone()
            .or(file.hold_cap.clone())
            .unwrap_or_else(|| "24h".to_owned());
        let hold_cap = parse_duration(&hold_text)?;
        let backstop_text = self
            .backstop_interval
            .clone()
            .or(file.backstop_interval.clone())
            .unwrap_or_else(|| "1h".to_owned());
        let backstop_interval = parse_duration(&backstop_text)?;
        if backstop_interval < Duration::from_secs(1) {
            return Err(Error::Config(format!(
                "--backstop-interval {backstop_text} is below the minimum of 1s"
            )));
        }
        let identity_name = self
            .identity
            .clone()
            .or_else(|| std::env::var("POD_NAME").ok())
            .or_else(|| {
                std::fs::read_to_string("/etc/hostname")
                    .ok()
                    .map(|h| h.trim().to_owned())
            })
            .unwrap_or_else(|| format!("windvane-agent-{}", std::process::id()));
        let reporter = match self.server.clone().or(file.server.clone()) {
            None => None,
            Some(server) => {
                if !(server.starts_with("http://") || server.starts_with("https://")) {
                    return Err(Error::Config(format!(
                        "--server {server:?} must be an http:// or https:// URL"
                    )));
                }
                let token_file = self
                    .registration_token_file
                    .clone()
                    .or(file.registration_token_file.clone())
                    .ok_or_else(|| Error::Config("--server needs --registration-token-file (the fleet registration token)".to_owned()))?;
                let token = std::fs::read_to_string(&token_file)
                    .map_err(|e| Error::ConfigFile {
                        path: token_file.display().to_string(),
                        detail: e.to_string(),
                    })?
                    .trim()
                    .to_owned();
                if token.is_empty() {
                    return Err(Error::ConfigFile {
                        path: token_file.display().to_string(),
                        detail: "the registration token file is empty".to_owned(),
                    });
                }
                let interval_text = self
                    .heartbeat_interval
                    .clone()
                    .or(file.heartbeat_interval.clone())
                    .unwrap_or_else(|| "30s".to_owned());
                let interval = parse_duration(&interval_text)?;
                if interval < Duration::from_secs(1) {
                    return Err(Error::Config(format!(
                        "--heartbeat-interval {interval_text} is below the minimum of 1s"
                    )));
                }
                Some(crate::reporter::ReporterConfig {
                    server,
                    token,
                    fleet: fleet.clone(),
                    identity: identity.clone(),
                    interval,
                    namespace: namespace.clone(),
                })
            }
        };
        Ok(RunConfig {
            reporter,
            engine: EngineConfig {
                source_url,
                channel,
                fleet,
                trusted,
                identity,
                allowlist,
                poll_interval,
                namespace,
                prune_budget,
                apply: ApplyOptions::default(),
                source_limits: SourceLimits::default(),
                identity_name: identity_name.clone(),
                hold_cap,
                backstop_interval,
            },
            kubeconfig: self.agent.kubeconfig.clone(),
            admin_listen: self
                .admin_listen
                .or(file.admin_listen)
                .unwrap_or_else(|| ([0, 0, 0, 0], 8481).into()),
            identity: identity_name,
            json_logs,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_settings_name_the_flag_env_and_file_key() {
        let err = required(None, "--poll-interval").unwrap_err().to_string();
        assert!(
            err.contains("--poll-interval")
                && err.contains("WINDVANE_POLL_INTERVAL")
                && err.contains("pollInterval"),
            "{err}"
        );
    }
}
