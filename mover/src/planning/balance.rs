//! Plans of many moves: `drain` (every entity off a shard), `split` (a share of a shard's weight
//! to another) and `rebalance` (the shards evened out), each a list of moves a person can read
//! and edit before `move --from-file` runs it ([`crate::batch`]).
//!
//! The rules every plan keeps: an entity with a region moves only to a shard of that region; an
//! entity never moves twice; an entity whose move would freeze it longer than the fleet's
//! `max_freeze` is not moved but listed in the plan's `skipped`; the heaviest entities are placed
//! first, each on the allowed shard that would weigh least, so the result is deterministic for
//! the same sizes.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use shard_directory_protocol::EntityKey;

use crate::error::Error;
use crate::planning::sizes::{Size, Weigh};
use crate::run::way_back::{self, WayBack};

/// A shard as the plans see it.
#[derive(Debug, Clone, PartialEq)]
pub struct ShardInfo {
    pub name: String,
    pub region: Option<String>,
}

/// An entity where the directory has it, with its size there.
#[derive(Debug, Clone, PartialEq)]
pub struct Placed {
    pub key: EntityKey,
    pub shard: String,
    pub region: Option<String>,
    pub size: Size,
    /// The freeze a move of it is expected to take, when that grows with its size (`None`: a
    /// logical move with the online check, whose freeze does not).
    pub freeze: Option<Duration>,
}

impl Placed {
    fn fits(&self, max_freeze: Duration) -> bool {
        self.freeze.is_none_or(|f| f <= max_freeze)
    }
}

/// An entity a plan leaves where it is: its move's freeze is expected to outlast `max_freeze`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Skipped {
    pub entity_type: String,
    pub entity_id: String,
    pub shard: String,
    pub rows: i64,
    /// The expected freeze, in milliseconds.
    pub freeze_ms: u64,
}

/// One move of a plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlannedMove {
    pub entity_type: String,
    pub entity_id: String,
    pub from: String,
    pub to: String,
    #[serde(default)]
    pub rows: i64,
    #[serde(default)]
    pub bytes: i64,
    #[serde(default)]
    pub load: f64,
}

impl PlannedMove {
    pub fn key(&self) -> EntityKey {
        EntityKey::new(self.entity_type.clone(), self.entity_id.clone())
    }
}

/// A plan file: what it was made for, each shard's weight before and after, and the moves.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BatchPlan {
    /// `drain shard_1`, `split shard_1 --to shard_9 --fraction 0.5`, `rebalance`.
    #[serde(default)]
    pub purpose: String,
    #[serde(default = "by_bytes")]
    pub by: Weigh,
    /// Each shard's total before the moves and after them.
    #[serde(default)]
    pub shards: BTreeMap<String, Totals>,
    pub moves: Vec<PlannedMove>,
    /// Entities the plan would have moved but whose freeze would outlast `--max-freeze`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<Skipped>,
    /// The shard a drain empties: its batch does not start while a way back joins it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drains: Option<String>,
}

