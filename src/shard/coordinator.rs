//! The coordinator: the one task that holds this replica's Leases. It follows every Lease of the
//! group, renews its member Lease (which keeps every watch Lease it holds valid, see
//! [`membership`]), claims what the assignment gives it and gives up the rest in order (see the
//! parent module), and deletes Leases nobody needs any more.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::ControlFlow;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use kube::runtime::watcher::{self, Event as WatcherEvent};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::membership::{Departures, watch_free_since, watch_holder};
use super::names::{self, Names};
use super::{
    Command, DECLINE_HOLD_OFF, Metrics, Owned, Ownership, REASONS, Reason, Settings, assign,
    membership, stale,
};
use crate::lease::Validity;
use crate::lease::{self, Seen, holder};

/// A watch Lease this replica holds.
#[derive(Debug)]
struct Held {
    epoch: u64,
    /// The member Lease's validity, lost on its own when the watch is.
    validity: Validity,
    /// The Lease as last written.
    lease: Lease,
    /// Set once the watch is being given up (its pipeline drains).
    giving_up: Option<Reason>,
    /// Not given up for a rebalance before then (a watch taken as an orphan is kept a while).
    keep_until: Instant,
}

/// How long a starting replica watches the member Leases before its first claims, at most (and
/// at most one renewal period): the member Leases of replicas started together are written
/// within it.
const MEMBERS_SETTLE: Duration = Duration::from_secs(2);

/// Stale Leases deleted per renewal period at most.
const STALE_PER_RENEWAL: usize = 16;

/// Claims written per pass of the loop at most: between two passes the member Lease's renewal
/// comes first, however many watches are still to claim (a pass takes a few round trips, well
/// within a renewal period).
const CLAIMS_PER_PASS: usize = 256;

/// Claims written at once at most: a dead replica's share is taken in a few round trips
/// rather than one write after another.
const CLAIMS_IN_FLIGHT: usize = 32;

/// One watch Lease to take.
struct Claim {
    id: String,
    /// The Lease as it will be written (a compare-and-swap on the copy seen, or a create).
    lease: Lease,
    /// How long the watch has had no owner, as seen here.
    unowned: Option<Duration>,
    /// Taken as an orphan (assigned to another replica that does not run it).
    orphan: bool,
}

/// The task that holds the Leases: one loop, so its state needs no lock.
pub(super) struct Coordinator {
    api: Api<Lease>,
    /// For the member Lease's renewals only: a client of their own (shared with the Lease
    /// watch), whose `qps` budget claims and releases never spend.
    renew_api: Api<Lease>,
    names: Names,
    s: Settings,
    /// Every Lease of the group, by name.
    view: BTreeMap<String, Seen>,
    /// A relist in progress.
    listing: Option<BTreeMap<String, Lease>>,
    held: BTreeMap<String, Held>,
    desired: BTreeMap<String, String>,
    /// Desired watches without a Lease, since when (as seen here).
    absent_since: BTreeMap<String, Instant>,
    owned: watch::Sender<Owned>,
    commands: mpsc::UnboundedSender<Command>,
    metrics: Arc<Metrics>,
    leaving: bool,
    epoch: u64,
    /// This replica's member Lease as last written.
    member: Option<Lease>,
    /// The member Lease's validity: every watch held shares it ([`Validity::child`]).
    member_validity: Validity,
    /// Leaving, and the member Lease is deleted.
    left: bool,
    /// Watches that could not start here, not claimed again before then.
    declined: BTreeMap<String, Instant>,
    /// The last pass stopped at [`CLAIMS_PER_PASS`]: reconcile again soon.
    more_to_claim: bool,
    /// Since when the member Lease's renewals succeed without a failure between.
    answering_since: Option<Instant>,
    /// Waiting for the next reconciliation ([`Command::Settled`]).
    settled: Vec<oneshot::Sender<()>>,
    /// Replicas whose member Lease was read unchanged after it expired here.
    departures: Departures,
}

