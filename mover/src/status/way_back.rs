//! Why a reversible move's way back stopped, when a value stopped it: the target (often a newer
//! major, as in a fleet's upgrade) holds a value its source cannot read (`interval 'infinity'`,
//! new in 17), so the source's subscription fails on that change for ever.
//!
//! What stops a subscription is the first transaction it has not applied, so only that one is
//! read: the source's subscription says how far it applied (its replication origin's
//! progress), a temporary copy of the way back's slot is moved there (the slot itself is the
//! subscription's, and its confirmed position lags what was applied), and the copy's next
//! transaction is read as pgoutput, one message at a time. Each value it writes is read on the
//! source as the subscriber reads it (the type's input function, with the column's modifier):
//! the first the source refuses as data (SQLSTATE class 22) is named, with its own error. An update of a row the source does not have is skipped
//! as the subscriber skips it, its new values never read. Anything else that stops the way back
//! (a constraint, a paused subscription, a source down) gets nothing named.

use std::collections::HashMap;

use futures_util::{pin_mut, TryStreamExt};
use serde::Serialize;
use tokio_postgres::types::ToSql;
use tokio_postgres::Client;

use crate::run::replication::pgoutput::{self, Message, Relation, Value};

/// Longest value shown; the rest is cut (a value can be a whole document).
const SHOWN: usize = 200;

/// A value the way back carries that its source cannot read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Unreadable {
    /// The table, schema-qualified.
    pub table: String,
    pub column: String,
    /// The column's type on the source, with its modifier.
    pub type_name: String,
    /// The value's text, as the target sent it (cut at 200 characters).
    pub value: String,
    /// What the source says of it, and its SQLSTATE.
    pub error: String,
    pub sqlstate: String,
}

impl std::fmt::Display for Unreadable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}.{} = '{}' ({}): {} ({})",
            self.table, self.column, self.value, self.type_name, self.error, self.sqlstate
        )
    }
}

/// The value of the way back `name` (its slot and publication on `target`, its subscription on
/// `source`) that stops it, if a value does. Needs REPLICATION on the target, as the way back
/// itself does, and on the source a role that may run `pg_replication_origin_progress`.
pub(crate) async fn unreadable(
    target: &Client,
    source: &Client,
    name: &str,
) -> Result<Option<Unreadable>, tokio_postgres::Error> {
    // How far the source applied: the end of the last transaction it took.
    let Some(row) = source
        .query_opt(
            "SELECT pg_replication_origin_progress('pg_' || s.oid, false)::text \
             FROM pg_subscription s JOIN pg_database d ON d.oid = s.subdbid \
             WHERE s.subname = $1 AND d.datname = current_database()",
            &[&name],
        )
        .await?
    else {
        return Ok(None);
    };
    let applied: Option<String> = row.get(0);
    target
        .batch_execute(
            // The text forms a walreceiver asks for; and a bound: moving the copy and reading
            // it decode the WAL the slot keeps, which a long stop on a busy target makes long.
            "SET datestyle = ISO; SET intervalstyle = postgres; SET extra_float_digits = 3; \
             SET statement_timeout = '30s'",
        )
        .await?;
    let copy: String = target
        .query_one(
            "SELECT slot_name::text FROM pg_copy_logical_replication_slot(\
                 $1::text::name, (left($1::text, 40) || '_peek_' || pg_backend_pid())::name, true)",
            &[&name],
        )
        .await?
        .get(0);
    let found = first_unapplied(target, source, &copy, name, applied.as_deref()).await;
    target
        .execute("SELECT pg_drop_replication_slot($1)", &[&copy])
        .await?;
    found
}

/// The first transaction past `applied` on the copy `copy`, read until a value the source
/// cannot read, or its end.
async fn first_unapplied(
    target: &Client,
    source: &Client,
    copy: &str,
    publication: &str,
    applied: Option<&str>,
) -> Result<Option<Unreadable>, tokio_postgres::Error> {
    if let Some(applied) = applied {
        target
            .execute(
                "SELECT pg_replication_slot_advance(slot_name, $2::text::pg_lsn) \
                 FROM pg_replication_slots \
                 WHERE slot_name = $1 AND confirmed_flush_lsn < $2::text::pg_lsn",
                &[&copy, &applied],
            )
            .await?;
    }
    // One change asked for: the whole first transaction comes (decoding stops only between
    // transactions), streamed a message at a time.
    let params: [&(dyn ToSql + Sync); 2] = [&copy, &publication];
    let rows = target
        .query_raw(
            "SELECT data FROM pg_logical_slot_peek_binary_changes(\
                 $1::text::name, NULL, 1, 'proto_version', '1', 'publication_names', $2::text)",
            params,
        )
        .await?;
    pin_mut!(rows);
    // Each relation of the stream as the source has it, read once (the stream describes a
    // relation before its first row).
    let mut tables: HashMap<u32, Table> = HashMap::new();
    while let Some(row) = rows.try_next().await? {
        let message = match pgoutput::parse(row.get::<_, &[u8]>(0)) {
            Ok(m) => m,
            Err(err) => {
                tracing::warn!(target: "shard_directory_mover::status", "way back {publication}: {err}");
                return Ok(None);
            }
        };
        let (relation, values, old) = match message {
            Message::Relation(r) => {
                tables.insert(r.id, Table::of(source, r).await?);
                continue;
            }
            Message::Row {
                relation,
                values,
                old,
            } => (relation, values, old),
            Message::Commit => break,
            Message::Other => continue,
        };
        let Some(table) = tables.get(&relation) else {
            continue;
        };
        // An update that sent its old key is found by it first; a row the source lacks is
        // skipped, its new values never read.
        if let Some(old) = &old {
            match table.holds(source, old).await? {
                Holds::Yes => {}
                Holds::No => continue,
                Holds::Unreadable(u) => return Ok(Some(u)),
            }
        }
        for (at, value) in values.iter().enumerate() {
            if let Some(u) = table.read(source, at, value).await? {
                return Ok(Some(u));
            }
        }
    }
    Ok(None)
}

