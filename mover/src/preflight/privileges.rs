//! What the mover's role must hold, checked before a move changes anything: on the directory,
//! what a writer of the directory holds and the move record; on each shard, the fence functions,
//! the entity's tables and sequences; for the logical method, what publications and
//! subscriptions need. Each missing privilege is named with the GRANT (or role attribute) that
//! gives it, the same statements docs/operations.md lists.

use tokio_postgres::Client;

use crate::directory::record::Method;
use crate::shards::catalog::EntityTable;

/// Functions of the extension the mover calls on a shard.
const SHARD_FUNCTIONS: &[&str] = &[
    "shard_directory.fence_owned(text, text, bigint)",
    "shard_directory.fence_frozen(text, text)",
    "shard_directory.fence_frozen(text, text, interval, bigint)",
    "shard_directory.fence_cutover(text, text, interval, bigint)",
    "shard_directory.fence_moved(text, text, text, bigint)",
    "shard_directory.unfence(text, text)",
    "shard_directory.bypass_fence(text, text)",
    "shard_directory.advance_sequence(regclass, bigint)",
];

/// `(object, privileges)` pairs the role lacks, as GRANTs on `kind` (TABLE, SEQUENCE). An object
/// that does not exist is left to the checks that say so.
async fn missing_grants(
    client: &Client,
    kind: &str,
    wanted: &[(String, &str)],
) -> Result<Vec<String>, tokio_postgres::Error> {
    let (objects, privileges): (Vec<&str>, Vec<&str>) =
        wanted.iter().map(|(o, p)| (o.as_str(), *p)).unzip();
    let check = match kind {
        "SEQUENCE" => "has_sequence_privilege",
        _ => "has_table_privilege",
    };
    let rows = client
        .query(
            &format!(
                "SELECT format('GRANT %s ON {kind} %s TO %I', p, o, current_user) \
                 FROM unnest($1::text[], $2::text[]) AS w(o, p) \
                 WHERE to_regclass(o) IS NOT NULL AND NOT {check}(o, replace(p, ' ', ''))"
            ),
            &[&objects, &privileges],
        )
        .await?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// SELECT on every table the entity's tables reference: the check that every row the moved rows
/// reference is on the target reads them.
fn referenced(tables: &[EntityTable]) -> impl Iterator<Item = (String, &'static str)> + '_ {
    tables
        .iter()
        .flat_map(|t| t.foreign_keys.iter().map(|f| (f.quoted.clone(), "SELECT")))
}

/// What the role lacks on a target to check that every row the moved rows reference is there.
pub(crate) async fn missing_for_references(
    client: &Client,
    tables: &[EntityTable],
) -> Result<Vec<String>, tokio_postgres::Error> {
    missing_grants(client, "TABLE", &referenced(tables).collect::<Vec<_>>()).await
}

/// What the role lacks on the directory: a writer's privileges on the entries, and the move and
/// batch records.
pub(crate) async fn missing_on_directory(
    directory: &Client,
) -> Result<Vec<String>, tokio_postgres::Error> {
    let mut missing = schema_usage(directory).await?;
    if !missing.is_empty() {
        return Ok(missing);
    }
    let wanted = [
        (
            "shard_directory.shard_directory".to_owned(),
            "SELECT, UPDATE",
        ),
        ("shard_directory.shards".to_owned(), "SELECT"),
        (
            "shard_directory.shard_directory_history".to_owned(),
            "SELECT",
        ),
        (
            "shard_directory.shard_moves".to_owned(),
            "SELECT, INSERT, UPDATE",
        ),
        (
            "shard_directory.shard_move_batches".to_owned(),
            "SELECT, INSERT, UPDATE",
        ),
        (
            "shard_directory.shard_sizes".to_owned(),
            "SELECT, INSERT, UPDATE",
        ),
    ];
    missing.extend(missing_grants(directory, "TABLE", &wanted).await?);
    Ok(missing)
}

pub(crate) async fn schema_usage(client: &Client) -> Result<Vec<String>, tokio_postgres::Error> {
    Ok(client
        .query(
            "SELECT format('GRANT USAGE ON SCHEMA shard_directory TO %I', current_user) \
             WHERE NOT has_schema_privilege('shard_directory', 'USAGE')",
            &[],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect())
}

/// Which end of a move a shard is.
#[derive(Clone, Copy)]
pub(crate) enum End<'a> {
    Source,
    /// The target, whose subscription (method logical) connects to `publisher` (`publisher_name`'s
    /// replication conninfo).
    Target {
        publisher: &'a str,
        publisher_name: &'a str,
    },
}

/// What the role lacks on a shard, as the `end` of a move by `method`.
pub(crate) async fn missing_on_shard(
    client: &Client,
    tables: &[EntityTable],
    method: Method,
    end: End<'_>,
) -> Result<Vec<String>, tokio_postgres::Error> {
    let source = matches!(end, End::Source);
    let mut missing = schema_usage(client).await?;
    if !missing.is_empty() {
        return Ok(missing);
    }
    let functions: Vec<&str> = SHARD_FUNCTIONS.to_vec();
    missing.extend(
        client
            .query(
                "SELECT format('GRANT EXECUTE ON FUNCTION %s TO %I', f, current_user) \
                 FROM unnest($1::text[]) AS f WHERE NOT has_function_privilege(f, 'EXECUTE')",
                &[&functions],
            )
            .await?
            .iter()
            .map(|r| r.get::<_, String>(0)),
    );
    let mut wanted = vec![("shard_directory.shard_fences".to_owned(), "SELECT")];
    wanted.extend(
        tables
            .iter()
            .map(|t| (t.quoted.clone(), "SELECT, INSERT, DELETE")),
    );
    if !source && method == Method::Logical {
        wanted.extend(referenced(tables));
    }
    missing.extend(missing_grants(client, "TABLE", &wanted).await?);
    let sequences: Vec<(String, &str)> = crate::run::cutover::sequences::of(tables)
        .into_iter()
        .map(|s| (s.to_owned(), "SELECT, UPDATE"))
        .collect();
    missing.extend(missing_grants(client, "SEQUENCE", &sequences).await?);
    if method == Method::Logical {
        let quoted: Vec<&str> = tables.iter().map(|t| t.quoted.as_str()).collect();
        // pg_create_subscription exists from PostgreSQL 16.
        let row = client
            .query_one(
                "SELECT r.rolsuper, r.rolreplication, \
                        has_database_privilege(current_database(), 'CREATE'), \
                        (SELECT array_agg(t ORDER BY t) FROM unnest($1::text[]) t \
                          WHERE NOT pg_has_role((SELECT relowner FROM pg_class \
                                                  WHERE oid = to_regclass(t)), 'USAGE')), \
                        current_setting('server_version_num')::int, \
                        coalesce(pg_has_role(to_regrole('pg_create_subscription')::oid, 'USAGE'), \
                                 false) \
                 FROM pg_roles r WHERE r.rolname = current_user",
                &[&quoted],
            )
            .await?;
        let (superuser, replication, create): (bool, bool, bool) =
            (row.get(0), row.get(1), row.get(2));
        let not_owned: Option<Vec<String>> = row.get(3);
        let (version, create_subscription): (i32, bool) = (row.get(4), row.get(5));
        let role: String = client
            .query_one("SELECT quote_ident(current_user)", &[])
            .await?
            .get(0);
        if !superuser {
            if source {
                if !replication {
                    missing.push(format!("ALTER ROLE {role} REPLICATION"));
                }
                if !create {
                    missing.push(format!(
                        "GRANT CREATE ON DATABASE <this database> TO {role} (CREATE PUBLICATION)"
                    ));
                }
                for t in not_owned.unwrap_or_default() {
                    missing.push(format!(
                        "ALTER TABLE {t} OWNER TO {role} (a publication's tables are its \
                         owner's)"
                    ));
                }
            } else if version < 160000 {
                missing.push(format!(
                    "ALTER ROLE {role} SUPERUSER (PostgreSQL 15 lets only superusers CREATE \
                     SUBSCRIPTION), or use --method copy"
                ));
            } else {
                if !create_subscription {
                    missing.push(format!("GRANT pg_create_subscription TO {role}"));
                }
                if !create {
                    missing.push(format!(
                        "GRANT CREATE ON DATABASE <this database> TO {role}"
                    ));
                }
                // A subscription applies changes as each table's owner (run_as_owner = false).
                for t in not_owned.unwrap_or_default() {
                    missing.push(format!(
                        "ALTER TABLE {t} OWNER TO {role} (a subscription of a role that is not \
                         a superuser applies changes as the tables' owner)"
                    ));
                }
                if let End::Target {
                    publisher,
                    publisher_name,
                } = end
                {
                    if !gives_password(publisher) {
                        missing.push(format!(
                            "a password in shard {publisher_name}'s replication_conninfo, and \
                             password authentication for it there (PostgreSQL 16 and later let \
                             a subscription of a role that is not a superuser connect only with \
                             a password the publisher asked for)"
                        ));
                    }
                }
            }
        }
    }
    Ok(missing)
}

/// Whether a conninfo (`key=value` or a URL) carries a password; one it cannot read is left for
/// CREATE SUBSCRIPTION to judge.
fn gives_password(conninfo: &str) -> bool {
    conninfo
        .parse::<tokio_postgres::Config>()
        .map_or(true, |c| c.get_password().is_some())
}
