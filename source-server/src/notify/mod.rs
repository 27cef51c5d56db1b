//! Notifications: which state changes and drift page someone, deduplicated, and delivered to webhooks.
//!
//! Configured from a JSON (or YAML) file ([`Config`]): sinks — a generic JSON webhook, a Slack-compatible
//! incoming webhook or PagerDuty Events v2 ([`crate::notify::pagerduty`]) — each optionally limited to some
//! triggers, a minimum and a maximum severity and a label selector.
//! Triggers: a cluster enters OutOfSync, Degraded, Failed, Contested or Unknown; it recovers (reaches Synced
//! after any of those); drift on RBAC (`rbac.authorization.k8s.io`), NetworkPolicy, admission webhook
//! configurations or `securityContext` fields (always severity critical).
//!
//! Events come from the ingest writer (each accepted heartbeat, after its commit) and from a periodic scan of
//! the database (which is how silence becomes Unknown). The decisions are pure ([`Tracker::observe`],
//! [`transition`], [`drift_severity`]); each candidate is then claimed in the database under
//! `(cluster, trigger, release serial)` within the cluster's alert episode — one episode runs from entering an
//! alerting state until the cluster is Synced again, and the episodes are stored
//! ([`crate::db::decide_episode`]) — so it is sent once per episode across restarts and replicas,
//! and a cluster that goes Unknown, recovers and goes Unknown again in one release alerts twice. A claim
//! queues one delivery per sink in the database's outbox in the same transaction; the replica leading the
//! sender delivers them, with retries and exponential backoff ([`crate::notify::outbox`]). Ingestion never
//! waits for any of this: events travel through a bounded queue and are dropped (and counted) when it is full.

//!
//! This folder is stage 5 of the server: besides the notifier here, the [`audit`] export (every stored drift
//! record as a JSON line to a file or URL), the open [`break_glass`] changes (decided from the drift audit log;
//! reminded here, listed by the page), [`pagerduty`]'s events, the [`outbox`] sender and [`escape`] (text from
//! clusters made safe for each sink). Data comes from the ingest writer and the database; it goes to the
//! sinks, off this server.

pub mod audit;
pub mod break_glass;
pub mod escape;
pub mod outbox;
pub mod pagerduty;

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use windvane_shared::wire::heartbeat::DriftRecord;

use crate::db::{Database, Db, EpisodeClaim, NewDelivery, VerifiedHeartbeat, episode_key};
use crate::fleet::metrics::Metrics;
use crate::fleet::status::{self, ClusterFacts, ClusterState, Filter};
use crate::{Error, Result};

/// How bad a notification is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Info,
    Warning,
    Critical,
}

/// What happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trigger {
    /// The cluster entered an alerting state.
    Entered(ClusterState),
    /// The cluster is Synced again after an alerting state.
    Recovered,
    /// Security-relevant drift on one object.
    Drift { object: String },
    /// A two-person break-glass change on a prevented object: `opened` (held), `expiring` (its hold ends
    /// within the hour) or `reverted`; `episode` tells one change from the next on the same object.
    BreakGlass {
        object: String,
        phase: &'static str,
        episode: String,
    },
}

impl Trigger {
    /// The trigger's name in configs and payloads: the state's name, `Recovered` or `Drift`.
    pub fn name(&self) -> &str {
        match self {
            Trigger::Entered(state) => state.as_str(),
            Trigger::Recovered => "Recovered",
            Trigger::Drift { .. } => "Drift",
            Trigger::BreakGlass { .. } => "BreakGlass",
        }
    }

    /// The dedup key within a cluster, serial and episode.
    pub fn key(&self) -> String {
        match self {
            Trigger::Drift { object } => format!("Drift {object}"),
            Trigger::BreakGlass {
                object,
                phase,
                episode,
            } => format!("BreakGlass {phase} {object} {episode}"),
            other => other.name().to_owned(),
        }
    }

    /// What the trigger does to the cluster's alert episode.
    pub fn claim(&self) -> EpisodeClaim {
        match self {
            Trigger::Entered(_) => EpisodeClaim::Open,
            Trigger::Recovered => EpisodeClaim::Close,
            Trigger::Drift { .. } | Trigger::BreakGlass { .. } => EpisodeClaim::Within,
        }
    }
}

/// One kind of sink.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SinkKind {
    /// POSTs the notification as JSON.
    Webhook,
    /// POSTs `{"text": …}` to a Slack-compatible incoming webhook.
    Slack,
    /// POSTs a PagerDuty Events API v2 event ([`crate::notify::pagerduty`]): trigger, and resolve on recovery.
    Pagerduty,
}

/// One destination.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Sink {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: SinkKind,
    pub url: String,
    /// Trigger names (`Failed`, `Unknown`, `Recovered`, `Drift`, …); absent = all.
    #[serde(default)]
    pub triggers: Option<Vec<String>>,
    #[serde(default = "default_severity")]
    pub min_severity: Severity,
    /// A label selector: only clusters it matches.
    #[serde(default)]
    pub selector: Option<String>,
    /// Only notifications up to this severity (route critical to PagerDuty, the rest to Slack).
    #[serde(default)]
    pub max_severity: Option<Severity>,
    /// PagerDuty: the integration's routing key (or `routingKeyFile`).
    #[serde(default, skip_serializing)]
    pub routing_key: Option<String>,
    /// PagerDuty: a file holding the routing key, relative to the config file.
    #[serde(default)]
    pub routing_key_file: Option<std::path::PathBuf>,
}

fn default_severity() -> Severity {
    Severity::Info
}

/// The notifications config file.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Config {
    pub sinks: Vec<Sink>,
}

