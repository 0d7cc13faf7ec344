//! The mover on schemas it was not written with: every common key type, tables nobody
//! protected, foreign keys into, out of and across entities, a table that references itself,
//! columns of every kind of type on shards configured differently, types without a binary form,
//! sequences no column owns, partitions whose replica identity leaves the key out. Each move ends
//! with every row of the entity once, on the shard the directory names, or is refused before it
//! changes anything.

use std::sync::Arc;

use shard_directory_client::EntityKey;
use shard_directory_e2e::observe::{self, act_at};
use shard_directory_e2e::topology::NON_TEXT_KEYS;
use shard_directory_e2e::{column, Topology};
use shard_directory_mover::{Error, Failure, Left, Method, MethodChoice, MoveOptions, Phase, Step};
use tokio_postgres::error::SqlState;

fn options(method: MethodChoice) -> MoveOptions {
    MoveOptions {
        method,
        ..Default::default()
    }
}

/// The logical method with its initial copy made by the mover, paced.
fn paced() -> MoveOptions {
    MoveOptions {
        max_rate: Some(10_000),
        ..options(MethodChoice::Logical)
    }
}

/// `(shard_name, state)` of the entity's entry.
async fn entry(t: &Topology, key: &EntityKey) -> (String, String) {
    t.entry(&key.entity_type, &key.entity_id).await
}

/// A move that preflight refuses: the message names each of `says`, and nothing changed.
async fn refused(t: &Topology, options: MoveOptions, key: &EntityKey, to: &str, says: &[&str]) {
    let before = entry(t, key).await;
    let failure = t
        .mover(options)
        .start(key, to)
        .await
        .expect_err("preflight refuses");
    assert!(
        matches!(
            failure.error,
            Error::Preflight { .. } | Error::CrossEntity { .. }
        ) && failure.left == Left::Untouched,
        "{failure}"
    );
    let message = failure.to_string();
    for part in says {
        assert!(message.contains(part), "{part:?} not in: {message}");
    }
    assert_eq!(entry(t, key).await, before, "the entry is as it was");
    let open: i64 = t
        .step("SELECT count(*) FROM shard_directory.shard_moves WHERE finished_at IS NULL")
        .await;
    assert_eq!(open, 0, "no move left open");
}

/// A key type, two entities of it (the one that moves, and one whose key is close to it), and
/// other spellings of the moving one's id.
struct KeyCase {
    ty: &'static str,
    id: &'static str,
    neighbour: &'static str,
    /// Other texts of the same key value, which the shard must read as the moved entity.
    spellings: &'static [&'static str],
}

const KEY_CASES: &[KeyCase] = &[
    KeyCase {
        ty: "text",
        id: "acme",
        neighbour: "ACME",
        spellings: &[],
    },
    KeyCase {
        ty: "varchar(12)",
        id: "acme",
        neighbour: "acme-2",
        spellings: &[],
    },
    KeyCase {
        ty: "char(8)",
        id: "acme",
        neighbour: "acme2",
        spellings: &["acme   "],
    },
    KeyCase {
        ty: "integer",
        id: "8842",
        neighbour: "88420",
        spellings: &["08842", "+8842"],
    },
    KeyCase {
        ty: "bigint",
        id: "8842",
        neighbour: "8843",
        spellings: &["0008842"],
    },
    KeyCase {
        ty: "numeric(12,0)",
        id: "8842",
        neighbour: "8843",
        spellings: &["8842.0"],
    },
    KeyCase {
        ty: "uuid",
        id: "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
        neighbour: "b0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
        spellings: &[
            "A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11",
            "{a0eebc999c0b4ef8bb6d6bb9bd380a11}",
        ],
    },
    KeyCase {
        ty: "tenant_code",
        id: "acme",
        neighbour: "acme2",
        spellings: &[],
    },
    KeyCase {
        ty: "plan",
        id: "pro",
        neighbour: "free",
        spellings: &[],
    },
];

fn table_of(i: usize) -> String {
    format!("keyed_{i}")
}

fn entity_type_of(i: usize) -> String {
    format!("kind_{i}")
}

