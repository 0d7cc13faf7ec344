//! How the client sends its own statements: prepared once per connection (then one round trip
//! each), or unnamed (parse, bind and execute in one round trip, nothing left on the server) for
//! a pooler in transaction mode that cannot carry prepared statements from one transaction to
//! the next (PgBouncer before 1.21, or without `max_prepared_statements`).

use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{GenericClient, Row};

/// How this crate's own statements (lookups, version reads, the stamp) reach the server. The
/// application's statements inside a routed transaction are its own: prepared inside the
/// transaction, they stay on one server connection through any pooler.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Statements {
    /// Prepared once per connection: straight to PostgreSQL, through a session-mode pooler, or
    /// PgBouncer 1.21+ with `max_prepared_statements`.
    #[default]
    Prepared,
    /// Unnamed, with the parameter types given: through a transaction-mode pooler that cannot
    /// carry prepared statements. Still one round trip; the server parses each time.
    Unnamed,
}

impl Statements {
    /// Runs `sql` on `on`, prepared through `cache` (the same pooled connection or transaction,
    /// as deadpool wraps it, for its statement cache) or unnamed.
    pub(crate) async fn query<C: GenericClient, const N: usize>(
        self,
        cache: &impl deadpool_postgres::GenericClient,
        on: &C,
        sql: &str,
        params: [(&(dyn ToSql + Sync), Type); N],
    ) -> Result<Vec<Row>, tokio_postgres::Error> {
        match self {
            Statements::Prepared => {
                let types = params.each_ref().map(|(_, t)| t.clone());
                let statement = cache.prepare_typed_cached(sql, &types).await?;
                on.query(&statement, &params.map(|(v, _)| v)).await
            }
            Statements::Unnamed => on.query_typed(sql, &params).await,
        }
    }
}