pub(crate) const TRIGGER_NAMES: [&str; 8] = [
    "OutOfSync",
    "Degraded",
    "Failed",
    "Contested",
    "Unknown",
    "Recovered",
    "Drift",
    "BreakGlass",
];

impl Config {
    /// Reads and checks the file: JSON, or YAML if the file is not JSON.
    pub fn load(path: &Path) -> Result<Config> {
        let bad = |detail: String| Error::NotificationConfig {
            path: path.to_path_buf(),
            detail,
        };
        let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
        let mut config = Config::parse(&text).map_err(|e| bad(e.to_string()))?;
        let base = path.parent().unwrap_or(Path::new("."));
        for sink in &mut config.sinks {
            if let Some(file) = &sink.routing_key_file {
                let file = base.join(file);
                let key = std::fs::read_to_string(&file).map_err(|e| {
                    bad(format!(
                        "sink {}: routingKeyFile {}: {e}",
                        sink.name,
                        file.display()
                    ))
                })?;
                sink.routing_key = Some(key.trim().to_owned());
            }
        }
        Ok(config)
    }

    /// Parses config text (JSON) and checks it.
    /// Parses config text, JSON or YAML (one document), and checks it.
    pub fn parse(text: &str) -> Result<Config> {
        let value = match serde_json::from_str::<serde_json::Value>(text) {
            Ok(value) => value,
            Err(_) => {
                let limits = windvane_shared::text::yaml::YamlLimits::default();
                let mut documents = windvane_shared::text::yaml::documents_to_json(
                    text,
                    "notifications config",
                    limits,
                )?;
                if documents.len() != 1 {
                    return Err(Error::NotificationDocuments {
                        found: documents.len(),
                    });
                }
                documents.remove(0).1
            }
        };
        let config: Config =
            serde_json::from_value(value).map_err(|source| Error::NotificationSchema { source })?;
        config.check()?;
        Ok(config)
    }

    fn check(&self) -> Result<()> {
        for sink in &self.sinks {
            let name = || sink.name.clone();
            if !(sink.url.starts_with("http://") || sink.url.starts_with("https://")) {
                return Err(Error::SinkUrl { sink: name() });
            }
            let keyed = sink.routing_key.is_some() || sink.routing_key_file.is_some();
            if sink.kind == SinkKind::Pagerduty && !keyed {
                return Err(Error::SinkRoutingKey { sink: name() });
            }
            for trigger in sink.triggers.iter().flatten() {
                if !TRIGGER_NAMES.contains(&trigger.as_str()) {
                    return Err(Error::SinkTrigger {
                        sink: name(),
                        trigger: trigger.clone(),
                    });
                }
            }
            if let Some(selector) = &sink.selector {
                Filter::parse(Some(selector), &[]).map_err(|source| Error::SinkSelector {
                    sink: name(),
                    source: Box::new(source),
                })?;
            }
        }
        Ok(())
    }
}

/// Drift on these is critical: who may do what, what may talk to what, what admission lets in, and how
/// containers run.
pub fn drift_severity(record: &DriftRecord) -> Severity {
    let critical_kind = matches!(
        (record.group.as_str(), record.kind.as_str()),
        ("rbac.authorization.k8s.io", _)
            | ("networking.k8s.io", "NetworkPolicy")
            | (
                "admissionregistration.k8s.io",
                "ValidatingWebhookConfiguration" | "MutatingWebhookConfiguration"
            )
            | (
                "admissionregistration.k8s.io",
                "ValidatingAdmissionPolicy" | "ValidatingAdmissionPolicyBinding"
            )
    );
    let critical_field = record
        .fields
        .iter()
        .any(|f| f.split('/').any(|segment| segment == "securityContext"));
    if critical_kind || critical_field {
        Severity::Critical
    } else {
        Severity::Warning
    }
}

fn object_name(record: &DriftRecord) -> String {
    let group = if record.group.is_empty() {
        String::new()
    } else {
        format!("{}/", record.group)
    };
    match &record.namespace {
        Some(ns) => format!("{group}{} {ns}/{}", record.kind, record.name),
        None => format!("{group}{} {}", record.kind, record.name),
    }
}

/// What the notifier learns about a cluster.
#[derive(Debug, Clone)]
pub struct Event {
    pub cluster: String,
    pub labels: BTreeMap<String, String>,
    pub state: ClusterState,
    /// The state stored before this heartbeat (for a notifier that has no memory of the cluster yet).
    pub previous: Option<ClusterState>,
    pub serial: u64,
    pub message: Option<String>,
    pub drift: Vec<DriftRecord>,
    /// Drift records of break-glass changes in a heartbeat: held (opened), reverted, or taken in by a release.
    pub break_glass: Vec<DriftRecord>,
    /// Open break-glass changes whose hold ends within the hour (from the scan).
    pub break_glass_expiring: Vec<DriftRecord>,
    pub at: Timestamp,
}

impl Event {
    /// The event of an accepted heartbeat.
    pub fn from_heartbeat(
        hb: &VerifiedHeartbeat,
        previous: Option<windvane_shared::wire::status::SyncState>,
    ) -> Event {
        let h = &hb.heartbeat;
        Event {
            cluster: h.cluster.clone(),
            labels: h.labels.clone(),
            state: ClusterState::from_reported(h.state),
            previous: previous.map(ClusterState::from_reported),
            serial: h.source.applied_serial.unwrap_or(0),
            message: h.last_error.clone(),
            drift: h
                .drift
                .iter()
                .filter(|d| drift_severity(d) == Severity::Critical)
                .cloned()
                .collect(),
            break_glass: h
                .drift
                .iter()
                .filter(|d| d.break_glass.is_some())
                .cloned()
                .collect(),
            break_glass_expiring: Vec::new(),
            at: hb.received_at,
        }
    }
}

