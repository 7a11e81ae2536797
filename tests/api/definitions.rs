//! The SQL definitions (sql/*.sql): a database migrated as on
//! 2026-12-03, when the functions lived in the migrations, ends up with the
//! same functions, views and triggers as one built with today's layout, and
//! upgrades cleanly; a newer definition set is never overwritten by an
//! older binary.

use std::borrow::Cow;
use std::path::Path;

use poolkeeper::db::definitions::{DefinitionSet, Outcome};
use sqlx::migrate::{Migration, MigrationType, Migrator};
use sqlx::{Connection, SqlSafeStr};

use crate::helpers::{TestDb, binary, empty_db, migrated_db};

const LEGACY: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/migrations-2026-12-03"
);

/// The migrations exactly as they were before the functions moved to sql/, read at run
/// time from the frozen fixture.
fn legacy_migrator() -> Migrator {
    let mut migrations = Vec::new();
    for entry in std::fs::read_dir(Path::new(LEGACY)).expect("fixture directory") {
        let path = entry.expect("fixture entry").path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .expect("file name")
            .to_owned();
        let Some(stem) = name.strip_suffix(".sql.legacy") else {
            continue;
        };
        let (version, description) = stem.split_once('_').expect("VERSION_description");
        let sql = std::fs::read_to_string(&path).expect("read fixture");
        migrations.push(Migration::new(
            version.parse().expect("version"),
            Cow::Owned(description.replace('_', " ")),
            MigrationType::Simple,
            sqlx::AssertSqlSafe(sql).into_sql_str(),
            false,
        ));
    }
    assert_eq!(migrations.len(), 7, "the seven migrations of 2026-12-03");
    Migrator::with_migrations(migrations)
}

/// Every function (its whole definition, settings included), view and
/// trigger of the public schema, one line each.
async fn definitions_of(db: &TestDb) -> Vec<String> {
    let mut conn = db.connection().await;
    let rows: Vec<String> = sqlx::query_scalar(
        "SELECT 'function ' || pg_get_functiondef(p.oid)
           FROM pg_proc p WHERE p.pronamespace = 'public'::regnamespace
         UNION ALL
         SELECT format('view %s %s', c.relname, pg_get_viewdef(c.oid))
           FROM pg_class c WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('v', 'm')
         UNION ALL
         SELECT 'trigger ' || pg_get_triggerdef(t.oid) || ' ' || t.tgenabled::text
           FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
          WHERE c.relnamespace = 'public'::regnamespace AND NOT t.tgisinternal
         ORDER BY 1",
    )
    .fetch_all(&mut conn)
    .await
    .expect("catalog");
    let _ = conn.close().await;
    rows
}

/// The tables, columns, constraints and indexes (as tests/api/migrations.rs).
async fn schema_of(db: &TestDb) -> Vec<String> {
    let mut conn = db.connection().await;
    let rows: Vec<String> = sqlx::query_scalar(
        "SELECT format('col %s.%s %s %s %s', table_name, column_name, data_type, column_default, ordinal_position)
           FROM information_schema.columns WHERE table_schema = 'public'
         UNION ALL
         SELECT format('con %s %s', conname, pg_get_constraintdef(oid)) FROM pg_constraint
          WHERE connamespace = 'public'::regnamespace
         UNION ALL
         SELECT format('idx %s', indexdef) FROM pg_indexes WHERE schemaname = 'public'
         UNION ALL
         SELECT format('type %s %s', t.typname, t.typtype) FROM pg_type t
          WHERE t.typnamespace = 'public'::regnamespace
         ORDER BY 1",
    )
    .fetch_all(&mut conn)
    .await
    .expect("schema");
    let _ = conn.close().await;
    rows
}

async fn migrations_table(db: &TestDb) -> Vec<(i64, String, bool, Vec<u8>)> {
    let mut conn = db.connection().await;
    let rows = sqlx::query_as(
        "SELECT version, description, success, checksum FROM _sqlx_migrations ORDER BY version",
    )
    .fetch_all(&mut conn)
    .await
    .expect("_sqlx_migrations");
    let _ = conn.close().await;
    rows
}

/// The definition files as they were at version 1 (when they left the migrations), frozen.
const V1: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/sql-definitions-v1"
);

/// The migration that created `sql_definitions`, the last of the old layout.
const LAYOUT_MIGRATION: i64 = 20261203000008;