#[tokio::test]
async fn every_common_key_type_moves_exactly_its_entity_and_its_fences_catch_every_spelling() {
    let t = Topology::with_shards("keys", 2).await;
    let mut ddl = String::from(
        "CREATE DOMAIN tenant_code AS text CHECK (VALUE ~ '^[a-z0-9-]+$');
         CREATE TYPE plan AS ENUM ('free', 'pro');",
    );
    for (i, case) in KEY_CASES.iter().enumerate() {
        ddl.push_str(&format!(
            "CREATE TABLE {table} (k {ty} NOT NULL, n int NOT NULL, body text, PRIMARY KEY (k, n));
             SELECT shard_directory.protect('{table}', 'k', '{kind}');",
            table = table_of(i),
            ty = case.ty,
            kind = entity_type_of(i)
        ));
    }
    t.on_every_shard(&ddl).await;
    for (i, case) in KEY_CASES.iter().enumerate() {
        let (table, kind) = (table_of(i), entity_type_of(i));
        let key = EntityKey::new(&kind, case.id);
        t.add_entity(&kind, case.id, "shard_1").await;
        t.add_entity(&kind, case.neighbour, "shard_1").await;
        t.write_as_client(
            "shard_1",
            &format!(
                "INSERT INTO {table} SELECT '{}', g, 'moving' FROM generate_series(1, 5) g;
                 INSERT INTO {table} SELECT '{}', g, 'staying' FROM generate_series(1, 3) g",
                case.id, case.neighbour
            ),
        )
        .await
        .unwrap();
        let rows = async |shard: &str, body: &str| {
            t.count(
                shard,
                &format!("SELECT count(*) FROM {table} WHERE body = '{body}'"),
            )
            .await
        };
        let builtin = !matches!(case.ty, "tenant_code" | "plan");
        if !builtin {
            refused(
                &t,
                options(MethodChoice::Logical),
                &key,
                "shard_2",
                &["is not built in", "--method copy"],
            )
            .await;
        }
        let legs = [
            (options(MethodChoice::Auto), "shard_1", "shard_2"),
            (options(MethodChoice::Copy), "shard_2", "shard_1"),
            (paced(), "shard_1", "shard_2"),
        ];
        // A type the logical method refuses is not moved paced.
        for (options, from, to) in &legs[..if builtin { 3 } else { 2 }] {
            let record = t
                .mover(options.clone())
                .start(&key, to)
                .await
                .unwrap_or_else(|e| panic!("{} {}: {e}", case.ty, case.id));
            let expected = if builtin && options.method != MethodChoice::Copy {
                Method::Logical
            } else {
                Method::Copy
            };
            assert_eq!(record.method, expected, "{}", case.ty);
            assert_eq!(
                (rows(to, "moving").await, rows(from, "moving").await),
                (5, 0),
                "{}: every row of the entity on {to}, none left on {from}",
                case.ty
            );
            assert_eq!(
                (
                    rows("shard_1", "staying").await,
                    rows("shard_2", "staying").await
                ),
                (3, 0),
                "{}: its neighbour {} did not move",
                case.ty,
                case.neighbour
            );
            // A stale client writing the moved entity where it was, in any spelling, is refused.
            for spelling in std::iter::once(&case.id).chain(case.spellings) {
                let e = t
                    .write_as_client(
                        from,
                        &format!("INSERT INTO {table} VALUES ('{spelling}', 100, 'stale')"),
                    )
                    .await
                    .expect_err("refused on the shard it left");
                assert_eq!(
                    e.code(),
                    Some(&SqlState::T_R_SERIALIZATION_FAILURE),
                    "{} {spelling:?}: {e:?}",
                    case.ty
                );
            }
        }
    }
}

#[tokio::test]
async fn an_entity_id_that_is_not_canonical_for_its_key_is_refused_before_anything_moves() {
    let t = Topology::with_shards("canonical", 2).await;
    t.on_every_shard(NON_TEXT_KEYS).await;
    t.add_entity("account", "08842", "shard_1").await;
    t.write_as_client("shard_1", "INSERT INTO accounts VALUES (8842, 'x')")
        .await
        .unwrap();
    refused(
        &t,
        MoveOptions::default(),
        &EntityKey::new("account", "08842"),
        "shard_2",
        &[
            "entity id \"08842\" of account/08842 is not canonical for key column \
             public.accounts.account_id (bigint)",
            "reads it as \"8842\"",
            "use the canonical id \"8842\"",
        ],
    )
    .await;
    let upper = "A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11";
    t.add_entity("device", upper, "shard_1").await;
    refused(
        &t,
        MoveOptions::default(),
        &EntityKey::new("device", upper),
        "shard_2",
        &["reads it as \"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11\""],
    )
    .await;
    t.add_entity("account", "eighty", "shard_1").await;
    refused(
        &t,
        MoveOptions::default(),
        &EntityKey::new("account", "eighty"),
        "shard_2",
        &[
            "cannot be moved by table public.accounts",
            "invalid input syntax for type bigint",
        ],
    )
    .await;
    assert_eq!(t.count("shard_2", "SELECT count(*) FROM accounts").await, 0);
}

/// `(rows in ONLY the parent, rows in the child, the child's with their own column)` of tenant
/// `a` on `shard`.
async fn inherited(t: &Topology, shard: &str) -> (i64, i64, i64) {
    (
        t.count(
            shard,
            "SELECT count(*) FROM ONLY measurements WHERE tenant_id = 'a'",
        )
        .await,
        t.count(
            shard,
            "SELECT count(*) FROM measurements_eu WHERE tenant_id = 'a'",
        )
        .await,
        t.count(
            shard,
            "SELECT count(*) FROM measurements_eu WHERE tenant_id = 'a' AND region = 'eu'",
        )
        .await,
    )
}

