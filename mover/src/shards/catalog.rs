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
    pub not_null: bool,
}

/// A foreign key of an entity table (declared on it, not the copies PostgreSQL makes on
/// partitions).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ForeignKey {
    pub name: String,
    /// The referenced table, `schema.table` and quoted.
    pub table: String,
    pub quoted: String,
    /// Referencing columns and the referenced columns they match, quoted, in order.
    pub columns: Vec<String>,
    pub referenced: Vec<String>,
}

/// A table (or partition) whose replica identity does not cover the key column.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct IdentityGap {
    /// `schema.table` of the table or partition.
    pub name: String,
    /// A unique index on it that includes the key and could be its replica identity.
    pub usable_index: Option<String>,
}

/// Between which shards binary COPY reads back what it wrote, judged on every type of a table's
/// columns and the types inside them (elements, domains' bases, fields, range subtypes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BinaryCopy {
    /// A type has no binary send or receive function, or an array or composite holds a type made
    /// on the shard: its binary form carries the type's OID, which differs between shards.
    Never,
    /// Between shards of one major: a type's binary form is its send and receive functions',
    /// and types initdb makes (`information_schema`'s) have one OID per major.
    SameMajor,
    /// Between shards of any majors: every type is sent and received by PostgreSQL's own
    /// functions, and every type an array or composite holds has an OID fixed in its catalog.
    /// These are the forms of the wire protocol that drivers read from servers of every major;
    /// and the check compares the rows' text after the copy all the same.
    AnyMajor,
}

#[derive(Debug, Clone, Deserialize)]
pub struct EntityTable {
    /// `schema.table`, for messages and the move record.
    pub name: String,
    /// `"schema"."table"`, for statements.
    pub quoted: String,
    pub key_column: String,
    pub key_quoted: String,
    /// The key column's type with its modifier (`character(8)`), as `format_type` prints it: what
    /// the entity's id is read as in every predicate.
    pub key_type: String,
    /// Whether the key's type is built in: PostgreSQL's row filters refuse user-defined types
    /// (a domain, an enum), so only then can the logical method filter on it.
    pub key_builtin: bool,
    /// Whether an index (without a predicate) leads with the key column: without one, every
    /// read of the entity's rows (the checks, the batched deletes) reads the whole table.
    pub key_indexed: bool,
    /// Stored columns (not generated), in table order.
    pub columns: Vec<Column>,
    /// Primary key columns, quoted: how verification names a differing row.
    pub primary_key: Vec<String>,
    /// The table, or each partition, whose replica identity does not cover the key column: a
    /// row filter on it needs that for UPDATE and DELETE.
    pub identity_gaps: Vec<IdentityGap>,
    /// Every sequence the table's columns draw from, quoted: serial and identity columns' own,
    /// and any other a column default calls `nextval` on.
    pub sequences: Vec<String>,
    /// Between which shards binary COPY carries every column.
    pub binary_copy: BinaryCopy,
    pub foreign_keys: Vec<ForeignKey>,
}

/// The stored columns (not generated) of the table `c`, in table order: a JSON array of
/// [`Column`]s. Shared by [`DESCRIBE`] and the schema check (`run/schema.rs`), which compares them.
macro_rules! columns_json {
    () => {
        r#"(SELECT coalesce(json_agg(json_build_object(
                     'name', a.attname, 'quoted', quote_ident(a.attname),
                     'type_name', format_type(a.atttypid, a.atttypmod),
                     'not_null', a.attnotnull) ORDER BY a.attnum), '[]')
            FROM pg_attribute a
           WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
             AND a.attgenerated = '')"#
    };
}
pub(crate) use columns_json;

/// The primary key columns of the table `c`, quoted, in key order: a JSON array.
macro_rules! primary_key_json {
    () => {
        r#"(SELECT coalesce(json_agg(quote_ident(a.attname) ORDER BY x.ord), '[]')
            FROM pg_index i
            CROSS JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY AS x(attnum, ord)
            JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = x.attnum
           WHERE i.indrelid = c.oid AND i.indisprimary)"#
    };
}
pub(crate) use primary_key_json;

