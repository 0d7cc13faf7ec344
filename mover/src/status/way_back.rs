//! Why a reversible move's way back stopped, when a value stopped it: the target (often a newer
//! major, as in a fleet's upgrade) holds a value its source cannot read (`interval 'infinity'`,
//! new in 17), so the source's subscription fails on that change for ever. The way back's next
//! changes are read from a temporary copy of its slot (the slot itself is its subscription's,
//! taken again every few seconds), and each value is read on the source as its column's type:
//! the first it refuses is named, with the source's own error.

use std::collections::{HashMap, HashSet};

use serde::Serialize;
use tokio_postgres::Client;

use crate::run::replication::pgoutput::{self, Message, Relation};

/// Changes of the way back read at most: the one that stops it is among the first (its
/// subscriber confirmed what it applied), unless that subscriber lagged far behind before.
const CHANGES: i32 = 1_000;

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

/// The first value of the way back `name` (its slot and publication on `target`) that `source`
/// cannot read; `None` when every value of its next changes reads (then something else stops
/// it, which the source's server log names). Needs REPLICATION on the target, as the way back
/// itself does.
pub(crate) async fn unreadable(
    target: &Client,
    source: &Client,
    name: &str,
) -> Result<Option<Unreadable>, tokio_postgres::Error> {
    let messages = peek(target, name).await?;
    let mut relations: HashMap<u32, Relation> = HashMap::new();
    let mut types: HashMap<(u32, usize), Option<String>> = HashMap::new();
    let mut read: HashSet<(u32, usize, String)> = HashSet::new();
    for message in messages {
        let (relation, values) = match message {
            Message::Relation(r) => {
                relations.insert(r.id, r);
                continue;
            }
            Message::Row { relation, values } => (relation, values),
            Message::Other => continue,
        };
        let Some(r) = relations.get(&relation) else {
            continue;
        };
        for (at, value) in values.into_iter().enumerate() {
            let (Some(value), Some(column)) = (value, r.columns.get(at)) else {
                continue;
            };
            if !read.insert((relation, at, value.clone())) {
                continue;
            }
            let type_name = match types.get(&(relation, at)) {
                Some(t) => t.clone(),
                None => {
                    let t = column_type(source, r, column).await?;
                    types.insert((relation, at), t.clone());
                    t
                }
            };
            // A column the source lacks is the schema check's to name, not this.
            let Some(type_name) = type_name else { continue };
            if let Err(err) = source
                .query_one(&format!("SELECT $1::text::{type_name}"), &[&value])
                .await
            {
                let Some(db) = err.as_db_error() else {
                    return Err(err);
                };
                return Ok(Some(Unreadable {
                    table: format!("{}.{}", r.schema, r.table),
                    column: column.clone(),
                    type_name,
                    value: value.chars().take(SHOWN).collect(),
                    error: db.message().to_owned(),
                    sqlstate: db.code().code().to_owned(),
                }));
            }
        }
    }
    Ok(None)
}

/// The way back's next changes, from a temporary copy of its slot (dropped with the session, and
/// here), in the text forms its subscriber gets (the settings a walreceiver asks for).
async fn peek(target: &Client, name: &str) -> Result<Vec<Message>, tokio_postgres::Error> {
    target
        .batch_execute(
            "SET datestyle = ISO; SET intervalstyle = postgres; SET extra_float_digits = 3",
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
    let rows = target
        .query(
            "SELECT data FROM pg_logical_slot_peek_binary_changes(\
                 $1, NULL, $2, 'proto_version', '1', 'publication_names', $3)",
            &[&copy, &CHANGES, &name],
        )
        .await;
    target
        .execute("SELECT pg_drop_replication_slot($1)", &[&copy])
        .await?;
    let mut messages = Vec::new();
    for row in rows? {
        let data: &[u8] = row.get(0);
        match pgoutput::parse(data) {
            Ok(m) => messages.push(m),
            // What cannot be read ends the reading, not the status.
            Err(err) => {
                tracing::warn!(target: "shard_directory_mover::status", "way back {name}: {err}");
                break;
            }
        }
    }
    Ok(messages)
}

/// `column`'s type with its modifier on the source, if the source's table has it.
async fn column_type(
    source: &Client,
    relation: &Relation,
    column: &str,
) -> Result<Option<String>, tokio_postgres::Error> {
    let row = source
        .query_opt(
            "SELECT format_type(a.atttypid, a.atttypmod) FROM pg_attribute a \
             WHERE a.attrelid = to_regclass(format('%I.%I', $1::text, $2::text)) \
               AND a.attname = $3 AND a.attnum > 0 AND NOT a.attisdropped",
            &[&relation.schema, &relation.table, &column],
        )
        .await?;
    Ok(row.map(|r| r.get(0)))
}
