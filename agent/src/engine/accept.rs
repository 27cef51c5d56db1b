//! Taking releases in: what the fetcher task found (nothing new, a refusal, the source unavailable, or a
//! verified release) goes to the report stage; a verified release goes to the gates, which hold it or let it
//! through, and what they let through is persisted as last known good before anything of it is applied.
//! Also the re-verification of the release the cluster remembers, at start. The network side (polls,
//! fetches, verification of what arrives) is the fetcher's ([`crate::fetch::fetcher`]).

use tracing::{Instrument, info, info_span, warn};
use windvane_shared::format::bundle::{Bundle, BundleLimits};
use windvane_shared::format::release::{self, AcceptedRelease};

use super::{Enforced, Engine, Fresh};
use crate::Result;
use crate::fetch::fetcher::{Fetched, FetcherConfig, NewRelease};
use crate::gates::pending::GateStep;
use crate::gates::wave::GateEvent;
use crate::kube::state::KnownGood;

impl Engine {
    /// Re-verifies a persisted release: signature, fleet, channel and digest. Expiry is not checked — an
    /// expired release stays enforced until a newer one is accepted; self-healing never stops.
    pub(super) fn verify_known_good(
        &self,
        known_good: &KnownGood,
    ) -> Result<(AcceptedRelease, Bundle)> {
        let accepted = release::verify_known_good(
            &known_good.pointer,
            &self.config.trusted,
            &self.config.fleet,
            &self.config.channel,
        )?;
        let bundle = release::verify_bundle(
            &known_good.bundle,
            &accepted.pointer,
            self.config.source_limits.max_bundle_bytes,
            BundleLimits::default(),
        )?;
        Ok((accepted, bundle))
    }

    /// What the fetcher found. True when a new release was accepted and persisted, to be applied now.
    pub(super) async fn on_fetched(&mut self, fetched: Fetched) -> bool {
        match fetched {
            Fetched::NotModified => {
                self.report.fetched("not_modified");
                self.report.source_fresh();
                false
            }
            Fetched::Current(accepted) => {
                self.gates.on_control(&accepted);
                self.report.fetched("ok");
                self.report.clear_refusal();
                self.report.source_fresh();
                false
            }
            Fetched::Release(release) => match self.gates.plan(&release) {
                Some(plan) => {
                    self.gates.hold(*release, plan, self.apply.inventory());
                    self.report.fetched("ok");
                    self.report.clear_refusal();
                    self.report.source_fresh();
                    false
                }
                None => {
                    self.gates.drop_held();
                    self.accept(*release).await
                }
            },
            Fetched::Unavailable(error) => {
                self.report.fetched(error.reason());
                warn!(%error, "source unavailable; enforcing the last known good release");
                self.report.source_stale(&error);
                false
            }
            Fetched::Refused(error) => {
                warn!(reason = error.reason(), %error, "refusing the release; enforcing the last known good one");
                self.report.refused(&error);
                false
            }
        }
    }

    /// What the gate said: report the wait, or take the release. True when a release was taken.
    pub(super) async fn on_gate(&mut self, event: GateEvent) -> bool {
        match self.gates.on_gate(event) {
            GateStep::Nothing | GateStep::Expired(_) => false,
            GateStep::Waiting(report) => {
                self.report.gate_waiting(report);
                false
            }
            GateStep::Window(report) => {
                self.report.window_waiting(report);
                false
            }
            GateStep::Open(release) => {
                self.report.gate_opened();
                self.accept(*release).await
            }
        }
    }

    /// Takes a release the fetcher verified: persists it as last known good before anything is applied, and
    /// tells the fetcher whether it did. True when it was taken.
    pub(super) async fn accept(&mut self, release: NewRelease) -> bool {
        let NewRelease {
            pointer_bytes,
            bundle_bytes,
            accepted,
            bundle,
            taken,
        } = release;
        let known_good = KnownGood {
            pointer: pointer_bytes,
            bundle: bundle_bytes,
        };
        // Rendered while the write that persists it is out: nothing of it is applied before that write
        // succeeded, but the rendering no longer waits for it. The render is polled first: it hands its work
        // to a blocking thread, so that it runs beside the compression of the write on the agent's own one.
        let enforced_apps =
            crate::gates::windows::app_digests(&bundle, &self.config.identity.labels);
        let state = self.state.clone();
        let render = self
            .render_bundle(bundle)
            .instrument(info_span!("render", serial = accepted.pointer.serial));
        let (rendered, saved) = futures::join!(render, state.save_known_good(&known_good));
        if let Err(error) = saved {
            self.report.fetched(error.reason());
            warn!(%error, "cannot persist the new release; enforcing the last known good one");
            self.report.source_stale(&error);
            let _ = taken.send(false);
            return false;
        }
        let accepted_serial = accepted.pointer.serial;
        info!(serial = accepted.pointer.serial, sha256 = %accepted.pointer.bundle.sha256, keyid = %accepted.keyid, "accepted a new release");
        self.enforced = Some(Enforced {
            accepted,
            bundle: crate::fetch::packed::PackedBundle::new(known_good.bundle),
        });
        self.gates.enforcing(enforced_apps);
        self.fresh = Some(Fresh::Rendered(rendered));
        self.report.accepted(accepted_serial);
        let _ = taken.send(true);
        true
    }

    pub(super) fn fetcher_config(&self) -> FetcherConfig {
        FetcherConfig {
            trusted: self.config.trusted.clone(),
            fleet: self.config.fleet.clone(),
            channel: self.config.channel.clone(),
            poll_interval: self.config.poll_interval,
            max_pointer_bytes: self.config.source_limits.max_pointer_bytes,
            max_bundle_bytes: self.config.source_limits.max_bundle_bytes,
        }
    }
}
