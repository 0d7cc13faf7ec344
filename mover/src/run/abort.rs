//! Back to the start: the directory releases the entity first, then the shards are put back as
//! they were, going on through lost connections.

use crate::directory::phase::Phase;
use crate::error::{Error, Step};
use crate::failpoint::point;
use crate::patience::{Retry, Verdict, Wait};

use super::directory_steps::DirectoryStep;
use super::Run;

impl Run<'_> {
    /// Back to the start, the directory first: in one directory transaction the move becomes
    /// `aborting` and its entry active on its source again, so the entity is released before
    /// anything that can wait on a shard. Then the source's fence as it was (a frozen fence left
    /// behind ends with its lease), and the target cleaned: replication dropped, the move's rows
    /// deleted, its fence as it was. A connection lost on the way (a server restarted, a
    /// session ended) is made again and the abort goes on, for up to `--fence-wait`.
    pub(crate) async fn abort(&mut self) -> Result<(), Error> {
        let mut retry = Retry::new(Wait {
            patience: self.options.fence_patience,
            from_call: true,
            whole_pauses: false,
        });
        // The error that lost a connection, once the abort has lost one: connect again (after
        // each pause, while the servers are still away), then go on.
        let mut lost: Option<Error> = None;
        loop {
            if let Some(error) = lost.take() {
                match self.reconnect().await {
                    Ok(()) => self.observer.note(
                        self.id(),
                        &format!(
                            "the abort lost a connection ({error}); connected again, going on"
                        ),
                    ),
                    Err(e) if e.lost_connection() => {
                        if !retry.again(Verdict::Again).await {
                            return Err(error);
                        }
                        lost = Some(error);
                        continue;
                    }
                    Err(e) => return Err(e),
                }
            }
            let error = match self.abort_once().await {
                Err(e) if e.lost_connection() => e,
                done => return done,
            };
            if !retry.again(Verdict::Again).await {
                return Err(error);
            }
            lost = Some(error);
        }
    }

    pub(super) async fn abort_once(&mut self) -> Result<(), Error> {
        let id = self.id();
        if !self.released {
            match self
                .directory_step(DirectoryStep::Abort, Phase::Aborting)
                .await
            {
                // Released meanwhile by its lease (`release_expired_freeze`): the same abort.
                Err(Error::State { .. }) if self.record.phase == Phase::Aborting => {
                    self.directory_step(DirectoryStep::Abort, Phase::Aborting)
                        .await?
                }
                released => released?,
            }
            (self.released, self.deadline) = (true, None);
        }
        if self.stale_sessions {
            self.fresh_shard_sessions().await?;
            self.stale_sessions = false;
        }
        point!("abort.end_sessions.source");
        self.source.end_other_sessions(id).await?;
        let before = self.record.source_fence.clone();
        self.set_fence_patiently(&self.source, &before, Step::Abort)
            .await?;
        let target = self.target(Step::Abort)?;
        point!("abort.end_sessions.target");
        target.end_other_sessions(id).await?;
        if self.record.reverses.is_some() {
            // A revert's replication and the rows on its target are the reversible move's way
            // back: they stay, and the target's fence goes back to `moved`.
            self.drop_tracking(Step::Abort).await?;
            let before = self.record.target_fence.clone();
            self.set_fence_patiently(target, &before, Step::Abort)
                .await?;
            return self.enter(Phase::Aborted).await;
        }
        self.drop_replication(Step::Abort).await?;
        self.drop_way_back(Step::Abort).await?;
        self.delete_rows_on_target(Step::Abort).await?;
        let target = self.target(Step::Abort)?;
        let before = self.record.target_fence.clone();
        self.set_fence_patiently(target, &before, Step::Abort)
            .await?;
        self.enter(Phase::Aborted).await
    }
}
