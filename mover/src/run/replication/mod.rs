//! Method `logical`, phases `copying` and `catching_up`: the publication and subscription, the
//! initial copy (the subscription's, or with a pace the mover's own), the wait for a small lag.

pub(crate) mod initial_copy;
pub(crate) mod logical;
pub(crate) mod pgoutput;
pub(crate) mod tablesync;

use std::time::{Duration, Instant};

use crate::directory::entry;
use crate::directory::record::{self, Method};
use crate::error::{At, Error, Place, Step};
use crate::failpoint::point;
use crate::run::copy::rows;
use crate::run::replication::logical::Trouble;
use crate::run::replication::tablesync::LostSlots;

use super::max_freeze;
use super::Run;

/// Copies of every table made in one run before a lost tablesync slot stops the move.
pub(super) const COPY_ATTEMPTS: u32 = 3;

/// How the wait for the subscription's initial copy ended.
pub(super) enum Synced {
    Ready,
    /// These tables' copies PostgreSQL can no longer finish (`tablesync`).
    Lost(Vec<String>),
}

impl Run<'_> {
    /// `trouble` of the replication from `shard` (the publisher) to `subscriber`.
    pub(super) fn replication_trouble(
        &self,
        step: Step,
        (shard, subscriber): (&str, &str),
        trouble: Trouble,
        what: &str,
    ) -> Error {
        match trouble {
            Trouble::Db(e) => Error::Db {
                step,
                place: Place::Shard(shard.to_owned()),
                source: e,
            },
            Trouble::Subscriber(e) => Error::Db {
                step,
                place: Place::Shard(subscriber.to_owned()),
                source: e,
            },
            Trouble::NotOurs(why) => Error::State {
                move_id: self.id(),
                phase: self.record.phase,
                why,
            },
            Trouble::Blocked(blockers) => Error::Blocked {
                step,
                shard: shard.to_owned(),
                what: what.to_owned(),
                waited: self.options.fence_patience,
                blockers,
            },
        }
    }

    /// Logical: publication and subscription, then the initial copy of every table: the
    /// subscription's own, or with a pace the mover's (`initial_copy`). A copy of the mover's
    /// found unfinished, or where the subscription is now to copy, is made again from the start,
    /// and so is one PostgreSQL can no longer finish (`tablesync`), up to [`COPY_ATTEMPTS`] times.
    pub(super) async fn replicate(&mut self) -> Result<(), Error> {
        let mut attempt = 1;
        loop {
            let lost = match self.replicate_once().await? {
                Synced::Ready => return Ok(()),
                Synced::Lost(tables) => tables,
            };
            let target = self.target(Step::Sync)?.name().to_owned();
            if attempt == COPY_ATTEMPTS {
                return Err(Error::TablesyncLost {
                    step: Step::Sync,
                    table: lost.join(", "),
                    from: self.source.name().to_owned(),
                    to: target,
                    attempts: attempt,
                });
            }
            self.observer.note(
                self.id(),
                &format!(
                    "the initial copy of {} on shard {target} lost its tablesync slot on shard {} \
                     (the target stopped as PostgreSQL finished the table's copy); copying every \
                     table again",
                    lost.join(", "),
                    self.source.name()
                ),
            );
            self.copy_again().await?;
            attempt += 1;
        }
    }

    /// Back to before the initial copy: the replication dropped (the next copy begins by deleting
    /// the rows this one made: `replicate_once`).
    pub(super) async fn copy_again(&mut self) -> Result<(), Error> {
        self.drop_replication(Step::Sync).await?;
        for p in self.record.tables.values_mut() {
            (p.copied, p.rows_per_second, p.eta_seconds) = (0, None, None);
        }
        Ok(())
    }

    pub(super) async fn replicate_once(&mut self) -> Result<Synced, Error> {
        let name = self.record.replication_name.clone();
        let paced = self.options.throttle().paces() && self.record.reverses.is_none();
        let mut signature = logical::signature(&self.record);
        let copied_by_mover = initial_copy::signature(&signature);
        let target = self.target(Step::Replicate)?;
        let found = logical::subscription_comment(&target.client, &name)
            .await
            .at(Step::Replicate, target.name())?;
        let published = logical::publication_comment(&self.source.client, &name)
            .await
            .at(Step::Replicate, self.source.name())?;
        // A paced copy is made again from the start; and replication made for the other kind of
        // copy (the move ran with a pace, and is resumed without, or the other way) is made again.
        let other = if paced { &signature } else { &copied_by_mover };
        let mut kept = found.is_some();
        if found.is_some() && paced || [&found, &published].contains(&&Some(other.clone())) {
            point!("replicate.drop_other");
            self.drop_replication(Step::Replicate).await?;
            kept = false;
        }
        if paced {
            signature = copied_by_mover;
        } else if !kept && self.record.reverses.is_none() {
            // Whatever made rows of the entity on the target before (a copy of the mover's, a
            // subscription dropped mid-copy, a run killed between the two), the subscription's
            // copy starts from a target without them: it would stop on their keys. (The paced
            // copy deletes them in its own transaction; a revert's target holds the way back's.)
            self.delete_rows_on_target(Step::Replicate).await?;
        }
        let target = self.target(Step::Replicate)?;
        point!("replicate.publication");
        let publication = logical::ensure_publication(
            &self.source.client,
            &name,
            &self.tables,
            &self.key.entity_id,
            &signature,
        )
        .await;
        publication.map_err(|t| {
            let shards = (self.source.name(), target.name());
            self.replication_trouble(Step::Replicate, shards, t, "the publication")
        })?;
        point!("replicate.subscription");
        let subscription = logical::ensure_subscription(
            &self.source.client,
            &target.client,
            &name,
            &self.source.endpoint.replication_conninfo,
            &signature,
            self.options.fence_patience,
            if paced {
                logical::Begin::Off
            } else {
                logical::Begin::CopyThenStream
            },
        )
        .await;
        subscription.map_err(|t| {
            let what = format!("creating replication slot {name}");
            let shards = (self.source.name(), target.name());
            self.replication_trouble(Step::Replicate, shards, t, &what)
        })?;
        if paced {
            return self.copy_paced().await.map(|()| Synced::Ready);
        }
        self.observer.step(self.id(), Step::Sync).await;
        let started = Instant::now();
        let mut saved = Instant::now();
        let mut lost = LostSlots::default();
        for poll in 0u32.. {
            let target = self.target(Step::Sync)?;
            let state = logical::sync_state(&target.client, &name)
                .await
                .at(Step::Sync, target.name())?;
            // Every half second, and at once when the subscription stopped: a lost slot stops
            // it (`disable_on_error`), and the copy is made again instead.
            if poll % 10 == 9 || !state.enabled {
                let target = self.target(Step::Sync)?;
                let lost = lost
                    .look(
                        (&self.source.client, self.source.name()),
                        (&target.client, target.name()),
                        &name,
                        Step::Sync,
                    )
                    .await?;
                if !lost.is_empty() {
                    return Ok(Synced::Lost(lost));
                }
            }
            if !lost.suspects() {
                self.check_replication(&state, Step::Sync).await?;
            }
            let id = self.id();
            for (table, ready, copied) in &state.tables {
                if let Some(p) = self.record.tables.get_mut(table) {
                    p.copied = if *ready { p.rows } else { *copied };
                    (p.rows_per_second, p.eta_seconds) =
                        self.rates.update(table, (p.copied, p.rows), Instant::now());
                    self.observer.rows(id, table, p.copied, p.rows);
                }
            }
            if state.all_ready() || saved.elapsed() > Duration::from_secs(1) {
                record::set_tables(&self.directory, self.id(), &self.record.tables)
                    .await
                    .at(Step::Record, Place::Directory)?;
                saved = Instant::now();
            }
            if state.all_ready() {
                // The copied rows get statistics before the freeze, so that the checks under it
                // (and the application's queries after the cutover) are planned for them, not for
                // the empty tables the copy began with.
                let target = self.target(Step::Sync)?;
                return logical::analyze(&target.client, &self.tables)
                    .await
                    .at(Step::Sync, target.name())
                    .map(|()| Synced::Ready);
            }
            if started.elapsed() > self.options.sync_timeout {
                // Tablesync slots wait for the source's transactions in progress, as the main
                // slot did: name them.
                let blockers = logical::transactions_in_progress(&self.source.client)
                    .await
                    .at(Step::Sync, self.source.name())?;
                let waiting: Vec<&str> = state
                    .tables
                    .iter()
                    .filter(|(_, ready, _)| !ready)
                    .map(|(table, _, _)| table.as_str())
                    .collect();
                return Err(Error::Timeout {
                    step: Step::Sync,
                    what: format!(
                        "the initial copy of {} on shard {} (its server log says why; \
                         transactions in progress on shard {}: {blockers})",
                        waiting.join(", "),
                        self.target(Step::Sync)?.name(),
                        self.source.name()
                    ),
                    after: self.options.sync_timeout,
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        unreachable!("the loop returns")
    }

    /// The mover's initial copy, paced: from a snapshot that matches the slot's position; then
    /// the subscription is turned on.
    pub(super) async fn copy_paced(&mut self) -> Result<(), Error> {
        let (id, name) = (self.id(), self.record.replication_name.clone());
        self.target(Step::Sync)?;
        let Ok(target) = &self.target else {
            unreachable!("checked just above")
        };
        let version = entry::current_version(&self.directory)
            .await
            .at(Step::Sync, Place::Directory)?;
        let lock = self.source.another(id).await?;
        let (mut read, mut write) = (self.source.another(id).await?, target.another(id).await?);
        let snapshot = initial_copy::snapshot_at_slot(
            &self.source,
            (&lock, &mut read),
            &self.key,
            &name,
            self.options.fence_patience,
        )
        .await?;
        drop(lock);
        for p in self.record.tables.values_mut() {
            (p.copied, p.rows_per_second, p.eta_seconds) = (0, None, None);
        }
        let mut pace = initial_copy::Paced {
            move_id: id,
            throttle: self.options.throttle(),
            target: (&target.client, target.name()),
            source: (&self.source.client, self.source.name()),
            slot: (&name, self.options.max_slot_lag),
            directory: &self.directory,
            tables: &mut self.record.tables,
            rates: &mut self.rates,
            observer: &*self.observer,
            saved: Instant::now(),
        };
        rows::copy_rows(
            (&snapshot, self.source.name()),
            (&mut write, target.name()),
            (&self.tables, &self.key, version),
            Step::Sync,
            &mut pace,
        )
        .await?;
        snapshot.commit().await.at(Step::Sync, self.source.name())?;
        record::set_tables(&self.directory, id, &self.record.tables)
            .await
            .at(Step::Record, Place::Directory)?;
        point!("paced.enable_subscription");
        logical::enable_subscription(&target.client, &name)
            .await
            .at(Step::Sync, target.name())?;
        logical::analyze(&target.client, &self.tables)
            .await
            .at(Step::Sync, target.name())
    }

    /// The subscription is on (a subscription that stopped after an error is turned back on
    /// once per run, with a note), and the slot keeps no more WAL than `--max-slot-lag`.
    pub(super) async fn check_replication(
        &mut self,
        state: &logical::SyncState,
        step: Step,
    ) -> Result<(), Error> {
        let name = self.record.replication_name.clone();
        logical::check_slot(
            (&self.source.client, self.source.name()),
            (self.id(), &name),
            self.options.max_slot_lag,
            step,
        )
        .await?;
        if state.exists && state.enabled {
            return Ok(());
        }
        // A subscription stopped by DDL on one shard only: named, rather than turned on again.
        self.check_schema(step).await?;
        let target = self.target(step)?;
        if state.exists && !self.reenabled {
            self.observer.note(
                self.id(),
                &format!(
                    "subscription {name} on shard {} stopped after {} error(s) (its server log \
                     there says why); turning it on again",
                    target.name(),
                    state.errors
                ),
            );
            point!("replicate.reenable");
            logical::enable_subscription(&target.client, &name)
                .await
                .at(step, target.name())?;
            self.reenabled = true;
            return Ok(());
        }
        Err(Error::SubscriptionFailed {
            step,
            name,
            shard: target.name().to_owned(),
            errors: state.errors,
        })
    }

    /// Waits until the slot confirms `lsn`, or `deadline`; returns the confirmed position.
    pub(super) async fn wait_confirmed(
        &mut self,
        lsn: &str,
        deadline: Instant,
        on_timeout: impl Fn() -> Error,
    ) -> Result<String, Error> {
        let name = self.record.replication_name.clone();
        for poll in 0u32.. {
            let (passed, confirmed, behind) = logical::confirmed(&self.source.client, &name, lsn)
                .await
                .at(Step::CatchUp, self.source.name())?;
            if passed {
                return Ok(confirmed);
            }
            self.observer.lag(self.id(), behind);
            if Instant::now() >= deadline {
                return Err(on_timeout());
            }
            if poll % 50 == 49 {
                let target = self.target(Step::CatchUp)?;
                let state = logical::sync_state(&target.client, &name)
                    .await
                    .at(Step::CatchUp, target.name())?;
                self.check_replication(&state, Step::CatchUp).await?;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        unreachable!("the loop returns")
    }

    /// Before freezing: probes until the target catches up with the source within a quarter of
    /// `max_freeze`, so the catch-up under the freeze is expected to fit in it; returns how long
    /// the last catch-up took.
    pub(super) async fn wait_for_small_lag(&mut self) -> Result<Duration, Error> {
        let started = Instant::now();
        let small = max_freeze(&self.record) / 4;
        let limit = self.options.sync_timeout;
        loop {
            let lsn = logical::catchup_position(&self.source.client)
                .await
                .at(Step::CatchUp, self.source.name())?;
            let probe = Instant::now();
            self.wait_confirmed(&lsn, started + limit, || Error::Timeout {
                step: Step::CatchUp,
                what: "the target to catch up with the source".into(),
                after: limit,
            })
            .await?;
            let took = probe.elapsed();
            if took <= small {
                return Ok(took);
            }
            let lag = logical::lag_bytes(&self.source.client, &self.record.replication_name)
                .await
                .at(Step::CatchUp, self.source.name())?;
            self.observer.note(
                self.id(),
                &format!(
                    "catch-up took {took:?} (lag {lag} bytes); waiting for it to take under {small:?}"
                ),
            );
        }
    }

    /// Drops the subscription (on the target) and the slot and publication (on the source), and
    /// change tracking's on both.
    pub(super) async fn drop_replication(&self, step: Step) -> Result<(), Error> {
        if self.record.method != Method::Logical {
            return Ok(());
        }
        let name = &self.record.replication_name;
        let target = self.target(step)?;
        point!("replication.drop.{:?}", step);
        logical::drop_subscription(&target.client, name)
            .await
            .at(step, target.name())?;
        logical::drop_publication(&self.source.client, name)
            .await
            .at(step, self.source.name())?;
        self.drop_tracking(step).await
    }
}
