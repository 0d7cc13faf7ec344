//! The cutover, the point of no return: the last look for DDL inside the freeze's budget, the
//! sequences carried, then `complete_move`.

pub(crate) mod sequences;

use std::time::Instant;

use tokio_postgres::error::SqlState;

use crate::directory::phase::Phase;
use crate::error::{At, Error, Step};
use crate::failpoint::point;
use crate::run::replication::logical;
use crate::shards::fence::{self, Fence};

use super::directory_steps::{DirectoryStep, CUTOVER_FENCE_WAIT};
use super::freeze::within;
use super::max_freeze;
use super::Run;

impl Run<'_> {
    /// `complete_move`, the point of no return, unless the freeze has run out (this run's
    /// budget, or the lease the directory checks in the same transaction), or the source is no
    /// longer frozen: then nothing written on it since its catch-up would be carried.
    pub(super) async fn cutover(&mut self) -> Result<(), Error> {
        if !self.verified_here {
            let checked = self.catch_up_and_verify().await;
            self.unless_ddl(checked).await?;
        }
        let deadline = self.deadline.expect("a frozen move has a deadline");
        if Instant::now() >= deadline {
            return Err(Error::FreezeExceeded {
                step: Step::Cutover,
                limit: max_freeze(&self.record),
            });
        }
        // The last look for DDL, inside the freeze's budget.
        let limit = max_freeze(&self.record);
        let found = within(
            deadline,
            limit,
            Step::Cutover,
            self.check_schema(Step::Cutover),
        )
        .await;
        self.unless_ddl(found).await?;
        if self.record.reversible {
            let target = self.target(Step::WayBack)?;
            let name = logical::way_back_name(self.id());
            let skipped = async {
                point!("way_back.skip");
                logical::skip_to_now(&target.client, &name)
                    .await
                    .at(Step::WayBack, target.name())
            };
            let limit = max_freeze(&self.record);
            within(deadline, limit, Step::WayBack, skipped).await?;
        }
        let fence = fence::read(&self.source.client, &self.key)
            .await
            .at(Step::Cutover, self.source.name())?;
        if !matches!(fence, Fence::Frozen | Fence::Cutover) {
            return Err(Error::State {
                move_id: self.id(),
                phase: self.record.phase,
                why: format!(
                    "the source's fence is {fence}, not frozen: someone changed it by hand, and \
                     writes since its catch-up would be lost; the move is undone"
                ),
            });
        }
        // The source's cutover fence waits for its checked transactions in flight while the
        // directory's version lock is held: briefly, and tried again within the freeze.
        loop {
            let done = self
                .directory_step(DirectoryStep::Complete, Phase::Cutover)
                .await;
            match done {
                Err(Error::Db { source, .. })
                    if source.code() == Some(&SqlState::LOCK_NOT_AVAILABLE)
                        && Instant::now() + CUTOVER_FENCE_WAIT < deadline =>
                {
                    tokio::time::sleep(CUTOVER_FENCE_WAIT / 5).await
                }
                done => break done?,
            }
        }
        self.deadline = None;
        self.tracking = None;
        Ok(())
    }
}