/// A tenant with rows in an inheritance child of a protected table (`INHERITS`, with a column of
/// its own) is not moved: preflight refuses, naming the child and its parent, by either method,
/// with the child protected too or named unrelated, and nothing is left behind. Moved table by
/// table, the child's rows were copied through its parent (`SELECT` without `ONLY`): they landed
/// in the target's parent without their own column (named unrelated), or twice (protected), and
/// verification, counting through the parent, passed the first.
#[tokio::test]
async fn an_inheritance_child_of_a_protected_table_is_refused_before_anything_moves() {
    let t = Topology::with_shards("inheriting", 2).await;
    t.on_every_shard(
        "CREATE TABLE measurements (tenant_id text NOT NULL, id int NOT NULL, v int,
                                    PRIMARY KEY (tenant_id, id));
         CREATE TABLE measurements_eu (region text NOT NULL, PRIMARY KEY (tenant_id, id))
             INHERITS (measurements);
         SELECT shard_directory.protect('measurements', 'tenant_id', 'tenant');",
    )
    .await;
    t.add_tenant("a", "shard_1").await;
    t.write_as_client(
        "shard_1",
        "INSERT INTO measurements SELECT 'a', g, g FROM generate_series(1, 3) g;
         INSERT INTO measurements_eu SELECT 'a', g, g, 'eu' FROM generate_series(101, 102) g",
    )
    .await
    .unwrap();
    let key = EntityKey::new("tenant", "a");
    let says = [
        "public.measurements_eu",
        "inherits public.measurements",
        "partition",
    ];
    for protect_child in [false, true] {
        if protect_child {
            t.on_every_shard(
                "SELECT shard_directory.protect('measurements_eu', 'tenant_id', 'tenant')",
            )
            .await;
        }
        for method in [MethodChoice::Copy, MethodChoice::Logical] {
            let options = MoveOptions {
                unrelated_tables: vec!["public.measurements_eu".into()],
                ..options(method)
            };
            refused(&t, options, &key, "shard_2", &says).await;
            assert_eq!(
                (
                    inherited(&t, "shard_1").await,
                    inherited(&t, "shard_2").await
                ),
                ((3, 2, 2), (0, 0, 0)),
                "{method:?}: the rows where they were"
            );
            assert_eq!(t.fence("shard_1", "a").await, None);
            assert!(t.replication_objects().await.is_empty());
        }
    }
}

#[tokio::test]
async fn a_table_that_may_hold_the_entitys_rows_must_be_protected_and_then_moves_with_it() {
    let t = Topology::with_shards("coverage", 2).await;
    t.on_every_shard(
        "CREATE TABLE attachments (
             tenant_id text NOT NULL, order_id bigint NOT NULL, name text NOT NULL,
             PRIMARY KEY (tenant_id, order_id, name),
             FOREIGN KEY (tenant_id, order_id) REFERENCES orders ON DELETE CASCADE);
         CREATE TABLE audit_log (tenant_id text, what text);",
    )
    .await;
    t.add_tenant("a", "shard_1").await;
    t.seed_orders("shard_1", "a", 10, 1).await;
    t.write_as_client(
        "shard_1",
        "INSERT INTO attachments SELECT tenant_id, order_id, 'scan.pdf' FROM orders;
         INSERT INTO audit_log VALUES ('a', 'created')",
    )
    .await
    .unwrap();
    let key = EntityKey::new("tenant", "a");
    refused(
        &t,
        MoveOptions::default(),
        &key,
        "shard_2",
        &[
            "table public.attachments on shard shard_1 references public.orders (foreign key \
             attachments_tenant_id_order_id_fkey)",
            "is not protected itself",
            "SELECT shard_directory.protect('public.attachments', '<its key column>', 'tenant')",
        ],
    )
    .await;
    t.on_every_shard("SELECT shard_directory.protect('attachments', 'tenant_id', 'tenant')")
        .await;
    refused(
        &t,
        MoveOptions::default(),
        &key,
        "shard_2",
        &[
            "table public.audit_log on shard shard_1 has a column tenant_id",
            "--unrelated-table public.audit_log",
        ],
    )
    .await;
    let record = t
        .mover(MoveOptions {
            unrelated_tables: vec!["public.audit_log".into()],
            ..Default::default()
        })
        .start(&key, "shard_2")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(record.phase, Phase::Done);
    let attachments = "SELECT count(*) FROM attachments WHERE tenant_id = 'a'";
    assert_eq!(
        (
            t.count("shard_2", attachments).await,
            t.count("shard_1", attachments).await
        ),
        (10, 0),
        "the child rows moved, none lost to the cascade"
    );
    assert_eq!(t.rows("shard_2", "a").await, (10, 10));
    assert_eq!(
        t.count("shard_1", "SELECT count(*) FROM audit_log").await,
        1,
        "the unrelated table is left alone"
    );
}