fn by_bytes() -> Weigh {
    Weigh::Bytes
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Totals {
    pub before: Size,
    pub after: Size,
    pub entities_before: usize,
    pub entities_after: usize,
}

/// The fleet a plan starts from.
pub struct Fleet {
    pub shards: Vec<ShardInfo>,
    pub entities: Vec<Placed>,
    /// The longest freeze a plan may ask of one move.
    pub max_freeze: Duration,
    /// The shards whose entities' rows and bytes were read from the directory, as kept there
    /// (`shard_sizes`), and how old they were; the others were measured.
    pub sizes_kept: BTreeMap<String, Duration>,
    /// The reversible moves not finished yet: no shard their ways back join is drained.
    pub ways_back: Vec<WayBack>,
}

impl Fleet {
    fn shard(&self, name: &str) -> Result<&ShardInfo, Error> {
        self.shards
            .iter()
            .find(|s| s.name == name)
            .ok_or_else(|| Error::Preflight {
                problem: format!("shard \"{name}\" is not in shard_directory.shards"),
                fix: "`shard-directory shards` lists them".into(),
            })
    }

    /// The entities of `shard` a plan may move, and those it must leave (their freeze would
    /// outlast `max_freeze`).
    fn on(&self, shard: &str) -> (Vec<&Placed>, Vec<Skipped>) {
        self.movable(self.entities.iter().filter(|e| e.shard == shard))
    }

    fn movable<'a>(
        &self,
        entities: impl Iterator<Item = &'a Placed>,
    ) -> (Vec<&'a Placed>, Vec<Skipped>) {
        let (fit, over): (Vec<&Placed>, Vec<&Placed>) =
            entities.partition(|e| e.fits(self.max_freeze));
        let skipped = over
            .into_iter()
            .map(|e| Skipped {
                entity_type: e.key.entity_type.clone(),
                entity_id: e.key.entity_id.clone(),
                shard: e.shard.clone(),
                rows: e.size.rows,
                freeze_ms: e.freeze.map_or(0, |f| f.as_millis() as u64),
            })
            .collect();
        (fit, skipped)
    }

    /// Each shard's total now.
    fn totals(&self) -> BTreeMap<String, Size> {
        let mut totals: BTreeMap<String, Size> = self
            .shards
            .iter()
            .map(|s| (s.name.clone(), Size::default()))
            .collect();
        for e in &self.entities {
            *totals.entry(e.shard.clone()).or_default() += e.size;
        }
        totals
    }

    fn plan(
        &self,
        purpose: String,
        by: Weigh,
        moves: Vec<PlannedMove>,
        skipped: Vec<Skipped>,
    ) -> BatchPlan {
        let before = self.totals();
        let mut after = before.clone();
        let mut count: BTreeMap<String, (usize, usize)> = BTreeMap::new();
        for e in &self.entities {
            let c = count.entry(e.shard.clone()).or_default();
            c.0 += 1;
            c.1 += 1;
        }
        for m in &moves {
            let size = Size {
                rows: m.rows,
                bytes: m.bytes,
                load: m.load,
            };
            sub(after.entry(m.from.clone()).or_default(), size);
            *after.entry(m.to.clone()).or_default() += size;
            count.entry(m.from.clone()).or_default().1 -= 1;
            count.entry(m.to.clone()).or_default().1 += 1;
        }
        let shards = before
            .into_iter()
            .map(|(name, before)| {
                let (entities_before, entities_after) =
                    count.get(&name).copied().unwrap_or_default();
                let totals = Totals {
                    before,
                    after: after[&name],
                    entities_before,
                    entities_after,
                };
                (name, totals)
            })
            .collect();
        BatchPlan {
            purpose,
            by,
            shards,
            moves,
            skipped,
            drains: None,
        }
    }
}

fn sub(total: &mut Size, size: Size) {
    total.rows -= size.rows;
    total.bytes -= size.bytes;
    total.load -= size.load;
}

fn allowed(entity: &Placed, shard: &ShardInfo) -> bool {
    entity.region.is_none() || entity.region == shard.region
}

fn planned(e: &Placed, to: &str) -> PlannedMove {
    PlannedMove {
        entity_type: e.key.entity_type.clone(),
        entity_id: e.key.entity_id.clone(),
        from: e.shard.clone(),
        to: to.to_owned(),
        rows: e.size.rows,
        bytes: e.size.bytes,
        load: e.size.load,
    }
}

/// Heaviest first; equal weights by key, so plans are the same for the same sizes.
fn heaviest_first(mut entities: Vec<&Placed>, by: Weigh) -> Vec<&Placed> {
    entities.sort_by(|a, b| {
        b.size
            .weight(by)
            .total_cmp(&a.size.weight(by))
            .then_with(|| a.key.cmp(&b.key))
    });
    entities
}

