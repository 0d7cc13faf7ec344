//! Sequences do not travel with logical replication or a copy: before the target owns the entity,
//! every sequence the entity's tables draw from (serial and identity columns' own, and any other a
//! column default calls `nextval` on) is advanced on the target past its value on the source, so
//! new rows of the entity there cannot take a key its copied rows already hold. The target's
//! extension does it (`advance_sequence`): locked against `nextval`, and never backwards.
//!
//! Past the source's value, but along the target's own progression (its START plus a multiple of
//! its INCREMENT): shards whose sequences interleave (INCREMENT 16, a START per shard) mint ids
//! no other shard mints, and a target set to the source's value would go on in the source's
//! residue class, minting the ids the source mints next.

use std::collections::BTreeSet;

use tokio_postgres::Client;

use crate::error::{At, Error, Step};
use crate::shards::catalog::EntityTable;

/// Every sequence of `tables`, once each.
pub(crate) fn of(tables: &[EntityTable]) -> BTreeSet<&str> {
    tables
        .iter()
        .flat_map(|t| t.sequences.iter().map(String::as_str))
        .collect()
}

/// A sequence's settings, from `pg_sequence`.
const SETTINGS: &str =
    "SELECT seqstart, seqincrement, seqcache FROM pg_sequence WHERE seqrelid = to_regclass($1)";

/// The refusal for a sequence the target lacks.
fn missing(seq: &str, shard: &str) -> Error {
    Error::Preflight {
        problem: format!("sequence {seq} is missing on target shard {shard}"),
        fix: format!("create it on shard {shard} as on the source, with CACHE 1"),
    }
}

/// Refuses, naming the sequence, when the target lacks one of the source's sequences, caches
/// values per session (`CACHE` above 1: a session there may hold values below the moved rows'
/// keys, fetched before the sequence was advanced, and hand them out after), or runs it the other
/// way (ascending on one shard, descending on the other: no value of the target's progression is
/// past every value the source handed out).
pub(crate) async fn check_target(
    (source, source_name): (&Client, &str),
    (target, shard): (&Client, &str),
    tables: &[EntityTable],
) -> Result<(), Error> {
    for seq in of(tables) {
        let Some(there) = target
            .query_opt(SETTINGS, &[&seq])
            .await
            .at(Step::Preflight, shard)?
        else {
            return Err(missing(seq, shard));
        };
        let here = source
            .query_one(SETTINGS, &[&seq])
            .await
            .at(Step::Preflight, source_name)?;
        let (cache, increment, increment_here): (i64, i64, i64) =
            (there.get(2), there.get(1), here.get(1));
        if cache > 1 {
            return Err(Error::Preflight {
                problem: format!(
                    "sequence {seq} on target shard {shard} caches {cache} values per session: \
                     one may hand out values fetched before the move advanced it, which moved \
                     rows hold"
                ),
                fix: format!("ALTER SEQUENCE {seq} CACHE 1 on shard {shard}"),
            });
        }
        if increment.signum() != increment_here.signum() {
            return Err(Error::Preflight {
                problem: format!(
                    "sequence {seq} increments by {increment_here} on source shard \
                     {source_name} but by {increment} on target shard {shard}: no value the \
                     target hands out can be made to come after every value the source did"
                ),
                fix: format!(
                    "ALTER SEQUENCE {seq} INCREMENT BY <n> with the same sign on both shards \
                     (a START per shard keeps interleaved sequences apart)"
                ),
            });
        }
    }
    Ok(())
}

/// Advances each sequence on the target past the source's last value, along the target's own
/// progression.
pub(crate) async fn advance(
    (source, source_name): (&Client, &str),
    (target, target_name): (&Client, &str),
    tables: &[EntityTable],
) -> Result<(), Error> {
    for seq in of(tables) {
        let last: Option<i64> = source
            .query_one("SELECT pg_sequence_last_value($1::text::regclass)", &[&seq])
            .await
            .at(Step::Sequences, source_name)?
            .get(0);
        let Some(last) = last else { continue };
        let Some(there) = target
            .query_opt(SETTINGS, &[&seq])
            .await
            .at(Step::Sequences, target_name)?
        else {
            return Err(missing(seq, target_name));
        };
        let Some(past) = last_along(there.get(0), there.get(1), last) else {
            continue;
        };
        target
            .execute(
                "SELECT shard_directory.advance_sequence($1::text::regclass, $2)",
                &[&seq, &past],
            )
            .await
            .at(Step::Sequences, target_name)?;
    }
    Ok(())
}

/// The last value of the progression `start`, `start + increment`, ... that is not past `last`
/// (in the direction of `increment`): a sequence set to it hands out next the progression's first
/// value past `last`. `None` when `last` comes before `start`: the progression's first value is
/// past it already.
fn last_along(start: i64, increment: i64, last: i64) -> Option<i64> {
    // Measured in the sequence's direction, in i128: the distance spans up to twice i64's range.
    let step = i128::from(increment).abs();
    let ahead = (i128::from(last) - i128::from(start)) * i128::from(increment.signum());
    if step == 0 || ahead < 0 {
        return None;
    }
    let value = i128::from(start) + ahead / step * i128::from(increment);
    // Between `start` and `last`, both i64.
    Some(i64::try_from(value).expect("between two i64 values"))
}

#[cfg(test)]
mod tests {
    use super::last_along;

    #[test]
    fn an_interleaved_target_stays_in_its_residue_class_past_the_source() {
        // Shard 1 mints 1, 17, 33, ...; shard 2 mints 2, 18, 34, ...
        assert_eq!(last_along(2, 16, 33), Some(18), "next on the target: 34");
        assert_eq!(last_along(1, 16, 34), Some(33), "next: 49");
        assert_eq!(last_along(2, 16, 2), Some(2), "on the progression: itself");
        assert_eq!(last_along(2, 16, 1), None, "the target starts past it");
        assert_eq!(
            last_along(1, 1, 100),
            Some(100),
            "a plain sequence: the value"
        );
        assert_eq!(last_along(5, 3, 6), Some(5));
    }

    #[test]
    fn a_descending_progression_goes_down_past_the_source() {
        assert_eq!(last_along(-1, -16, -40), Some(-33), "next: -49");
        assert_eq!(last_along(-2, -16, -33), Some(-18), "next: -34");
        assert_eq!(last_along(-1, -1, -40), Some(-40));
        assert_eq!(
            last_along(100, -10, 150),
            None,
            "the target starts below it"
        );
    }

    #[test]
    fn the_arithmetic_holds_at_the_ends_of_bigint() {
        assert_eq!(last_along(i64::MIN, 1, i64::MAX), Some(i64::MAX));
        assert_eq!(last_along(i64::MIN + 1, i64::MAX, i64::MAX), Some(i64::MAX));
        assert_eq!(last_along(i64::MAX, -1, i64::MIN), Some(i64::MIN));
        assert_eq!(last_along(i64::MAX, i64::MIN, i64::MIN), Some(-1));
        assert_eq!(last_along(0, i64::MIN, i64::MIN), Some(i64::MIN));
    }
}