/// The definition set at version 1, read from the frozen fixture, in the
/// order of `FILES`.
fn v1_set() -> DefinitionSet {
    DefinitionSet {
        version: 1,
        files: poolkeeper::db::definitions::FILES
            .iter()
            .filter_map(|(name, _)| {
                // Named `*.sql.v1`, so that nothing reads the frozen copy as running code.
                let path = Path::new(V1).join(format!("{name}.v1"));
                // A file added after version 1 was not part of it.
                let sql = std::fs::read_to_string(path).ok()?;
                Some(((*name).to_owned(), sql))
            })
            .collect(),
    }
}

/// Database A migrated with the migrations of 2026-12-03; database B with
/// today's migrations up to that one and the definitions at version 1:
/// the same functions, views and triggers (the move changed nothing). Then
/// A is upgraded by today's `migrate` (the legacy checksums rewritten, the
/// later migrations and definitions installed): A equals C, a database
/// built from scratch by today's `migrate`, schema and `_sqlx_migrations`
/// included. A checksum that is neither the legacy one nor the current one
/// is still refused.
#[tokio::test]
async fn the_legacy_migrations_and_the_new_layout_define_the_same_and_upgrade_cleanly() {
    let (a, b, c) = (empty_db().await, empty_db().await, empty_db().await);
    let mut conn = a.connection().await;
    legacy_migrator()
        .run(&mut conn)
        .await
        .expect("legacy migrations");
    let _ = conn.close().await;
    let mut conn = b.connection().await;
    Migrator::with_migrations(
        poolkeeper::db::MIGRATOR
            .iter()
            .filter(|m| m.version <= LAYOUT_MIGRATION)
            .cloned()
            .collect(),
    )
    .run(&mut conn)
    .await
    .expect("the migrations up to the layout");
    let v1 = v1_set();
    assert_eq!(v1.files.len(), 4, "the four files of version 1");
    poolkeeper::db::definitions::apply(&mut conn, &v1)
        .await
        .expect("the definitions at version 1");
    let _ = conn.close().await;
    let report = poolkeeper::db::migrate(&c.options)
        .await
        .expect("new layout");
    let set = DefinitionSet::embedded().expect("embedded set");
    assert_eq!(
        report.definitions,
        Some(Outcome::Applied {
            from: 0,
            to: set.version,
            files: set.files.iter().map(|(n, _)| n.clone()).collect(),
        })
    );

    let legacy = definitions_of(&a).await;
    let moved = definitions_of(&b).await;
    let fresh = definitions_of(&c).await;
    // Not vacuous: what moved to sql/ is there, including the copy of
    // reservation_transition that runs (20261203000007's, `org_id + 0`).
    let functions = legacy.iter().filter(|l| l.starts_with("function ")).count();
    assert_eq!(functions, 12, "{legacy:#?}");
    assert_eq!(
        legacy.iter().filter(|l| l.starts_with("trigger ")).count(),
        1
    );
    assert!(
        legacy
            .iter()
            .any(|l| l.contains("reservation_transition") && l.contains("r.org_id + 0 = p_org"))
    );
    assert_eq!(legacy, moved, "the legacy and the new layout differ");

    // The upgrade of A by today's binary.
    let report = poolkeeper::db::migrate(&a.options).await.expect("upgrade");
    assert_eq!(report.checksums_rewritten, 4);
    let later = poolkeeper::db::MIGRATOR
        .iter()
        .filter(|m| m.version > 20261203000007)
        .count();
    assert_eq!(
        report.applied, later,
        "sql_definitions' migration and those after"
    );
    assert!(matches!(
        report.definitions,
        Some(Outcome::Applied { from: 0, .. })
    ));
    assert_eq!(definitions_of(&a).await, fresh);
    assert_eq!(schema_of(&a).await, schema_of(&c).await);
    assert_eq!(migrations_table(&a).await, migrations_table(&c).await);
    let installed = |db: TestDb| async move {
        let mut conn = db.connection().await;
        let rows: Vec<(String, Vec<u8>, i64)> =
            sqlx::query_as("SELECT file, checksum, version FROM sql_definitions ORDER BY file")
                .fetch_all(&mut conn)
                .await
                .expect("sql_definitions");
        let _ = conn.close().await;
        rows
    };
    assert_eq!(installed(a.clone()).await, installed(c.clone()).await);

    // Once more: nothing left to do.
    let again = poolkeeper::db::migrate(&a.options).await.expect("again");
    assert_eq!(
        (again.checksums_rewritten, again.applied, again.definitions),
        (0, 0, Some(Outcome::Current))
    );

    // Any other checksum than the legacy one still mismatches, loudly.
    let mut conn = a.connection().await;
    sqlx::query(
        "UPDATE _sqlx_migrations SET checksum = sha384('edited by hand')
          WHERE version = 20261203000006",
    )
    .execute(&mut conn)
    .await
    .expect("tamper");
    let _ = conn.close().await;
    let err = poolkeeper::db::migrate(&a.options)
        .await
        .expect_err("a checksum edited by hand");
    assert!(format!("{err:#}").contains("20261203000006"), "{err:#}");
}

