//! Directory role: the entity -> shard mapping, its version, notification, history and the move
//! state machine.

mod changes;
mod columns;
mod epoch;
mod heap;
mod history;
pub(crate) mod latest;
mod moves;
mod registry;
mod row;
pub(crate) mod statement;
pub mod transition;
pub mod triggers;
mod writer;

pub fn init() {
    latest::init();
}