/// A notification to claim and send.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Notification {
    /// `cluster/trigger-key/serial` in the cluster's first alert episode, `cluster/trigger-key#N/serial` in its
    /// Nth: the dedup key, also a stable id receivers can dedupe on.
    pub id: String,
    pub cluster: String,
    pub trigger: String,
    #[serde(skip)]
    pub trigger_key: String,
    #[serde(skip)]
    pub claim: EpisodeClaim,
    /// The cluster's alert episode it belongs to (set when claimed; 0 before any episode).
    pub episode: u64,
    pub severity: Severity,
    pub state: ClusterState,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub previous_state: Option<ClusterState>,
    pub serial: u64,
    pub labels: BTreeMap<String, String>,
    pub summary: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drift: Option<DriftRecord>,
    pub at: Timestamp,
}

/// The trigger for a move from `previous` to `next`, if any: entering an alerting state from any other
/// state; and (given whether the cluster was alerting since it was last Synced) reaching Synced again.
pub fn transition(
    previous: Option<ClusterState>,
    next: ClusterState,
    was_alerting: bool,
) -> Option<Trigger> {
    if status::is_alerting(next) && previous != Some(next) {
        Some(Trigger::Entered(next))
    } else if next == ClusterState::Synced && was_alerting {
        Some(Trigger::Recovered)
    } else {
        None
    }
}

/// What the notifier remembers of a cluster: its last state (unknown for one seeded from the database), and
/// whether it has alerted since it was Synced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Memory {
    state: Option<ClusterState>,
    alerting: bool,
}

/// The notifier's memory: the last state of each cluster, and whether it has alerted since it was Synced.
#[derive(Debug, Default)]
pub struct Tracker {
    clusters: HashMap<String, Memory>,
}

impl Tracker {
    /// Remembers `clusters` as alerting: those whose alert episode is open in the database, so that a
    /// restarted notifier still sends their recovery (and closes the episode) when they are Synced again.
    pub fn seed_alerting(&mut self, clusters: impl IntoIterator<Item = String>) {
        for cluster in clusters {
            self.clusters.entry(cluster).or_insert(Memory {
                state: None,
                alerting: true,
            });
        }
    }

    /// Updates the memory with `event` and returns the notifications it calls for (before dedup).
    pub fn observe(&mut self, event: &Event) -> Vec<Notification> {
        let remembered = self.clusters.get(&event.cluster).copied();
        let previous = remembered.and_then(|m| m.state).or(event.previous);
        let was_alerting =
            remembered.map_or(previous.is_some_and(status::is_alerting), |m| m.alerting);
        let trigger = transition(previous, event.state, was_alerting);
        let alerting = match event.state {
            ClusterState::Synced => false,
            state if status::is_alerting(state) => true,
            _ => was_alerting,
        };
        self.clusters.insert(
            event.cluster.clone(),
            Memory {
                state: Some(event.state),
                alerting,
            },
        );

        let critical_drift = !event.drift.is_empty();
        let mut out = Vec::new();
        if let Some(trigger) = trigger {
            let severity = match &trigger {
                Trigger::Recovered => Severity::Info,
                Trigger::Entered(ClusterState::Failed) => Severity::Critical,
                Trigger::Entered(ClusterState::OutOfSync) if critical_drift => Severity::Critical,
                _ => Severity::Warning,
            };
            let summary = match &trigger {
                Trigger::Recovered => format!("cluster {} recovered: Synced again", event.cluster),
                other => format!("cluster {} is {}", event.cluster, other.name()),
            };
            out.push(self.notification(event, trigger, severity, previous, summary, None));
        }
        for record in &event.drift {
            let object = object_name(record);
            let who = record.manager.as_deref().unwrap_or("an unknown manager");
            let summary = format!(
                "critical drift on cluster {}: {object} changed by {who}",
                event.cluster
            );
            let trigger = Trigger::Drift { object };
            out.push(self.notification(
                event,
                trigger,
                Severity::Critical,
                previous,
                summary,
                Some(record.clone()),
            ));
        }
        let break_glass = event.break_glass.iter().map(|r| (r, false));
        let expiring = event.break_glass_expiring.iter().map(|r| (r, true));
        for (record, expiring) in break_glass.chain(expiring) {
            if let Some(notification) = self.break_glass(event, previous, record, expiring) {
                out.push(notification);
            }
        }
        out
    }

    /// The notification of a break-glass record: opened when held, reverted, taken in (a release now declares
    /// the change, so it is closed and will not be reverted: those told it opened, and perhaps that it was
    /// expiring, learn it is over, at the same severity so the same sinks hear it), or `expiring` (a held
    /// record whose hold ends within the hour, as the scan finds it).
    fn break_glass(
        &self,
        event: &Event,
        previous: Option<ClusterState>,
        record: &DriftRecord,
        expiring: bool,
    ) -> Option<Notification> {
        use windvane_shared::wire::heartbeat::DriftAction;
        let names = record.break_glass.as_ref()?;
        let phase = match record.action {
            DriftAction::Held if expiring => "expiring",
            DriftAction::Held => "opened",
            DriftAction::Reverted if !expiring => "reverted",
            DriftAction::TakenIn if !expiring => "taken in",
            _ => return None,
        };
        let object = object_name(record);
        let summary = format!(
            "break-glass {phase} on cluster {}: {object} by {}, approved by {}, ticket {}, until {}",
            event.cluster, names.by, names.approver, names.ticket, names.until
        );
        let trigger = Trigger::BreakGlass {
            object,
            phase,
            episode: record.detected_at.to_string(),
        };
        Some(self.notification(
            event,
            trigger,
            Severity::Warning,
            previous,
            summary,
            Some(record.clone()),
        ))
    }

