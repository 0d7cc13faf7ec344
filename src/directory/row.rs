//! Reading a `shard_directory` row out of a trigger tuple.

use std::ffi::CStr;

use pgrx::prelude::*;
use pgrx::varlena;

use super::columns;
use super::transition::{self, EntityKey, Placement};
use crate::error::{required, spi};

pub struct Entry {
    pub key: EntityKey,
    pub placement: Placement,
    pub region: Option<String>,
}

/// Where each of `names` is in the columns `desc` describes (from 1), found in one pass: reading
/// by name would scan the columns once per value, and every directory change reads two rows
/// twice. A column missing, or of another type, is an error naming it.
pub fn positions<const N: usize>(desc: pg_sys::TupleDesc, names: [&'static CStr; N]) -> [usize; N] {
    // SAFETY: a valid descriptor (the trigger's relation's), `natts` attributes long.
    let attrs = unsafe { crate::catalog::attributes(desc) };
    let mut found = [None; N];
    for (i, attr) in attrs.iter().enumerate() {
        if attr.attisdropped {
            continue;
        }
        let name = unsafe { CStr::from_ptr(attr.attname.data.as_ptr()) };
        if let Some(n) = names.iter().position(|n| *n == name) {
            columns::check(desc, attr);
            found[n] = Some(i + 1);
        }
    }
    std::array::from_fn(|i| {
        spi(
            "find a column",
            found[i].ok_or_else(|| format!("no column {:?}", names[i])),
        )
    })
}

const COLUMNS: [&CStr; 6] = [
    c"entity_type",
    c"entity_id",
    c"state",
    c"shard_name",
    c"target_shard",
    c"region",
];

impl Entry {
    /// The entry `tuple` holds, its columns deformed once (pgrx's `get_by_index` walks the tuple
    /// to each column and converts it through its type checks: 4% of a one-entry change).
    ///
    /// # Safety
    /// `tuple` is a valid tuple that `desc` describes.
    pub unsafe fn read(tuple: pg_sys::HeapTuple, desc: pg_sys::TupleDesc) -> Entry {
        let at = positions(desc, COLUMNS);
        let natts = unsafe { (*desc).natts } as usize;
        let (mut values, mut nulls) = (vec![pg_sys::Datum::from(0); natts], vec![true; natts]);
        unsafe { pg_sys::heap_deform_tuple(tuple, desc, values.as_mut_ptr(), nulls.as_mut_ptr()) };
        let text = |i: usize| -> Option<String> {
            let column = at[i] - 1;
            (!nulls[column]).then(|| {
                // SAFETY: a text column's non-NULL datum, detoasted while the tuple lives.
                let bytes = unsafe {
                    let value = pg_sys::pg_detoast_datum_packed(values[column].cast_mut_ptr());
                    crate::catalog::slice(
                        varlena::vardata_any(value).cast::<u8>(),
                        varlena::varsize_any_exhdr(value),
                    )
                };
                spi(
                    "read the entry",
                    std::str::from_utf8(bytes)
                        .map(str::to_owned)
                        .map_err(|e| format!("{:?} is not UTF-8: {e}", COLUMNS[i])),
                )
            })
        };
        let name = |i: usize| COLUMNS[i].to_str().unwrap_or_default();
        let not_null = |i: usize| required(text(i), name(i));
        let key = EntityKey {
            entity_type: not_null(0),
            entity_id: not_null(1),
        };
        let state = transition::parse_state(&key, &not_null(2)).unwrap_or_else(|e| e.raise());
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
}