/// Every entity of `shard` moved to the shards `to` (all others when empty), each to the one of
/// its region that would weigh least. Refused while a reversible move's way back joins `shard`
/// to another shard: a drained shard is one to decommission.
pub fn drain(fleet: &Fleet, shard: &str, to: &[String], by: Weigh) -> Result<BatchPlan, Error> {
    fleet.shard(shard)?;
    way_back::refuse_drain(shard, &fleet.ways_back)?;
    let targets: Vec<&ShardInfo> = if to.is_empty() {
        fleet.shards.iter().filter(|s| s.name != shard).collect()
    } else {
        to.iter()
            .map(|name| fleet.shard(name))
            .collect::<Result<_, _>>()?
    };
    if let Some(t) = targets.iter().find(|t| t.name == shard) {
        return Err(Error::Preflight {
            problem: format!("shard {} cannot be drained into itself", t.name),
            fix: "name other shards with --to".into(),
        });
    }
    let mut load: BTreeMap<&str, (f64, usize)> = BTreeMap::new();
    for t in &targets {
        load.insert(&t.name, (0.0, 0));
    }
    for e in &fleet.entities {
        if let Some(l) = load.get_mut(e.shard.as_str()) {
            l.0 += e.size.weight(by);
            l.1 += 1;
        }
    }
    let (movable, skipped) = fleet.on(shard);
    let mut moves = Vec::new();
    for e in heaviest_first(movable, by) {
        let Some(best) = targets.iter().filter(|t| allowed(e, t)).min_by(|a, b| {
            let (la, lb) = (load[a.name.as_str()], load[b.name.as_str()]);
            la.0.total_cmp(&lb.0).then(la.1.cmp(&lb.1))
        }) else {
            return Err(Error::Preflight {
                problem: format!(
                    "{} is in region {} and no target shard is",
                    e.key,
                    e.region.as_deref().unwrap_or("?")
                ),
                fix: "add a shard of that region to --to".into(),
            });
        };
        let l = load.get_mut(best.name.as_str()).expect("a target");
        l.0 += e.size.weight(by);
        l.1 += 1;
        moves.push(planned(e, &best.name));
    }
    let purpose = format!("drain {shard}");
    Ok(BatchPlan {
        drains: Some(shard.to_owned()),
        ..fleet.plan(purpose, by, moves, skipped)
    })
}

/// About `fraction` of `shard`'s weight moved to `to`: the heaviest entities that still fit in
/// what is left to move, so no single move overshoots.
pub fn split(
    fleet: &Fleet,
    shard: &str,
    to: &str,
    fraction: f64,
    by: Weigh,
) -> Result<BatchPlan, Error> {
    fleet.shard(shard)?;
    let target = fleet.shard(to)?;
    if !(fraction > 0.0 && fraction < 1.0) || shard == to {
        return Err(Error::Preflight {
            problem: format!("cannot split {shard} to {to} with --fraction {fraction}"),
            fix: "a fraction between 0 and 1, and a shard other than the one split".into(),
        });
    }
    let all: f64 = fleet
        .entities
        .iter()
        .filter(|e| e.shard == shard)
        .map(|e| e.size.weight(by))
        .sum();
    let (movable, skipped) = fleet.on(shard);
    let mut left = all * fraction;
    let mut moves = Vec::new();
    for e in heaviest_first(movable, by) {
        let w = e.size.weight(by);
        if w <= left && allowed(e, target) {
            left -= w;
            moves.push(planned(e, to));
        }
    }
    let purpose = format!("split {shard} --to {to} --fraction {fraction}");
    Ok(fleet.plan(purpose, by, moves, skipped))
}

/// The shards evened out: while the heaviest shard is more than `tolerance` (a fraction) above
/// the mean, one of its entities moves to the lightest shard it may go to: the one that leaves
/// the two closest to even. At most `max_moves` moves, and no entity twice.
pub fn rebalance(
    fleet: &Fleet,
    by: Weigh,
    tolerance: f64,
    max_moves: usize,
) -> Result<BatchPlan, Error> {
    let mut load: BTreeMap<String, f64> = fleet
        .totals()
        .into_iter()
        .map(|(s, size)| (s, size.weight(by)))
        .collect();
    let mean = load.values().sum::<f64>() / load.len().max(1) as f64;
    let mut placed: Vec<Placed> = fleet.entities.clone();
    let mut moved = vec![false; placed.len()];
    let mut moves = Vec::new();
    while moves.len() < max_moves {
        let Some((heaviest, high)) = load
            .iter()
            .max_by(|a, b| a.1.total_cmp(b.1).then(b.0.cmp(a.0)))
            .map(|(s, l)| (s.clone(), *l))
        else {
            break;
        };
        if high <= mean * (1.0 + tolerance) {
            break;
        }
        // For each entity of it, the lightest shard it may go to; of those moves, the one that
        // leaves the two shards closest to even.
        let mut best: Option<(usize, &ShardInfo, f64)> = None;
        for (i, e) in placed.iter().enumerate() {
            let w = e.size.weight(by);
            if moved[i] || e.shard != heaviest || w <= 0.0 || !e.fits(fleet.max_freeze) {
                continue;
            }
            let lightest = fleet
                .shards
                .iter()
                .filter(|t| t.name != heaviest && allowed(e, t))
                .min_by(|a, b| {
                    load[&a.name]
                        .total_cmp(&load[&b.name])
                        .then(a.name.cmp(&b.name))
                });
            let Some(t) = lightest else { continue };
            let low = load[&t.name];
            if w >= high - low {
                continue;
            }
            let spread = ((high - w) - (low + w)).abs();
            if best.is_none_or(|(_, _, s)| spread < s) {
                best = Some((i, t, spread));
            }
        }
        let Some((i, t, _)) = best else { break };
        let w = placed[i].size.weight(by);
        *load.get_mut(&heaviest).expect("a shard") -= w;
        *load.get_mut(&t.name).expect("a shard") += w;
        moves.push(planned(&placed[i], &t.name));
        placed[i].shard = t.name.clone();
        moved[i] = true;
    }
    let (_, skipped) = fleet.movable(fleet.entities.iter());
    Ok(fleet.plan("rebalance".into(), by, moves, skipped))
}

