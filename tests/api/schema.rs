//! R1/R2/R10: the arbiters live in the database, under names that say what
//! they protect.

use crate::helpers::migrated_db;

/// R2: the states that hold capacity are a table; the partial unique index
/// must list exactly those. Reads the predicate from the catalog, so adding
/// a holding state without changing the index (or the reverse) fails here.
#[tokio::test]
async fn holding_states_table_matches_the_partial_index_predicate() {
    let db = migrated_db().await;
    let pool = db.pool().await;
    let (unique, predicate, columns): (bool, String, String) = sqlx::query_as(
        "SELECT i.indisunique, pg_get_expr(i.indpred, i.indrelid), pg_get_indexdef(i.indexrelid)
           FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
          WHERE c.relname = 'reservations_one_holder_per_machine'",
    )
    .fetch_one(&pool)
    .await
    .expect("the arbiter index exists");
    assert!(unique, "the arbiter must be a unique index");
    assert!(
        columns.contains("(machine_id)"),
        "it must be on the machine: {columns}"
    );

    let holding: Vec<String> = sqlx::query_scalar(
        "SELECT state FROM reservation_states WHERE holds_capacity ORDER BY state",
    )
    .fetch_all(&pool)
    .await
    .expect("states");
    let in_predicate = states_named_in(&predicate);
    assert_eq!(
        in_predicate, holding,
        "index predicate {predicate:?} disagrees with reservation_states"
    );

    // And the comparison itself can fail: declare one more holding state.
    sqlx::query("UPDATE reservation_states SET holds_capacity = true WHERE state = 'expired'")
        .execute(&pool)
        .await
        .expect("update");
    let holding: Vec<String> = sqlx::query_scalar(
        "SELECT state FROM reservation_states WHERE holds_capacity ORDER BY state",
    )
    .fetch_all(&pool)
    .await
    .expect("states");
    assert_ne!(states_named_in(&predicate), holding);
}

/// The quoted literals of a predicate such as `(state = 'held'::text)` or
/// `(state = ANY (ARRAY['held'::text, 'x'::text]))`, sorted.
fn states_named_in(predicate: &str) -> Vec<String> {
    assert!(
        predicate.contains("state"),
        "predicate must be on state: {predicate}"
    );
    let mut out: Vec<String> = predicate
        .split('\'')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect();
    out.sort();
    out
}

#[tokio::test]
async fn the_arbiters_have_names_that_say_what_they_protect() {
    let db = migrated_db().await;
    let pool = db.pool().await;
    let unique_indexes: Vec<String> = sqlx::query_scalar(
        "SELECT c.relname::text FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
          WHERE i.indisunique AND c.relnamespace = 'public'::regnamespace ORDER BY 1",
    )
    .fetch_all(&pool)
    .await
    .expect("indexes");
    for name in [
        "reservations_one_holder_per_machine",
        "reservations_order_ref_unique_per_org",
        "service_links_one_live_per_machine",
        "machines_asset_tag_unique_per_org",
    ] {
        assert!(
            unique_indexes.iter().any(|n| n == name),
            "missing {name} in {unique_indexes:?}"
        );
    }
    let check: String = sqlx::query_scalar(
        "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = 'leases_expiry_after_acquisition'",
    )
    .fetch_one(&pool)
    .await
    .expect("L1 check constraint");
    assert!(check.contains("expires_at > acquired_at"), "{check}");
}

/// Time columns default to clock_timestamp(), not now() (L1 and the traps).
#[tokio::test]
async fn time_defaults_use_the_real_clock() {
    let db = migrated_db().await;
    let pool = db.pool().await;
    let defaults: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT table_name::text, column_name::text, column_default::text FROM information_schema.columns
          WHERE table_schema = 'public' AND data_type LIKE 'timestamp%' AND column_default IS NOT NULL
            AND table_name <> '_sqlx_migrations'",
    )
    .fetch_all(&pool)
    .await
    .expect("columns");
    assert!(
        defaults.len() >= 10,
        "expected many time defaults, got {defaults:?}"
    );
    for (table, column, default) in defaults {
        assert_eq!(default, "clock_timestamp()", "{table}.{column}");
    }
}