/// The embedded set with `transitions.sql` changed in a function body, one
/// version higher: what a newer release installs.
fn newer_set() -> DefinitionSet {
    let mut set = DefinitionSet::embedded().expect("embedded set");
    set.version += 1;
    let file = set
        .files
        .iter_mut()
        .find(|(n, _)| n == "transitions.sql")
        .expect("transitions.sql");
    assert!(file.1.contains("'unknown transition %'"));
    file.1 = file
        .1
        .replace("'unknown transition %'", "'unknown transition (newer) %'");
    set
}

async fn functiondefs(db: &TestDb) -> Vec<String> {
    definitions_of(db)
        .await
        .into_iter()
        .filter(|l| l.starts_with("function "))
        .collect()
}

/// Rolling deploys: a newer set is installed, then the older binary starts
/// (in process and as the real `poolkeeper migrate`): nothing changes, and
/// it says so, naming both versions. Its `serve` start-up check passes
/// without a migration session. The same version with other content is
/// refused.
#[tokio::test]
async fn an_older_binary_never_puts_its_older_definitions_back() {
    let db = migrated_db().await;
    let older = DefinitionSet::embedded().expect("embedded set");
    let newer = newer_set();

    let report = poolkeeper::db::migrate_with(&db.options, &newer)
        .await
        .expect("newer set");
    assert_eq!(
        report.definitions,
        Some(Outcome::Applied {
            from: older.version,
            to: newer.version,
            files: vec!["transitions.sql".to_owned()],
        })
    );
    let installed = functiondefs(&db).await;
    assert!(
        installed
            .iter()
            .any(|f| f.contains("unknown transition (newer) %")),
        "the newer set's function is installed"
    );

    // The older set, in process.
    let report = poolkeeper::db::migrate_with(&db.options, &older)
        .await
        .expect("older set");
    assert_eq!(
        report.definitions,
        Some(Outcome::Newer {
            installed: newer.version,
            ours: older.version
        })
    );
    assert_eq!(functiondefs(&db).await, installed);

    // The older binary: its log says why it applied nothing.
    let out = tokio::process::Command::new(binary())
        .arg("migrate")
        .env("DATABASE_URL", db.url())
        .env("RUST_LOG", "warn")
        .output()
        .await
        .expect("run migrate");
    let log =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    assert!(
        log.contains(&format!(
            "installed (version {}) are newer than this binary's (version {})",
            newer.version, older.version
        )),
        "{log}"
    );
    assert_eq!(functiondefs(&db).await, installed);

    // A pooler-only older replica may start: nothing is pending for it.
    let app = db.pool().await;
    poolkeeper::db::prepare_schema_with(None, &app, &older)
        .await
        .expect("an older replica starts without a migration session");
    assert_eq!(functiondefs(&db).await, installed);

    // The newer version number with other content: refused, nothing applied.
    let mut tampered = newer.clone();
    tampered.files[0]
        .1
        .push_str("\n-- changed without a new version\n");
    let err = poolkeeper::db::migrate_with(&db.options, &tampered)
        .await
        .expect_err("same version, other content");
    assert!(format!("{err:#}").contains("sql/VERSIONS"), "{err:#}");
    let err = poolkeeper::db::prepare_schema_with(None, &app, &tampered)
        .await
        .expect_err("same version, other content");
    assert!(format!("{err:#}").contains("sql/VERSIONS"), "{err:#}");
    assert_eq!(functiondefs(&db).await, installed);
    app.close().await;
}