impl Coordinator {
    /// A coordinator writing through `api`, its member Lease's renewals through `renew_api`.
    pub(super) fn new(
        [api, renew_api]: [Api<Lease>; 2],
        names: Names,
        s: Settings,
        owned: watch::Sender<Owned>,
        commands: mpsc::UnboundedSender<Command>,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            api,
            renew_api,
            names,
            s,
            view: BTreeMap::new(),
            listing: None,
            held: BTreeMap::new(),
            desired: BTreeMap::new(),
            absent_since: BTreeMap::new(),
            owned,
            commands,
            metrics,
            leaving: false,
            epoch: 0,
            member: None,
            member_validity: Validity::unrenewed(),
            left: false,
            declined: BTreeMap::new(),
            more_to_claim: false,
            answering_since: None,
            settled: Vec::new(),
            departures: Departures::default(),
        }
    }

    pub(super) async fn run(
        mut self,
        mut leases: mpsc::UnboundedReceiver<watcher::Result<WatcherEvent<Lease>>>,
        mut commands: mpsc::UnboundedReceiver<Command>,
        stop: CancellationToken,
        first: oneshot::Sender<Result<(), watcher::Error>>,
    ) {
        let mut first = Some(first);
        let mut next_renew = tokio::time::Instant::now() + self.s.renew;
        // No claim before then: replicas started together see each other's member Leases first,
        // so each claims its fair share at once instead of the first claiming everything,
        // listing it, and giving two thirds away at the next rebalance.
        let claim_after = tokio::time::Instant::now() + self.s.renew.min(MEMBERS_SETTLE);
        let mut claiming = false;
        loop {
            tokio::select! {
                biased;
                () = stop.cancelled(), if !self.leaving => self.leave().await,
                // The renewal before anything else: every watch held depends on it.
                () = tokio::time::sleep_until(next_renew) => {
                    next_renew = tokio::time::Instant::now() + self.s.renew;
                    self.renew_all().await;
                }
                () = tokio::time::sleep_until(claim_after), if !claiming => claiming = true,
                event = leases.recv() => {
                    // Every event already there before reconciling: claims judged on a view
                    // that lags by hundreds of Leases would fail or take what is held.
                    let mut event = Some(event);
                    while let Some(next) = event {
                        if self.lease_event(next, &mut first).is_break() {
                            return;
                        }
                        event = leases.try_recv().ok().map(Some);
                    }
                }
                // After the Lease watch: each claim changes what is owned, and the supervisor
                // answers every change with a command, which must not starve the watch.
                Some(command) = commands.recv() => self.command(command).await,
                () = std::future::ready(()), if self.more_to_claim => {}
            }
            if first.is_none() && (claiming || self.leaving) {
                self.reconcile().await;
                for done in self.settled.drain(..) {
                    let _ = done.send(());
                }
            }
            // Every watch released and the member Lease deleted: nothing is left to coordinate.
            if self.left {
                return;
            }
        }
    }

    /// Takes one item of the Lease watch (`None`: it ended); the first complete listing or the
    /// error before it answers `first`. Breaks when the coordinator must stop: the watch ended
    /// or failed before its first listing.
    fn lease_event(
        &mut self,
        event: Option<watcher::Result<WatcherEvent<Lease>>>,
        first: &mut Option<oneshot::Sender<Result<(), watcher::Error>>>,
    ) -> ControlFlow<()> {
        match event {
            Some(Ok(event)) => {
                if self.observe(event)
                    && let Some(tx) = first.take()
                {
                    let _ = tx.send(Ok(()));
                }
                ControlFlow::Continue(())
            }
            Some(Err(error)) => {
                if let Some(tx) = first.take() {
                    let _ = tx.send(Err(error));
                    return ControlFlow::Break(());
                }
                warn!(error = %error, "lease watch failed; retrying");
                ControlFlow::Continue(())
            }
            None => ControlFlow::Break(()),
        }
    }

    /// Takes one event of the Lease watch; true when a complete listing was just taken.
    fn observe(&mut self, event: WatcherEvent<Lease>) -> bool {
        let now = Instant::now();
        match event {
            WatcherEvent::Init => self.listing = Some(BTreeMap::new()),
            WatcherEvent::InitApply(lease) => {
                let name = lease.metadata.name.clone().unwrap_or_default();
                self.listing.get_or_insert_default().insert(name, lease);
            }
            WatcherEvent::InitDone => {
                let listed = self.listing.take().unwrap_or_default();
                self.view.retain(|name, _| listed.contains_key(name));
                for (name, lease) in listed {
                    self.seen(name, lease, now);
                }
                return true;
            }
            WatcherEvent::Apply(lease) => {
                let name = lease.metadata.name.clone().unwrap_or_default();
                self.seen(name, lease, now);
            }
            WatcherEvent::Delete(lease) => {
                let name = lease.metadata.name.clone().unwrap_or_default();
                self.view.remove(&name);
            }
        }
        false
    }

    /// Records a Lease as read or written; an older copy than the one seen is ignored.
    fn seen(&mut self, name: String, lease: Lease, now: Instant) {
        match self.view.get_mut(&name) {
            Some(seen) if !older(&lease, &seen.lease) => seen.update(lease, now),
            Some(_) => {}
            None => {
                self.view.insert(name, Seen::first(lease, now));
            }
        }
    }

    async fn command(&mut self, command: Command) {
        match command {
            Command::Desired(desired) => self.desired = desired,
            Command::Release { id, epoch, done } => {
                if self.held.get(&id).is_some_and(|h| h.epoch == epoch) {
                    self.release(&id).await;
                }
                self.delete_member_once_left().await;
                let _ = done.send(());
            }
            Command::Abandon { id, epoch } => {
                if self.held.get(&id).is_some_and(|h| h.epoch == epoch) {
                    warn!(watch = %id, "watch stopped without draining: its lease is given up");
                    self.forget(&id, Reason::Lost);
                }
                self.delete_member_once_left().await;
            }
            Command::Decline { id, epoch } => {
                if self.held.get(&id).is_some_and(|h| h.epoch == epoch) {
                    let hold_off = self.s.lease_duration * DECLINE_HOLD_OFF;
                    self.declined.insert(id.clone(), Instant::now() + hold_off);
                    if let Some(held) = self.held.get_mut(&id) {
                        held.giving_up = Some(Reason::CannotStart);
                    }
                    warn!(watch = %id, hold_off_secs = hold_off.as_secs(), "watch cannot start here: releasing its lease so that another replica may try it");
                    self.release(&id).await;
                }
            }
            Command::Settled(done) => self.settled.push(done),
        }
    }

    /// Drops the watches whose Lease another replica took (it judged this one gone), gives up
    /// what the assignment no longer gives this replica, then claims what it does.
    async fn reconcile(&mut self) {
        self.drop_taken();
        let members = membership::live(&self.view, &self.s.identity, self.leaving);
        let ids: Vec<String> = self.desired.keys().cloned().collect();
        let owners = assign::assign(&members, &ids);
        let me = self.s.identity.clone();
        let now = Instant::now();
        let mut given_up = Vec::new();
        for (id, held) in &mut self.held {
            if held.giving_up.is_some() {
                continue;
            }
            let reason = if self.leaving {
                Some(Reason::Shutdown)
            } else if !self.desired.contains_key(id) {
                Some(Reason::Unselected)
            } else if owners.get(id).is_some_and(|o| *o != me.as_str()) && now >= held.keep_until {
                Some(Reason::Rebalance)
            } else {
                None
            };
            if let Some(reason) = reason {
                held.giving_up = Some(reason);
                given_up.push((id.clone(), reason));
            }
        }
        for (id, reason) in given_up {
            info!(watch = %id, reason = REASONS[reason as usize], "giving the watch up: draining it, then releasing its lease");
            self.owned.send_modify(|o| {
                if let Some(o) = o.get_mut(&id) {
                    o.giving_up = true;
                }
            });
        }
        // Claims need a valid member Lease: the others judge every watch Lease this replica
        // holds by it.
        if self.leaving || !self.member_validity.is_valid() {
            return;
        }
        self.absent_since
            .retain(|id, _| self.desired.contains_key(id));
        self.declined.retain(|_, until| now < *until);
        let mut wanted = Vec::new();
        self.more_to_claim = false;
        for id in ids {
            if self.held.contains_key(&id) || self.declined.contains_key(&id) {
                continue;
            }
            let assigned = owners.get(&id).is_some_and(|o| *o == me.as_str());
            if let Some(orphan) = self.claimable(&id, assigned, now) {
                if wanted.len() == CLAIMS_PER_PASS {
                    self.more_to_claim = true;
                    break;
                }
                wanted.push((id, orphan));
            }
        }
        self.claim_all(wanted).await;
    }

    /// Forgets the watches held whose Lease, as seen now, names another holder. (A Lease missing
    /// from the view may be one this replica just created, not yet in a relisting.)
    fn drop_taken(&mut self) {
        let me = self.s.identity.as_str();
        let taken: Vec<String> = self
            .held
            .keys()
            .filter(|id| {
                let seen = self.view.get(&self.names.watch(id));
                seen.is_some_and(|s| s.holder_identity() != Some(me))
            })
            .cloned()
            .collect();
        for id in taken {
            warn!(watch = %id, "watch lease taken over: stopping the watch");
            self.forget(&id, Reason::Lost);
        }
    }

    /// Whether this replica should claim the watch `id` now: `Some(false)` when it is assigned
    /// here and free (or already this replica's), `Some(true)` when it is assigned elsewhere but
    /// has had no owner for two lease durations (its assignee does not run it: the replicas'
    /// views of the desired watches differ for a while).
    fn claimable(&mut self, id: &str, assigned: bool, now: Instant) -> Option<bool> {
        let name = self.names.watch(id);
        let free_since = match self.view.get(&name) {
            Some(seen) => {
                self.absent_since.remove(id);
                match watch_holder(&self.view, &self.names, seen) {
                    Some(h) if h == self.s.identity => return Some(false),
                    Some(_) => return None,
                    None => watch_free_since(&self.view, &self.names, seen).unwrap_or(now),
                }
            }
            None => *self.absent_since.entry(id.to_string()).or_insert(now),
        };
        if assigned {
            return Some(false);
        }
        (free_since.elapsed() >= self.s.lease_duration * 2).then_some(true)
    }

    /// Takes the Leases of the watches `wanted` (id, and whether taken as an orphan), creating
    /// them if need be, with up to [`CLAIMS_IN_FLIGHT`] writes at once. A Lease still naming
    /// another replica is taken only once that replica's member Lease is read unchanged (once
    /// per departure, see [`Departures`]).
    async fn claim_all(&mut self, wanted: Vec<(String, bool)>) {
        let view = &self.view;
        let names = &self.names;
        self.departures
            .retain(|holder| member_rv(view, names, holder));
        // Holders found live, or not read, in this pass: their watches wait for the next.
        let mut unconfirmed = BTreeSet::new();
        let mut claims = Vec::new();
        for (id, orphan) in wanted {
            if let Some(claim) = self.prepare_claim(id, orphan, &mut unconfirmed).await {
                claims.push(claim);
            }
        }
        let api = &self.api;
        let written: Vec<(Claim, Instant, kube::Result<Option<Lease>>)> =
            futures::stream::iter(claims)
                .map(|claim| async move {
                    let at = Instant::now();
                    let written = lease::write(api, &claim.lease).await;
                    (claim, at, written)
                })
                .buffer_unordered(CLAIMS_IN_FLIGHT)
                .collect()
                .await;
        for (claim, at, written) in written {
            let Claim {
                id,
                lease,
                unowned,
                orphan,
            } = claim;
            match written {
                Ok(Some(written)) => self.claimed(&id, written, at, unowned, orphan),
                Ok(None) => debug!(watch = %id, "another replica took the watch first"),
                Err(e) => {
                    let name = lease.metadata.name.unwrap_or_default();
                    warn!(watch = %id, lease = %name, error = %e, "cannot claim the watch's lease; retrying")
                }
            }
        }
    }

    /// The write that takes the Lease of watch `id`, or `None` while its previous holder is not
    /// confirmed gone (`unconfirmed`: those not confirmed in this pass, not read again).
    async fn prepare_claim(
        &mut self,
        id: String,
        orphan: bool,
        unconfirmed: &mut BTreeSet<String>,
    ) -> Option<Claim> {
        let name = self.names.watch(&id);
        let (me, d) = (self.s.identity.clone(), self.s.lease_duration);
        let previous = self
            .view
            .get(&name)
            .and_then(Seen::holder_identity)
            .filter(|h| *h != me)
            .map(str::to_string);
        if let Some(previous) = previous {
            if unconfirmed.contains(&previous) {
                return None;
            }
            let seen_rv = member_rv(&self.view, &self.names, &previous).map(str::to_string);
            if !self.departures.confirmed(&previous, seen_rv.as_deref()) {
                if !self.member_gone(&previous).await {
                    unconfirmed.insert(previous);
                    return None;
                }
                self.departures.confirm(&previous, seen_rv.as_deref());
            }
        }
        let (lease, unowned) = match self.view.get(&name) {
            Some(seen) => (
                lease::held_by(&seen.lease, &me, d),
                watch_free_since(&self.view, &self.names, seen).map(|t| t.elapsed()),
            ),
            None => {
                let description = self.desired.get(&id).cloned().unwrap_or_default();
                let lease = self.names.lease(&name, &me, d, Some((&id, &description)));
                (lease, None)
            }
        };
        Some(Claim {
            id,
            lease,
            unowned,
            orphan,
        })
    }

    /// Whether the member Lease of `holder`, judged expired here, is still unchanged when read
    /// from the API server (or gone): this replica's view of it may lag, and a watch Lease is
    /// never renewed itself, so its compare-and-swap alone cannot tell a live holder.
    async fn member_gone(&mut self, holder: &str) -> bool {
        let name = self.names.member(holder);
        match self.api.get_opt(&name).await {
            Ok(None) => true,
            Ok(Some(lease)) => {
                let seen = self
                    .view
                    .get(&name)
                    .map(|s| &s.lease.metadata.resource_version);
                if seen == Some(&lease.metadata.resource_version) {
                    return true;
                }
                debug!(member = %holder, "member lease renewed meanwhile: its watches stay its own");
                self.seen(name, lease, Instant::now());
                false
            }
            Err(e) => {
                warn!(member = %holder, error = %e, "cannot read a member lease before taking its watches; retrying");
                false
            }
        }
    }

    fn claimed(
        &mut self,
        id: &str,
        written: Lease,
        at: Instant,
        unowned: Option<Duration>,
        orphan: bool,
    ) {
        let validity = self.member_validity.child();
        self.epoch += 1;
        let name = self.names.watch(id);
        self.seen(name.clone(), written.clone(), at);
        let keep = if orphan {
            self.s.lease_duration * 10
        } else {
            Duration::ZERO
        };
        self.held.insert(
            id.to_string(),
            Held {
                epoch: self.epoch,
                validity: validity.clone(),
                lease: written,
                giving_up: None,
                keep_until: at + keep,
            },
        );
        if let Some(gap) = unowned {
            self.metrics.unowned(gap);
        }
        self.metrics
            .owned
            .store(self.held.len() as u64, Ordering::Relaxed);
        info!(watch = %id, lease = %name, orphan, unowned_ms = unowned.map(|d| d.as_millis() as u64), "watch claimed");
        let ownership = Ownership {
            id: id.to_string(),
            epoch: self.epoch,
            validity,
            unowned,
            giving_up: false,
            commands: self.commands.clone(),
        };
        self.owned.send_modify(|o| {
            o.insert(id.to_string(), ownership);
        });
    }

    /// Drops a held watch without releasing its Lease.
    fn forget(&mut self, id: &str, reason: Reason) {
        if let Some(held) = self.held.remove(id) {
            held.validity.lose();
            self.metrics.handoff(reason);
        }
        self.metrics
            .owned
            .store(self.held.len() as u64, Ordering::Relaxed);
        self.owned.send_modify(|o| {
            o.remove(id);
        });
    }

    /// Releases the Lease of a drained watch: no holder, so the next owner takes it at once.
    async fn release(&mut self, id: &str) {
        let Some(held) = self.held.get(id) else {
            return;
        };
        let reason = held.giving_up.unwrap_or(Reason::Rebalance);
        let mut current = held.lease.clone();
        self.forget(id, reason);
        for _ in 0..3 {
            match lease::write(&self.api, &lease::released(&current)).await {
                Ok(Some(written)) => {
                    let name = self.names.watch(id);
                    self.seen(name, written, Instant::now());
                    info!(watch = %id, reason = REASONS[reason as usize], "watch lease released");
                    return;
                }
                Ok(None) => match self.api.get_opt(&self.names.watch(id)).await {
                    Ok(Some(lease)) if holder(&lease) == Some(&self.s.identity) => current = lease,
                    Ok(_) => return,
                    Err(e) => {
                        warn!(watch = %id, error = %e, "cannot release the watch's lease; it expires instead");
                        return;
                    }
                },
                Err(e) => {
                    warn!(watch = %id, error = %e, "cannot release the watch's lease; it expires instead");
                    return;
                }
            }
        }
    }

    /// Renews the member Lease, which keeps every watch Lease held valid; once it has lapsed,
    /// every watch held is lost (another replica may have judged this one gone).
    async fn renew_all(&mut self) {
        if !self.left {
            match self.renew_member().await {
                Ok(()) => {
                    self.answering_since.get_or_insert_with(Instant::now);
                }
                Err(e) => {
                    self.answering_since = None;
                    warn!(error = %e, "cannot renew the member lease; retrying");
                }
            }
        }
        if !self.member_validity.is_valid() {
            self.lose_all();
        }
        // After the renewal, so that many stale Leases never delay it; and only once the API
        // server has answered for as long as a member Lease takes to turn stale: after an
        // outage every member Lease looks unchanged (nobody could renew), and deleting them
        // would take every replica's watches away at once.
        let settled = self.s.lease_duration * stale::MEMBER_GRACE;
        if self.answering_since.is_some_and(|t| t.elapsed() >= settled) {
            self.delete_stale().await;
        }
    }

    /// Forgets every watch held: the member Lease lapsed.
    fn lose_all(&mut self) {
        if self.held.is_empty() {
            return;
        }
        warn!(
            watches = self.held.len(),
            "member lease not renewed in time: stopping every watch held (another replica may take them)"
        );
        let ids: Vec<String> = self.held.keys().cloned().collect();
        for id in ids {
            self.forget(&id, Reason::Lost);
        }
    }

    /// Deletes the Leases nobody needs: members of replicas gone (killed, so they could not
    /// delete theirs) and free watch Leases of watches no longer desired. Each delete is
    /// conditional on the copy seen, so a Lease renewed or taken meanwhile stays.
    async fn delete_stale(&mut self) {
        let desired: BTreeSet<String> =
            self.desired.keys().map(|id| self.names.watch(id)).collect();
        let stale = stale::leases(&self.view, &self.names, &desired, self.s.lease_duration);
        // A few per renewal period: a selector dropping hundreds of namespaces at once does
        // not hold the coordinator up.
        for (name, rv) in stale.into_iter().take(STALE_PER_RENEWAL) {
            debug!(lease = %name, "deleting a lease nobody holds or needs");
            // The Lease watch reports the deletion; until then the Lease stays in the view, so
            // a delete that failed never hides a Lease that still exists.
            lease::delete(&self.api, &name, rv).await;
        }
    }

    /// Creates or renews this replica's member Lease.
    pub(super) async fn renew_member(&mut self) -> kube::Result<()> {
        let name = self.names.member(&self.s.identity);
        let (me, d) = (self.s.identity.clone(), self.s.lease_duration);
        let current = match self.member.take() {
            Some(lease) => Some(lease),
            None => self.renew_api.get_opt(&name).await?,
        };
        let mut lease = match current {
            Some(current) => lease::held_by(&current, &me, d),
            None => self.names.lease(&name, &me, d, None),
        };
        if self.leaving {
            lease = names::leaving(&lease);
        }
        let at = Instant::now();
        let written = lease::write(&self.renew_api, &lease).await?;
        // A renewal that lands after the validity lapsed revives no watch: meanwhile another
        // replica may have judged this one gone and taken them.
        if !self.member_validity.is_valid() {
            self.lose_all();
        }
        // A lost race leaves `member` empty: the next renewal reads the Lease again.
        if let Some(written) = written {
            self.member = Some(written.clone());
            self.seen(name, written, at);
            self.member_validity.renewed(d, at);
        }
        Ok(())
    }

    /// Leaves the replicas: the member Lease is marked leaving first, so the others count this
    /// replica out at once; every held watch is given up (the supervisor drains them all) and
    /// stays valid until released; then the member Lease is deleted.
    async fn leave(&mut self) {
        self.leaving = true;
        if let Err(e) = self.renew_member().await {
            warn!(error = %e, "cannot mark the member lease leaving; the others count this replica out when it expires");
        }
        info!(identity = %self.s.identity, watches = self.held.len(), "leaving the replicas: handing the watches over");
        self.delete_member_once_left().await;
    }

    /// Deletes the member Lease once leaving and every watch is released.
    async fn delete_member_once_left(&mut self) {
        if !self.leaving || self.left || !self.held.is_empty() {
            return;
        }
        self.left = true;
        let name = self.names.member(&self.s.identity);
        let rv = self.member.take().and_then(|l| l.metadata.resource_version);
        lease::delete(&self.api, &name, rv).await;
        info!(identity = %self.s.identity, "left the replicas: every watch released, member lease deleted");
    }
}

/// The resourceVersion of `holder`'s member Lease in `view`, if seen.
fn member_rv<'a>(view: &'a BTreeMap<String, Seen>, names: &Names, holder: &str) -> Option<&'a str> {
    let seen = view.get(&names.member(holder))?;
    seen.lease.metadata.resource_version.as_deref()
}

/// Whether `a` is an older copy than `b` (resourceVersions compared as numbers, as the API
/// server issues them; when either is not a number, `a` is taken as newer).
fn older(a: &Lease, b: &Lease) -> bool {
    let rv = |l: &Lease| {
        l.metadata
            .resource_version
            .as_deref()
            .and_then(|v| v.parse::<u64>().ok())
    };
    matches!((rv(a), rv(b)), (Some(a), Some(b)) if a < b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_older_copy_of_a_lease_is_recognised() {
        let with_rv = |rv: &str| Lease {
            metadata: kube::api::ObjectMeta {
                resource_version: Some(rv.into()),
                ..Default::default()
            },
            spec: None,
        };
        assert!(older(&with_rv("9"), &with_rv("10")));
        assert!(!older(&with_rv("10"), &with_rv("10")));
        assert!(!older(&with_rv("x"), &with_rv("10")));
    }
}