    /// Forgets a cluster (after `windvane cluster forget`).
    pub fn forget(&mut self, cluster: &str) {
        self.clusters.remove(cluster);
    }

    fn notification(
        &self,
        event: &Event,
        trigger: Trigger,
        severity: Severity,
        previous: Option<ClusterState>,
        summary: String,
        drift: Option<DriftRecord>,
    ) -> Notification {
        let key = trigger.key();
        Notification {
            id: format!("{}/{key}/{}", event.cluster, event.serial),
            cluster: event.cluster.clone(),
            trigger: trigger.name().to_owned(),
            trigger_key: key,
            claim: trigger.claim(),
            episode: 0,
            severity,
            state: event.state,
            previous_state: previous,
            serial: event.serial,
            labels: event.labels.clone(),
            summary,
            message: event.message.clone(),
            drift,
            at: event.at,
        }
    }
}

impl Notification {
    /// The notification as claimed in `episode`: its id names the episode.
    pub fn in_episode(mut self, episode: u64) -> Notification {
        self.episode = episode;
        self.id = format!(
            "{}/{}/{}",
            self.cluster,
            episode_key(&self.trigger_key, episode),
            self.serial
        );
        self
    }
}

/// Whether a sink wants a notification.
pub fn sink_wants(sink: &Sink, notification: &Notification) -> bool {
    let trigger_ok = sink
        .triggers
        .as_ref()
        .is_none_or(|t| t.iter().any(|t| t == &notification.trigger));
    let selector_ok = match &sink.selector {
        Some(selector) => {
            Filter::parse(Some(selector), &[]).is_ok_and(|f| f.matches_labels(&notification.labels))
        }
        None => true,
    };
    let below_max = sink
        .max_severity
        .is_none_or(|max| notification.severity <= max);
    // A recovery (severity info) resolves an incident a PagerDuty sink may have opened at any severity:
    // filtered by severity, a `minSeverity: critical` sink would never close its incidents. Resolving one
    // that was never opened does nothing at PagerDuty.
    let resolves_incident =
        sink.kind == SinkKind::Pagerduty && notification.trigger == Trigger::Recovered.name();
    let severity_ok =
        resolves_incident || (notification.severity >= sink.min_severity && below_max);
    trigger_ok && severity_ok && selector_ok
}

/// The request body for `sink` (PagerDuty needs the sink's routing key).
pub fn sink_body(sink: &Sink, notification: &Notification) -> serde_json::Value {
    match sink.kind {
        SinkKind::Pagerduty => pagerduty::event(
            notification,
            sink.routing_key.as_deref().unwrap_or_default(),
        ),
        kind => body_for(kind, notification),
    }
}

/// The request body for a sink. Text from the cluster (in the summary and the message) is escaped for the
/// sink ([`crate::notify::escape`]); the body goes out as [`crate::notify::escape::json`].
pub fn body_for(kind: SinkKind, notification: &Notification) -> serde_json::Value {
    match kind {
        SinkKind::Webhook => serde_json::to_value(notification).unwrap_or_default(),
        SinkKind::Slack => serde_json::json!({ "text": slack_text(notification) }),
        SinkKind::Pagerduty => pagerduty::event(notification, ""),
    }
}

/// The Slack message: the summary on one line, then the message quoted, every line of it, so that nothing
/// from the cluster escapes the quote or the summary line; both escaped for mrkdwn.
fn slack_text(notification: &Notification) -> String {
    let mut text = format!(
        "[{}] {} (release serial {})",
        match notification.severity {
            Severity::Critical => "CRITICAL",
            Severity::Warning => "warning",
            Severity::Info => "resolved",
        },
        escape::slack(&escape::one_line(&notification.summary)),
        notification.serial
    );
    if let Some(message) = &notification.message {
        for line in message.lines() {
            text.push_str("\n> ");
            text.push_str(&escape::slack(&escape::one_line(line)));
        }
    }
    text
}

/// Delay before retry `attempt` (1-based): 0.5 s doubling, at most 30 s.
pub fn backoff(attempt: u32) -> Duration {
    Duration::from_millis(500u64.saturating_mul(1u64 << attempt.saturating_sub(1).min(6)))
        .min(Duration::from_secs(30))
}

/// How many times a delivery is tried.
pub const MAX_ATTEMPTS: u32 = 6;

/// Settings of the notifier task.
#[derive(Debug, Clone)]
pub struct NotifierSettings {
    pub config: Arc<Config>,
    pub scan_every: Duration,
    pub unknown_after: Option<Duration>,
}