/// Without a migration session (a pooler-only `serve`), pending definitions
/// stop the start-up with what to set, as pending migrations do; with one,
/// they are applied and the replica starts.
#[tokio::test]
async fn pending_definitions_need_a_migration_session() {
    let db = migrated_db().await;
    let app = db.pool().await;
    let newer = newer_set();
    let err = poolkeeper::db::prepare_schema_with(None, &app, &newer)
        .await
        .expect_err("definitions pending, no migration session");
    let msg = format!("{err:#}");
    assert!(
        msg.contains("SQL definitions are pending (transitions.sql)"),
        "{msg}"
    );
    assert!(msg.contains("POOLKEEPER_MIGRATION_DATABASE_URL"), "{msg}");
    assert!(
        !functiondefs(&db)
            .await
            .iter()
            .any(|f| f.contains("(newer)"))
    );
    let report = poolkeeper::db::prepare_schema_with(Some(&db.options), &app, &newer)
        .await
        .expect("with a migration session");
    assert!(matches!(report.definitions, Some(Outcome::Applied { .. })));
    assert!(
        functiondefs(&db)
            .await
            .iter()
            .any(|f| f.contains("(newer)"))
    );
    app.close().await;
}

/// The entry points of orders of one (set 1 to 6) are dropped by set 7:
/// gone from a fresh database and from one upgraded from set 1, where they
/// existed.
#[tokio::test]
async fn legacy_entry_points_are_gone() {
    const LEGACY_NAMES: &str = "SELECT p.proname::text FROM pg_proc p
         WHERE p.pronamespace = 'public'::regnamespace
           AND p.proname IN ('api_reserve', 'reserve_machine', 'reserve_walk')
         ORDER BY 1";
    let old = empty_db().await;
    let mut conn = old.connection().await;
    Migrator::with_migrations(
        poolkeeper::db::MIGRATOR
            .iter()
            .filter(|m| m.version <= LAYOUT_MIGRATION)
            .cloned()
            .collect(),
    )
    .run(&mut conn)
    .await
    .expect("the migrations up to the layout");
    poolkeeper::db::definitions::apply(&mut conn, &v1_set())
        .await
        .expect("the definitions at version 1");
    let before: Vec<String> = sqlx::query_scalar(LEGACY_NAMES)
        .fetch_all(&mut conn)
        .await
        .expect("names");
    // Not vacuous: set 1 had all three.
    assert_eq!(before, ["api_reserve", "reserve_machine", "reserve_walk"]);
    let _ = conn.close().await;
    poolkeeper::db::migrate(&old.options)
        .await
        .expect("upgrade");
    let fresh = migrated_db().await;
    for db in [&old, &fresh] {
        let mut conn = db.connection().await;
        let after: Vec<String> = sqlx::query_scalar(LEGACY_NAMES)
            .fetch_all(&mut conn)
            .await
            .expect("names");
        assert!(after.is_empty(), "still defined: {after:?}");
    }
}

/// The entry points of 8 arguments (before segments and customers) that a
/// database of sets 11 to 15 holds are dropped when it is upgraded, and a
/// fresh database never has them.
#[tokio::test]
async fn entry_points_of_8_arguments_are_gone() {
    const OLD: &str = "SELECT p.oid::regprocedure::text FROM pg_proc p
         WHERE p.pronamespace = 'public'::regnamespace
           AND p.proname IN ('reserve_order', 'api_reserve_order') AND p.pronargs = 8
         ORDER BY 1";
    let db = migrated_db().await;
    let mut conn = db.connection().await;
    let fresh: Vec<String> = sqlx::query_scalar(OLD)
        .fetch_all(&mut conn)
        .await
        .expect("names");
    assert!(fresh.is_empty(), "defined on a fresh database: {fresh:?}");
    // As set 15 left them, with allocator.sql installed at set 15.
    sqlx::raw_sql(
        "CREATE FUNCTION reserve_order(p_org bigint, p_actor text, p_order_ref text, p_site text, p_profile text,
                                       p_vendor text, p_hold integer, p_quantity integer)
         RETURNS SETOF reserve_result LANGUAGE sql AS $$
             SELECT * FROM reserve_order(p_org, p_actor, p_order_ref, p_site, p_profile, p_vendor, p_hold,
                                         p_quantity, NULL, NULL)
         $$;
         CREATE FUNCTION api_reserve_order(p_token_hash bytea, p_module_on boolean, p_order_ref text, p_site text,
                                           p_profile text, p_vendor text, p_hold integer, p_quantity integer)
         RETURNS TABLE (caller text, result reserve_result) LANGUAGE sql AS $$
             SELECT * FROM api_reserve_order(p_token_hash, p_module_on, p_order_ref, p_site, p_profile, p_vendor,
                                             p_hold, p_quantity, NULL, NULL)
         $$;
         UPDATE sql_definitions SET version = 15;
         UPDATE sql_definitions SET checksum = '\\x00'::bytea WHERE file = 'allocator.sql';",
    )
    .execute(&mut conn)
    .await
    .expect("the set-15 entry points");
    let before: Vec<String> = sqlx::query_scalar(OLD)
        .fetch_all(&mut conn)
        .await
        .expect("names");
    assert_eq!(before.len(), 2, "{before:?}");
    let _ = conn.close().await;
    poolkeeper::db::migrate(&db.options).await.expect("upgrade");
    let mut conn = db.connection().await;
    let after: Vec<String> = sqlx::query_scalar(OLD)
        .fetch_all(&mut conn)
        .await
        .expect("names");
    assert!(
        after.is_empty(),
        "still defined after the upgrade: {after:?}"
    );
}

