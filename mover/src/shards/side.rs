//! One shard as a move sees it: its endpoint and the mover's connection to it.

use tokio_postgres::Client;

use crate::directory::registry::{self, Endpoint};
use crate::error::{At, Error, Place, Step};

pub(crate) struct Side {
    pub endpoint: Endpoint,
    pub client: Client,
}

/// How the mover's sessions for move `id` show up in `pg_stat_activity`.
pub(crate) fn application_name(move_id: Option<i64>) -> String {
    match move_id {
        Some(id) => format!("shard-directory move {id}"),
        None => "shard-directory".to_owned(),
    }
}

/// Names the session of `client` after move `move_id`.
pub(crate) async fn name_session(
    client: &Client,
    move_id: i64,
) -> Result<(), tokio_postgres::Error> {
    client
        .execute(
            "SELECT set_config('application_name', $1, false)",
            &[&application_name(Some(move_id))],
        )
        .await
        .map(|_| ())
}

impl Side {
    pub async fn connect(endpoint: Endpoint, move_id: Option<i64>) -> Result<Side, Error> {
        let place = Place::Shard(endpoint.name.clone());
        let client = registry::connect(&endpoint.config, &application_name(move_id), place).await?;
        Ok(Side { endpoint, client })
    }

    pub fn name(&self) -> &str {
        &self.endpoint.name
    }

    /// A second connection, for work that may be abandoned mid-stream (a copy cut off by the
    /// freeze deadline) without leaving `client` unusable.
    pub async fn another(&self, move_id: i64) -> Result<Client, Error> {
        let place = Place::Shard(self.name().to_owned());
        registry::connect(
            &self.endpoint.config,
            &application_name(Some(move_id)),
            place,
        )
        .await
    }

    /// Names this session after the move, once the move has an id.
    pub async fn name_after(&self, move_id: i64) -> Result<(), Error> {
        name_session(&self.client, move_id)
            .await
            .at(Step::Connect, self.name())
    }

    /// Ends every other session of move `move_id` on this shard (a crashed run's, a copy cut off
    /// by the deadline) and waits for each to be gone, so none can commit behind an abort.
    pub async fn end_other_sessions(&self, move_id: i64) -> Result<(), Error> {
        self.client
            .execute(
                "SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity \
                 WHERE application_name = $1 AND pid <> pg_backend_pid()",
                &[&application_name(Some(move_id))],
            )
            .await
            .at(Step::Abort, self.name())
            .map(|_| ())
    }
}