#[tokio::test]
async fn a_foreign_key_that_joins_two_entities_is_refused_and_aborts_a_frozen_move() {
    let t = Topology::with_shards("crossing", 2).await;
    t.on_every_shard(
        "CREATE TABLE shared_notes (
             tenant_id text NOT NULL, id int NOT NULL, ref_tenant text, ref_order bigint,
             PRIMARY KEY (tenant_id, id),
             FOREIGN KEY (ref_tenant, ref_order) REFERENCES orders (tenant_id, order_id));
         SELECT shard_directory.protect('shared_notes', 'tenant_id', 'tenant');",
    )
    .await;
    for id in ["a", "b"] {
        t.add_tenant(id, "shard_1").await;
        t.seed_orders("shard_1", id, 3, 1).await;
    }
    let order_of_a = t
        .count(
            "shard_1",
            "SELECT min(order_id) FROM orders WHERE tenant_id = 'a'",
        )
        .await;
    let cross = format!("INSERT INTO shared_notes VALUES ('b', 1, 'a', {order_of_a})");
    t.write_as_client("shard_1", &cross).await.unwrap();
    let key = EntityKey::new("tenant", "a");
    refused(
        &t,
        MoveOptions::default(),
        &key,
        "shard_2",
        &[
            "foreign key shared_notes_ref_tenant_ref_order_fkey of public.shared_notes joins rows \
             of tenant/a and of other entities",
            "(b,1)",
        ],
    )
    .await;
    t.write_as_client("shard_1", "DELETE FROM shared_notes")
        .await
        .unwrap();
    // Another tenant's row starts referencing the entity's rows while it is frozen.
    let writer = Arc::new(t.shard("shard_1").await);
    let version = t.step("SELECT shard_directory.current_version()").await + 10;
    let act = act_at(Phase::Frozen, move || {
        let (writer, cross) = (writer.clone(), cross.clone());
        Box::pin(async move {
            writer
                .batch_execute(&format!(
                    "BEGIN; SELECT set_config('app.directory_version', '{version}', true); \
                     {cross}; COMMIT"
                ))
                .await
                .expect("tenant b writes while a is frozen");
        })
    });
    let failure: Failure = t
        .mover(MoveOptions::default())
        .with_observer(act)
        .start(&key, "shard_2")
        .await
        .expect_err("the crossing row aborts the move");
    assert!(
        matches!(failure.error, Error::CrossEntity { .. }) && failure.left == Left::Aborted,
        "{failure}"
    );
    assert_eq!(entry(&t, &key).await, ("shard_1".into(), "active".into()));
    assert_eq!(t.rows("shard_1", "a").await, (3, 3));
    assert_eq!(t.rows("shard_2", "a").await, (0, 0));
}

#[tokio::test]
async fn a_table_that_references_itself_moves_and_aborts_whatever_the_delete_batch() {
    let t = Topology::with_shards("selfref", 2).await;
    t.on_every_shard(
        "CREATE TABLE folders (
             tenant_id text NOT NULL, id int NOT NULL, parent int,
             PRIMARY KEY (tenant_id, id),
             FOREIGN KEY (tenant_id, parent) REFERENCES folders (tenant_id, id));
         SELECT shard_directory.protect('folders', 'tenant_id', 'tenant');",
    )
    .await;
    t.add_tenant("a", "shard_1").await;
    // A chain 50 deep: each folder's parent is the one before it.
    t.write_as_client(
        "shard_1",
        "INSERT INTO folders SELECT 'a', g, nullif(g - 1, 0) FROM generate_series(1, 50) g",
    )
    .await
    .unwrap();
    let folders = "SELECT count(*) FROM folders WHERE tenant_id = 'a'";
    let small = |method| MoveOptions {
        method,
        delete_batch: 7,
        ..Default::default()
    };
    let key = EntityKey::new("tenant", "a");
    for (method, from, to) in [
        (MethodChoice::Copy, "shard_1", "shard_2"),
        (MethodChoice::Logical, "shard_2", "shard_1"),
    ] {
        let record = t.mover(small(method)).start(&key, to).await;
        let record = record.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(record.phase, Phase::Done);
        assert_eq!(
            (t.count(to, folders).await, t.count(from, folders).await),
            (50, 0)
        );
    }
    // An abort after the target holds the chain clears it there too.
    let open = observe::crash_at(
        &t,
        small(MethodChoice::Copy),
        &key,
        "shard_2",
        Phase::Verified,
    )
    .await;
    assert_eq!(t.count("shard_2", folders).await, 50);
    let record = t
        .mover(small(MethodChoice::Copy))
        .abort(open)
        .await
        .unwrap();
    assert_eq!(record.phase, Phase::Aborted);
    assert_eq!(
        (
            t.count("shard_1", folders).await,
            t.count("shard_2", folders).await
        ),
        (50, 0)
    );
}

