//! Reading a `shard_directory` row out of a trigger tuple.

use std::num::NonZeroUsize;

use pgrx::prelude::*;
use pgrx::WhoAllocated;

use super::transition::{EntityKey, Placement, State};
use crate::catalog;
use crate::error::{required, spi, SdError};

pub struct Entry {
    pub key: EntityKey,
    pub placement: Placement,
    pub region: Option<String>,
}

/// Where each of `names` is in `t`'s columns, found in one pass: reading by name would scan the
/// columns once per value, and every directory change reads two rows twice. A column missing is
/// an error naming it.
pub fn positions<A: WhoAllocated, const N: usize>(
    t: &PgHeapTuple<'_, A>,
    names: [&'static str; N],
) -> [NonZeroUsize; N] {
    let mut found = [None; N];
    for (attnum, attr) in t.attributes() {
        if attr.attisdropped {
            continue;
        }
        let name = attr.name();
        if let Some(i) = names.iter().position(|n| *n == name) {
            found[i] = Some(attnum);
        }
    }
    std::array::from_fn(|i| {
        spi(
            names[i],
            found[i].ok_or_else(|| format!("no column {}", names[i])),
        )
    })
}

const COLUMNS: [&str; 6] = [
    "entity_type",
    "entity_id",
    "state",
    "shard_name",
    "target_shard",
    "region",
];

impl Entry {
    pub fn read<A: WhoAllocated>(t: &PgHeapTuple<'_, A>) -> Entry {
        let at = positions(t, COLUMNS);
        let text = |i: usize| spi(COLUMNS[i], t.get_by_index::<String>(at[i]));
        let not_null = |i: usize| required(text(i), COLUMNS[i]);
        let key = EntityKey {
            entity_type: not_null(0),
            entity_id: not_null(1),
        };
        let state = State::parse(&key, &not_null(2)).unwrap_or_else(|e| e.raise());
        Entry {
            placement: Placement {
                state,
                shard_name: not_null(3),
                target_shard: text(4),
            },
            region: text(5),
            key,
        }
    }

    /// Every shard the entry names must be registered, and in the entry's region when both have
    /// one.
    pub fn check_shards(&self) -> Result<(), SdError> {
        let named = [
            Some(&self.placement.shard_name),
            self.placement.target_shard.as_ref(),
        ];
        for shard in named.into_iter().flatten() {
            let found = shard_region(shard);
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

/// The region of the registered shard `shard` (`None`: not registered; `Some(None)`: it has no
/// region). Read straight through the registry's primary key, not through SQL: it is on every
/// change's path, and with no statement there is no name or operator to resolve, so it needs
/// neither the owner's rights nor a pinned `search_path`. It sees what the statement sees (its
/// snapshot).
fn shard_region(shard: &str) -> Option<Option<String>> {
    let relid = catalog::relation(c"shards");
    let key_datum = shard.into_datum().expect("text is never NULL");
    // SAFETY: the relation is opened and closed here under AccessShareLock; the scan key, the
    // snapshot (the statement's, active while a trigger runs) and the tuple live across their use.
    unsafe {
        let lock = pg_sys::AccessShareLock as pg_sys::LOCKMODE;
        let rel = pg_sys::table_open(relid, lock);
        let name_column = pg_sys::get_attnum(relid, c"shard_name".as_ptr());
        let region_column = pg_sys::get_attnum(relid, c"region".as_ptr());
        let mut key = std::mem::MaybeUninit::<pg_sys::ScanKeyData>::zeroed().assume_init();
        pg_sys::ScanKeyInit(
            &mut key,
            name_column,
            pg_sys::BTEqualStrategyNumber as pg_sys::StrategyNumber,
            pg_sys::Oid::from(pg_sys::F_TEXTEQ),
            key_datum,
        );
        // Compare as the index orders: in the column's collation, not ScanKeyInit's C.
        let (mut type_oid, mut typmod) = (pg_sys::InvalidOid, 0);
        pg_sys::get_atttypetypmodcoll(
            relid,
            name_column,
            &mut type_oid,
            &mut typmod,
            &mut key.sk_collation,
        );
        let scan = pg_sys::systable_beginscan(
            rel,
            pg_sys::RelationGetPrimaryKeyIndex(rel),
            true,
            pg_sys::GetActiveSnapshot(),
            1,
            &mut key,
        );
        let tuple = pg_sys::systable_getnext(scan);
        let found = (!tuple.is_null()).then(|| {
            let mut is_null = false;
            let datum =
                pg_sys::heap_getattr(tuple, region_column.into(), (*rel).rd_att, &mut is_null);
            String::from_datum(datum, is_null)
        });
        pg_sys::systable_endscan(scan);
        pg_sys::table_close(rel, lock);
        found
    }
}
