//! The move state machine: which changes of `state`, `shard_name` and `target_shard` are steps of
//! a move, and which are refused. Pure Rust so that the triggers and the move functions share it.

pub use super::placement::{Placement, State};
pub use crate::entity::EntityKey;
use crate::error::SdError;

/// The state `s` (a `state` column's value) spells; an error naming the entity otherwise.
pub fn parse_state(entity: &EntityKey, s: &str) -> Result<State, SdError> {
    s.parse().map_err(|_| SdError::UnknownState {
        entity: entity.clone(),
        state: s.to_owned(),
    })
}

/// What kind of change a permitted update is; recorded in history.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    Insert,
    /// Same state, shard and target (e.g. a region edit).
    Unchanged,
    BeginMove,
    /// migrating -> read_only before the cutover.
    Freeze,
    /// active -> read_only with no target.
    MaintenanceFreeze,
    Cutover,
    Abort,
    /// Any well-formed change under `shard_directory.allow_repoint`.
    Repoint,
    Delete,
}

impl Transition {
    pub fn as_str(self) -> &'static str {
        match self {
            Transition::Insert => "insert",
            Transition::Unchanged => "update",
            Transition::BeginMove => "begin_move",
            Transition::Freeze => "freeze",
            Transition::MaintenanceFreeze => "maintenance_freeze",
            Transition::Cutover => "cutover",
            Transition::Abort => "abort",
            Transition::Repoint => "repoint",
            Transition::Delete => "delete",
        }
    }
}

/// A placement is well formed when the target is set exactly for a move: `migrating` needs a
/// target other than the source, `active` has none, `read_only` may have one (cutover) or not
/// (maintenance).
fn well_formed(p: &Placement) -> bool {
    match p.state {
        State::Active => p.target_shard.is_none(),
        State::Migrating => p.target_shard.as_ref().is_some_and(|t| *t != p.shard_name),
        State::ReadOnly => p.target_shard.as_ref() != Some(&p.shard_name),
    }
}

pub fn check_insert(entity: &EntityKey, new: &Placement) -> Result<Transition, SdError> {
    if new.state == State::Active && new.target_shard.is_none() {
        Ok(Transition::Insert)
    } else {
        Err(SdError::InvalidInsert {
            entity: entity.clone(),
            to: new.clone(),
        })
    }
}

/// A restored entry may be in any well-formed placement: it was valid when it was dumped.
pub fn check_restore(entity: &EntityKey, new: &Placement) -> Result<Transition, SdError> {
    if well_formed(new) {
        Ok(Transition::Insert)
    } else {
        Err(SdError::InvalidInsert {
            entity: entity.clone(),
            to: new.clone(),
        })
    }
}

pub fn check_delete(entity: &EntityKey, old: &Placement) -> Result<Transition, SdError> {
    if old.state == State::Active {
        Ok(Transition::Delete)
    } else {
        Err(SdError::DeleteDuringMove {
            entity: entity.clone(),
            from: old.clone(),
        })
    }
}

pub fn check_update(
    entity: &EntityKey,
    old: &Placement,
    new: &Placement,
    allow_repoint: bool,
) -> Result<Transition, SdError> {
    use State::*;
    let same_shard = old.shard_name == new.shard_name;
    let step = if !well_formed(new) {
        None
    } else if old == new {
        Some(Transition::Unchanged)
    } else {
        match (old.state, new.state) {
            (Active, Migrating) if same_shard => Some(Transition::BeginMove),
            (Migrating, ReadOnly) if same_shard && old.target_shard == new.target_shard => {
                Some(Transition::Freeze)
            }
            (Active, ReadOnly) if same_shard && new.target_shard.is_none() => {
                Some(Transition::MaintenanceFreeze)
            }
            (ReadOnly, Active)
                if old.target_shard.is_some()
                    && old.target_shard.as_ref() == Some(&new.shard_name) =>
            {
                Some(Transition::Cutover)
            }
            (Migrating | ReadOnly, Active) if same_shard => Some(Transition::Abort),
            _ if allow_repoint => Some(Transition::Repoint),
            _ => None,
        }
    };
    step.ok_or_else(|| SdError::InvalidTransition {
        entity: entity.clone(),
        from: old.clone(),
        to: new.clone(),
        step: None,
    })
}

