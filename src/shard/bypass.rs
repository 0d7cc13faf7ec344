//! The mover's own path through the fences. A move copies an entity's rows onto a shard where its
//! fence refuses everyone (`moved` from an earlier move away), deletes them from the source once it
//! is fenced `moved`, and from the target when a move is aborted. `bypass_fence` lets exactly one
//! entity's rows through the protect row trigger, for the rest of the calling transaction, in the
//! calling session only. It is not executable by PUBLIC: grant it to the mover's role alone.

use std::cell::RefCell;

use pgrx::prelude::*;

use crate::entity::{EntityKey, EntityRef};

thread_local! {
    static PASSING: RefCell<Option<EntityKey>> = const { RefCell::new(None) };
}

/// For the rest of this transaction, this session's writes of `(entity_type, entity_id)` rows pass
/// the entity's fence. The shard-wide check (`app.directory_version`) still applies. A second call
/// in the same transaction replaces the first.
#[pg_extern(volatile)]
fn bypass_fence(entity_type: Option<&str>, entity_id: Option<&str>) {
    let key = crate::entity::key_of(entity_type, entity_id);
    PASSING.set(Some(key));
}

/// Whether the row trigger lets `key` through without looking at its fence.
pub fn passes(key: EntityRef<'_>) -> bool {
    PASSING.with_borrow(|p| p.as_ref().is_some_and(|p| EntityRef::from(p) == key))
}

/// Called by `crate::xact` when the transaction ends.
pub fn clear() {
    PASSING.set(None);
}
