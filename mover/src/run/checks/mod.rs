//! Whether the target holds the entity's rows as the source does: online before the freeze (then
//! tracking what changes), under the freeze only what changed; foreign keys that must resolve.

pub(crate) mod pgoutput;
pub(crate) mod tracking;
pub(crate) mod verify;

use std::time::{Duration, Instant};

use crate::directory::record::{self, Method};
use crate::error::{At, Error, Place, Step};
use crate::failpoint::point;
use crate::preflight::integrity;
use crate::run::checks::tracking::{Changed, Tracker, Tracking};
use crate::run::copy::triggers;
use crate::run::cutover::sequences;
use crate::run::replication::logical;
use crate::shards::fence::Fence;

use super::freeze::within;
use super::max_freeze;
use super::Run;

impl Run<'_> {
    /// While the entity is writable: change tracking starts on both shards, then every row is
    /// compared (and what the moved rows reference looked for on the target), so that the freeze
    /// checks only the rows that differed or changed since. A shard that cannot be tracked
    /// leaves the whole comparison to the freeze, with a note.
    pub(super) async fn check_online(&mut self) -> Result<(), Error> {
        let (id, patience) = (self.id(), self.options.fence_patience);
        let target = self.target(Step::Track)?;
        point!("track.start");
        let source_stream =
            Tracker::start(&self.source, id, &self.tables, &self.key, patience).await?;
        let target_stream = Tracker::start(target, id, &self.tables, &self.key, patience).await?;
        let (source_stream, target_stream) = match (source_stream, target_stream) {
            (Ok(s), Ok(t)) => (s, t),
            (Err(why), _) | (_, Err(why)) => {
                self.observer
                    .note(id, &format!("the freeze will compare every row: {why}"));
                self.untracked = Some(why);
                return Ok(());
            }
        };
        let started = Instant::now();
        let (counts, changed) = verify::online(
            (&self.source.client, self.source.name()),
            (&target.client, target.name()),
            &self.tables,
            &self.key,
        )
        .await?;
        integrity::check_references_present(
            &target.client,
            target.name(),
            &self.tables,
            &self.key,
            None,
        )
        .await?;
        self.observer.note(
            id,
            &format!(
                "compared every row online in {:?}; {} key(s) to compare again under the freeze",
                started.elapsed(),
                changed.len()
            ),
        );
        for (table, rows) in counts {
            if let Some(p) = self.record.tables.get_mut(&table) {
                p.verified = Some(rows);
            }
        }
        record::set_tables(&self.directory, id, &self.record.tables)
            .await
            .at(Step::Record, Place::Directory)?;
        self.tracking = Some(Tracking {
            source: source_stream,
            target: target_stream,
            changed,
        });
        Ok(())
    }

    /// Before freezing with change tracking: catches up, then compares the rows changed since the
    /// online check while the entity is still writable (those equal now need no comparison under
    /// the freeze; one that changes again comes back through the streams). The freeze is
    /// estimated as that catch-up and that comparison; while the estimate exceeds half of
    /// `max_freeze` it catches up and compares again instead of freezing, up to `sync_timeout`.
    pub(super) async fn estimate_freeze(&mut self) -> Result<(), Error> {
        let (started, budget) = (Instant::now(), max_freeze(&self.record) / 2);
        loop {
            self.observer.step(self.id(), Step::CatchUp).await;
            let catch_up = self.wait_for_small_lag().await?;
            let compared = Instant::now();
            let mut tracking = self.tracking.take().expect("tracking the entity's changes");
            let left = async {
                tracking.drain(&self.tables).await?;
                let target = self.target(Step::Verify)?;
                verify::still_differing(
                    (&self.source.client, self.source.name()),
                    (&target.client, target.name()),
                    &self.tables,
                    &self.key,
                    &tracking.changed,
                )
                .await
            }
            .await;
            let (before, compare) = (tracking.changed.len(), compared.elapsed());
            let left = left.map(|left| tracking.changed = left);
            self.tracking = Some(tracking);
            left?;
            let estimate = catch_up + compare;
            let note = format!(
                "estimated freeze {estimate:?}: a catch-up of {catch_up:?} and {before} changed \
                 key(s) compared in {compare:?}"
            );
            if estimate <= budget {
                self.observer.note(self.id(), &note);
                return Ok(());
            }
            if started.elapsed() > self.options.sync_timeout {
                return Err(Error::Timeout {
                    step: Step::CatchUp,
                    what: format!("an estimated freeze within half of --max-freeze ({note})"),
                    after: self.options.sync_timeout,
                });
            }
            self.observer.note(
                self.id(),
                &format!("{note}; over half of --max-freeze, catching up again"),
            );
        }
    }

    /// Under the freeze: catch up (logical) or copy, verify, check foreign keys, advance
    /// sequences, fence the target owned.
    pub(super) async fn catch_up_and_verify(&mut self) -> Result<(), Error> {
        if !self.fenced_here {
            self.hold_freeze().await?;
        }
        let deadline = self.deadline.expect("a frozen move has a deadline");
        let limit = max_freeze(&self.record);
        match self.record.method {
            Method::Logical => {
                // Taken after the fence committed: every write of the entity precedes it.
                let lsn = logical::catchup_position(&self.source.client)
                    .await
                    .at(Step::CatchUp, self.source.name())?;
                record::set_positions(&self.directory, self.id(), Some(&lsn), None)
                    .await
                    .at(Step::Record, Place::Directory)?;
                let confirmed = self
                    .wait_confirmed(&lsn, deadline, || Error::FreezeExceeded {
                        step: Step::CatchUp,
                        limit,
                    })
                    .await?;
                record::set_positions(&self.directory, self.id(), None, Some(&confirmed))
                    .await
                    .at(Step::Record, Place::Directory)?;
            }
            Method::Copy => within(deadline, limit, Step::Copy, self.copy()).await?,
        }
        let mut tracking = self.tracking.take();
        let checked = self.check_rows(tracking.as_mut(), deadline, limit).await;
        self.tracking = tracking;
        checked?;
        let target = self.target(Step::Verify)?;
        within(
            deadline,
            limit,
            Step::Sequences,
            sequences::advance(
                (&self.source.client, self.source.name()),
                (&target.client, target.name()),
                &self.tables,
            ),
        )
        .await?;
        let min_version = self
            .record
            .freeze_version
            .expect("recorded with the freeze");
        within(
            deadline,
            limit,
            Step::FenceTarget,
            self.set_fence_patiently(target, &Fence::Owned { min_version }, Step::FenceTarget),
        )
        .await?;
        self.verified_here = true;
        Ok(())
    }

    /// Under the freeze: the rows changed since the online check (every row without one) compared
    /// on both sides, and what they reference looked for on the target.
    pub(super) async fn check_rows(
        &mut self,
        tracking: Option<&mut Tracking>,
        deadline: Instant,
        limit: Duration,
    ) -> Result<(), Error> {
        let changed = match tracking {
            Some(tracking) => {
                within(deadline, limit, Step::Track, tracking.drain(&self.tables)).await?;
                let target = self.target(Step::Verify)?;
                let compared = verify::recheck(
                    (&self.source.client, self.source.name()),
                    (&target.client, target.name()),
                    &self.tables,
                    &self.key,
                    &tracking.changed,
                );
                within(deadline, limit, Step::Verify, compared).await?;
                Some(&tracking.changed)
            }
            None => {
                let target = self.target(Step::Verify)?;
                let counts = within(
                    deadline,
                    limit,
                    Step::Verify,
                    verify::verify(
                        (&self.source.client, self.source.name()),
                        (&target.client, target.name()),
                        &self.tables,
                        &self.key,
                    ),
                )
                .await?;
                for (table, rows) in counts {
                    if let Some(p) = self.record.tables.get_mut(&table) {
                        p.verified = Some(rows);
                        p.copied = rows;
                    }
                }
                record::set_tables(&self.directory, self.id(), &self.record.tables)
                    .await
                    .at(Step::Record, Place::Directory)?;
                None
            }
        };
        self.check_references(changed, deadline, limit).await
    }

    /// No row may join the entity to another one; and logical apply checks no foreign key, nor
    /// does a copy made as replica (`triggers`), so after them what the moved rows (`changed`:
    /// those changed since the online check) reference must be on the target.
    pub(super) async fn check_references(
        &self,
        changed: Option<&Changed>,
        deadline: Instant,
        limit: Duration,
    ) -> Result<(), Error> {
        let target = self.target(Step::Verify)?;
        within(deadline, limit, Step::Verify, async {
            integrity::check_crossings(
                &self.source.client,
                self.source.name(),
                &self.tables,
                &self.key,
                Step::Verify,
            )
            .await?;
            if self.record.method != Method::Logical
                && !triggers::copy_as_replica(
                    &target.client,
                    target.name(),
                    &self.tables,
                    Step::Verify,
                )
                .await?
            {
                return Ok(());
            }
            integrity::check_references_present(
                &target.client,
                target.name(),
                &self.tables,
                &self.key,
                changed,
            )
            .await
        })
        .await
    }

    pub(super) async fn drop_tracking(&self, step: Step) -> Result<(), Error> {
        let target = self.target(step)?;
        tracking::drop(&target.client, self.id())
            .await
            .at(step, target.name())?;
        tracking::drop(&self.source.client, self.id())
            .await
            .at(step, self.source.name())
    }
}