const DESCRIBE: &str = concat!(
    r#"
SELECT coalesce(json_agg(t ORDER BY t.name), '[]')::text FROM (
  SELECT format('%s.%s', n.nspname, c.relname) AS name,
         format('%I.%I', n.nspname, c.relname) AS quoted,
         p.key_column,
         quote_ident(p.key_column) AS key_quoted,
         format_type(k.atttypid, k.atttypmod) AS key_type,
         k.atttypid < 16384 AS key_builtin,
         EXISTS (SELECT 1 FROM pg_index i
                  WHERE i.indrelid = c.oid AND i.indkey[0] = k.attnum AND i.indpred IS NULL)
           AS key_indexed,
         "#,
    columns_json!(),
    r#" AS columns,
         "#,
    primary_key_json!(),
    r#" AS primary_key,
         (SELECT coalesce(json_agg(json_build_object(
                     'name', format('%s.%s', ln.nspname, l.relname),
                     'usable_index',
                     (SELECT i.indexrelid::regclass::text FROM pg_index i
                       WHERE i.indrelid = l.oid AND i.indisunique AND i.indimmediate
                         AND i.indpred IS NULL AND i.indexprs IS NULL
                         AND lk.attnum = ANY (i.indkey)
                         AND NOT EXISTS (SELECT 1 FROM pg_attribute ia
                                          WHERE ia.attrelid = l.oid AND ia.attnum = ANY (i.indkey)
                                            AND NOT ia.attnotnull)
                       ORDER BY i.indisprimary DESC, i.indexrelid LIMIT 1))
                   ORDER BY l.relname), '[]')
            FROM (SELECT c.oid AS relid UNION SELECT relid FROM pg_partition_tree(c.oid)) tree
            JOIN pg_class l ON l.oid = tree.relid AND l.relkind = 'r'
            JOIN pg_namespace ln ON ln.oid = l.relnamespace
            JOIN pg_attribute lk ON lk.attrelid = l.oid AND lk.attname = p.key_column
           WHERE CASE l.relreplident
                   WHEN 'f' THEN false
                   WHEN 'n' THEN true
                   ELSE NOT EXISTS (SELECT 1 FROM pg_index i
                                     WHERE i.indrelid = l.oid AND lk.attnum = ANY (i.indkey)
                                       AND CASE l.relreplident WHEN 'd' THEN i.indisprimary
                                                               ELSE i.indisreplident END)
                 END) AS identity_gaps,
         (SELECT coalesce(json_agg(DISTINCT seq ORDER BY seq), '[]') FROM (
            SELECT format('%I.%I', sn.nspname, s.relname) AS seq
              FROM pg_attrdef ad
              JOIN pg_depend d ON d.classid = 'pg_attrdef'::regclass AND d.objid = ad.oid
                              AND d.refclassid = 'pg_class'::regclass
              JOIN pg_class s ON s.oid = d.refobjid AND s.relkind = 'S'
              JOIN pg_namespace sn ON sn.oid = s.relnamespace
             WHERE ad.adrelid = c.oid
            UNION
            SELECT format('%I.%I', sn.nspname, s.relname)
              FROM pg_depend d
              JOIN pg_class s ON s.oid = d.objid AND s.relkind = 'S'
              JOIN pg_namespace sn ON sn.oid = s.relnamespace
             WHERE d.classid = 'pg_class'::regclass AND d.refclassid = 'pg_class'::regclass
               AND d.refobjid = c.oid AND d.deptype IN ('a', 'i')) q) AS sequences,
         (WITH RECURSIVE inner_types(oid, embedded) AS (
              SELECT a.atttypid, false FROM pg_attribute a
               WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
                 AND a.attgenerated = ''
              UNION
              SELECT x.oid, it.embedded OR x.embedded FROM inner_types it
                JOIN pg_type ty ON ty.oid = it.oid
                CROSS JOIN LATERAL (
                  SELECT ty.typelem, true WHERE ty.typsubscript = 'array_subscript_handler'::regproc
                  UNION ALL SELECT nullif(ty.typbasetype, 0), false
                  UNION ALL SELECT r.rngsubtype, false FROM pg_range r WHERE r.rngtypid = ty.oid
                  UNION ALL SELECT r.rngtypid, false FROM pg_range r WHERE r.rngmultitypid = ty.oid
                  UNION ALL SELECT fa.atttypid, true FROM pg_attribute fa
                             WHERE fa.attrelid = ty.typrelid AND fa.attnum > 0
                               AND NOT fa.attisdropped) x(oid, embedded)
               WHERE x.oid IS NOT NULL)
          -- Binary arrays and composites carry their elements' and fields' type OIDs, which
          -- differ between shards for types made there (enums, domains, composites), and between
          -- majors for types initdb makes (OIDs 10000 and up).
          SELECT CASE
                   WHEN NOT coalesce(bool_and(ty.typsend <> 0 AND ty.typreceive <> 0
                                              AND NOT (it.embedded AND it.oid >= 16384)), true)
                     THEN 'never'
                   WHEN coalesce(bool_and(ty.typsend::oid < 10000 AND ty.typreceive::oid < 10000
                                          AND NOT (it.embedded AND it.oid >= 10000)), true)
                     THEN 'any_major'
                   ELSE 'same_major'
                 END
            FROM inner_types it JOIN pg_type ty ON ty.oid = it.oid) AS binary_copy,
         (SELECT coalesce(json_agg(json_build_object(
                     'name', f.conname,
                     'table', format('%s.%s', fn.nspname, fc.relname),
                     'quoted', format('%I.%I', fn.nspname, fc.relname),
                     'columns', (SELECT json_agg(quote_ident(a.attname) ORDER BY x.ord)
                                   FROM unnest(f.conkey) WITH ORDINALITY x(attnum, ord)
                                   JOIN pg_attribute a ON a.attrelid = f.conrelid
                                                      AND a.attnum = x.attnum),
                     'referenced', (SELECT json_agg(quote_ident(a.attname) ORDER BY x.ord)
                                      FROM unnest(f.confkey) WITH ORDINALITY x(attnum, ord)
                                      JOIN pg_attribute a ON a.attrelid = f.confrelid
                                                         AND a.attnum = x.attnum))
                   ORDER BY f.conname), '[]')
            FROM pg_constraint f
            JOIN pg_class fc ON fc.oid = f.confrelid
            JOIN pg_namespace fn ON fn.oid = fc.relnamespace
           WHERE f.conrelid = c.oid AND f.contype = 'f' AND f.conparentid = 0) AS foreign_keys
    FROM shard_directory.protected_tables() p
    JOIN pg_class c ON c.oid = p.tbl
    JOIN pg_namespace n ON n.oid = c.relnamespace
    JOIN pg_attribute k ON k.attrelid = c.oid AND k.attname = p.key_column
   WHERE p.entity_type = $1
) t
"#
);

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
            t.foreign_keys
                .iter()
                .all(|f| f.table == t.name || !pending.iter().any(|p| p.name == f.table))
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

    /// `key = ($1::text)::type`: the entity's rows, with the id as parameter `$1`, read as the key
    /// column's type with its modifier (a bare `character` would be `char(1)`). Preflight has
    /// checked that the id is canonical for the key, so this selects exactly the rows whose key
    /// the shard's check reads as the id.
    pub fn entity_predicate(&self) -> String {
        format!("{} = ($1::text)::{}", self.key_quoted, self.key_type)
    }

    /// Whether a foreign key of this table references the table itself: its rows are deleted in one
    /// statement, since a batch could remove a row another batch's rows still reference.
    pub fn references_itself(&self) -> bool {
        self.foreign_keys.iter().any(|f| f.table == self.name)
    }

    /// How a row is named in messages: its primary key, or the whole row without one, read from
    /// the table as `alias`.
    pub fn row_key_at(&self, alias: &str) -> String {
        let columns: Vec<String> = if self.primary_key.is_empty() {
            self.columns.iter().map(|c| c.quoted.clone()).collect()
        } else {
            self.primary_key.clone()
        };
        let columns: Vec<String> = columns.iter().map(|c| format!("{alias}.{c}")).collect();
        format!("ROW({})::text", columns.join(", "))
    }

    /// `JOIN unnest($first::text[], ...) AS sd_keys(...) ON alias.pk = ...`: the rows of `alias`
    /// whose primary key is among keys passed as one text array per key column (from parameter
    /// `$first` on), each read as its column's type with its modifier.
    pub fn keys_join(&self, alias: &str, first: usize) -> String {
        let (mut arrays, mut names, mut on) = (Vec::new(), Vec::new(), Vec::new());
        for (i, pk) in self.primary_key.iter().enumerate() {
            let column = self
                .columns
                .iter()
                .find(|c| &c.quoted == pk)
                .expect("primary key columns are stored columns");
            arrays.push(format!("${}::text[]", first + i));
            names.push(format!("sd_k{i}"));
            on.push(format!(
                "{alias}.{pk} = sd_keys.sd_k{i}::{}",
                column.type_name
            ));
        }
        format!(
            "JOIN unnest({}) AS sd_keys({}) ON {}",
            arrays.join(", "),
            names.join(", "),
            on.join(" AND ")
        )
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
            key_builtin: true,
            key_indexed: true,
            columns: vec![],
            primary_key: vec![],
            identity_gaps: vec![],
            sequences: vec![],
            binary_copy: BinaryCopy::AnyMajor,
            foreign_keys: references
                .iter()
                .map(|r| ForeignKey {
                    name: format!("{name}_{r}_fkey"),
                    table: r.to_string(),
                    quoted: r.to_string(),
                    columns: vec!["tenant_id".into()],
                    referenced: vec!["tenant_id".into()],
                })
                .collect(),
        }
    }

    #[test]
    fn parents_come_before_the_tables_that_reference_them() {
        let ordered = parents_first(vec![
            table("public.lines", &["public.orders", "public.lines"]),
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