/// Every kind of column, on shards whose settings shape values' text differently.
const TYPED: &str = "
    CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
    CREATE TYPE pair AS (label text, at timestamptz);
    CREATE TABLE typed (
        tenant_id text NOT NULL, id int NOT NULL,
        at timestamptz, day date, clock time, span interval, f double precision, r real,
        n numeric, j json, jb jsonb, b bytea, moods mood[], duo pair, cash money, bits bit(4),
        nothing text, PRIMARY KEY (tenant_id, id));
    SELECT shard_directory.protect('typed', 'tenant_id', 'tenant');";

const TYPED_ROWS: &str = "
    INSERT INTO typed VALUES
      ('a', 1, '2026-03-15 12:34:56.789+05:30', '2026-03-15', '23:59:59.999', '1 year 2 mons 3 days 04:05:06.7',
       'NaN', '-0', 12345678901234567890.123456789, '{\"b\": 1,  \"a\": [1, 2]}', '{\"b\": 1, \"a\": [1, 2]}',
       '\\x00ff10', '{sad,happy}', ('x', '2026-01-01 00:00+00'), 12.34, B'1010', NULL),
      ('a', 2, 'infinity', '-infinity', '00:00', '-1 day +02:00', 'Infinity', '-Infinity', 'NaN', 'null', '[]',
       '', '{}', NULL, -0.01, B'0000', NULL),
      ('a', 3, '1999-12-31 23:59:59.999999-08', '0001-01-01 BC', NULL, '0', 2.2250738585072014e-308, 1.1754944e-38,
       0.000000000000000000000000000001, '\"café\"', '{\"k\": \"café\"}', '\\x', '{ok,NULL}', ('', NULL), 0, NULL, NULL)";

/// The entity's rows as text read under one set of settings, to compare shards by.
async fn typed_rows(t: &Topology, shard: &str) -> Vec<String> {
    let c = t.shard(shard).await;
    c.batch_execute(
        "SET TimeZone = 'UTC'; SET DateStyle = 'ISO'; SET IntervalStyle = 'postgres'; \
         SET extra_float_digits = 3; SET bytea_output = 'hex'; SET lc_monetary = 'C'",
    )
    .await
    .unwrap();
    column(
        &c,
        "SELECT ROW(t.*)::text FROM typed t WHERE tenant_id = 'a' ORDER BY id",
        &[],
    )
    .await
}

#[tokio::test]
async fn verification_holds_between_shards_configured_differently_for_every_kind_of_column() {
    let other_settings: &[(&str, &str)] = &[
        ("TimeZone", "Asia/Kathmandu"),
        ("DateStyle", "German, DMY"),
        ("IntervalStyle", "sql_standard"),
        ("extra_float_digits", "0"),
        ("bytea_output", "escape"),
    ];
    let t = Topology::configured("settings", &[other_settings, &[]]).await;
    // The enum, and so its array type, get other OIDs on shard_2.
    t.shard("shard_2")
        .await
        .batch_execute("CREATE TYPE shifts_the_oids AS ENUM ('x')")
        .await
        .unwrap();
    t.on_every_shard(TYPED).await;
    t.add_tenant("a", "shard_1").await;
    t.write_as_client("shard_1", TYPED_ROWS).await.unwrap();
    let original = typed_rows(&t, "shard_1").await;
    assert_eq!(original.len(), 3);
    let key = EntityKey::new("tenant", "a");
    for (options, to) in [
        (options(MethodChoice::Logical), "shard_2"),
        (options(MethodChoice::Copy), "shard_1"),
        (options(MethodChoice::Copy), "shard_2"),
        (paced(), "shard_1"),
    ] {
        let method = options.method;
        let record = t.mover(options).start(&key, to).await;
        let record = record.unwrap_or_else(|e| panic!("{method:?} to {to}: {e}"));
        assert_eq!(record.phase, Phase::Done);
        assert_eq!(typed_rows(&t, to).await, original, "{method:?} to {to}");
    }
}

