//! The freeze and its lease: the directory first, then the source's fence; a deadline over every
//! step under it; a freeze undone, the copy kept, when it runs past its budget.

use std::time::{Duration, Instant};

use tokio_postgres::error::SqlState;

use crate::directory::phase::Phase;
use crate::directory::record;
use crate::error::{At, Error, Place, Step};
use crate::failpoint::point;
use crate::shards::fence::{self, Fence};
use crate::shards::side::Side;

use super::directory_steps::DirectoryStep;
use super::Run;
use super::{max_freeze, thawed};

/// Fails with `FreezeExceeded` when `work` does not finish by `deadline`.
pub(super) async fn within<T>(
    deadline: Instant,
    limit: Duration,
    step: Step,
    work: impl std::future::Future<Output = Result<T, Error>>,
) -> Result<T, Error> {
    tokio::time::timeout_at(deadline.into(), work)
        .await
        .unwrap_or(Err(Error::FreezeExceeded { step, limit }))
}

impl Run<'_> {
    /// A fence change on `side`, retried while the shard gives up waiting for its checked
    /// transactions in flight (up to `--fence-wait`): a fence that did not commit changes
    /// nothing, so it is worth another try rather than a failed move.
    pub(super) async fn set_fence_patiently(
        &self,
        side: &Side,
        to: &Fence,
        step: Step,
    ) -> Result<(), Error> {
        point!(
            "fence.{:?}.{}",
            step,
            if std::ptr::eq(side, &self.source) {
                "source"
            } else {
                "target"
            }
        );
        let (client, key) = (&side.client, &self.key);
        fence::patiently(self.options.fence_patience, move || {
            fence::set(client, key, to)
        })
        .await
        .at(step, side.name())
    }

    /// Until the cutover, nothing but the move writes the entity on the target: an abort then
    /// deletes only what the move wrote there. (Logical apply and the mover's own writes pass the
    /// fence; reads go through, as the guide's dual read needs.)
    pub(super) async fn fence_target_during_move(&self) -> Result<(), Error> {
        let target = self.target(Step::Begin)?;
        self.set_fence_patiently(target, &Fence::Frozen, Step::Begin)
            .await
    }

    /// A freeze that ran past `max_freeze`, undone with the copy kept ([`Run::thaw`]). The next
    /// freeze follows a new online check: a stream read cut off by the deadline may have
    /// consumed changes the mover never saw.
    pub(super) async fn unfreeze(&mut self, exceeded: Error) -> Result<(), Error> {
        self.freezes_undone += 1;
        self.thaw().await?;
        self.observer.note(
            self.id(),
            &format!(
                "{exceeded}; the freeze was undone, the copy kept: freezing again (freeze {} of \
                 {})",
                self.freezes_undone + 1,
                self.options.freeze_attempts
            ),
        );
        Ok(())
    }

    /// Undoes a freeze with the copy kept, the directory first: the entry back to migrating (the
    /// record back to catching up, or to migrating for the copy method, whose next freeze copies
    /// again), then (on new sessions: a check cut off by the deadline may still run on the old
    /// ones, which are ended) the target fenced as during the move and the source's fence as
    /// before it.
    pub(super) async fn thaw(&mut self) -> Result<(), Error> {
        self.tracking = None;
        self.directory_step(DirectoryStep::Thaw, thawed(self.record.method))
            .await?;
        (self.deadline, self.fenced_here, self.verified_here) = (None, false, false);
        self.fresh_shard_sessions().await?;
        self.source.end_other_sessions(self.id()).await?;
        self.target(Step::Freeze)?
            .end_other_sessions(self.id())
            .await?;
        self.fence_target_during_move().await?;
        let before = self.record.source_fence.clone();
        self.set_fence_patiently(&self.source, &before, Step::Freeze)
            .await
    }

    /// Freezes the entry (its version `F` is what the source's lease admits clients above once
    /// it ends), then fences the source frozen, which waits for its checked writers in flight.
    /// From here an error aborts the move; a source fence that cannot commit undoes the freeze
    /// instead, keeping the copy.
    pub(super) async fn freeze(&mut self) -> Result<(), Error> {
        self.check_schema(Step::Freeze).await?;
        if self.record.reversible {
            point!("way_back.create");
            self.ensure_way_back().await?;
        }
        self.wait_for_open_checks().await?;
        self.deadline = Some(Instant::now() + max_freeze(&self.record));
        self.directory_step(DirectoryStep::Freeze, Phase::Frozen)
            .await?;
        self.fence_source_frozen(self.lease()).await
    }

    /// Before freezing anything: the source's fence will wait for every checked transaction in
    /// flight there, so one left open (idle in a transaction) would hold the freeze as long as it
    /// stays. Waits up to `--fence-wait` for none to have been open over a second (or idle in it
    /// over a quarter of one); past that, stops (resumable, nothing frozen) naming them.
    pub(super) async fn wait_for_open_checks(&self) -> Result<(), Error> {
        let (started, patience) = (Instant::now(), self.options.fence_patience);
        loop {
            let lingering = fence::lingering_checks(&self.source.client)
                .await
                .at(Step::Freeze, self.source.name())?;
            match lingering {
                None => return Ok(()),
                Some(blockers) if started.elapsed() >= patience => {
                    return Err(Error::Blocked {
                        step: Step::Freeze,
                        shard: self.source.name().to_owned(),
                        what: "freezing the entity (its fence waits for checked transactions in \
                               flight)"
                            .into(),
                        waited: patience,
                        blockers,
                    })
                }
                Some(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }

    /// The source's fence, frozen for the freeze's lease. When it cannot commit in time (the shard
    /// keeps giving up behind open transactions), the directory's freeze is undone and the move
    /// goes back to catching up with its copy: nothing was frozen on the source.
    pub(super) async fn fence_source_frozen(&mut self, lease: Duration) -> Result<(), Error> {
        let deadline = self.deadline.expect("set with the freeze");
        let freeze_version = self
            .record
            .freeze_version
            .expect("recorded with the freeze");
        let patience = self
            .options
            .fence_patience
            .min(deadline.saturating_duration_since(Instant::now()));
        let (client, key) = (&self.source.client, &self.key);
        point!("fence.freeze_leased.source");
        let fenced = fence::patiently(patience, move || {
            fence::freeze_leased(client, key, lease, freeze_version)
        })
        .await;
        match fenced {
            Ok(()) => {
                self.fenced_here = true;
                Ok(())
            }
            Err(e) if e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) => {
                self.directory_step(DirectoryStep::Thaw, thawed(self.record.method))
                    .await?;
                self.deadline = None;
                self.observer.note(
                    self.id(),
                    "the source's fence could not commit: the freeze was undone, the copy kept; \
                     `resume` tries again",
                );
                Err(Error::Db {
                    step: Step::Freeze,
                    place: Place::Shard(self.source.name().to_owned()),
                    source: e,
                })
            }
            Err(e) => Err(Error::Db {
                step: Step::Freeze,
                place: Place::Shard(self.source.name().to_owned()),
                source: e,
            }),
        }
    }

    /// A freeze this run did not start (resumed, or verified by an earlier run) keeps the budget
    /// and the lease it began with: however often it is stopped and resumed, the entity is
    /// refused no longer than one lease. The source is fenced again, for what is left of the
    /// lease, before anything relies on it; a freeze with no budget left is over.
    pub(super) async fn hold_freeze(&mut self) -> Result<(), Error> {
        let id = self.id();
        let at = |e| Error::Db {
            step: Step::Freeze,
            place: Place::Directory,
            source: e,
        };
        let tx = self.directory.transaction().await.map_err(at)?;
        let (locked, _) = record::lock(&tx, id).await.map_err(at)?;
        if locked != self.record.phase {
            drop(tx);
            let expected = self.record.phase;
            self.reload().await?;
            return Err(self.moved_on(expected));
        }
        let left = record::lease_left(&tx, id).await.map_err(at)?;
        tx.commit().await.map_err(at)?;
        let budget = left.saturating_sub(self.options.lease_grace);
        if budget.is_zero() {
            return Err(Error::FreezeExceeded {
                step: Step::Freeze,
                limit: max_freeze(&self.record),
            });
        }
        self.deadline = Some(Instant::now() + budget);
        self.fence_source_frozen(left).await
    }
}
