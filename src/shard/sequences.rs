//! `advance_sequence`: the mover's step that puts a target's sequence past the values the moved
//! rows took on the source, and never moves it backwards.
//!
//! `setval` after a read is a race: a `nextval` between the two can take the sequence past the
//! value read, and `setval` then hands out its values again. Here the sequence is locked in a
//! mode that `nextval` waits for (and that waits for the transactions that called it), read, and
//! set only if its next value would not be past `past`.

use pgrx::prelude::*;

use crate::error::{required, spi, SdError};
use crate::{catalog, privilege};

/// Makes the next value `seq` hands out come after `past` (below it, for a descending sequence),
/// unless it already does; returns the sequence's last value. Needs UPDATE on the sequence, as
/// `setval` does. Holds the lock until the transaction ends.
#[pg_extern(volatile)]
fn advance_sequence(seq: pgrx::PgRelation, past: Option<i64>) -> i64 {
    let past = required(past, "past");
    let oid = seq.oid();
    if unsafe { (*seq.rd_rel).relkind } as u8 != pg_sys::RELKIND_SEQUENCE {
        SdError::NotASequence {
            name: catalog::relation_name(oid),
        }
        .raise();
    }
    if !privilege::has_table_privilege(oid, privilege::current_role(), pg_sys::ACL_UPDATE) {
        SdError::SequenceNotAllowed {
            name: catalog::relation_name(oid),
            role: privilege::role_name(privilege::current_role()),
        }
        .raise();
    }
    // ShareRowExclusiveLock conflicts with the RowExclusiveLock that nextval holds to the end of
    // its transaction.
    unsafe { pg_sys::LockRelationOid(oid, pg_sys::ShareRowExclusiveLock as pg_sys::LOCKMODE) };
    let quoted = catalog::relation_name(oid);
    let (last, called, increment) = spi(
        "read the sequence",
        Spi::connect(|c| {
            let row = c
                .select(
                    &format!(
                        "SELECT s.last_value, s.is_called, p.seqincrement FROM {quoted} s, \
                         pg_catalog.pg_sequence p WHERE p.seqrelid = $1"
                    ),
                    Some(1),
                    &[oid.into()],
                )?
                .first()
                .get_three::<i64, bool, i64>()?;
            Ok::<_, pgrx::spi::SpiError>(row)
        }),
    );
    let (last, called, increment) = (
        last.unwrap_or(0),
        called.unwrap_or(false),
        increment.unwrap_or(1),
    );
    let next = if called {
        last.saturating_add(increment)
    } else {
        last
    };
    let behind = if increment > 0 {
        next <= past
    } else {
        next >= past
    };
    if !behind {
        return last;
    }
    spi(
        "advance the sequence",
        Spi::get_one_with_args::<i64>(
            "SELECT pg_catalog.setval($1, $2, true)",
            &[oid.into(), past.into()],
        ),
    )
    .unwrap_or(past)
}
