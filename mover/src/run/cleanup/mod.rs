//! The rows a move leaves behind, deleted through the fence bypass: on the source once the target
//! owns the entity, on the target when a move is undone.

pub(crate) mod purge;
pub(crate) mod throttle;

use std::time::Instant;

use crate::directory::entry;
use crate::directory::record;
use crate::error::{At, Error, Place, Step};
use crate::failpoint::point;
use crate::run::copy::triggers;

use super::Run;

impl Run<'_> {
    /// Deletes the entity's rows from the target. It held none when the move began (preflight),
    /// and its fence let nothing but the move write them since: all there are the move's.
    pub(super) async fn delete_rows_on_target(&mut self, step: Step) -> Result<(), Error> {
        let version = entry::current_version(&self.directory)
            .await
            .at(step, Place::Directory)?;
        self.target(step)?;
        let Ok(target) = self.target.as_mut() else {
            unreachable!("checked just above")
        };
        // What the copy or logical apply wrote fired none of the target's triggers; nor does
        // taking it away.
        let replica =
            triggers::delete_as_replica(&target.client, &target.endpoint.name, &self.tables, step)
                .await;
        point!("purge.target.{:?}", step);
        purge::delete_rows(
            (&mut target.client, &target.endpoint.name),
            &self.tables,
            &self.key,
            version,
            &mut self.options.throttle(),
            step,
            replica,
            |_, _| {},
        )
        .await
    }

    pub(super) async fn delete_rows_on_source(&mut self) -> Result<(), Error> {
        let version = entry::current_version(&self.directory)
            .await
            .at(Step::DeleteSource, Place::Directory)?;
        let (id, observer) = (self.id(), self.observer.clone());
        let replica = triggers::delete_as_replica(
            &self.source.client,
            &self.source.endpoint.name,
            &self.tables,
            Step::DeleteSource,
        )
        .await;
        let (tables, rates) = (&mut self.record.tables, &mut self.rates);
        point!("purge.source");
        purge::delete_rows(
            (&mut self.source.client, &self.source.endpoint.name),
            &self.tables,
            &self.key,
            version,
            &mut self.options.throttle(),
            Step::DeleteSource,
            replica,
            |table, deleted| {
                if let Some(p) = tables.get_mut(table) {
                    p.deleted = deleted as i64;
                    (p.rows_per_second, p.eta_seconds) =
                        rates.update(table, (p.deleted, p.rows), Instant::now());
                    observer.rows(id, table, p.deleted, p.rows);
                }
            },
        )
        .await?;
        record::set_tables(&self.directory, id, &self.record.tables)
            .await
            .at(Step::Record, Place::Directory)
    }
}
