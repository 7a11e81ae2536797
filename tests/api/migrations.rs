//! Migrations: idempotent, and serialised across replicas by an advisory lock.

use std::process::Stdio;

use crate::helpers::{binary, empty_db, migrated_db};

/// A text fingerprint of the schema: tables, columns, constraints, indexes.
async fn schema_fingerprint(pool: &poolkeeper::db::Db) -> String {
    let rows: Vec<String> = sqlx::query_scalar(
        "SELECT format('col %s.%s %s %s', table_name, column_name, data_type, column_default)
           FROM information_schema.columns WHERE table_schema = 'public'
         UNION ALL
         SELECT format('con %s %s', conname, pg_get_constraintdef(oid)) FROM pg_constraint
          WHERE connamespace = 'public'::regnamespace
         UNION ALL
         SELECT format('idx %s', indexdef) FROM pg_indexes WHERE schemaname = 'public'
         ORDER BY 1",
    )
    .fetch_all(pool)
    .await
    .expect("fingerprint");
    rows.join("\n")
}

#[tokio::test]
async fn migrating_twice_changes_nothing() {
    let db = migrated_db().await;
    let pool = db.pool().await;
    let before = schema_fingerprint(&pool).await;
    let states_before: i64 = sqlx::query_scalar("SELECT count(*) FROM reservation_states")
        .fetch_one(&pool)
        .await
        .expect("count");
    let report = poolkeeper::db::migrate(&db.options)
        .await
        .expect("second migration");
    assert_eq!(report.applied, 0);
    assert_eq!(schema_fingerprint(&pool).await, before);
    let states_after: i64 = sqlx::query_scalar("SELECT count(*) FROM reservation_states")
        .fetch_one(&pool)
        .await
        .expect("count");
    assert_eq!(states_after, states_before);
}

/// Three `poolkeeper migrate` processes started together on an empty
/// database all succeed, and each migration is applied once.
#[tokio::test]
async fn three_migrate_processes_at_once_all_succeed() {
    let db = empty_db().await;
    let children: Vec<_> = (0..3)
        .map(|_| {
            tokio::process::Command::new(binary())
                .arg("migrate")
                .env("DATABASE_URL", db.url())
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn poolkeeper migrate")
        })
        .collect();
    for child in children {
        let out = child.wait_with_output().await.expect("wait");
        assert!(
            out.status.success(),
            "migrate failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let pool = db.pool().await;
    let applied: i64 = sqlx::query_scalar("SELECT count(*) FROM _sqlx_migrations")
        .fetch_one(&pool)
        .await
        .expect("count");
    assert_eq!(applied as usize, poolkeeper::db::MIGRATOR.iter().count());
    let states: i64 = sqlx::query_scalar("SELECT count(*) FROM reservation_states")
        .fetch_one(&pool)
        .await
        .expect("count");
    assert_eq!(states, 4, "seed rows inserted once");
}

/// A rolling start: an older binary that saw migrations pending gets the
/// advisory lock after a newer one applied its own (here: a version this
/// binary does not know, recorded as applied). The decision is made again
/// under the lock: the database is ahead, nothing is applied (sqlx would
/// refuse the unknown version), and the older binary serves.
#[tokio::test]
async fn an_older_binary_migrating_after_a_newer_one_applies_nothing_and_serves() {
    let db = migrated_db().await;
    let pool = db.pool().await;
    let ours: i64 = poolkeeper::db::MIGRATOR
        .iter()
        .map(|m| m.version)
        .max()
        .expect("migrations");
    sqlx::query(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time)
         VALUES ($1, 'a newer release', true, '\\x00', 1)",
    )
    .bind(ours + 1)
    .execute(&pool)
    .await
    .expect("a newer release's migration");
    let before = schema_fingerprint(&pool).await;
    let report = poolkeeper::db::migrate(&db.options)
        .await
        .expect("the older binary starts");
    assert_eq!(report.applied, 0);
    assert_eq!(schema_fingerprint(&pool).await, before);
    let report = poolkeeper::db::prepare_schema(Some(&db.options), &pool)
        .await
        .expect("and serves");
    assert_eq!(report.applied, 0);
    assert!(
        poolkeeper::db::migrations_current(&pool)
            .await
            .expect("readiness")
    );
}
