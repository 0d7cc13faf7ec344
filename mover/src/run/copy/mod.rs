//! Method `copy`: the entity's rows copied while it is frozen, from one snapshot of the source.

pub(crate) mod rows;
pub(crate) mod triggers;

use crate::directory::entry;
use crate::error::{At, Error, Place, Step};

use super::Run;

impl Run<'_> {
    /// Method copy: the entity's rows, over connections of their own (a copy cut off by the
    /// deadline leaves them mid-stream; an abort ends them). The source is frozen, so its rows
    /// hold still; one snapshot makes that explicit.
    pub(super) async fn copy(&self) -> Result<(), Error> {
        let target = self.target(Step::Copy)?;
        let mut read = self.source.another(self.id()).await?;
        let mut write = target.another(self.id()).await?;
        let version = entry::current_version(&self.directory)
            .await
            .at(Step::Copy, Place::Directory)?;
        let (id, observer, record) = (self.id(), &self.observer, &self.record);
        let snapshot = rows::snapshot(&mut read, self.source.name(), Step::Copy).await?;
        rows::copy_rows(
            (&snapshot, self.source.name()),
            (&mut write, target.name()),
            (&self.tables, &self.key, version),
            Step::Copy,
            &mut rows::Unpaced(|table: &str, rows: u64| {
                let total = record.tables.get(table).map_or(rows as i64, |p| p.rows);
                observer.rows(id, table, rows as i64, total);
            }),
        )
        .await?;
        snapshot.commit().await.at(Step::Copy, self.source.name())
    }
}