/// Under the freeze only the changed rows are compared, found by their primary key's values as
/// the shards' streams spell them: keys of char(n), timestamptz, uuid, numeric and float columns,
/// between shards configured differently, still find the row. A row altered on the target after
/// the online check is named, so the lookup found it there and on the source.
#[tokio::test]
async fn changed_rows_are_found_by_keys_of_every_common_type_between_shards_configured_differently()
{
    let other_settings: &[(&str, &str)] = &[
        ("TimeZone", "Asia/Kathmandu"),
        ("DateStyle", "German, DMY"),
        ("extra_float_digits", "0"),
    ];
    let t = Topology::configured("changedkeys", &[&[], other_settings]).await;
    t.on_every_shard(
        "CREATE TABLE stamped (
             tenant_id text NOT NULL, code character(6) NOT NULL, at timestamptz NOT NULL,
             id uuid NOT NULL, amount numeric NOT NULL, f double precision NOT NULL, body text,
             PRIMARY KEY (tenant_id, code, at, id, amount, f));
         SELECT shard_directory.protect('stamped', 'tenant_id', 'tenant');",
    )
    .await;
    t.add_tenant("a", "shard_1").await;
    t.write_as_client(
        "shard_1",
        "INSERT INTO stamped VALUES
           ('a', 'ab', '2026-03-15 12:34:56.789+05:30', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', 12.50, 0.1, 'x'),
           ('a', 'cd', '1999-12-31 23:59:59.999999-08', 'b0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', -0.000001, 1e-300, 'y')",
    )
    .await
    .unwrap();
    let target = Arc::new(t.shard("shard_2").await);
    let act = act_at(Step::Freeze, move || {
        let target = target.clone();
        Box::pin(async move {
            target
                .batch_execute(
                    "BEGIN; SET LOCAL session_replication_role = replica;
                     UPDATE stamped SET body = 'altered' WHERE code = 'cd'; COMMIT",
                )
                .await
                .unwrap();
        })
    });
    let failure = t
        .mover(options(MethodChoice::Logical))
        .with_observer(act)
        .start(&EntityKey::new("tenant", "a"), "shard_2")
        .await
        .expect_err("the altered row is found");
    match &failure.error {
        Error::Mismatch {
            table,
            source_rows,
            target_rows,
            changed_only,
            keys,
        } => {
            assert_eq!(
                (table.as_str(), *source_rows, *target_rows, *changed_only),
                ("public.stamped", 1, 1, true)
            );
            assert_eq!(keys.len(), 1, "{keys:?}");
            assert!(
                keys[0].starts_with("(a,\"cd    \",\"2000-01-01 07:59:59.999999+00\",b0eebc99"),
                "{keys:?}"
            );
        }
        other => panic!("expected a mismatch, got {other}"),
    }
    assert_eq!(failure.left, Left::Aborted, "{failure}");
}

#[tokio::test]
async fn a_copy_move_carries_a_type_without_a_binary_form() {
    let t = Topology::with_shards("isn", 2).await;
    t.on_every_shard("CREATE EXTENSION isn;
         CREATE TABLE books (tenant_id text NOT NULL, isbn isbn NOT NULL, PRIMARY KEY (tenant_id, isbn));
         SELECT shard_directory.protect('books', 'tenant_id', 'tenant');",
    )
    .await;
    t.add_tenant("a", "shard_1").await;
    t.write_as_client(
        "shard_1",
        "INSERT INTO books VALUES ('a', '978-0-393-04002-9'), ('a', '0-306-40615-2')",
    )
    .await
    .unwrap();
    let record = t
        .mover(options(MethodChoice::Copy))
        .start(&EntityKey::new("tenant", "a"), "shard_2")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(record.phase, Phase::Done);
    assert_eq!(
        t.count(
            "shard_2",
            "SELECT count(*) FROM books WHERE tenant_id = 'a'"
        )
        .await,
        2
    );
}

#[tokio::test]
async fn every_sequence_the_entitys_tables_draw_from_is_advanced_on_the_target() {
    let t = Topology::with_shards("sequences", 2).await;
    t.on_every_shard("CREATE SEQUENCE ticket_seq;
         CREATE TABLE tickets (tenant_id text NOT NULL, id bigint NOT NULL DEFAULT nextval('ticket_seq'), PRIMARY KEY (tenant_id, id));
         SELECT shard_directory.protect('tickets', 'tenant_id', 'tenant');",
    )
    .await;
    t.add_tenant("a", "shard_1").await;
    t.add_tenant("b", "shard_1").await;
    t.write_as_client(
        "shard_1",
        "INSERT INTO tickets (tenant_id) SELECT 'a' FROM generate_series(1, 20)",
    )
    .await
    .unwrap();
    t.shard("shard_2")
        .await
        .batch_execute("ALTER SEQUENCE ticket_seq CACHE 10")
        .await
        .unwrap();
    refused(
        &t,
        MoveOptions::default(),
        &EntityKey::new("tenant", "a"),
        "shard_2",
        &[
            "sequence public.ticket_seq on target shard shard_2 caches 10 values per session",
            "ALTER SEQUENCE public.ticket_seq CACHE 1",
        ],
    )
    .await;
    t.shard("shard_2")
        .await
        .batch_execute("ALTER SEQUENCE ticket_seq CACHE 1")
        .await
        .unwrap();
    for (method, id) in [(MethodChoice::Logical, "a"), (MethodChoice::Copy, "b")] {
        if id == "b" {
            t.write_as_client(
                "shard_1",
                "INSERT INTO tickets (tenant_id) SELECT 'b' FROM generate_series(1, 20)",
            )
            .await
            .unwrap();
        }
        t.mover(options(method))
            .start(&EntityKey::new("tenant", id), "shard_2")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        // A new row of the moved entity on the target takes a key none of its rows holds.
        t.write_as_client(
            "shard_2",
            &format!("INSERT INTO tickets (tenant_id) VALUES ('{id}')"),
        )
        .await
        .unwrap_or_else(|e| panic!("{method:?}: a new ticket on the target: {e}"));
    }
}