/// Rolling deploys: a binary of the previous release calls the entry
/// points of 10 arguments and reads the flat `reserve_result`, as it did:
/// a new order, its replay (`existing`), a refusal with its organization,
/// and a caller refused by its token. They wrap the one-value reserve.
#[tokio::test]
async fn the_previous_releases_entry_points_answer_as_they_did() {
    let db = migrated_db().await;
    let pool = db.pool().await;
    let org = crate::helpers::create_org(&pool, "rolling", true).await;
    crate::helpers::FakeMachine::new()
        .tag("R-0001")
        .create(&pool, org.id)
        .await;
    let mut conn = db.connection().await;
    const API: &str = "SELECT c.caller, (c.result).* FROM api_reserve_order($1, $2, $3, $4, $5, $6::text, $7, $8, $9::text, $10::text) c";
    type Flat = (
        String,
        Option<String>,
        Option<i64>,
        Option<i64>,
        Option<String>,
        Option<i16>,
        Option<i16>,
        Option<serde_json::Value>,
    );
    let ask = |order_ref: &'static str, token: Vec<u8>| {
        sqlx::query_as::<_, Flat>(
            sqlx::AssertSqlSafe(format!(
                "SELECT a.caller, a.outcome, a.id, a.org_id, a.state, a.quantity, a.slot, a.machine FROM ({API}) a"
            )),
        )
        .bind(token)
        .bind(true)
        .bind(order_ref)
        .bind(crate::helpers::SITE)
        .bind(crate::helpers::PROFILE)
        .bind(None::<String>)
        .bind(900)
        .bind(1)
        .bind(None::<String>)
        .bind(None::<String>)
    };
    let digest = poolkeeper::tokens::digest(&org.token);
    let created: Flat = ask("OLD-1", digest.clone())
        .fetch_one(&mut conn)
        .await
        .expect("the previous release's reserve");
    assert_eq!(created.0, "ok");
    assert_eq!(created.1.as_deref(), Some("created"));
    let id = created.2.expect("the reservation's id");
    assert_eq!(
        (created.3, created.4.as_deref(), created.5, created.6),
        (Some(org.id), Some("held"), Some(1), Some(1))
    );
    assert_eq!(
        created.7.as_ref().and_then(|m| m["asset_tag"].as_str()),
        Some("R-0001")
    );
    let replay: Flat = ask("OLD-1", digest.clone())
        .fetch_one(&mut conn)
        .await
        .expect("its replay");
    assert_eq!(
        (replay.1.as_deref(), replay.2),
        (Some("existing"), Some(id))
    );
    // The one machine is held: nothing matches a second order.
    let refused: Flat = ask("OLD-2", digest)
        .fetch_one(&mut conn)
        .await
        .expect("a refusal");
    assert_eq!(
        (refused.1.as_deref(), refused.2, refused.3),
        (Some("unavailable"), None, Some(org.id))
    );
    let unknown: Flat = ask("OLD-3", vec![0; 32])
        .fetch_one(&mut conn)
        .await
        .expect("an unknown token");
    assert_eq!((unknown.0.as_str(), unknown.1), ("unauthorized", None));
    // The entry point without the token check, as the previous release's
    // demo and tests call it.
    let (outcome, held_by): (Option<String>, Option<i64>) = sqlx::query_as(
        "SELECT r.outcome, r.id FROM reserve_order($1, 'old', 'OLD-1', $2, $3, NULL, 900, 1, NULL, NULL) r",
    )
    .bind(org.id)
    .bind(crate::helpers::SITE)
    .bind(crate::helpers::PROFILE)
    .fetch_one(&mut conn)
    .await
    .expect("the previous release's reserve_order");
    assert_eq!((outcome.as_deref(), held_by), (Some("existing"), Some(id)));
}

