//! DDL on the entity's tables during a move. A run carries the columns it described when it
//! began (`Run::tables`: what its copy reads and writes and its checks hash), so a column added,
//! dropped or retyped on either shard afterwards makes logical apply stop (a column the target
//! lacks) or the copies drift (a column the copy and the check no longer see). Each check reads
//! the definition of every entity table on both shards (its columns in order with their types
//! and NOT NULL, its key column, its primary key: one catalog query a shard, cheap enough for the
//! freeze) and compares it with what the run began with: the source with the run's own
//! description, the target with its first check. The first check also compares the target with
//! the source as preflight does (every column the source has, of the same type), which is what
//! a resumed run meets after the DBA made the shards agree.
//!
//! Any change stops the move resumable before its cutover, naming the shard, the table, the
//! change and the DDL that makes the other shard agree; `resume` describes the tables again.

use serde::Deserialize;
use shard_directory_protocol::EntityKey;
use tokio_postgres::Client;

use crate::error::{At, Error, Step};
use crate::shards::catalog::{columns_json, primary_key_json, Column, EntityTable};

use super::Run;

/// One entity table as a shard defines it: what a change of it would make the move carry wrong.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
struct Definition {
    /// `schema.table`.
    name: String,
    /// `"schema"."table"`.
    quoted: String,
    key_column: String,
    columns: Vec<Column>,
    /// Quoted, in key order.
    primary_key: Vec<String>,
}

impl From<&EntityTable> for Definition {
    fn from(t: &EntityTable) -> Definition {
        Definition {
            name: t.name.clone(),
            quoted: t.quoted.clone(),
            key_column: t.key_column.clone(),
            columns: t.columns.clone(),
            primary_key: t.primary_key.clone(),
        }
    }
}

const READ: &str = concat!(
    r#"
SELECT coalesce(json_agg(t ORDER BY t.name), '[]')::text FROM (
  SELECT format('%s.%s', n.nspname, c.relname) AS name,
         format('%I.%I', n.nspname, c.relname) AS quoted,
         p.key_column,
         "#,
    columns_json!(),
    r#" AS columns,
         "#,
    primary_key_json!(),
    r#" AS primary_key
    FROM shard_directory.protected_tables() p
    JOIN pg_class c ON c.oid = p.tbl
    JOIN pg_namespace n ON n.oid = c.relnamespace
   WHERE p.entity_type = $1
) t
"#
);

/// The definitions of the tables `client`'s shard protects for `entity_type`.
async fn read(
    client: &Client,
    entity_type: &str,
) -> Result<Vec<Definition>, tokio_postgres::Error> {
    let json: String = client.query_one(READ, &[&entity_type]).await?.get(0);
    Ok(serde_json::from_str(&json).expect("the schema query returns this shape"))
}

/// What changed in one table between two definitions of it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Change {
    /// Protected for the entity type now, not before.
    Protected,
    /// Protected before, not now (unprotected, or dropped).
    Unprotected,
    KeyColumn(String),
    ColumnAdded(Column),
    ColumnDropped(Column),
    /// The column, and its type now.
    Retyped(Column, String),
    /// The column, and whether it is NOT NULL now.
    Nullability(Column, bool),
    PrimaryKey(Vec<String>),
}

/// The definition of table `name` among `defs`.
fn find<'a>(defs: &'a [Definition], name: &str) -> Option<&'a Definition> {
    defs.iter().find(|d| d.name == name)
}

/// Each table's changes from `before` to `now`, in table order.
fn changes<'a>(before: &'a [Definition], now: &'a [Definition]) -> Vec<(&'a Definition, Change)> {
    let mut found = Vec::new();
    for b in before {
        let Some(n) = find(now, &b.name) else {
            found.push((b, Change::Unprotected));
            continue;
        };
        if n.key_column != b.key_column {
            found.push((n, Change::KeyColumn(n.key_column.clone())));
        }
        for c in &b.columns {
            let Some(x) = n.columns.iter().find(|x| x.name == c.name) else {
                found.push((n, Change::ColumnDropped(c.clone())));
                continue;
            };
            if x.type_name != c.type_name {
                found.push((n, Change::Retyped(c.clone(), x.type_name.clone())));
            }
            if x.not_null != c.not_null {
                found.push((n, Change::Nullability(c.clone(), x.not_null)));
            }
        }
        for x in &n.columns {
            if !b.columns.iter().any(|c| c.name == x.name) {
                found.push((n, Change::ColumnAdded(x.clone())));
            }
        }
        if n.primary_key != b.primary_key {
            found.push((n, Change::PrimaryKey(n.primary_key.clone())));
        }
    }
    for n in now {
        if find(before, &n.name).is_none() {
            found.push((n, Change::Protected));
        }
    }
    found
}