#[cfg(test)]
mod unit {
    use super::*;

    fn key() -> EntityKey {
        EntityKey {
            entity_type: "tenant".into(),
            entity_id: "8842".into(),
        }
    }
    fn p(state: State, shard: &str, target: Option<&str>) -> Placement {
        Placement {
            state,
            shard_name: shard.into(),
            target_shard: target.map(Into::into),
        }
    }
    fn up(old: &Placement, new: &Placement) -> Result<Transition, SdError> {
        check_update(&key(), old, new, false)
    }

    #[test]
    fn move_walk_and_aborts_are_allowed() {
        use State::*;
        let a = p(Active, "s1", None);
        let m = p(Migrating, "s1", Some("s2"));
        let r = p(ReadOnly, "s1", Some("s2"));
        assert_eq!(up(&a, &m), Ok(Transition::BeginMove));
        assert_eq!(up(&m, &r), Ok(Transition::Freeze));
        assert_eq!(up(&r, &p(Active, "s2", None)), Ok(Transition::Cutover));
        assert_eq!(up(&r, &a), Ok(Transition::Abort));
        assert_eq!(up(&m, &a), Ok(Transition::Abort));
        assert_eq!(
            up(&a, &p(ReadOnly, "s1", None)),
            Ok(Transition::MaintenanceFreeze)
        );
        assert_eq!(up(&p(ReadOnly, "s1", None), &a), Ok(Transition::Abort));
        assert_eq!(up(&a, &a), Ok(Transition::Unchanged));
    }

    #[test]
    fn everything_else_is_refused() {
        use State::*;
        let a = p(Active, "s1", None);
        let m = p(Migrating, "s1", Some("s2"));
        let refused = [
            (a.clone(), p(Active, "s5", None)),          // bare re-point
            (a.clone(), p(Migrating, "s1", Some("s1"))), // target = source
            (a.clone(), p(Migrating, "s1", None)),       // no target
            (a.clone(), p(Migrating, "s2", Some("s3"))), // source moved
            (a.clone(), p(ReadOnly, "s1", Some("s2"))),  // skipped migrating
            (a.clone(), p(Active, "s1", Some("s2"))),    // active with a target
            (m.clone(), p(Active, "s2", None)),          // cutover without freeze
            (m.clone(), p(Migrating, "s1", Some("s3"))), // re-targeted
            (p(ReadOnly, "s1", None), p(Migrating, "s1", Some("s2"))),
            (
                p(ReadOnly, "s1", Some("s2")),
                p(Migrating, "s1", Some("s2")),
            ),
            (p(ReadOnly, "s1", Some("s2")), p(Active, "s3", None)),
        ];
        for (old, new) in refused {
            assert!(
                matches!(up(&old, &new), Err(SdError::InvalidTransition { .. })),
                "{old} -> {new} should be refused"
            );
        }
    }

    #[test]
    fn repoint_needs_the_setting_and_a_well_formed_result() {
        use State::*;
        let a = p(Active, "s1", None);
        assert_eq!(
            check_update(&key(), &a, &p(Active, "s5", None), true),
            Ok(Transition::Repoint)
        );
        assert!(check_update(&key(), &a, &p(Migrating, "s1", None), true).is_err());
    }

    #[test]
    fn inserts_start_active_and_deletes_wait_for_the_move() {
        use State::*;
        assert_eq!(
            check_insert(&key(), &p(Active, "s1", None)),
            Ok(Transition::Insert)
        );
        assert!(check_insert(&key(), &p(Migrating, "s1", Some("s2"))).is_err());
        assert_eq!(
            check_delete(&key(), &p(Active, "s1", None)),
            Ok(Transition::Delete)
        );
        assert!(check_delete(&key(), &p(ReadOnly, "s1", Some("s2"))).is_err());
    }
}
