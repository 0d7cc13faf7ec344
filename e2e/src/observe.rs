//! Observers that act on a move when it reaches a phase (as a slow step, another process or a
//! crash there would), and a move stopped dead at a phase.

use std::sync::{Arc, Mutex};

use futures_util::future::BoxFuture;
use shard_directory_client::EntityKey;
use shard_directory_mover::{MoveOptions, Observer, Phase, Step};
use tokio::sync::Notify;

use crate::Topology;

type Action = Box<dyn Fn() -> BoxFuture<'static, ()> + Send + Sync>;

/// Where in a move an action runs: as its record enters a phase, or as it begins a step.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum At {
    Phase(Phase),
    Step(Step),
}

impl From<Phase> for At {
    fn from(phase: Phase) -> At {
        At::Phase(phase)
    }
}

impl From<Step> for At {
    fn from(step: Step) -> At {
        At::Step(step)
    }
}

/// Runs its action when the move reaches its phase or step; the move goes on when the action is
/// done. Keeps the move's notes.
pub struct ActAt {
    at: At,
    act: Action,
    notes: Mutex<Vec<String>>,
}

impl Observer for ActAt {
    fn phase(&self, _move_id: i64, phase: Phase) -> BoxFuture<'_, ()> {
        self.act_if(At::Phase(phase))
    }

    fn step(&self, _move_id: i64, step: Step) -> BoxFuture<'_, ()> {
        self.act_if(At::Step(step))
    }

    fn note(&self, _move_id: i64, message: &str) {
        self.notes.lock().unwrap().push(message.to_owned());
    }
}

impl ActAt {
    fn act_if(&self, now: At) -> BoxFuture<'static, ()> {
        if now == self.at {
            (self.act)()
        } else {
            Box::pin(std::future::ready(()))
        }
    }

    /// What the move noted so far.
    pub fn notes(&self) -> Vec<String> {
        self.notes.lock().unwrap().clone()
    }
}

/// Runs `act` when the move reaches `at` (a phase or a step).
pub fn act_at(
    at: impl Into<At>,
    act: impl Fn() -> BoxFuture<'static, ()> + Send + Sync + 'static,
) -> Arc<ActAt> {
    Arc::new(ActAt {
        at: at.into(),
        act: Box::new(act),
        notes: Mutex::default(),
    })
}

/// An observer that holds the move forever once it reaches `at`, and the notice it gives then.
pub fn hold_at(at: impl Into<At>) -> (Arc<ActAt>, Arc<Notify>) {
    let reached = Arc::new(Notify::new());
    let hold = act_at(at, {
        let reached = reached.clone();
        move || {
            reached.notify_one();
            Box::pin(std::future::pending())
        }
    });
    (hold, reached)
}

/// Runs `work` (driving a move observed by [`hold_at`]) until it is held, then drops it, as a
/// crash there would leave the move (its sessions end with it). `work` must not end first.
pub async fn until_held<T: std::fmt::Debug>(
    reached: &Notify,
    what: &str,
    work: impl std::future::Future<Output = T>,
) {
    tokio::select! {
        r = work => panic!("{what} should have been held: {r:?}"),
        _ = reached.notified() => {}
    }
}

/// Starts a move of `key` to `to` with `options` and stops it dead once its record says `at`,
/// as a crash there would leave it (its sessions end with it); returns its id.
pub async fn crash_at(
    t: &Topology,
    options: MoveOptions,
    key: &EntityKey,
    to: &str,
    at: Phase,
) -> i64 {
    let (hold, reached) = hold_at(at);
    let mover = t.mover(options).with_observer(hold);
    let what = format!("the move of {key} to {to} at {at}");
    until_held(&reached, &what, mover.start(key, to)).await;
    open_move(t, key).await
}

/// The id of the entity's open move.
pub async fn open_move(t: &Topology, key: &EntityKey) -> i64 {
    t.dba()
        .await
        .query_one(
            "SELECT move_id FROM shard_directory.shard_moves \
             WHERE entity_type = $1 AND entity_id = $2 AND finished_at IS NULL",
            &[&key.entity_type, &key.entity_id],
        )
        .await
        .expect("an open move")
        .get(0)
}
