//! Reading a `shard_directory` row out of a trigger tuple.

use pgrx::prelude::*;
use pgrx::WhoAllocated;

use super::transition::{EntityKey, Placement, State};
use crate::error::{required, spi, SdError};
use crate::plans::Plan;
use crate::{catalog, privilege};
use pgrx::pg_sys::PgBuiltInOids;

static SHARD_REGION: Plan = Plan {
    sql: "SELECT region FROM shard_directory.shards WHERE shard_name = $1",
    args: &[PgBuiltInOids::TEXTOID],
    mutating: false,
};

pub struct Entry {
    pub key: EntityKey,
    pub placement: Placement,
    pub region: Option<String>,
}

fn text<A: WhoAllocated>(t: &PgHeapTuple<'_, A>, column: &'static str) -> Option<String> {
    spi(column, t.get_by_name::<String>(column))
}

fn not_null<A: WhoAllocated>(t: &PgHeapTuple<'_, A>, column: &'static str) -> String {
    required(text(t, column), column)
}

impl Entry {
    pub fn read<A: WhoAllocated>(t: &PgHeapTuple<'_, A>) -> Entry {
        let key = EntityKey {
            entity_type: not_null(t, "entity_type"),
            entity_id: not_null(t, "entity_id"),
        };
        let state = State::parse(&key, &not_null(t, "state")).unwrap_or_else(|e| e.raise());
        Entry {
            placement: Placement {
                state,
                shard_name: not_null(t, "shard_name"),
                target_shard: text(t, "target_shard"),
            },
            region: text(t, "region"),
            key,
        }
    }

    /// Every shard the entry names must be registered, and in the entry's region when both have
    /// one. Read as the owner of `shards`: a writer needs no privilege on it.
    pub fn check_shards(&self) -> Result<(), SdError> {
        privilege::as_owner_of(catalog::relation(c"shards"), || {
            self.check_shards_as_owner()
        })
    }

    fn check_shards_as_owner(&self) -> Result<(), SdError> {
        let named = [
            Some(&self.placement.shard_name),
            self.placement.target_shard.as_ref(),
        ];
        for shard in named.into_iter().flatten() {
            let found: Option<Option<String>> = spi(
                "look up shard",
                Spi::connect(|c| {
                    let table =
                        c.select(&*SHARD_REGION.kept(c)?, Some(1), &[shard.as_str().into()])?;
                    if table.is_empty() {
                        Ok::<_, pgrx::spi::SpiError>(None)
                    } else {
                        Ok(Some(table.first().get_one::<String>()?))
                    }
                }),
            );
            match found {
                None => {
                    return Err(SdError::UnknownShard {
                        entity: self.key.clone(),
                        shard: shard.clone(),
                    })
                }
                Some(Some(shard_region)) => match &self.region {
                    Some(entity_region) if *entity_region != shard_region => {
                        return Err(SdError::RegionMismatch {
                            entity: self.key.clone(),
                            entity_region: entity_region.clone(),
                            shard: shard.clone(),
                            shard_region,
                        })
                    }
                    _ => {}
                },
                Some(None) => {}
            }
        }
        Ok(())
    }
}
