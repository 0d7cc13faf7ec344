//! Plans of many moves: each entity's size and load, the freeze each move would take, and the
//! drains, splits and rebalances made of them.

pub(crate) mod balance;
pub(crate) mod budget;
pub(crate) mod sizes;