/// Rolling deploys: the previous release's positional transition entry
/// points (`api_transition`, `reservation_transition`,
/// `api_order_transition`, `order_transition`) still answer as they did;
/// they wrap the one-value functions (`transition_request`,
/// `order_request`).
#[tokio::test]
async fn the_previous_releases_transition_entry_points_answer_as_they_did() {
    let db = migrated_db().await;
    let pool = db.pool().await;
    let org = crate::helpers::create_org(&pool, "rolling-t", true).await;
    for tag in ["T-1", "T-2", "T-3", "T-4"] {
        crate::helpers::FakeMachine::new()
            .tag(tag)
            .create(&pool, org.id)
            .await;
    }
    let mut conn = db.connection().await;
    let mut held = Vec::new();
    for order_ref in ["T-CANCEL", "T-CONVERT", "T-ORDER", "T-EXTEND"] {
        let (id, fence): (i64, i64) = sqlx::query_as(
            "SELECT (r.reservation).id, (r.reservation).fence
               FROM reserve_order_request($1, 'old', jsonb_build_object('order_ref', $2::text,
                    'site', $3::text, 'profile', $4::text, 'hold_seconds', 900, 'quantity', 1)) r",
        )
        .bind(org.id)
        .bind(order_ref)
        .bind(crate::helpers::SITE)
        .bind(crate::helpers::PROFILE)
        .fetch_one(&mut conn)
        .await
        .expect("a hold");
        held.push((id, fence));
    }
    let digest = poolkeeper::tokens::digest(&org.token);
    // A cancel through the API's positional entry point, then its replay.
    let cancel = |id: i64, fence: i64| {
        sqlx::query_as::<_, (String, Option<String>, Option<String>, Option<String>)>(
            "SELECT c.caller, (c.result).outcome, (c.result).state, (c.result).end_reason
               FROM api_transition($1, true, $2, $3, 'cancel', 'old reason') c",
        )
        .bind(digest.clone())
        .bind(id)
        .bind(fence)
    };
    let (id, fence) = held[0];
    let first = cancel(id, fence)
        .fetch_one(&mut conn)
        .await
        .expect("cancel");
    assert_eq!(
        first,
        (
            "ok".to_owned(),
            Some("ok".to_owned()),
            Some("cancelled".to_owned()),
            Some("old reason".to_owned())
        )
    );
    let again = cancel(id, fence)
        .fetch_one(&mut conn)
        .await
        .expect("replay");
    assert_eq!(again, first, "the replay answers what it did");
    // A convert through the positional function without the token check.
    let (id, fence) = held[1];
    let (outcome, state, service): (String, String, Option<String>) = sqlx::query_as(
        "SELECT x.outcome, x.state, x.link_service_ref FROM reservation_transition($1, $2, $3, 'old', 'convert', 'SRV-OLD') x",
    )
    .bind(org.id)
    .bind(id)
    .bind(fence)
    .fetch_one(&mut conn)
    .await
    .expect("convert");
    assert_eq!(
        (outcome.as_str(), state.as_str(), service.as_deref()),
        ("ok", "converted", Some("SRV-OLD"))
    );
    // An order's cancel through the API's positional entry point.
    let (id, fence) = held[2];
    let (caller, outcome, state): (String, Option<String>, Option<String>) = sqlx::query_as(
        "SELECT c.caller, (c.result).outcome, (c.result).state
           FROM api_order_transition($1, true, 'T-ORDER', ARRAY[$2::bigint], ARRAY[$3::bigint], '{}',
                                     'cancel', 'old order reason', NULL, NULL) c",
    )
    .bind(digest.clone())
    .bind(id)
    .bind(fence)
    .fetch_one(&mut conn)
    .await
    .expect("order cancel");
    assert_eq!(
        (caller.as_str(), outcome.as_deref(), state.as_deref()),
        ("ok", Some("ok"), Some("cancelled"))
    );
    // An extension through the positional function without the token check.
    let (id, fence) = held[3];
    let (outcome, extended): (String, bool) = sqlx::query_as(
        "SELECT x.outcome, x.expires_at > clock_timestamp() + interval '20 minutes'
           FROM order_transition($1, NULL, ARRAY[$2::bigint], ARRAY[$3::bigint], '{}', 'old', 'extend',
                                 NULL, 1800, 3600) x",
    )
    .bind(org.id)
    .bind(id)
    .bind(fence)
    .fetch_one(&mut conn)
    .await
    .expect("extend");
    assert_eq!((outcome.as_str(), extended), ("ok", true));
}
