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
use windvane_shared::crypto::keys::TrustedKeys;
use windvane_shared::decide::render::ClusterIdentity;
use windvane_shared::spec::selector::parse_label_assignment;
use windvane_shared::text::duration::parse_duration;

use crate::apply::ApplyOptions;
use crate::apply::allowlist::Allowlist;
use crate::engine::EngineConfig;
use crate::fetch::source::SourceLimits;
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
    /// Approver public keys (SPKI PEM files); repeat or separate with commas. A release whose signed rollout
    /// requires approval is applied only once this many of them (never the publisher's key) signed it.
    #[arg(
        long = "approver-key",
        value_name = "PUB",
        value_delimiter = ',',
        env = "WINDVANE_APPROVER_KEYS"
    )]
    pub approver_keys: Vec<PathBuf>,
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
    /// Secret in the agent's namespace whose `*.agekey` entries hold the age identities that open
    /// SOPS-encrypted manifests (read at every sync). Without it, SOPS objects fail and the rest applies.
    #[arg(long, value_name = "NAME", env = "WINDVANE_AGE_KEY_SECRET")]
    pub age_key_secret: Option<String>,
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
    /// How long a source that holds polls (windvane-server) may hold one until the pointer changes, so a
    /// publish arrives in about a second; static hosts ignore it. 0s turns it off. [default: 60s]
    #[arg(long, value_name = "DURATION", env = "WINDVANE_LONG_POLL_WAIT")]
    pub long_poll_wait: Option<String>,
    /// Address of the admin server (/livez, /readyz, /status, /metrics). Loopback by default: in a pod, give
    /// 0.0.0.0:8481 so that the kubelet's probes and Prometheus reach it. [default: 127.0.0.1:8481]
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
    /// The group whose members may make a two-person break-glass change to an object under prevention.
    /// [default: windvane:break-glass]
    #[arg(long, value_name = "GROUP", env = "WINDVANE_BREAK_GLASS_GROUP")]
    pub break_glass_group: Option<String>,
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
    /// The operator's approval floor: every new release is applied only once N distinct --approver-key keys
    /// (never the key that signed it) approved it, whatever its signed rollout says. [default: 0]
    #[arg(long, value_name = "N", env = "WINDVANE_REQUIRE_APPROVALS")]
    pub require_approvals: Option<u32>,
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
    /// The agent's namespace and its age identity Secret, to open SOPS objects as the agent does.
    pub namespace: String,
    pub age_key_secret: Option<String>,
}