#[cfg(test)]
mod unit {
    use super::*;
    use crate::directory::phase::Phase;

    fn shard(name: &str, region: Option<&str>) -> ShardInfo {
        ShardInfo {
            name: name.into(),
            region: region.map(Into::into),
        }
    }

    fn entity(id: &str, shard: &str, region: Option<&str>, bytes: i64) -> Placed {
        Placed {
            key: EntityKey::new("tenant", id),
            shard: shard.into(),
            region: region.map(Into::into),
            size: Size {
                rows: bytes / 100,
                bytes,
                load: 0.0,
            },
            freeze: None,
        }
    }

    fn fleet_of(shards: Vec<ShardInfo>, entities: Vec<Placed>) -> Fleet {
        Fleet {
            shards,
            entities,
            max_freeze: Duration::from_secs(10),
            sizes_kept: BTreeMap::new(),
            ways_back: Vec::new(),
        }
    }

    fn moves(plan: &BatchPlan) -> Vec<(&str, &str)> {
        plan.moves
            .iter()
            .map(|m| (m.entity_id.as_str(), m.to.as_str()))
            .collect()
    }

    #[test]
    fn a_drain_moves_everything_heaviest_first_to_the_lightest_shard_of_its_region() {
        let fleet = fleet_of(
            vec![
                shard("s1", Some("eu")),
                shard("s2", Some("eu")),
                shard("s3", Some("us")),
            ],
            vec![
                entity("a", "s1", None, 500),
                entity("b", "s1", Some("eu"), 400),
                entity("c", "s1", None, 300),
                entity("d", "s2", None, 100),
            ],
        );
        let plan = drain(&fleet, "s1", &[], Weigh::Bytes).unwrap();
        assert_eq!(moves(&plan), [("a", "s3"), ("b", "s2"), ("c", "s3")]);
        assert_eq!(plan.shards["s1"].after.bytes, 0);
        assert_eq!(plan.shards["s1"].entities_after, 0);
        assert_eq!(plan.shards["s2"].after.bytes, 500);
        // Only a us shard to go to: the eu entity has nowhere, and the plan is refused.
        let refused = drain(&fleet, "s1", &["s3".into()], Weigh::Bytes).unwrap_err();
        assert!(
            refused.to_string().contains("tenant/b is in region eu"),
            "{refused}"
        );
    }

    #[test]
    fn a_drain_is_refused_while_a_way_back_joins_the_shard() {
        let way_back = |phase, finalizing| WayBack {
            move_id: 7,
            entity: EntityKey::new("tenant", "a"),
            source: "s1".into(),
            target: "s2".into(),
            phase,
            finalizing,
        };
        let mut fleet = fleet_of(
            vec![shard("s1", None), shard("s2", None), shard("s3", None)],
            vec![entity("b", "s1", None, 100)],
        );
        fleet.ways_back = vec![way_back(Phase::Reversible, false)];
        for drained in ["s1", "s2"] {
            let refused = drain(&fleet, drained, &[], Weigh::Bytes).unwrap_err();
            let said = refused.to_string();
            assert!(
                said.contains("move 7 of tenant/a (s1 -> s2, reversible)"),
                "{said}"
            );
            assert!(said.contains("`shard-directory finalize 7`"), "{said}");
            assert!(said.contains("`shard-directory revert 7`"), "{said}");
        }
        let plan = drain(&fleet, "s3", &[], Weigh::Bytes).unwrap();
        assert_eq!(plan.drains.as_deref(), Some("s3"));
        // One still under way, or being finalized: what ends that is named instead.
        fleet.ways_back = vec![way_back(Phase::Copying, false)];
        let said = drain(&fleet, "s1", &[], Weigh::Bytes)
            .unwrap_err()
            .to_string();
        assert!(said.contains("`shard-directory abort 7`"), "{said}");
        fleet.ways_back = vec![way_back(Phase::CleaningUp, true)];
        let said = drain(&fleet, "s1", &[], Weigh::Bytes)
            .unwrap_err()
            .to_string();
        assert!(said.contains("finishes its finalize"), "{said}");
    }