/// Shards whose sequences interleave (INCREMENT 16, START 1 on shard_1 and 2 on shard_2) mint
/// order ids no other shard mints. A reversible move leaves the target minting in its own residue
/// class, past every id the source minted: the ids it mints for the moved tenant, carried back by
/// the way back, meet none the source minted meanwhile for another tenant, and the revert brings
/// every row back once. A sequence that runs the other way on the target is refused.
#[tokio::test]
async fn interleaved_sequences_keep_each_shards_ids_apart_through_a_move_and_its_revert() {
    let t = Topology::with_shards("interleaved", 2).await;
    for (shard, start) in [("shard_1", 1), ("shard_2", 2)] {
        t.shard(shard)
            .await
            .batch_execute(&format!(
                "ALTER TABLE orders ALTER COLUMN order_id
                   SET INCREMENT BY 16 SET START WITH {start} RESTART;
                 CREATE UNIQUE INDEX orders_order_id ON orders (order_id);"
            ))
            .await
            .unwrap();
    }
    let shard_2 = t.shard("shard_2").await;
    let direction = async |increment: i32| {
        shard_2
            .batch_execute(&format!(
                "ALTER TABLE orders ALTER COLUMN order_id
                   SET INCREMENT BY {increment} SET MINVALUE -1000000 RESTART"
            ))
            .await
            .unwrap();
    };
    for id in ["a", "b"] {
        t.add_tenant(id, "shard_1").await;
    }
    t.seed_orders("shard_1", "a", 3, 1).await;
    t.seed_orders("shard_1", "b", 2, 1).await;
    let key = EntityKey::new("tenant", "a");
    let reversible = MoveOptions {
        reversible: true,
        ..Default::default()
    };
    direction(-16).await;
    refused(
        &t,
        reversible.clone(),
        &key,
        "shard_2",
        &[
            "sequence public.orders_order_id_seq increments by 16 on source shard shard_1 but \
             by -16 on target shard shard_2",
            "with the same sign on both shards",
        ],
    )
    .await;
    direction(16).await;

    let there = t
        .mover(reversible)
        .start(&key, "shard_2")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(there.phase, Phase::Reversible);
    // Another tenant's order on the source, then the moved tenant's on the target; the way back
    // carries the latter to the source.
    let router = t.connected_router().await;
    for (id, item) in [("b", "b on shard_1"), ("a", "a on shard_2")] {
        Topology::order(&router, id, item)
            .await
            .unwrap_or_else(|e| panic!("{item}: {e}"));
    }
    let back = t
        .mover(MoveOptions::default())
        .revert(there.move_id)
        .await
        .unwrap_or_else(|e| panic!("the revert: {e}"));
    assert_eq!(back.phase, Phase::Done);
    Topology::order(&router, "a", "a back on shard_1")
        .await
        .unwrap();

    let ids = async |shard: &str| -> Vec<String> {
        column(
            &t.shard(shard).await,
            "SELECT format('%s %s: %s', tenant_id, item, order_id % 16) FROM orders \
             ORDER BY tenant_id, order_id",
            &[],
        )
        .await
    };
    // Each id in the residue class of the shard that minted it, every row once, where the
    // directory says.
    assert_eq!(
        ids("shard_1").await,
        [
            "a seed a 1: 1",
            "a seed a 2: 1",
            "a seed a 3: 1",
            "a a on shard_2: 2",
            "a a back on shard_1: 1",
            "b seed b 1: 1",
            "b seed b 2: 1",
            "b b on shard_1: 1",
        ]
    );
    assert!(
        ids("shard_2").await.is_empty(),
        "the revert cleared shard_2"
    );
    assert_eq!(t.placement("a").await, "shard_1");
}