/// The notifier task: observes heartbeat events and periodic scans, claims, and delivers.
pub async fn run(
    settings: NotifierSettings,
    db: Arc<Db>,
    metrics: Arc<Metrics>,
    mut events: mpsc::Receiver<Event>,
) {
    let client = match reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(10))
        .build()
    {
        Ok(client) => client,
        Err(error) => {
            tracing::error!(%error, "cannot build the HTTP client for notifications; notifications are off");
            return;
        }
    };
    let _sender = outbox::spawn(
        Arc::clone(&settings.config),
        Arc::clone(&db),
        Arc::clone(&metrics),
        client,
    );
    let mut tracker = Tracker::default();
    match db.open_episodes().await {
        Ok(alerting) => tracker.seed_alerting(alerting),
        Err(error) => {
            tracing::warn!(%error, "cannot read the open alert episodes; recoveries of clusters alerting before this start may not be notified");
        }
    }
    let mut last_break_glass_scan = None;
    let mut scan = tokio::time::interval(settings.scan_every);
    scan.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let candidates = tokio::select! {
            event = events.recv() => match event {
                Some(event) => tracker.observe(&event),
                None => return,
            },
            _ = scan.tick() => {
                let break_glass = last_break_glass_scan
                    .is_none_or(|t: std::time::Instant| t.elapsed() >= settings.scan_every * BREAK_GLASS_EVERY);
                if break_glass {
                    last_break_glass_scan = Some(std::time::Instant::now());
                }
                match scan_events(&db, settings.unknown_after, break_glass).await {
                    Ok(events) => events.iter().flat_map(|e| tracker.observe(e)).collect(),
                    Err(error) => {
                        tracing::warn!(%error, "notification scan failed");
                        Vec::new()
                    }
                }
            }
        };
        for notification in candidates {
            claim(&db, &settings.config, notification).await;
        }
    }
}

/// Claims `notification` in the database (deduplicated within its cluster's alert episode) and, in the same
/// transaction, queues one delivery per sink that wants it.
async fn claim(db: &Db, config: &Config, notification: Notification) {
    let sinks: Vec<Sink> = config
        .sinks
        .iter()
        .filter(|s| sink_wants(s, &notification))
        .cloned()
        .collect();
    // Opening and closing episodes is claimed even when no sink wants this trigger: the episodes
    // decide what every sink gets next.
    if sinks.is_empty() && notification.claim == EpisodeClaim::Within {
        return;
    }
    let queued = notification.clone();
    let deliveries = move |episode: u64| {
        let notification = queued.in_episode(episode);
        sinks
            .iter()
            .map(|sink| NewDelivery {
                notification_id: notification.id.clone(),
                sink: sink.name.clone(),
                body: escape::json(&sink_body(sink, &notification)),
            })
            .collect()
    };
    match db
        .claim_notification(
            &notification.cluster,
            &notification.trigger_key,
            notification.serial,
            notification.at,
            notification.claim,
            deliveries,
        )
        .await
    {
        Ok(Some(episode)) => {
            let severity = notification.severity;
            let id = notification.in_episode(episode).id;
            tracing::info!(%id, ?severity, "notifying");
        }
        Ok(None) => {}
        Err(error) => {
            tracing::warn!(%error, id = %notification.id, "cannot claim notification; not sending it");
        }
    }
}

/// The current state of every cluster as events (no drift: that comes with heartbeats).
async fn scan_events(
    db: &Db,
    unknown_after: Option<Duration>,
    break_glass: bool,
) -> Result<Vec<Event>> {
    let now = Timestamp::now();
    let clusters = db.list_clusters().await?;
    let expiring = if break_glass {
        expiring_break_glass(db, now).await?
    } else {
        HashMap::new()
    };
    Ok(clusters
        .into_iter()
        .map(|c| {
            let facts = ClusterFacts {
                last_seen: c.last_seen,
                interval: c.interval_seconds.map(Duration::from_secs),
                reported: c.state,
            };
            let verdict = status::verdict(&facts, now, unknown_after);
            let message = (verdict.state == ClusterState::Unknown).then(|| {
                let age = verdict.heartbeat_age.unwrap_or_default();
                format!(
                    "no heartbeat for {} (grace {}); last reported {}",
                    windvane_shared::text::duration::format_duration(Duration::from_secs(
                        age.as_secs()
                    )),
                    windvane_shared::text::duration::format_duration(verdict.grace),
                    verdict.last_reported.map_or("nothing", |s| s.as_str())
                )
            });
            Event {
                labels: c.labels,
                state: verdict.state,
                previous: None,
                serial: c.applied_serial.unwrap_or(0),
                message: message.or(c.last_error),
                drift: Vec::new(),
                break_glass: Vec::new(),
                break_glass_expiring: expiring.get(&c.name).cloned().unwrap_or_default(),
                cluster: c.name,
                at: now,
            }
        })
        .collect())
}

/// Every how many scans the scan also looks for break-glass changes whose hold ends within the hour.
const BREAK_GLASS_EVERY: u32 = 5;