/// A relation of the stream as the source has it: its name, quoted, and its columns (`None`: a
/// column the source's table lacks, which the schema check names, not this).
struct Table {
    relation: Relation,
    name: String,
    columns: Vec<Option<Column>>,
}

/// A column of the source's table, and how the source's subscriber reads a value into it: the
/// type's input function with the column's type modifier (`varchar(5)` refuses a longer value,
/// where a cast to it would cut it).
struct Column {
    quoted: String,
    /// Its type with its modifier, as `format_type` prints it.
    type_name: String,
    input: String,
    io_param: u32,
    modifier: i32,
}

enum Holds {
    Yes,
    No,
    Unreadable(Unreadable),
}

impl Table {
    async fn of(source: &Client, relation: Relation) -> Result<Table, tokio_postgres::Error> {
        let rows = source
            .query(
                "SELECT r.oid::regclass::text, quote_ident(c.name), \
                        format_type(a.atttypid, a.atttypmod), t.typinput::regproc::text, \
                        CASE WHEN t.typelem <> 0 THEN t.typelem ELSE t.oid END, a.atttypmod \
                 FROM (SELECT to_regclass(format('%I.%I', $1::text, $2::text)) AS oid) r \
                 CROSS JOIN unnest($3::text[]) WITH ORDINALITY c(name, n) \
                 LEFT JOIN pg_attribute a ON a.attrelid = r.oid AND a.attname = c.name \
                      AND a.attnum > 0 AND NOT a.attisdropped \
                 LEFT JOIN pg_type t ON t.oid = a.atttypid \
                 ORDER BY c.n",
                &[&relation.schema, &relation.table, &relation.columns],
            )
            .await?;
        let name = rows
            .first()
            .and_then(|r| r.get::<_, Option<String>>(0))
            .unwrap_or_default();
        let columns = rows
            .iter()
            .map(|r| {
                Some(Column {
                    quoted: r.get(1),
                    type_name: r.get::<_, Option<String>>(2)?,
                    input: r.get(3),
                    io_param: r.get(4),
                    modifier: r.get(5),
                })
            })
            .collect();
        Ok(Table {
            relation,
            name,
            columns,
        })
    }

    /// The value at `at` as the source's subscriber reads it: `Some` when it refuses it as
    /// data. Any other error (a type the role may not use) says nothing of the value, and is
    /// passed over.
    async fn read(
        &self,
        source: &Client,
        at: usize,
        value: &Value,
    ) -> Result<Option<Unreadable>, tokio_postgres::Error> {
        let (Some(value), Some(Some(column))) = (value, self.columns.get(at)) else {
            return Ok(None);
        };
        let read = source
            .query_one(
                &format!("SELECT {}($1::text::cstring, $2, $3) IS NULL", column.input),
                &[value, &column.io_param, &column.modifier],
            )
            .await;
        match read {
            Ok(_) => Ok(None),
            Err(err) => match err.as_db_error() {
                Some(db) if db.code().code().starts_with("22") => Ok(Some(Unreadable {
                    table: format!("{}.{}", self.relation.schema, self.relation.table),
                    column: self.relation.columns[at].clone(),
                    type_name: column.type_name.clone(),
                    value: value.chars().take(SHOWN).collect(),
                    error: db.message().to_owned(),
                    sqlstate: db.code().code().to_owned(),
                })),
                Some(_) => Ok(None),
                None => Err(err),
            },
        }
    }

    /// Whether the source holds the row `old` (an update's old key, or whole old row) names, by
    /// the key's columns, as the subscriber looks it up.
    async fn holds(&self, source: &Client, old: &[Value]) -> Result<Holds, tokio_postgres::Error> {
        let mut predicates = Vec::new();
        let mut params: Vec<&(dyn ToSql + Sync)> = Vec::new();
        for (at, value) in old.iter().enumerate() {
            if !self.relation.key.get(at).copied().unwrap_or(false) {
                continue;
            }
            if let Some(u) = self.read(source, at, value).await? {
                return Ok(Holds::Unreadable(u));
            }
            let (Some(value), Some(Some(column))) = (value, self.columns.get(at)) else {
                continue;
            };
            params.push(value);
            predicates.push(format!(
                "{} = ${}::text::{}",
                column.quoted,
                params.len(),
                column.type_name
            ));
        }
        if predicates.is_empty() || self.name.is_empty() {
            return Ok(Holds::Yes);
        }
        let found = source
            .query_opt(
                &format!(
                    "SELECT 1 FROM {} WHERE {}",
                    self.name,
                    predicates.join(" AND ")
                ),
                &params,
            )
            .await?;
        Ok(if found.is_some() {
            Holds::Yes
        } else {
            Holds::No
        })
    }
}
