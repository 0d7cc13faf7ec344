//! An entry's routing state.

use std::fmt;

/// How an entry routes, as `shard_directory.state` spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(rename_all = "snake_case")
)]
pub enum State {
    /// Reads and writes go to `shard_name`.
    Active,
    /// Being copied to `target_shard`: reads go to both, writes to `shard_name`.
    Migrating,
    /// A cutover (or maintenance) is running: writes are refused, retryably.
    ReadOnly,
}

impl State {
    /// Every state.
    pub const ALL: [State; 3] = [State::Active, State::Migrating, State::ReadOnly];

    /// As `shard_directory.state` spells it.
    pub const fn as_str(self) -> &'static str {
        match self {
            State::Active => "active",
            State::Migrating => "migrating",
            State::ReadOnly => "read_only",
        }
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A `state` value that is none of [`State`]'s.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownState(pub String);

impl fmt::Display for UnknownState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown directory entry state \"{}\"", self.0)
    }
}

impl std::error::Error for UnknownState {}

impl std::str::FromStr for State {
    type Err = UnknownState;

    /// ```
    /// use shard_directory_protocol::State;
    /// assert_eq!("read_only".parse::<State>(), Ok(State::ReadOnly));
    /// assert!("paused".parse::<State>().is_err());
    /// ```
    fn from_str(s: &str) -> Result<State, UnknownState> {
        State::ALL
            .into_iter()
            .find(|state| state.as_str() == s)
            .ok_or_else(|| UnknownState(s.to_owned()))
    }
}