/// The open break-glass records whose hold ends within the hour, by cluster.
async fn expiring_break_glass(
    db: &Db,
    now: Timestamp,
) -> Result<HashMap<String, Vec<DriftRecord>>> {
    let week = now
        .checked_sub(jiff::SignedDuration::from_hours(24 * 7))
        .ok();
    let soon = now
        .checked_add(jiff::SignedDuration::from_hours(1))
        .unwrap_or(now);
    let entries = db.drift(None, week, 500, 0).await?;
    let mut out: HashMap<String, Vec<DriftRecord>> = HashMap::new();
    for entry in break_glass::open_entries(&entries, now) {
        if entry
            .record
            .break_glass
            .as_ref()
            .is_some_and(|b| b.until <= soon)
        {
            out.entry(entry.cluster.clone())
                .or_default()
                .push(entry.record.clone());
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use windvane_shared::wire::heartbeat::DriftAction;

    fn event(state: ClusterState, serial: u64) -> Event {
        Event {
            cluster: "c1".into(),
            labels: [("env".to_owned(), "prod".to_owned())].into(),
            state,
            previous: None,
            serial,
            message: None,
            drift: Vec::new(),
            break_glass: Vec::new(),
            break_glass_expiring: Vec::new(),
            at: Timestamp::from_second(1_800_000_000).expect("valid"),
        }
    }

    fn drift(group: &str, kind: &str, fields: &[&str]) -> DriftRecord {
        DriftRecord {
            app: "a".into(),
            group: group.into(),
            kind: kind.into(),
            namespace: Some("ns".into()),
            name: "x".into(),
            fields: fields.iter().map(|f| (*f).to_owned()).collect(),
            deleted: false,
            manager: Some("kubectl-edit".into()),
            operation: Some("Update".into()),
            changed_at: None,
            detected_at: Timestamp::from_second(1_800_000_000).expect("valid"),
            reverted_at: None,
            action: DriftAction::Reverted,
            break_glass: None,
            revert_requested_by: None,
        }
    }

    fn triggers(tracker: &mut Tracker, e: &Event) -> Vec<String> {
        tracker
            .observe(e)
            .into_iter()
            .map(|n| n.trigger_key)
            .collect()
    }

    #[test]
    fn entering_alerting_states_and_recovering() {
        use ClusterState::*;
        let mut t = Tracker::default();
        assert!(triggers(&mut t, &event(Synced, 1)).is_empty());
        assert_eq!(triggers(&mut t, &event(OutOfSync, 1)), ["OutOfSync"]);
        assert!(
            triggers(&mut t, &event(OutOfSync, 1)).is_empty(),
            "no repeat while it stays"
        );
        assert_eq!(triggers(&mut t, &event(Degraded, 1)), ["Degraded"]);
        assert!(triggers(&mut t, &event(Progressing, 1)).is_empty());
        assert_eq!(
            triggers(&mut t, &event(Synced, 1)),
            ["Recovered"],
            "recovery through Progressing"
        );
        assert!(triggers(&mut t, &event(Synced, 1)).is_empty());
        for state in [Failed, Contested, Unknown] {
            assert_eq!(triggers(&mut t, &event(state, 2)), [state.as_str()]);
        }
        assert!(triggers(&mut t, &event(Held, 2)).is_empty());
        assert!(triggers(&mut t, &event(NeverSeen, 2)).is_empty());
    }

    #[test]
    fn a_fresh_tracker_uses_the_stored_previous_state() {
        use ClusterState::*;
        let mut t = Tracker::default();
        let mut e = event(OutOfSync, 1);
        e.previous = Some(OutOfSync);
        assert!(
            triggers(&mut t, &e).is_empty(),
            "already OutOfSync before the restart"
        );
        let mut t = Tracker::default();
        let mut e = event(Synced, 1);
        e.previous = Some(Failed);
        assert_eq!(triggers(&mut t, &e), ["Recovered"]);
        let mut t = Tracker::default();
        assert_eq!(
            triggers(&mut t, &event(Unknown, 1)),
            ["Unknown"],
            "first sight of a silent cluster"
        );
    }

    #[test]
    fn each_alert_episode_notifies_again_and_names_itself() {
        use ClusterState::*;
        let mut t = Tracker::default();
        let notes: Vec<(String, EpisodeClaim)> = [Unknown, Synced, Unknown, Degraded, Synced]
            .into_iter()
            .flat_map(|state| t.observe(&event(state, 4)))
            .map(|n| (n.trigger_key, n.claim))
            .collect();
        assert_eq!(
            notes,
            [
                ("Unknown".to_owned(), EpisodeClaim::Open),
                ("Recovered".to_owned(), EpisodeClaim::Close),
                ("Unknown".to_owned(), EpisodeClaim::Open),
                ("Degraded".to_owned(), EpisodeClaim::Open),
                ("Recovered".to_owned(), EpisodeClaim::Close),
            ],
            "the same trigger again after a recovery is a candidate again (the database dedups per episode)"
        );
        let second = t.observe(&event(Failed, 4)).remove(0).in_episode(2);
        assert_eq!(second.id, "c1/Failed#2/4");
        assert_eq!(body_for(SinkKind::Webhook, &second)["episode"], 2);
        assert_eq!(
            t.observe(&event(Synced, 4)).remove(0).in_episode(1).id,
            "c1/Recovered/4",
            "the first episode keeps the ids of before"
        );
    }

    #[test]
    fn a_restarted_tracker_seeded_with_open_episodes_sends_their_recovery() {
        let mut t = Tracker::default();
        t.seed_alerting(["c1".to_owned()]);
        let mut e = event(ClusterState::Synced, 1);
        e.previous = Some(ClusterState::Synced);
        assert_eq!(
            triggers(&mut t, &e),
            ["Recovered"],
            "an Unknown cluster's stored state is its last report (Synced): only the episode says it alerted"
        );
        let mut fresh = Tracker::default();
        assert!(triggers(&mut fresh, &e).is_empty());
    }

    #[test]
    fn drift_severity_by_kind_and_field() {
        assert_eq!(
            drift_severity(&drift(
                "rbac.authorization.k8s.io",
                "ClusterRole",
                &["/rules"]
            )),
            Severity::Critical
        );
        assert_eq!(
            drift_severity(&drift("networking.k8s.io", "NetworkPolicy", &["/spec"])),
            Severity::Critical
        );
        assert_eq!(
            drift_severity(&drift(
                "admissionregistration.k8s.io",
                "MutatingWebhookConfiguration",
                &[]
            )),
            Severity::Critical
        );
        assert_eq!(
            drift_severity(&drift(
                "apps",
                "Deployment",
                &["/spec/template/spec/containers/0/securityContext/privileged"]
            )),
            Severity::Critical
        );
        assert_eq!(
            drift_severity(&drift("apps", "Deployment", &["/spec/replicas"])),
            Severity::Warning
        );
        assert_eq!(
            drift_severity(&drift("", "ConfigMap", &["/data/securityContextNote"])),
            Severity::Warning
        );
    }

    #[test]
    fn critical_drift_is_notified_per_object_and_raises_out_of_sync() {
        let mut t = Tracker::default();
        let mut e = event(ClusterState::OutOfSync, 3);
        e.drift = vec![drift("rbac.authorization.k8s.io", "Role", &["/rules"])];
        let notes = t.observe(&e);
        assert_eq!(notes.len(), 2);
        assert_eq!(notes[0].severity, Severity::Critical);
        assert_eq!(notes[1].trigger, "Drift");
        assert_eq!(
            notes[1].trigger_key,
            "Drift rbac.authorization.k8s.io/Role ns/x"
        );
        assert_eq!(
            notes[1].id,
            "c1/Drift rbac.authorization.k8s.io/Role ns/x/3"
        );
        assert!(notes[1].summary.contains("kubectl-edit"));
    }

    #[test]
    fn break_glass_notifies_on_open_before_expiry_and_on_revert() {
        use windvane_shared::wire::heartbeat::BreakGlassRecord;
        let mut record = drift("apps", "Deployment", &["/spec/template"]);
        record.action = DriftAction::Held;
        record.break_glass = Some(BreakGlassRecord {
            by: "alice".into(),
            approver: "bob".into(),
            ticket: "INC-7".into(),
            until: Timestamp::from_second(1_800_003_600).expect("valid"),
        });
        let mut t = Tracker::default();
        let mut held = event(ClusterState::Held, 3);
        held.break_glass = vec![record.clone()];
        let notes = t.observe(&held);
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert_eq!(notes[0].trigger, "BreakGlass");
        assert!(
            notes[0]
                .trigger_key
                .starts_with("BreakGlass opened apps/Deployment ns/x ")
        );
        assert!(
            notes[0]
                .summary
                .contains("alice, approved by bob, ticket INC-7"),
            "{}",
            notes[0].summary
        );
        let mut scanned = event(ClusterState::Held, 3);
        scanned.break_glass_expiring = vec![record.clone()];
        let notes = t.observe(&scanned);
        assert!(notes[0].trigger_key.starts_with("BreakGlass expiring "));
        record.action = DriftAction::Reverted;
        let mut reverted = event(ClusterState::Synced, 3);
        reverted.break_glass = vec![record];
        let notes = t.observe(&reverted);
        let keys: Vec<&str> = notes.iter().map(|n| n.trigger_key.as_str()).collect();
        assert!(
            keys.iter().any(|k| k.starts_with("BreakGlass reverted ")),
            "{keys:?}"
        );
    }

    #[test]
    fn a_break_glass_change_a_release_took_in_notifies_that_it_is_over() {
        use windvane_shared::wire::heartbeat::BreakGlassRecord;
        let mut record = drift("apps", "Deployment", &["/spec/template"]);
        record.action = DriftAction::TakenIn;
        record.break_glass = Some(BreakGlassRecord {
            by: "alice".into(),
            approver: "bob".into(),
            ticket: "INC-7".into(),
            until: Timestamp::from_second(1_800_003_600).expect("valid"),
        });
        let mut t = Tracker::default();
        let mut taken = event(ClusterState::Synced, 4);
        taken.break_glass = vec![record.clone()];
        let notes = t.observe(&taken);
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(
            notes[0]
                .trigger_key
                .starts_with("BreakGlass taken in apps/Deployment ns/x "),
            "{}",
            notes[0].trigger_key
        );
        assert!(
            notes[0]
                .summary
                .starts_with("break-glass taken in on cluster c1: apps/Deployment ns/x by alice"),
            "{}",
            notes[0].summary
        );
        assert_eq!(notes[0].severity, Severity::Warning);
        // A taken-in record is never an expiring one.
        let mut scanned = event(ClusterState::Synced, 4);
        scanned.break_glass_expiring = vec![record];
        assert!(t.observe(&scanned).is_empty());
    }

    #[test]
    fn pagerduty_sinks_need_a_routing_key_and_route_by_severity() {
        let missing = Config::parse(
            r#"{"sinks":[{"name":"pd","type":"pagerduty","url":"https://events.pagerduty.com/v2/enqueue"}]}"#,
        )
        .unwrap_err();
        assert!(
            matches!(&missing, Error::SinkRoutingKey { sink } if sink == "pd"),
            "{missing}"
        );
        assert!(missing.to_string().contains("routingKey"), "{missing}");
        let config = Config::parse(
            r#"{"sinks":[
                {"name":"pd","type":"pagerduty","url":"http://127.0.0.1:9/v2/enqueue","routingKey":"R",
                 "minSeverity":"critical"},
                {"name":"rest","type":"slack","url":"http://127.0.0.1:9/s","maxSeverity":"warning"}]}"#,
        )
        .expect("valid");
        let mut t = Tracker::default();
        let failed = t.observe(&event(ClusterState::Failed, 1)).remove(0);
        assert!(sink_wants(&config.sinks[0], &failed));
        assert!(
            !sink_wants(&config.sinks[1], &failed),
            "critical goes to PagerDuty only"
        );
        let body = sink_body(&config.sinks[0], &failed);
        assert_eq!(body["routing_key"], "R");
        assert_eq!(body["event_action"], "trigger");
        let out_of_sync = t.observe(&event(ClusterState::OutOfSync, 1)).remove(0);
        assert!(!sink_wants(&config.sinks[0], &out_of_sync));
        assert!(sink_wants(&config.sinks[1], &out_of_sync));
        // The recovery (severity info) still reaches the critical-only PagerDuty sink, to resolve its incident.
        let recovered = t.observe(&event(ClusterState::Synced, 1)).remove(0);
        assert_eq!(recovered.trigger, "Recovered");
        assert!(sink_wants(&config.sinks[0], &recovered));
        assert_eq!(
            sink_body(&config.sinks[0], &recovered)["event_action"],
            "resolve"
        );
        // The routing key is a secret: never written back out.
        assert!(
            !serde_json::to_string(&config.sinks[0])
                .unwrap()
                .contains("\"R\"")
        );
    }

    #[test]
    fn routing_keys_are_read_from_a_file_beside_the_config() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("pd.key"), "K3Y\n").expect("write");
        let path = dir.path().join("notifications.yaml");
        std::fs::write(
            &path,
            "sinks:\n  - {name: pd, type: pagerduty, url: 'http://127.0.0.1:9/e', routingKeyFile: pd.key}\n",
        )
        .expect("write");
        let config = Config::load(&path).expect("loads");
        assert_eq!(config.sinks[0].routing_key.as_deref(), Some("K3Y"));
        std::fs::remove_file(dir.path().join("pd.key")).expect("remove");
        let error = Config::load(&path).unwrap_err().to_string();
        assert!(error.contains("routingKeyFile"), "{error}");
    }

    #[test]
    fn config_parsing_and_sink_filters() {
        let config = Config::parse(
            r#"{"sinks":[
                {"name":"all","type":"webhook","url":"http://127.0.0.1:9/x"},
                {"name":"crit","type":"slack","url":"https://hooks.example/x","minSeverity":"critical",
                 "triggers":["Failed","Drift"],"selector":"env=prod"}]}"#,
        )
        .expect("valid");
        let mut t = Tracker::default();
        let failed = t.observe(&event(ClusterState::Failed, 1)).remove(0);
        assert!(sink_wants(&config.sinks[0], &failed));
        assert!(sink_wants(&config.sinks[1], &failed));
        let recovered = t.observe(&event(ClusterState::Synced, 1)).remove(0);
        assert!(sink_wants(&config.sinks[0], &recovered));
        assert!(!sink_wants(&config.sinks[1], &recovered));
        assert!(
            Config::parse(r#"{"sinks":[{"name":"x","type":"webhook","url":"ftp://x"}]}"#).is_err()
        );
        assert!(
            Config::parse(
                r#"{"sinks":[{"name":"x","type":"webhook","url":"http://x","triggers":["Bad"]}]}"#
            )
            .is_err()
        );
        assert!(
            Config::parse(r#"{"sinks":[{"name":"x","type":"email","url":"http://x"}]}"#).is_err()
        );
        assert!(Config::parse(r#"{"sinks":[],"extra":1}"#).is_err());
        let yaml = Config::parse("sinks:\n  - name: ops\n    type: slack\n    url: https://hooks.example/x\n    minSeverity: critical\n")
            .expect("yaml");
        assert_eq!(
            (yaml.sinks[0].kind, yaml.sinks[0].min_severity),
            (SinkKind::Slack, Severity::Critical)
        );
        assert!(Config::parse("sinks: [").is_err());
    }

    #[test]
    fn slack_and_webhook_bodies() {
        let mut t = Tracker::default();
        let n = t.observe(&event(ClusterState::Failed, 7)).remove(0);
        let slack = body_for(SinkKind::Slack, &n);
        assert_eq!(
            slack["text"],
            "[CRITICAL] cluster c1 is Failed (release serial 7)"
        );
        let hook = body_for(SinkKind::Webhook, &n);
        assert_eq!(hook["id"], "c1/Failed/7");
        assert_eq!(hook["state"], "Failed");
        assert_eq!(hook["severity"], "critical");
    }

    #[test]
    fn text_from_the_cluster_cannot_write_slack_markup_or_leave_the_quote() {
        let mut e = event(ClusterState::OutOfSync, 7);
        let mut record = drift("rbac.authorization.k8s.io", "ClusterRoleBinding", &[]);
        record.manager = Some("<!channel> <https://evil.example|Approve> & co\nfake line".into());
        e.drift = vec![record];
        e.message =
            Some("apply failed\n<!here> approve at <https://evil.example|this link>".into());
        let mut t = Tracker::default();
        let drift = t
            .observe(&e)
            .into_iter()
            .find(|n| n.trigger == "Drift")
            .expect("a drift notification");
        let text = body_for(SinkKind::Slack, &drift)["text"]
            .as_str()
            .expect("text")
            .to_owned();
        assert!(!text.contains('<') && !text.contains("& "), "{text}");
        assert!(
            text.contains(
                "&lt;!channel&gt; &lt;https://evil.example|Approve&gt; &amp; co fake line"
            ),
            "{text}"
        );
        assert_eq!(
            text.lines().collect::<Vec<_>>()[1..],
            [
                "> apply failed",
                "> &lt;!here&gt; approve at &lt;https://evil.example|this link&gt;"
            ],
            "every line of the message stays quoted: {text}"
        );
        let webhook = escape::json(&body_for(SinkKind::Webhook, &drift));
        assert!(!webhook.contains('<'), "{webhook}");
        let back: serde_json::Value = serde_json::from_str(&webhook).expect("JSON");
        assert_eq!(
            back["drift"]["manager"], "<!channel> <https://evil.example|Approve> & co\nfake line",
            "the webhook's values decode unchanged"
        );
    }

    #[test]
    fn backoff_doubles_and_caps() {
        assert_eq!(backoff(1), Duration::from_millis(500));
        assert_eq!(backoff(2), Duration::from_secs(1));
        assert_eq!(backoff(3), Duration::from_secs(2));
        assert_eq!(backoff(20), Duration::from_secs(30));
    }
}
