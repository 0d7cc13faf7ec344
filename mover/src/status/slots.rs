//! The slots of every open move, read again and again on a session kept per shard: the console's
//! live list shows each move's lag and retained WAL every second without a connection per read,
//! and a shard that does not answer is left out for a while, not waited on at each read.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use tokio_postgres::Client;

use super::{slot, slot_of, Slot};
use crate::directory::record::MoveRecord;
use crate::directory::registry::{self, Overrides};
use crate::shards::side::Side;

/// How long connecting to a shard, or reading its slot, may take.
const WITHIN: Duration = Duration::from_secs(3);

/// How long a shard that failed is left out.
const LEFT_OUT: Duration = Duration::from_secs(10);

/// Sessions on the shards whose slots are read (made by [`crate::Mover::slots`]).
pub struct Slots {
    overrides: Overrides,
    sessions: HashMap<String, Side>,
    left_out: HashMap<String, Instant>,
}

impl Slots {
    pub(crate) fn new(overrides: Overrides) -> Slots {
        Slots {
            overrides,
            sessions: HashMap::new(),
            left_out: HashMap::new(),
        }
    }

    /// The slot of each of `moves` that streams through one, by move id, as its shard says now;
    /// a move whose shard cannot be read now (or whose slot is gone) is absent. `directory`
    /// names the shards' addresses.
    pub async fn read(&mut self, directory: &Client, moves: &[MoveRecord]) -> BTreeMap<i64, Slot> {
        let mut read = BTreeMap::new();
        for m in moves {
            let Some((shard, name)) = slot_of(m) else {
                continue;
            };
            if self
                .left_out
                .get(shard)
                .is_some_and(|t| t.elapsed() < LEFT_OUT)
            {
                continue;
            }
            match self.read_one(directory, shard, &name).await {
                Ok(Some(s)) => {
                    read.insert(m.move_id, s);
                }
                Ok(None) => {}
                Err(why) => {
                    tracing::debug!(shard, "the console leaves a shard's slots out: {why}");
                    self.sessions.remove(shard);
                    self.left_out.insert(shard.to_owned(), Instant::now());
                }
            }
        }
        // Sessions on shards no open move streams from are closed.
        let in_use: Vec<&str> = moves
            .iter()
            .filter_map(|m| slot_of(m).map(|s| s.0))
            .collect();
        self.sessions
            .retain(|shard, _| in_use.contains(&shard.as_str()));
        read
    }

    async fn read_one(
        &mut self,
        directory: &Client,
        shard: &str,
        name: &str,
    ) -> Result<Option<Slot>, String> {
        if !self.sessions.contains_key(shard) {
            let connect = async {
                let endpoint = registry::endpoint(directory, &self.overrides, shard).await?;
                Side::connect(endpoint, None).await
            };
            let side = tokio::time::timeout(WITHIN, connect)
                .await
                .map_err(|_| format!("no answer within {WITHIN:?}"))?
                .map_err(|e| e.to_string())?;
            self.sessions.insert(shard.to_owned(), side);
        }
        let side = &self.sessions[shard];
        tokio::time::timeout(WITHIN, slot(&side.client, shard, name))
            .await
            .map_err(|_| format!("no answer within {WITHIN:?}"))?
            .map_err(|e| e.to_string())
    }
}
