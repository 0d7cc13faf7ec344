//! A fleet of several PostgreSQL majors, as while upgrading it tenant by tenant: the directory on
//! 17, shards on 15 and 18. Tenants move from 15 to 18 and back with both methods while routers
//! write (and one reversibly, then reverted), and every acknowledged write ends once, on the
//! shard the directory names, with every value of every type as it was written.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use shard_directory_client::{DirectoryConfig, EntityKey};
use shard_directory_e2e::topology::LOGICAL_SOURCE_GRANTS;
use shard_directory_e2e::workload::{refusals, Audit, Ledger, Workload};
use shard_directory_e2e::{eventually, Topology};
use shard_directory_mover::{Method, MethodChoice, MoveOptions, Mover, Phase};

/// A table of the types whose text and binary forms differ most, made on each shard (the enum's
/// OID is each shard's own).
const INVOICES: &str = "
    CREATE TYPE invoice_state AS ENUM ('draft', 'sent', 'paid');
    CREATE TABLE invoices (
        tenant_id  text        NOT NULL,
        invoice_id int         NOT NULL,
        amount     numeric(14, 4),
        rate       float8,
        issued     timestamptz,
        due        date,
        period     interval,
        valid      tstzrange,
        tags       text[],
        doc        jsonb,
        blob       bytea,
        ref        uuid,
        state      invoice_state,
        history    invoice_state[],
        PRIMARY KEY (tenant_id, invoice_id));
    SELECT shard_directory.protect('invoices', 'tenant_id', 'tenant');
    CREATE EXTENSION citext;
    CREATE TABLE contacts (
        tenant_id  text   NOT NULL,
        contact_id int    NOT NULL,
        email      citext NOT NULL,
        PRIMARY KEY (tenant_id, contact_id));
    SELECT shard_directory.protect('contacts', 'tenant_id', 'tenant');
    -- Every statement in the server log: which COPY format the mover chose.
    ALTER ROLE postgres IN DATABASE app SET log_statement = 'all';";

const SEED_INVOICES: &str = "
    INSERT INTO invoices
    SELECT $1, g, g * 1234.5678 / 7, g / 3.0, timestamptz '2026-03-29 01:30:00+01' + g * interval '37 minutes',
           date '2024-02-29' + g, make_interval(months => g, secs => g / 7.0),
           tstzrange(now() - g * interval '1 day', NULL), ARRAY['a' || g, NULL, 'ü ' || g],
           jsonb_build_object('n', g, 'f', g / 3.0, 'nested', jsonb_build_array(g, 'x', NULL)),
           decode(md5(g::text), 'hex'), md5(g::text)::uuid,
           (ARRAY['draft', 'sent', 'paid']::invoice_state[])[g % 3 + 1],
           ARRAY['draft', 'paid']::invoice_state[]
    FROM generate_series(1, 300) g;
    INSERT INTO contacts SELECT $1, g, 'Contact.' || g || '@Example.COM' FROM generate_series(1, 50) g";

/// Every value of `tenant`'s invoices as text, in one session setting that shapes it.
async fn invoices(t: &Topology, shard: &str, tenant: &str) -> String {
    let c = t.shard(shard).await;
    c.batch_execute(
        "SET TimeZone = 'UTC'; SET DateStyle = 'ISO, YMD'; SET IntervalStyle = 'postgres'; \
         SET extra_float_digits = 3; SET bytea_output = 'hex'",
    )
    .await
    .unwrap();
    c.query_one(
        "SELECT count(*)::text || ':' || coalesce(string_agg(i::text, E'\\n' ORDER BY invoice_id), '')
                || (SELECT coalesce(string_agg(c::text, E'\\n' ORDER BY contact_id), '')
                      FROM contacts c WHERE tenant_id = $1)
         FROM invoices i WHERE tenant_id = $1",
        &[&tenant],
    )
    .await
    .unwrap()
    .get(0)
}

/// 300 invoices and 50 contacts for `tenant` (a plain name) on `shard`, written as a client at the current version would.
async fn seed_invoices(t: &Topology, shard: &str, tenant: &str) {
    t.write_as_client(shard, &SEED_INVOICES.replace("$1", &format!("'{tenant}'")))
        .await
        .unwrap();
}

/// Table -> the formats the mover's `COPY ... FROM STDIN` took on `shard`, from its log.
fn copy_formats(t: &Topology, shard: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut formats: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in t.shard_cluster(shard).server_log().lines() {
        // `statement: COPY ...`, or `execute <name>: COPY ...` (the extended protocol).
        let Some((_, copy)) = line.split_once(": COPY ") else {
            continue;
        };
        if let (Some(table), Some(format)) = (
            copy.split(' ').next(),
            copy.split("FROM STDIN (FORMAT ").nth(1),
        ) {
            formats
                .entry(table.to_owned())
                .or_default()
                .insert(format.trim_end_matches(')').to_owned());
        }
    }
    formats
}

