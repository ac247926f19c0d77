//! One mirror's hold on its upstream: the subscription it holds (at the
//! peer, or at a relay the peer redirected it to), when it renews, whether
//! the upstream still answers, the repair under way when a relay stopped
//! answering, the subscriptions left at relays that died, the relays it
//! shuns, and which upstream the metrics show. [`Mirrors::mirror`] drives it
//! from its loop; each method here is one thing that happened there.

use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::apply::Applier;
use super::upstream::Abandoned;
use super::{MAX_ABANDONED, Mirrors, Spec};
use tidings_outbound::Attached;
use tidings_protocol::peer::Relay;
use tidings_protocol::peer::protocol::PeerError;
use tidings_protocol::retry::Backoff;

/// A mirror's link to its upstream (see the module).
#[derive(Debug)]
pub(super) struct Link {
    /// The subscription held upstream, once one is.
    pub(super) subscription: Option<String>,
    /// When to subscribe, renew or repair next.
    pub(super) renew_at: Instant,
    retry: Backoff,
    /// Where the subscription is held, as seen from the peer: the redirects
    /// followed, and the alternatives the last redirect offered (where to go
    /// first when the relay dies: docs/ref-federation.md, "Repair").
    hops: u32,
    alternatives: Vec<Relay>,
    /// Since when the upstream has not answered a probe; and, once that
    /// outlasted the repair timeout, the repair under way.
    unanswered: Option<Instant>,
    repairing: bool,
    /// Subscriptions left at relays that stopped answering: cancelled there
    /// if they answer again, forgotten when their token expires (the relay
    /// then ends them itself: docs/ref-subscriptions.md, "Limits").
    pub(super) abandoned: Vec<Abandoned>,
    /// The upstream the metrics show as current, and every one shown.
    shown_now: Option<String>,
    shown: Vec<String>,
    /// Relays that forged or withheld a change: never attached to again by
    /// this mirror (the newest [`MAX_ABANDONED`] of them).
    shunned: Vec<String>,
}

impl Link {
    /// No subscription yet: the first is taken at once.
    pub(super) fn new() -> Self {
        Self {
            subscription: None,
            renew_at: Instant::now(),
            retry: crate::pacing::MIRROR,
            hops: 0,
            alternatives: Vec::new(),
            unanswered: None,
            repairing: false,
            abandoned: Vec::new(),
            shown_now: None,
            shown: Vec::new(),
            shunned: Vec::new(),
        }
    }

    /// A relay that forged or withheld a change (the applier says so) is
    /// left and shunned; one that stopped answering is the repair's to deal
    /// with (which may come back to it).
    pub(super) fn leave_distrusted(&mut self, mirrors: &Mirrors, spec: &Spec, applier: &mut Applier<'_>) {
        let Some((relay, why)) = applier.distrusted.take() else { return };
        if relay != applier.upstream || relay == spec.peer || !(why == "forged" || self.unanswered.is_none()) {
            return;
        }
        tracing::warn!(mirror = spec.name, relay, why, "the relay forged or withheld a change; attaching elsewhere");
        crate::metrics::mirror_left_relay(&spec.name);
        self.shunned.retain(|r| *r != relay);
        self.shunned.truncate(MAX_ABANDONED - 1);
        self.shunned.insert(0, relay.clone());
        if let Some(id) = self.subscription.take() {
            Abandoned::push(&mut self.abandoned, &relay, id, mirrors.settings.token_ttl);
        }
        // Its deliveries are foreign from now on.
        applier.upstream = spec.peer.clone();
        (self.unanswered, self.repairing, self.renew_at) = (None, false, Instant::now());
        let why = format!("left the relay {relay}: it {why} a change");
        mirrors.set_state(&spec.name, |s| {
            s.state = "repairing";
            s.upstream = None;
            s.last_error = Some(why);
        });
    }

    /// Subscribes, renews or repairs: renewed where it is held; a first
    /// subscription starts at the peer and may be redirected to a relay; a
    /// repair tries the cached alternatives first, then the peer.
    pub(super) async fn attach(&self, mirrors: &Mirrors, spec: &Spec, applier: &Applier<'_>) -> Result<Attached, PeerError> {
        let (from, base) = if self.subscription.is_some() { (applier.upstream.as_str(), self.hops) } else { (spec.peer.as_str(), 0) };
        let avoid: Vec<&str> = self.shunned.iter().map(String::as_str).collect();
        if self.repairing {
            mirrors.reattach(spec, &applier.upstream, &self.alternatives, self.hops, &applier.inbox, &avoid).await
        } else {
            mirrors.attach(spec, from, &applier.inbox, &avoid).await.map(|a| a.below(base))
        }
    }

    /// The relay a repair under way may go back to (the one that stopped
    /// answering), if one is under way.
    pub(super) fn returning_to(&self, applier: &Applier<'_>) -> Option<String> {
        self.repairing.then(|| applier.upstream.clone())
    }

