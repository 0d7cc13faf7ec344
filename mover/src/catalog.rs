//! The tables an entity's rows live in, as each shard describes them: those protected with
//! `protect(table, key_column, entity_type)`. Identifiers arrive quoted by the server
//! (`quote_ident`, `format('%I.%I')`, `regtype`), so statements built from them are safe; entity
//! ids always travel as parameters, or as literals the server quoted (`quote_literal`).

use serde::Deserialize;
use tokio_postgres::Client;

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Column {
    pub name: String,
    pub quoted: String,
    pub type_name: String,
}

#[derive(Debug, Clone, Deserialize)]
pub struct EntityTable {
    /// `schema.table`, for messages and the move record.
    pub name: String,
    /// `"schema"."table"`, for statements.
    pub quoted: String,
    pub key_column: String,
    pub key_quoted: String,
    /// The key column's type, as `regtype` prints it.
    pub key_type: String,
    /// Stored columns (not generated), in table order.
    pub columns: Vec<Column>,
    /// Primary key columns, quoted: how verification names a differing row.
    pub primary_key: Vec<String>,
    /// Whether the replica identity covers the key column: a row filter on it needs that for
    /// UPDATE and DELETE.
    pub identity_covers_key: bool,
    /// Columns backed by a sequence (serial or identity).
    pub sequence_columns: Vec<String>,
    /// Tables this one references with a foreign key (`schema.table`).
    pub references: Vec<String>,
}

const DESCRIBE: &str = r#"
SELECT coalesce(json_agg(t ORDER BY t.name), '[]')::text FROM (
  SELECT format('%s.%s', n.nspname, c.relname) AS name,
         format('%I.%I', n.nspname, c.relname) AS quoted,
         p.key_column,
         quote_ident(p.key_column) AS key_quoted,
         k.atttypid::regtype::text AS key_type,
         (SELECT coalesce(json_agg(json_build_object(
                     'name', a.attname, 'quoted', quote_ident(a.attname),
                     'type_name', format_type(a.atttypid, a.atttypmod)) ORDER BY a.attnum), '[]')
            FROM pg_attribute a
           WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
             AND a.attgenerated = '') AS columns,
         (SELECT coalesce(json_agg(quote_ident(a.attname) ORDER BY x.ord), '[]')
            FROM pg_index i
            CROSS JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY AS x(attnum, ord)
            JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = x.attnum
           WHERE i.indrelid = c.oid AND i.indisprimary) AS primary_key,
         CASE c.relreplident
           WHEN 'f' THEN true
           WHEN 'n' THEN false
           ELSE EXISTS (SELECT 1 FROM pg_index i
                         WHERE i.indrelid = c.oid AND k.attnum = ANY (i.indkey)
                           AND CASE c.relreplident WHEN 'd' THEN i.indisprimary
                                                   ELSE i.indisreplident END)
         END AS identity_covers_key,
         (SELECT coalesce(json_agg(a.attname ORDER BY a.attnum), '[]')
            FROM pg_attribute a
           WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
             AND pg_get_serial_sequence(format('%I.%I', n.nspname, c.relname), a.attname)
                 IS NOT NULL) AS sequence_columns,
         (SELECT coalesce(json_agg(DISTINCT format('%s.%s', fn.nspname, fc.relname)), '[]')
            FROM pg_constraint f
            JOIN pg_class fc ON fc.oid = f.confrelid
            JOIN pg_namespace fn ON fn.oid = fc.relnamespace
           WHERE f.conrelid = c.oid AND f.contype = 'f' AND f.confrelid <> c.oid) AS references
    FROM shard_directory.protected_tables() p
    JOIN pg_class c ON c.oid = p.tbl
    JOIN pg_namespace n ON n.oid = c.relnamespace
    JOIN pg_attribute k ON k.attrelid = c.oid AND k.attname = p.key_column
   WHERE p.entity_type = $1
) t
"#;

/// The tables protected for `entity_type` on this shard, parents before the tables that
/// reference them (the order to insert in; deletes go the other way).
pub(crate) async fn describe(
    client: &Client,
    entity_type: &str,
) -> Result<Vec<EntityTable>, tokio_postgres::Error> {
    let json: String = client.query_one(DESCRIBE, &[&entity_type]).await?.get(0);
    let tables: Vec<EntityTable> =
        serde_json::from_str(&json).expect("the describe query returns this shape");
    Ok(parents_first(tables))
}

/// Topological order over the foreign keys among the entity's tables; a cycle keeps the rest in
/// name order (the insert then fails on the foreign key, and says which).
fn parents_first(mut pending: Vec<EntityTable>) -> Vec<EntityTable> {
    let mut ordered: Vec<EntityTable> = Vec::with_capacity(pending.len());
    while !pending.is_empty() {
        let ready = pending.iter().position(|t| {
            t.references
                .iter()
                .all(|r| !pending.iter().any(|p| &p.name == r))
        });
        ordered.push(pending.remove(ready.unwrap_or(0)));
    }
    ordered
}

impl EntityTable {
    /// `"a", "b", ...`: the stored columns.
    pub fn column_list(&self) -> String {
        self.columns
            .iter()
            .map(|c| c.quoted.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// `key = ($1::text)::type`: the entity's rows, with the id as parameter `$1`. The id is the
    /// key's text form (what the protect trigger reads), so any key type works.
    pub fn entity_predicate(&self) -> String {
        format!("{} = ($1::text)::{}", self.key_quoted, self.key_type)
    }

    /// How verification names a row: its primary key, or the whole row without one.
    pub fn row_key(&self) -> String {
        if self.primary_key.is_empty() {
            format!("ROW({})::text", self.column_list())
        } else {
            format!("ROW({})::text", self.primary_key.join(", "))
        }
    }
}

/// Whether `table` exists on this shard at all (protected or not).
pub(crate) async fn exists(client: &Client, quoted: &str) -> Result<bool, tokio_postgres::Error> {
    Ok(client
        .query_one("SELECT to_regclass($1) IS NOT NULL", &[&quoted])
        .await?
        .get(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(name: &str, references: &[&str]) -> EntityTable {
        EntityTable {
            name: name.into(),
            quoted: name.into(),
            key_column: "tenant_id".into(),
            key_quoted: "tenant_id".into(),
            key_type: "text".into(),
            columns: vec![],
            primary_key: vec![],
            identity_covers_key: true,
            sequence_columns: vec![],
            references: references.iter().map(|r| r.to_string()).collect(),
        }
    }

    #[test]
    fn parents_come_before_the_tables_that_reference_them() {
        let ordered = parents_first(vec![
            table("public.lines", &["public.orders"]),
            table("public.notes", &[]),
            table("public.orders", &["public.customers"]),
            table("public.customers", &[]),
        ]);
        let names: Vec<_> = ordered.iter().map(|t| t.name.as_str()).collect();
        let at = |n| names.iter().position(|x| *x == n).unwrap();
        assert!(at("public.customers") < at("public.orders"));
        assert!(at("public.orders") < at("public.lines"));
        assert_eq!(names.len(), 4);
    }
}