async fn major(client: &tokio_postgres::Client) -> i32 {
    client
        .query_one(
            "SELECT current_setting('server_version_num')::int / 10000",
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

#[tokio::test]
async fn tenants_move_between_postgresql_15_and_18_both_ways_with_both_methods_under_writers() {
    let t = Topology::mixed("mixed", 17, &[15, 18]).await;
    assert_eq!(major(&t.dba().await).await, 17, "the directory");
    assert_eq!(major(&t.shard("shard_1").await).await, 15);
    assert_eq!(major(&t.shard("shard_2").await).await, 18);
    for (shard, _) in &t.shards {
        t.shard(shard).await.batch_execute(INVOICES).await.unwrap();
    }

    let tenants = ["a", "b", "c", "d", "e"];
    let mut ledger = Ledger::default();
    let mut written = Vec::new();
    for tenant in tenants {
        let shard = if tenant == "d" { "shard_2" } else { "shard_1" };
        t.add_tenant(tenant, shard).await;
        for item in t.seed_orders(shard, tenant, 200, 2).await {
            ledger.acked.insert(item, tenant.into());
        }
        seed_invoices(&t, shard, tenant).await;
        written.push(invoices(&t, shard, tenant).await);
    }
    let seeded = ledger.acked.len();

    let mut routers = Vec::new();
    for _ in 0..2 {
        routers.push(Arc::new(
            t.router(t.client_directory(DirectoryConfig::default()).await),
        ));
    }
    let workload = Workload::start(
        &routers,
        &tenants,
        2,
        Duration::from_millis(3),
        fastrand::u64(..),
        ledger,
    );
    let acked = || workload.ledger().acked.len();
    let paced = MoveOptions {
        method: MethodChoice::Logical,
        max_rate: Some(5_000),
        ..Default::default()
    };
    let by = |method| MoveOptions {
        method,
        ..Default::default()
    };
    // Up to 18 and back down with each method; `c` stays on 18, copied by the mover's paced
    // initial copy; `d` lives on 18 throughout.
    let moves = [
        ("a", "shard_2", by(MethodChoice::Copy), Method::Copy),
        ("b", "shard_2", by(MethodChoice::Logical), Method::Logical),
        ("c", "shard_2", paced, Method::Logical),
        ("a", "shard_1", by(MethodChoice::Logical), Method::Logical),
        ("b", "shard_1", by(MethodChoice::Copy), Method::Copy),
    ];
    for (tenant, to, options, method) in moves {
        let before = acked();
        eventually(
            "the writers to write meanwhile",
            Duration::from_secs(20),
            || async { (acked() > before + 50).then_some(()) },
        )
        .await;
        let from = t.placement(tenant).await;
        let record = t
            .mover(options)
            .start(&EntityKey::new("tenant", tenant), to)
            .await
            .unwrap_or_else(|e| panic!("move {tenant} {from} -> {to}: {e}"));
        assert_eq!(record.method, method, "{tenant} -> {to}");
        assert_eq!(t.placement(tenant).await, to);
        let i = tenants.iter().position(|x| *x == tenant).unwrap();
        assert_eq!(
            invoices(&t, to, tenant).await,
            written[i],
            "{tenant}'s invoices, moved {from} -> {to} by {method:?}"
        );
        assert_eq!(
            invoices(&t, &from, tenant).await,
            "0:",
            "nothing of {tenant} is left on {from}"
        );
    }
    // The upgrade's safety net: `e` moved up reversibly, 15 kept current from 18 while the
    // writers write, then reverted.
    let e = EntityKey::new("tenant", "e");
    let reversible = MoveOptions {
        reversible: true,
        ..Default::default()
    };
    let there = t
        .mover(reversible)
        .start(&e, "shard_2")
        .await
        .unwrap_or_else(|err| panic!("move e up, reversibly: {err}"));
    assert_eq!(
        (there.phase, t.placement("e").await.as_str()),
        (Phase::Reversible, "shard_2")
    );
    for what in [
        "the writers to write on 18",
        "the writers to write after the moves",
    ] {
        let before = acked();
        eventually(what, Duration::from_secs(20), || async {
            (acked() > before + 50).then_some(())
        })
        .await;
        if t.placement("e").await == "shard_2" {
            let back = t
                .mover(MoveOptions::default())
                .revert(there.move_id)
                .await
                .unwrap_or_else(|err| panic!("revert e: {err}"));
            assert_eq!(
                (back.phase, back.reverses),
                (Phase::Done, Some(there.move_id))
            );
            assert_eq!(t.placement("e").await, "shard_1");
            assert_eq!(invoices(&t, "shard_1", "e").await, written[4]);
            assert_eq!(invoices(&t, "shard_2", "e").await, "0:");
        }
    }

    let ledger = workload.stop().await;
    let audit = Audit::of(&t, &ledger).await;
    println!(
        "mixed fleet: {} orders acked ({seeded} seeded), refusals retried {:?}, rows {:?}",
        ledger.acked.len(),
        refusals(&routers),
        audit.rows
    );
    assert!(audit.holds(), "{}", audit.problems());
    assert!(ledger.fatal.is_empty(), "{:?}", ledger.fatal);
    for tenant in ["a", "b", "e"] {
        assert!(
            audit.rows_of(tenant, "shard_1").0 > 200,
            "{tenant} is back on 15 with what was written on 18"
        );
    }
    assert_eq!(
        invoices(&t, "shard_2", "d").await,
        written[3],
        "the tenant that stayed"
    );
    // Binary between majors only for PostgreSQL's own types; text for an extension's type
    // (citext) and for arrays of an enum made on the shard, in both directions.
    let binary = BTreeSet::from(["binary".to_owned()]);
    let text = BTreeSet::from(["text".to_owned()]);
    for shard in ["shard_1", "shard_2"] {
        let formats = copy_formats(&t, shard);
        let expected = BTreeMap::from([
            ("public.contacts".to_owned(), text.clone()),
            ("public.invoices".to_owned(), text.clone()),
            ("public.order_lines".to_owned(), binary.clone()),
            ("public.orders".to_owned(), binary.clone()),
        ]);
        assert_eq!(formats, expected, "the copies into {shard}");
    }
    assert!(
        t.replication_objects().await.is_empty(),
        "{:?}",
        t.replication_objects().await
    );
}

/// PostgreSQL 16 and later let a role that is not a superuser create a subscription, when it
/// owns the tables and its subscription gives a password the publisher asked for: a logical move
/// onto 18 runs as a role holding what docs/operations.md lists for 16 and later, each missing
/// piece named first; one onto 15 is refused, naming the superuser it needs there.
#[tokio::test]
async fn a_role_without_superuser_moves_logically_onto_18_and_is_told_what_15_needs() {
    let t = Topology::mixed("mixed-roles", 17, &[15, 18]).await;
    t.add_tenant("a", "shard_1").await;
    t.seed_orders("shard_1", "a", 5, 2).await;
    t.create_mover_role().await;
    t.grant_mover_as_readme_lists(
        "public.orders, public.order_lines",
        "public.orders_order_id_seq",
    )
    .await;
    t.shard("shard_1")
        .await
        .batch_execute(&format!(
            "{LOGICAL_SOURCE_GRANTS}
             CREATE ROLE replicator LOGIN REPLICATION PASSWORD 'secret';
             GRANT SELECT ON orders, order_lines TO replicator;"
        ))
        .await
        .unwrap();
    t.shard_cluster("shard_1")
        .require_password("replicator")
        .await;
    let source = t.shard_cluster("shard_1").conn_str("app");
    // The target's server subscribes to shard_1 as `replicator` (with `password`, or not).
    let mover = |replication: &str| {
        let mut overrides = t.overrides_as_role(None);
        overrides
            .shards
            .get_mut("shard_1")
            .unwrap()
            .replication_conninfo = Some(source.replace("user=postgres", replication));
        let mut directory = t.directory_config();
        directory.user("mover");
        let logical = MoveOptions {
            method: MethodChoice::Logical,
            ..Default::default()
        };
        Mover::new(directory, overrides, logical)
    };
    let key = EntityKey::new("tenant", "a");
    let (t, key, mover) = (&t, &key, &mover);
    let refused = async |wanted: &[&str]| {
        let failure = mover("user=replicator")
            .start(key, "shard_2")
            .await
            .expect_err("a privilege is missing on 18");
        for w in wanted {
            assert!(failure.to_string().contains(w), "{w:?} not in: {failure}");
        }
        assert_eq!(t.placement("a").await, "shard_1");
    };
    refused(&[
        "GRANT pg_create_subscription TO mover",
        "GRANT CREATE ON DATABASE <this database> TO mover",
        "ALTER TABLE public.orders OWNER TO mover",
        "a password in shard shard_1's replication_conninfo",
    ])
    .await;
    t.shard("shard_2")
        .await
        .batch_execute(&format!(
            "GRANT pg_create_subscription TO mover; {LOGICAL_SOURCE_GRANTS}"
        ))
        .await
        .unwrap();
    refused(&["a password in shard shard_1's replication_conninfo"]).await;

    let record = mover("user=replicator password=secret")
        .start(key, "shard_2")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        (record.phase, record.method),
        (Phase::Done, Method::Logical)
    );
    assert_eq!(t.rows("shard_2", "a").await, (5, 10));
    assert_eq!(t.rows("shard_1", "a").await, (0, 0));

    // Back: 18 publishes (it has what 15 had), and 15 cannot subscribe without a superuser.
    let failure = mover("user=replicator password=secret")
        .start(key, "shard_1")
        .await
        .expect_err("15 lets only superusers create subscriptions");
    assert!(
        failure.to_string().contains("ALTER ROLE mover SUPERUSER"),
        "{failure}"
    );
    assert_eq!(t.placement("a").await, "shard_2");
}