impl Change {
    /// Whether `table` (another shard's definition of the changed table, if it protects it) is
    /// as the change left the changed one.
    fn shown_by(&self, table: Option<&Definition>) -> bool {
        let column = |name: &str| table.and_then(|t| t.columns.iter().find(|c| c.name == name));
        match self {
            Change::Protected => table.is_some(),
            Change::Unprotected => table.is_none(),
            Change::KeyColumn(key) => table.is_some_and(|t| &t.key_column == key),
            Change::ColumnAdded(c) => column(&c.name).is_some_and(|x| x.type_name == c.type_name),
            Change::ColumnDropped(c) => table.is_some() && column(&c.name).is_none(),
            Change::Retyped(c, to) => column(&c.name).is_some_and(|x| &x.type_name == to),
            Change::Nullability(c, now) => column(&c.name).is_some_and(|x| x.not_null == *now),
            Change::PrimaryKey(key) => table.is_some_and(|t| &t.primary_key == key),
        }
    }

    fn describe(&self, kind: &str) -> String {
        match self {
            Change::Protected => format!("table protected for entity type '{kind}'"),
            Change::Unprotected => {
                format!("table no longer protected for entity type '{kind}' (or dropped)")
            }
            Change::KeyColumn(key) => format!("table protected with key column {key} instead"),
            Change::ColumnAdded(c) => format!("column {} {} added", c.name, c.type_name),
            Change::ColumnDropped(c) => format!("column {} {} dropped", c.name, c.type_name),
            Change::Retyped(c, to) => {
                format!("column {} changed from {} to {to}", c.name, c.type_name)
            }
            Change::Nullability(c, true) => format!("column {} made NOT NULL", c.name),
            Change::Nullability(c, false) => format!("column {} made nullable", c.name),
            Change::PrimaryKey(key) => format!("primary key changed to ({})", key.join(", ")),
        }
    }

    /// The DDL that makes another shard's definition of `t` as the change left it.
    fn ddl(&self, t: &Definition, kind: &str) -> String {
        let table = &t.quoted;
        match self {
            Change::Protected | Change::KeyColumn(_) => format!(
                "SELECT shard_directory.protect('{}', '{}', '{kind}')",
                t.name, t.key_column
            ),
            Change::Unprotected => format!("SELECT shard_directory.unprotect('{}')", t.name),
            Change::ColumnAdded(c) => {
                format!(
                    "ALTER TABLE {table} ADD COLUMN {} {}",
                    c.quoted, c.type_name
                )
            }
            Change::ColumnDropped(c) => format!("ALTER TABLE {table} DROP COLUMN {}", c.quoted),
            Change::Retyped(c, to) => {
                format!("ALTER TABLE {table} ALTER COLUMN {} TYPE {to}", c.quoted)
            }
            Change::Nullability(c, now) => format!(
                "ALTER TABLE {table} ALTER COLUMN {} {} NOT NULL",
                c.quoted,
                if *now { "SET" } else { "DROP" }
            ),
            Change::PrimaryKey(key) => format!("give {table} the primary key ({})", key.join(", ")),
        }
    }