    /// The subscription is held at `a.upstream`.
    pub(super) async fn held(&mut self, mirrors: &Mirrors, spec: &Spec, applier: &mut Applier<'_>, a: Attached, stop: &CancellationToken) {
        // Back at a relay that only stalled, renewing the subscription left
        // there: the relay kept it, and what it holds for this mirror.
        let returned = self.abandoned.iter().any(|x| x.upstream == a.upstream && x.id == a.id);
        // A first subscription, or one the upstream ended meanwhile (a new
        // id): what was missed is re-read.
        let fresh = self.subscription.as_ref() != Some(&a.id) && !returned;
        applier.upstream = a.upstream.clone();
        // Held there again: nothing of it to cancel (any other left there
        // still is).
        self.abandoned.retain(|x| !(x.upstream == a.upstream && x.id == a.id));
        self.hops = a.hops;
        if !a.alternatives.is_empty() {
            self.alternatives = a.alternatives;
        }
        if fresh {
            // What the upstream holds now: changes after the subscription
            // come as notifications.
            applier.discover(stop).await;
            applier.reread_all(stop).await;
        }
        let repaired = std::mem::take(&mut self.repairing).then_some(self.unanswered).flatten().map(|since| since.elapsed());
        self.unanswered = None;
        if let Some(took) = repaired {
            tracing::info!(mirror = spec.name, upstream = a.upstream, took_ms = took.as_millis() as u64, "mirror repaired");
            crate::metrics::mirror_repaired(&spec.name);
        }
        let hops = self.hops;
        mirrors.set_state(&spec.name, |s| {
            s.state = "subscribed";
            s.subscription_id = Some(a.id.clone());
            s.upstream = Some(a.upstream.clone());
            s.hops = hops;
            s.last_error = None;
            if let Some(took) = repaired {
                s.repairs += 1;
                s.last_repair_ms = Some(took.as_millis() as u64);
            }
        });
        crate::metrics::mirror_hops(&spec.name, hops);
        self.show(spec, &a.upstream);
        self.subscription = Some(a.id);
        self.retry.reset();
        self.renew_at = Instant::now() + (mirrors.settings.token_ttl / 2).max(Duration::from_secs(5));
    }

    /// Shows `upstream` as current in the metrics: one series per upstream
    /// held at, at most [`MAX_ABANDONED`] of them, then "other" (relays come
    /// from redirects, so their number is not ours).
    fn show(&mut self, spec: &Spec, upstream: &str) {
        let label = if self.shown.iter().any(|s| s == upstream) || self.shown.len() < MAX_ABANDONED {
            upstream.to_owned()
        } else {
            "other".to_owned()
        };
        if self.shown_now.as_deref() == Some(label.as_str()) {
            return;
        }
        if let Some(p) = self.shown_now.take() {
            crate::metrics::mirror_upstream(&spec.name, &p, false);
        }
        crate::metrics::mirror_upstream(&spec.name, &label, true);
        if !self.shown.contains(&label) {
            self.shown.push(label.clone());
        }
        self.shown_now = Some(label);
    }

    /// Subscribing, renewing or repairing failed: started again from the
    /// peer after a backoff (renewals too: the relay may be gone); a repair
    /// stays one until it holds a subscription somewhere.
    pub(super) fn failed(&mut self, mirrors: &Mirrors, spec: &Spec, applier: &Applier<'_>, why: PeerError) {
        tracing::warn!(mirror = spec.name, why = %why, "cannot subscribe at the mirrored peer; retrying");
        mirrors.set_state(&spec.name, |s| {
            s.state = "failing";
            s.last_error = Some(why.to_string());
        });
        if let Some(id) = self.subscription.take() {
            Abandoned::push(&mut self.abandoned, &applier.upstream, id, mirrors.settings.token_ttl);
        }
        self.renew_at = Instant::now() + self.retry.next_delay();
    }

    /// A probe of the upstream did (or did not) answer.
    pub(super) fn probed(&mut self, mirrors: &Mirrors, spec: &Spec, applier: &Applier<'_>, answers: bool) {
        if answers {
            // Back after an outage: renewed now, in case it ended the
            // subscription meanwhile.
            if self.unanswered.take().is_some() {
                self.renew_at = Instant::now();
                mirrors.set_state(&spec.name, |s| {
                    s.state = "subscribed";
                    s.last_error = None;
                });
            }
            return;
        }
        let since = *self.unanswered.get_or_insert_with(Instant::now);
        let relayed = applier.upstream != spec.peer;
        let why = format!("the upstream {} does not answer", applier.upstream);
        // Only a relay is left: the peer itself has no stand-in, its
        // subscription resumes when it is back.
        if relayed && since.elapsed() >= mirrors.settings.repair_timeout {
            tracing::warn!(mirror = spec.name, upstream = applier.upstream, "the relay stopped answering; attaching elsewhere");
            self.repairing = true;
            self.renew_at = Instant::now();
            if let Some(id) = self.subscription.take() {
                Abandoned::push(&mut self.abandoned, &applier.upstream, id, mirrors.settings.token_ttl);
            }
            mirrors.set_state(&spec.name, |s| {
                s.state = "repairing";
                s.last_error = Some(why);
            });
        } else {
            mirrors.set_state(&spec.name, |s| {
                s.state = "unreachable";
                s.last_error = Some(why);
            });
        }
    }
}