    #[test]
    fn a_split_moves_about_the_fraction_without_overshooting() {
        let fleet = fleet_of(
            vec![shard("s1", None), shard("s9", None)],
            [600, 250, 100, 30, 20]
                .iter()
                .enumerate()
                .map(|(i, b)| entity(&i.to_string(), "s1", None, *b))
                .collect(),
        );
        let plan = split(&fleet, "s1", "s9", 0.5, Weigh::Bytes).unwrap();
        // Half of 1,000: 250 + 100 + 30 + 20 (600 alone overshoots).
        assert_eq!(
            moves(&plan),
            [("1", "s9"), ("2", "s9"), ("3", "s9"), ("4", "s9")]
        );
        assert_eq!(plan.shards["s9"].after.bytes, 400);
        assert!(split(&fleet, "s1", "s9", 1.5, Weigh::Bytes).is_err());
    }

    #[test]
    fn a_rebalance_evens_the_shards_and_stops_within_tolerance() {
        let fleet = fleet_of(
            vec![shard("s1", None), shard("s2", None), shard("s3", None)],
            (0..9)
                .map(|i| entity(&i.to_string(), "s1", None, 100))
                .chain([entity("x", "s2", None, 300)])
                .collect(),
        );
        let plan = rebalance(&fleet, Weigh::Bytes, 0.05, 100).unwrap();
        let after: Vec<i64> = plan.shards.values().map(|t| t.after.bytes).collect();
        assert_eq!(after, [400, 400, 400]);
        assert_eq!(plan.moves.len(), 5);
        // Already even: nothing to do.
        let even = fleet_of(
            fleet.shards.clone(),
            ["s1", "s2", "s3"]
                .iter()
                .enumerate()
                .map(|(i, s)| entity(&i.to_string(), s, None, 100))
                .collect(),
        );
        assert!(rebalance(&even, Weigh::Bytes, 0.05, 100)
            .unwrap()
            .moves
            .is_empty());
    }

    #[test]
    fn no_plan_moves_an_entity_whose_freeze_would_outlast_max_freeze() {
        let slow = |id: &str, shard: &str, bytes: i64, secs: u64| Placed {
            freeze: Some(Duration::from_secs(secs)),
            ..entity(id, shard, None, bytes)
        };
        let fleet = fleet_of(
            vec![shard("s1", None), shard("s2", None)],
            vec![
                slow("big", "s1", 900, 30),
                slow("small", "s1", 100, 1),
                entity("logical", "s1", None, 800),
            ],
        );
        let left = |plan: &BatchPlan| -> Vec<(String, u64)> {
            plan.skipped
                .iter()
                .map(|s| (s.entity_id.clone(), s.freeze_ms))
                .collect()
        };
        let drained = drain(&fleet, "s1", &[], Weigh::Bytes).unwrap();
        assert_eq!(moves(&drained), [("logical", "s2"), ("small", "s2")]);
        assert_eq!(left(&drained), [("big".to_owned(), 30_000)]);
        assert_eq!(drained.shards["s1"].entities_after, 1);
        let split = split(&fleet, "s1", "s2", 0.6, Weigh::Bytes).unwrap();
        assert_eq!(moves(&split), [("logical", "s2"), ("small", "s2")]);
        assert_eq!(left(&split), [("big".to_owned(), 30_000)]);
        let rebalanced = rebalance(&fleet, Weigh::Bytes, 0.05, 10).unwrap();
        assert!(rebalanced.moves.iter().all(|m| m.entity_id != "big"));
        assert_eq!(left(&rebalanced), [("big".to_owned(), 30_000)]);
    }

    #[test]
    fn a_plan_file_reads_back_and_may_be_cut_down_by_hand() {
        let text =
            r#"{"moves": [{"entity_type": "tenant", "entity_id": "7", "from": "s1", "to": "s2"}]}"#;
        let plan: BatchPlan = serde_json::from_str(text).unwrap();
        assert_eq!(plan.moves[0].key(), EntityKey::new("tenant", "7"));
        assert_eq!(plan.by, Weigh::Bytes);
    }
}