impl DiffArgs {
    /// Resolves and checks the settings of `diff`.
    pub fn resolve(&self) -> Result<DiffConfig> {
        let file = read_file_config(&self.agent.config)?;
        let agent = self.agent.resolve(&file)?;
        Ok(DiffConfig {
            source_url: agent.source_url,
            channel: agent.channel,
            fleet: agent.fleet,
            trusted: agent.trusted,
            identity: agent.identity,
            allowlist: agent.allowlist,
            kubeconfig: self.agent.kubeconfig.clone(),
            namespace: agent.namespace,
            age_key_secret: agent.age_key_secret,
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
    #[serde(default)]
    approver_keys: Vec<PathBuf>,
    fleet: Option<String>,
    cluster: Option<String>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    namespace: Option<String>,
    age_key_secret: Option<String>,
    #[serde(default)]
    allow_kinds: Vec<String>,
    #[serde(default)]
    allow_namespaces: Vec<String>,
    poll_interval: Option<String>,
    long_poll_wait: Option<String>,
    admin_listen: Option<SocketAddr>,
    prune_budget: Option<f64>,
    log_format: Option<String>,
    hold_cap: Option<String>,
    break_glass_group: Option<String>,
    backstop_interval: Option<String>,
    server: Option<String>,
    registration_token_file: Option<PathBuf>,
    heartbeat_interval: Option<String>,
    require_approvals: Option<u32>,
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
    pub reporter: Option<crate::report::heartbeat::ReporterConfig>,
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
    let documents =
        windvane_shared::text::yaml::documents_to_json(&text, &name, Default::default())?;
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

/// Loads approver keys (none is fine: then no release that requires approval can be approved).
fn load_approver_keys(paths: &[PathBuf]) -> Result<TrustedKeys> {
    if paths.is_empty() {
        return Ok(TrustedKeys::new());
    }
    load_trusted_keys(paths)
}

/// The source and identity settings shared by `run` and `diff`.
struct AgentSettings {
    source_url: String,
    channel: String,
    fleet: String,
    trusted: TrustedKeys,
    approvers: TrustedKeys,
    identity: ClusterIdentity,
    allowlist: Allowlist,
    namespace: String,
    age_key_secret: Option<String>,
}

impl AgentArgs {
    /// Resolves the source and identity settings shared by `run` and `diff`.
    fn resolve(&self, file: &FileConfig) -> Result<AgentSettings> {
        let source = required(self.source.clone().or(file.source.clone()), "--source")?;
        let key_paths = if self.trusted_keys.is_empty() {
            &file.trusted_keys
        } else {
            &self.trusted_keys
        };
        let mut labels = file.labels.clone();
        for assignment in &self.labels {
            let (key, value) = parse_label_assignment(assignment)?;
            labels.insert(key, value);
        }
        Ok(AgentSettings {
            source_url: http_url(source, "--source")?,
            channel: required(self.channel.clone().or(file.channel.clone()), "--channel")?,
            fleet: required(self.fleet.clone().or(file.fleet.clone()), "--fleet")?,
            identity: ClusterIdentity {
                name: required(self.cluster.clone().or(file.cluster.clone()), "--cluster")?,
                labels,
            },
            trusted: load_trusted_keys(key_paths)?,
            approvers: load_approver_keys(if self.approver_keys.is_empty() {
                &file.approver_keys
            } else {
                &self.approver_keys
            })?,
            allowlist: Allowlist::new(
                flags_or_file(&self.allow_kinds, &file.allow_kinds),
                flags_or_file(&self.allow_namespaces, &file.allow_namespaces),
            ),
            namespace: self
                .namespace
                .clone()
                .or(file.namespace.clone())
                .unwrap_or_else(|| "windvane-system".to_owned()),
            age_key_secret: self.age_key_secret.clone().or(file.age_key_secret.clone()),
        })
    }
}

/// A list setting: the flags when any were given, else the config file's.
fn flags_or_file(flags: &[String], file: &[String]) -> Vec<String> {
    if flags.is_empty() { file } else { flags }.to_vec()
}

fn http_url(url: String, flag: &str) -> Result<String> {
    if url.starts_with("http://") || url.starts_with("https://") {
        Ok(url)
    } else {
        Err(Error::Config(format!(
            "{flag} {url:?} must be an http:// or https:// URL"
        )))
    }
}

/// A duration setting from the flag, else the config file, else `default`; at least `minimum`.
/// `--long-poll-wait`: zero (off) up to the longest wait a server grants.
fn long_poll_wait(flag_value: &Option<String>, file_value: &Option<String>) -> Result<Duration> {
    let wait = duration_setting(
        flag_value,
        file_value,
        "60s",
        "--long-poll-wait",
        Duration::ZERO,
    )?;
    if wait > Duration::from_secs(120) {
        return Err(Error::Config(format!(
            "--long-poll-wait {}s is above the maximum of 120s (a server holds no poll longer)",
            wait.as_secs()
        )));
    }
    Ok(wait)
}

fn duration_setting(
    flag_value: &Option<String>,
    file_value: &Option<String>,
    default: &str,
    flag: &str,
    minimum: Duration,
) -> Result<Duration> {
    let text = flag_value
        .clone()
        .or(file_value.clone())
        .unwrap_or_else(|| default.to_owned());
    let duration = parse_duration(&text)?;
    if duration < minimum {
        return Err(Error::Config(format!(
            "{flag} {text} is below the minimum of {}s",
            minimum.as_secs()
        )));
    }
    Ok(duration)
}

/// The registration token, read from its file and trimmed; an empty file is an error naming it.
fn read_token(path: &std::path::Path) -> Result<String> {
    let file_error = |detail: String| Error::ConfigFile {
        path: path.display().to_string(),
        detail,
    };
    let token = std::fs::read_to_string(path)
        .map_err(|e| file_error(e.to_string()))?
        .trim()
        .to_owned();
    if token.is_empty() {
        return Err(file_error(
            "the registration token file is empty".to_owned(),
        ));
    }
    if windvane_shared::crypto::keys::is_placeholder(&token) {
        return Err(file_error(
            "the registration token file still holds the example's REPLACE-ME placeholder; put the fleet's \
             registration token in it"
                .to_owned(),
        ));
    }
    Ok(token)
}

const SECOND: Duration = Duration::from_secs(1);
/// The highest `--require-approvals` taken: more would be a typo, not a policy.
const MAX_REQUIRED_APPROVALS: u32 = 16;

/// The operator's approval floor (`--require-approvals`, default 0), checked against the approver keys: a
/// floor that the configured keys could never meet would hold every release forever, so it stops the agent.
fn require_approvals(value: Option<u32>, approvers: &TrustedKeys) -> Result<u32> {
    let floor = value.unwrap_or(0);
    if floor > MAX_REQUIRED_APPROVALS {
        return Err(Error::Config(format!(
            "--require-approvals {floor} is above the maximum of {MAX_REQUIRED_APPROVALS}"
        )));
    }
    let keys = approvers.len();
    if usize::try_from(floor).unwrap_or(usize::MAX) > keys {
        return Err(Error::Config(format!(
            "--require-approvals {floor} needs at least {floor} distinct --approver-key keys (WINDVANE_APPROVER_KEYS, \
             `approverKeys` in the config file), not {keys}: no release could ever be approved"
        )));
    }
    Ok(floor)
}

impl RunArgs {
    /// Resolves and checks every setting of `run`.
    pub fn resolve(&self) -> Result<RunConfig> {
        let file = read_file_config(&self.agent.config)?;
        let agent = self.agent.resolve(&file)?;
        let prune_budget = self.prune_budget.or(file.prune_budget).unwrap_or(0.5);
        if !(0.0..=1.0).contains(&prune_budget) {
            return Err(Error::Config(format!(
                "--prune-budget {prune_budget} must be between 0 and 1"
            )));
        }
        let identity_name = self.identity_name();
        let require_approvals = require_approvals(
            self.require_approvals.or(file.require_approvals),
            &agent.approvers,
        )?;
        Ok(RunConfig {
            reporter: self.reporter(&file, &agent)?,
            json_logs: self.json_logs(&file)?,
            engine: EngineConfig {
                poll_interval: duration_setting(
                    &self.poll_interval,
                    &file.poll_interval,
                    "30s",
                    "--poll-interval",
                    SECOND,
                )?,
                hold_cap: duration_setting(
                    &self.hold_cap,
                    &file.hold_cap,
                    "24h",
                    "--hold-cap",
                    Duration::ZERO,
                )?,
                backstop_interval: duration_setting(
                    &self.backstop_interval,
                    &file.backstop_interval,
                    "1h",
                    "--backstop-interval",
                    SECOND,
                )?,
                break_glass_group: self
                    .break_glass_group
                    .clone()
                    .or(file.break_glass_group.clone())
                    .unwrap_or_else(|| {
                        crate::prevent::policy::DEFAULT_BREAK_GLASS_GROUP.to_owned()
                    }),
                source_url: agent.source_url,
                channel: agent.channel,
                fleet: agent.fleet,
                trusted: agent.trusted,
                approvers: agent.approvers,
                require_approvals,
                identity: agent.identity,
                allowlist: agent.allowlist,
                namespace: agent.namespace,
                age_key_secret: agent.age_key_secret,
                prune_budget,
                apply: ApplyOptions::default(),
                source_limits: SourceLimits {
                    long_poll_wait: long_poll_wait(&self.long_poll_wait, &file.long_poll_wait)?,
                    ..SourceLimits::default()
                },
                identity_name: identity_name.clone(),
                rollout_server: None,
            },
            kubeconfig: self.agent.kubeconfig.clone(),
            admin_listen: self
                .admin_listen
                .or(file.admin_listen)
                .unwrap_or(crate::report::admin::DEFAULT_LISTEN),
            identity: identity_name,
        })
    }

    fn json_logs(&self, file: &FileConfig) -> Result<bool> {
        match self.log_format.as_deref().or(file.log_format.as_deref()) {
            None | Some("text") => Ok(false),
            Some("json") => Ok(true),
            Some(other) => Err(Error::Config(format!(
                "--log-format {other:?} must be text or json"
            ))),
        }
    }

    /// This replica's name in Events: the flag, the pod's name, the host name, or one made from the pid.
    fn identity_name(&self) -> String {
        self.identity
            .clone()
            .or_else(|| std::env::var("POD_NAME").ok())
            .or_else(|| {
                std::fs::read_to_string("/etc/hostname")
                    .ok()
                    .map(|h| h.trim().to_owned())
            })
            .unwrap_or_else(|| format!("windvane-agent-{}", std::process::id()))
    }

    /// The heartbeat reporter's settings, when a server is configured.
    fn reporter(
        &self,
        file: &FileConfig,
        agent: &AgentSettings,
    ) -> Result<Option<crate::report::heartbeat::ReporterConfig>> {
        let Some(server) = self.server.clone().or(file.server.clone()) else {
            return Ok(None);
        };
        let server = http_url(server, "--server")?;
        let token_file = self
            .registration_token_file
            .clone()
            .or(file.registration_token_file.clone())
            .ok_or_else(|| {
                Error::Config(
                    "--server needs --registration-token-file (the fleet registration token)"
                        .to_owned(),
                )
            })?;
        Ok(Some(crate::report::heartbeat::ReporterConfig {
            server,
            token: read_token(&token_file)?,
            fleet: agent.fleet.clone(),
            identity: agent.identity.clone(),
            interval: duration_setting(
                &self.heartbeat_interval,
                &file.heartbeat_interval,
                "30s",
                "--heartbeat-interval",
                SECOND,
            )?,
            namespace: agent.namespace.clone(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_registration_token_file_with_the_examples_placeholder_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        std::fs::write(&file, "REPLACE-ME-with-the-fleet-registration-token\n").unwrap();
        let err = read_token(&file).unwrap_err().to_string();
        assert!(err.contains("REPLACE-ME placeholder"), "{err}");
        std::fs::write(&file, "a-real-token-0123456789\n").unwrap();
        assert_eq!(read_token(&file).unwrap(), "a-real-token-0123456789");
    }

    #[test]
    fn the_long_poll_wait_is_zero_to_two_minutes() {
        assert_eq!(
            long_poll_wait(&None, &None).unwrap(),
            Duration::from_secs(60)
        );
        assert_eq!(
            long_poll_wait(&Some("0s".to_owned()), &None).unwrap(),
            Duration::ZERO
        );
        let err = long_poll_wait(&None, &Some("10m".to_owned()))
            .unwrap_err()
            .to_string();
        assert!(err.contains("above the maximum of 120s"), "{err}");
    }

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

    #[test]
    fn durations_come_from_the_flag_then_the_file_then_the_default_and_respect_the_minimum() {
        let one = Duration::from_secs(1);
        let flag = Some("5s".to_owned());
        let file = Some("1m".to_owned());
        let resolve = |flag: &Option<String>, file: &Option<String>| {
            duration_setting(flag, file, "30s", "--poll-interval", one)
        };
        assert_eq!(resolve(&flag, &file).unwrap(), Duration::from_secs(5));
        assert_eq!(resolve(&None, &file).unwrap(), Duration::from_secs(60));
        assert_eq!(resolve(&None, &None).unwrap(), Duration::from_secs(30));
        let err = resolve(&Some("500ms".to_owned()), &None)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--poll-interval 500ms is below the minimum of 1s"),
            "{err}"
        );
    }

    #[test]
    fn the_approval_floor_must_be_reachable_with_the_approver_keys() {
        use windvane_shared::crypto::keys::signing_key_from_seed;
        let mut approvers = TrustedKeys::new();
        assert_eq!(require_approvals(None, &approvers).unwrap(), 0);
        assert_eq!(require_approvals(Some(0), &approvers).unwrap(), 0);
        let err = require_approvals(Some(1), &approvers)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--require-approvals 1 needs at least 1 distinct --approver-key"),
            "{err}"
        );
        for seed in [2, 3] {
            approvers
                .insert(signing_key_from_seed([seed; 32]).verifying_key())
                .unwrap();
        }
        assert_eq!(require_approvals(Some(2), &approvers).unwrap(), 2);
        assert!(require_approvals(Some(3), &approvers).is_err());
        let err = require_approvals(Some(1000), &approvers)
            .unwrap_err()
            .to_string();
        assert!(err.contains("above the maximum of 16"), "{err}");
    }

    #[test]
    fn the_config_file_names_the_approval_floor() {
        let file: FileConfig =
            serde_json::from_value(serde_json::json!({"requireApprovals": 2})).unwrap();
        assert_eq!(file.require_approvals, Some(2));
    }

    #[test]
    fn urls_must_be_http_and_lists_prefer_the_flags() {
        assert!(http_url("https://store.example".into(), "--source").is_ok());
        let err = http_url("store.example".into(), "--server")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--server \"store.example\" must be an http:// or https:// URL"),
            "{err}"
        );
        let (flags, file) = (vec!["a".to_owned()], vec!["b".to_owned()]);
        assert_eq!(flags_or_file(&flags, &file), flags);
        assert_eq!(flags_or_file(&[], &file), file);
    }
}
