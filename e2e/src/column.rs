//! A query's first column, for the tests that compare what a server holds with what they expect.

use tokio_postgres::types::{FromSqlOwned, ToSql};
use tokio_postgres::GenericClient;

/// Column 0 of every row `sql` returns, in the rows' order; panics, naming the query, on an error.
pub async fn column<T: FromSqlOwned>(
    c: &impl GenericClient,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Vec<T> {
    c.query(sql, params)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .iter()
        .map(|r| r.get(0))
        .collect()
}