#[tokio::test]
async fn a_logical_move_whose_rows_reference_what_the_target_lacks_waits_for_them() {
    let t = Topology::with_shards("missingref", 2).await;
    t.on_every_shard(
        "CREATE TABLE products (sku text PRIMARY KEY);
         CREATE TABLE cart (tenant_id text NOT NULL, sku text NOT NULL REFERENCES products,
                            PRIMARY KEY (tenant_id, sku));
         SELECT shard_directory.protect('cart', 'tenant_id', 'tenant');
         INSERT INTO products VALUES ('everywhere');",
    )
    .await;
    t.shard("shard_1")
        .await
        .batch_execute("INSERT INTO products VALUES ('only-here')")
        .await
        .unwrap();
    t.add_tenant("a", "shard_1").await;
    t.write_as_client(
        "shard_1",
        "INSERT INTO cart VALUES ('a', 'everywhere'), ('a', 'only-here')",
    )
    .await
    .unwrap();
    // Found by the check while the tenant is writable: the move stops there, resumable, its copy
    // kept, and goes on once the DBA has put the referenced row on the target.
    let mover = t.mover(options(MethodChoice::Logical));
    let failure = mover
        .start(&EntityKey::new("tenant", "a"), "shard_2")
        .await
        .expect_err("the reference is missing on the target");
    assert!(
        matches!(&failure.error, Error::MissingReference { constraint, rows, .. }
            if constraint == "cart_sku_fkey" && rows == &["(a,only-here)"]),
        "{failure}"
    );
    assert_eq!(failure.left, Left::Resumable, "{failure}");
    assert_eq!(failure.phase, Some(Phase::CatchingUp), "{failure}");
    assert_eq!(
        t.entry("tenant", "a").await,
        ("shard_1".into(), "migrating".into()),
        "never frozen"
    );
    t.shard("shard_2")
        .await
        .batch_execute("INSERT INTO products VALUES ('only-here')")
        .await
        .unwrap();
    let done = mover.resume(failure.move_id.unwrap()).await.unwrap();
    assert_eq!(done.phase, Phase::Done);
    assert_eq!(t.count("shard_2", "SELECT count(*) FROM cart").await, 2);
    assert_eq!(t.count("shard_1", "SELECT count(*) FROM cart").await, 0);
}

#[tokio::test]
async fn a_partition_whose_replica_identity_leaves_out_the_key_is_named_with_its_fix() {
    let t = Topology::with_shards("identity", 2).await;
    t.on_every_shard(
        "CREATE TABLE events (tenant_id text NOT NULL, id bigint NOT NULL, seq bigint NOT NULL,
                              PRIMARY KEY (tenant_id, id)) PARTITION BY HASH (tenant_id);
         CREATE TABLE events_0 PARTITION OF events FOR VALUES WITH (MODULUS 2, REMAINDER 0);
         CREATE TABLE events_1 PARTITION OF events FOR VALUES WITH (MODULUS 2, REMAINDER 1);
         CREATE UNIQUE INDEX events_1_seq ON events_1 (seq);
         ALTER TABLE events_1 REPLICA IDENTITY USING INDEX events_1_seq;
         SELECT shard_directory.protect('events', 'tenant_id', 'tenant');",
    )
    .await;
    t.add_tenant("a", "shard_1").await;
    let key = EntityKey::new("tenant", "a");
    refused(
        &t,
        options(MethodChoice::Logical),
        &key,
        "shard_2",
        &[
            "the replica identity of public.events_1 does not include the key column tenant_id",
            "ALTER TABLE public.events_1 REPLICA IDENTITY USING INDEX public.events_1_pkey",
        ],
    )
    .await;
    // Nothing was published, so every tenant still updates the partition.
    t.add_tenant("b", "shard_1").await;
    t.write_as_client(
        "shard_1",
        "INSERT INTO events SELECT t, g, g * 10 + length(t) FROM unnest(ARRAY['a', 'b']) t, generate_series(1, 5) g;
         UPDATE events SET seq = seq + 1000",
    )
    .await
    .unwrap();
    let record = t
        .mover(options(MethodChoice::Copy))
        .start(&key, "shard_2")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(record.phase, Phase::Done);
}

/// A table whose key column leads no index: the plan warns, naming the index to create, and the
/// move goes ahead.
#[tokio::test]
async fn a_key_column_no_index_leads_is_warned_about_with_its_create_index() {
    let t = Topology::with_shards("keyindex", 2).await;
    t.on_every_shard(
        "CREATE TABLE \"Notes\" (id bigint PRIMARY KEY, tenant_id text NOT NULL, body text);
         SELECT shard_directory.protect('\"Notes\"', 'tenant_id', 'tenant');",
    )
    .await;
    t.add_tenant("a", "shard_1").await;
    let plan = t
        .mover(options(MethodChoice::Copy))
        .plan(&EntityKey::new("tenant", "a"), "shard_2")
        .await
        .unwrap();
    assert_eq!(plan.warnings.len(), 1, "{plan}");
    assert!(
        plan.warnings[0].contains("public.Notes")
            && plan.warnings[0].contains("CREATE INDEX ON public.\"Notes\" (tenant_id)"),
        "{plan}"
    );
    assert!(plan
        .to_string()
        .contains("warning: no index of public.Notes"));
}