    /// How the target's `table` differs from the source's `source` when this is the change
    /// from the source's definition to the target's, unless preflight lets a move start with
    /// it (a column or a table the source lacks, NOT NULL or the primary key declared
    /// otherwise): what and the DDL that makes the target as the source, on `(s, g)`.
    fn unlike_source(
        &self,
        source: &Definition,
        (s, g): (&str, &str),
        kind: &str,
    ) -> Option<(String, String)> {
        let (what, back) = match self {
            Change::ColumnDropped(c) => (
                format!(
                    "column {} {} is on shard {s} but not on {g}",
                    c.name, c.type_name
                ),
                Change::ColumnAdded(c.clone()),
            ),
            Change::Retyped(c, to) => (
                format!(
                    "column {} is {} on shard {s} but {to} on {g}",
                    c.name, c.type_name
                ),
                Change::Retyped(c.clone(), c.type_name.clone()),
            ),
            Change::Unprotected => (
                format!("table protected for entity type '{kind}' on shard {s} but not on {g}"),
                Change::Protected,
            ),
            Change::KeyColumn(key) => (
                format!(
                    "table protected with key column {} on shard {s} but {key} on {g}",
                    source.key_column
                ),
                Change::KeyColumn(source.key_column.clone()),
            ),
            _ => return None,
        };
        Some((what, back.ddl(source, kind)))
    }
}

/// A change to one of the entity's tables found during a move, for a person.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaChange {
    /// `schema.table`.
    pub table: String,
    /// The shard it was made on (the source, when made on both), or the target when it cannot
    /// take what the source has.
    pub shard: String,
    /// What changed, and where: `column note text added on shard_1 only`.
    pub what: String,
    /// What makes the shards agree.
    pub fix: String,
}

impl std::fmt::Display for SchemaChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.table, self.what)
    }
}

/// `change` of `table`, made on shard `on`; `both` when `other` is now as it left `on`.
fn named(
    (on, other): (&str, &str),
    table: &Definition,
    change: &Change,
    both: bool,
    kind: &str,
) -> SchemaChange {
    let (what, fix) = if both {
        (
            format!("{} on {on} (now as on {other})", change.describe(kind)),
            "nothing differs between the shards: `resume` describes the tables again".to_owned(),
        )
    } else {
        (
            format!("{} on {on} only", change.describe(kind)),
            format!(
                "{} on shard {other}, or undo it on shard {on}",
                change.ddl(table, kind)
            ),
        )
    };
    SchemaChange {
        table: table.name.clone(),
        shard: on.to_owned(),
        what,
        fix,
    }
}

/// The definitions one run of a move began with, to tell DDL made since.
pub(crate) struct Watch {
    /// The source's, as the run described it (what it copies and checks).
    source: Vec<Definition>,
    /// The target's at the run's first check that found it able to take what the source has.
    target: Option<Vec<Definition>>,
}

impl Watch {
    pub(crate) fn new(tables: &[EntityTable]) -> Watch {
        Watch {
            source: tables.iter().map(Definition::from).collect(),
            target: None,
        }
    }

    /// Fails with [`Error::SchemaChanged`] when a table of `key`'s changed on either shard since
    /// the run began, or (before the target's definitions are known) when the target cannot take
    /// what the source has. One catalog query on each shard.
    pub(crate) async fn check(
        &mut self,
        (source, s): (&Client, &str),
        (target, g): (&Client, &str),
        key: &EntityKey,
        step: Step,
    ) -> Result<(), Error> {
        let kind = key.entity_type.as_str();
        let on_source = read(source, kind).await.at(step, s)?;
        let on_target = read(target, kind).await.at(step, g)?;
        let from_source = changes(&self.source, &on_source);
        let mut found: Vec<SchemaChange> = from_source
            .iter()
            .map(|(t, c)| named((s, g), t, c, c.shown_by(find(&on_target, &t.name)), kind))
            .collect();
        match &self.target {
            Some(before) => {
                for (t, c) in changes(before, &on_target) {
                    // Made on both shards: named once, with the source's.
                    let named_already =
                        from_source.iter().any(|(x, y)| x.name == t.name && *y == c);
                    if !named_already {
                        let both = c.shown_by(find(&on_source, &t.name));
                        found.push(named((g, s), t, &c, both, kind));
                    }
                }
            }
            None => {
                for (t, c) in changes(&self.source, &on_target) {
                    let source = find(&self.source, &t.name).unwrap_or(t);
                    if let Some((what, ddl)) = c.unlike_source(source, (s, g), kind) {
                        found.push(SchemaChange {
                            table: t.name.clone(),
                            shard: g.to_owned(),
                            what,
                            fix: format!("{ddl} on shard {g}"),
                        });
                    }
                }
                if found.is_empty() {
                    self.target = Some(on_target);
                }
            }
        }
        if found.is_empty() {
            return Ok(());
        }
        Err(Error::SchemaChanged {
            step,
            entity: key.clone(),
            changes: found,
        })
    }
}

