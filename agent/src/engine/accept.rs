//! Taking releases in: what the fetcher task found (nothing new, a refusal, the source unavailable, or a
//! verified release) becomes the source's status and metrics; a new release is persisted as last known
//! good before anything of it is applied. Also the re-verification of the release the cluster remembers,
//! at start. The network side (polls, fetches, verification of what arrives) is the fetcher's
//! ([`crate::fetch::fetcher`]).

use jiff::Timestamp;
use tracing::{Instrument, info, info_span, warn};
use windvane_shared::bundle::{Bundle, BundleLimits};
use windvane_shared::release::{self, AcceptedRelease};

use super::{Enforced, Engine, Fresh};
use crate::fetch::fetcher::{Fetched, FetcherConfig, NewRelease};
use crate::kube::state::KnownGood;
use crate::{Error, Result};

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
                self.metrics.source_fetch("not_modified");
                self.mark_source_fresh();
                false
            }
            Fetched::Current(accepted) => {
                self.on_control(&accepted);
                self.metrics.source_fetch("ok");
                self.clear_refusal();
                self.mark_source_fresh();
                false
            }
            Fetched::Release(release) => match self.gate_plan(&release) {
                Some(plan) => {
                    self.hold(*release, plan);
                    self.clear_refusal();
                    self.mark_source_fresh();
                    false
                }
                None => {
                    self.pending = None;
                    self.accept(*release).await
                }
            },
            Fetched::Unavailable(error) => {
                self.metrics.source_fetch(error.reason());
                warn!(%error, "source unavailable; enforcing the last known good release");
                self.mark_source_stale(&error);
                false
            }
            Fetched::Refused(error) => {
                self.metrics.source_fetch(error.reason());
                warn!(reason = error.reason(), %error, "refusing the release; enforcing the last known good one");
                self.status.send_modify(|status| {
                    status.refuse(error.reason(), error.to_string(), Timestamp::now());
                });
                false
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
            self.metrics.source_fetch(error.reason());
            warn!(%error, "cannot persist the new release; enforcing the last known good one");
            self.mark_source_stale(&error);
            let _ = taken.send(false);
            return false;
        }
        let accepted_serial = accepted.pointer.serial;
        info!(serial = accepted.pointer.serial, sha256 = %accepted.pointer.bundle.sha256, keyid = %accepted.keyid, "accepted a new release");
        self.metrics.source_fetch("ok");
        self.metrics.set_release_serial(accepted.pointer.serial);
        self.enforced = Some(Enforced {
            accepted,
            bundle: crate::fetch::packed::PackedBundle::new(known_good.bundle),
        });
        self.enforced_apps = enforced_apps;
        self.fresh = Some(Fresh::Rendered(rendered));
        self.clear_refusal();
        self.mark_source_fresh();
        self.status.send_modify(|status| {
            if status
                .source
                .pending
                .as_ref()
                .is_some_and(|p| p.serial <= accepted_serial)
            {
                status.source.pending = None;
            }
        });
        let _ = taken.send(true);
        true
    }

    /// A release verified: any earlier refusal is over, the source is good again.
    fn clear_refusal(&self) {
        self.status
            .send_modify(|status| status.source.last_refusal = None);
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

    fn mark_source_fresh(&self) {
        self.status
            .send_modify(|status| status.source.stale_since = None);
        self.metrics.set_source_stale(false);
    }

    fn mark_source_stale(&self, error: &Error) {
        self.metrics.set_source_stale(true);
        self.status.send_modify(|status| {
            status.source.stale_since.get_or_insert_with(Timestamp::now);
            status.last_error = Some(error.to_string());
        });
    }
}
