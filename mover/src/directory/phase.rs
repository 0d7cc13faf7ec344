//! Where a move stands. The order is the order of the steps; `cutover` is the point of no return.

use std::fmt;

use serde::{Serialize, Serializer};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Phase {
    /// `begin_move` committed: routers dual-read, writes stay on the source.
    Migrating,
    /// Logical: the publication and subscription exist; the initial copy runs.
    Copying,
    /// Logical: every table is copied; streaming until the lag is small.
    CatchingUp,
    /// The source refuses the entity's writes (fence `frozen`, entry `read_only`).
    Frozen,
    /// Caught up, verified, sequences advanced, target fenced `owned`.
    Verified,
    /// `complete_move` committed: the entity lives on the target. Only forward from here.
    Cutover,
    /// Source fenced `moved`; replication objects and source rows being removed.
    CleaningUp,
    /// `--reversible`: the entity lives on the target, and its rows stream back to the source
    /// (kept there, fenced `moved`) until `finalize` or `revert`.
    Reversible,
    Done,
    /// A reversible move a later move (its `revert`) took back.
    Reverted,
    Aborting,
    Aborted,
}

impl Phase {
    pub const ALL: [Phase; 12] = [
        Phase::Migrating,
        Phase::Copying,
        Phase::CatchingUp,
        Phase::Frozen,
        Phase::Verified,
        Phase::Cutover,
        Phase::CleaningUp,
        Phase::Reversible,
        Phase::Done,
        Phase::Reverted,
        Phase::Aborting,
        Phase::Aborted,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Migrating => "migrating",
            Phase::Copying => "copying",
            Phase::CatchingUp => "catching_up",
            Phase::Frozen => "frozen",
            Phase::Verified => "verified",
            Phase::Cutover => "cutover",
            Phase::CleaningUp => "cleaning_up",
            Phase::Reversible => "reversible",
            Phase::Done => "done",
            Phase::Reverted => "reverted",
            Phase::Aborting => "aborting",
            Phase::Aborted => "aborted",
        }
    }

    pub fn parse(s: &str) -> Option<Phase> {
        Phase::ALL.into_iter().find(|p| p.as_str() == s)
    }

    pub fn is_finished(self) -> bool {
        matches!(self, Phase::Done | Phase::Reverted | Phase::Aborted)
    }

    /// Whether `abort` can still return everything to the start.
    pub fn can_abort(self) -> bool {
        self < Phase::Cutover || self == Phase::Aborting
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Phase {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_the_cutover_is_the_point_of_no_return() {
        for p in Phase::ALL {
            assert_eq!(Phase::parse(p.as_str()), Some(p));
        }
        assert!(Phase::Verified.can_abort());
        assert!(!Phase::Cutover.can_abort());
        assert!(!Phase::CleaningUp.can_abort());
        assert!(!Phase::Reversible.can_abort() && !Phase::Reversible.is_finished());
        assert!(Phase::Aborting.can_abort());
    }
}