impl Run<'_> {
    /// DDL on the entity's tables since this run began: fails naming it.
    pub(super) async fn check_schema(&mut self, step: Step) -> Result<(), Error> {
        self.target(step)?;
        let Ok(target) = &self.target else {
            unreachable!("checked just above")
        };
        let source = (&self.source.client, self.source.name());
        let target = (&target.client, target.name());
        self.schema.check(source, target, &self.key, step).await
    }

    /// Under the freeze: DDL found (`result` is [`Error::SchemaChanged`]), or an error DDL
    /// explains (a column gone from a copy's statement, rows that differ in a retyped column),
    /// undoes the freeze with the copy kept and stops the move resumable, naming the change,
    /// where any other error aborts it. A freeze past its budget is left to that path: a check
    /// it cut off may still hold the sessions.
    pub(super) async fn unless_ddl(&mut self, result: Result<(), Error>) -> Result<(), Error> {
        let ddl = match result {
            Ok(()) => return Ok(()),
            Err(e @ Error::FreezeExceeded { .. }) => return Err(e),
            Err(ddl @ Error::SchemaChanged { .. }) => ddl,
            Err(e) => match self.check_schema(Step::Verify).await {
                Err(ddl @ Error::SchemaChanged { .. }) => ddl,
                _ => return Err(e),
            },
        };
        self.thaw().await?;
        Err(ddl)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn column(name: &str, type_name: &str) -> Column {
        Column {
            name: name.into(),
            quoted: name.into(),
            type_name: type_name.into(),
            not_null: false,
        }
    }

    fn orders(columns: Vec<Column>) -> Definition {
        Definition {
            name: "public.orders".into(),
            quoted: "public.orders".into(),
            key_column: "tenant_id".into(),
            columns,
            primary_key: vec!["tenant_id".into(), "order_id".into()],
        }
    }

    #[test]
    fn each_change_is_told_with_the_ddl_that_makes_another_shard_agree() {
        let before = vec![orders(vec![
            column("tenant_id", "text"),
            column("item", "text"),
        ])];
        let now = vec![orders(vec![
            column("tenant_id", "text"),
            column("item", "character varying(40)"),
            column("note", "text"),
        ])];
        let found = changes(&before, &now);
        let told: Vec<(String, String)> = found
            .iter()
            .map(|(t, c)| (c.describe("tenant"), c.ddl(t, "tenant")))
            .collect();
        assert_eq!(
            told,
            [
                (
                    "column item changed from text to character varying(40)".to_owned(),
                    "ALTER TABLE public.orders ALTER COLUMN item TYPE character varying(40)"
                        .to_owned()
                ),
                (
                    "column note text added".to_owned(),
                    "ALTER TABLE public.orders ADD COLUMN note text".to_owned()
                ),
            ]
        );
        // A shard that has it too shows the change; one without does not.
        let added = &found[1].1;
        assert!(added.shown_by(now.first()));
        assert!(!added.shown_by(before.first()));
        assert!(changes(&now, &before)
            .iter()
            .any(|(_, c)| c.describe("tenant") == "column note text dropped"));
        assert_eq!(changes(&before, &[]), [(&before[0], Change::Unprotected)]);
        assert!(changes(&now, &now).is_empty());
    }

    #[test]
    fn a_target_may_have_more_but_must_take_every_column_of_the_source() {
        let source = vec![orders(vec![
            column("tenant_id", "text"),
            column("item", "text"),
        ])];
        let target = vec![orders(vec![
            column("tenant_id", "text"),
            column("extra", "int"),
        ])];
        let unlike: Vec<(String, String)> = changes(&source, &target)
            .iter()
            .filter_map(|(_, c)| c.unlike_source(&source[0], ("s1", "s2"), "tenant"))
            .collect();
        assert_eq!(
            unlike,
            [(
                "column item text is on shard s1 but not on s2".to_owned(),
                "ALTER TABLE public.orders ADD COLUMN item text".to_owned()
            )]
        );
    }
}
