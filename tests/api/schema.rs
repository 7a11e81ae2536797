//! R1/R2/R10: the arbiters live in the database, under names that say what
//! they protect.

use crate::helpers::migrated_db;
use crate::helpers::{FakeHold, FakeMachine};

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

/// R2: the states a reservation and an event may name are the rows of
/// reservation_states. Each column checks them with a CHECK (no lock on the
/// table's rows per write); the CHECKs are read from the catalog
/// and compared with the table, so a state added to one and not the other
/// fails here.
#[tokio::test]
async fn state_checks_list_exactly_the_states_of_the_table() {
    let db = migrated_db().await;
    let pool = db.pool().await;
    let states = || async {
        sqlx::query_scalar::<_, String>("SELECT state FROM reservation_states ORDER BY state")
            .fetch_all(&pool)
            .await
            .expect("states")
    };
    let table = states().await;
    assert_eq!(table, ["cancelled", "converted", "expired", "held"]);
    let check = |name: &'static str| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, String>(
                "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = $1",
            )
            .bind(name)
            .fetch_one(&pool)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"))
        }
    };
    let reservations = check("reservations_state_known").await;
    assert!(reservations.contains("state"), "{reservations}");
    assert_eq!(states_listed(&reservations), table, "{reservations}");
    let events = check("reservation_events_states_known").await;
    // Two lists, one per column, each the whole table.
    let (from, to) = events
        .split_once("to_state")
        .unwrap_or_else(|| panic!("both columns checked: {events}"));
    assert!(from.contains("from_state"), "{events}");
    assert_eq!(states_listed(from), table, "{events}");
    assert_eq!(states_listed(to), table, "{events}");

    // And the comparison itself can fail: one more state in the table.
    sqlx::query(
        "INSERT INTO reservation_states (state, holds_capacity, description) VALUES ('parked', false, 'test')",
    )
    .execute(&pool)
    .await
    .expect("insert");
    assert_ne!(states_listed(&reservations), states().await);
}

/// The quoted literals of a constraint's text, sorted and deduplicated.
fn states_listed(text: &str) -> Vec<String> {
    let mut out: Vec<String> = text
        .split('\'')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect();
    out.sort();
    out.dedup();
    out
}

/// A reservation's organization is its machine's (one key on the machine
/// of the organization, not two separate keys): a row
/// naming another organization's machine is refused by the database.
#[tokio::test]
async fn a_reservation_names_a_machine_of_its_own_organization() {
    let db = migrated_db().await;
    let pool = db.pool().await;
    let orgs: Vec<i64> = sqlx::query_scalar(
        "INSERT INTO organizations (slug, name) VALUES ('fk-a', 'A'), ('fk-b', 'B') RETURNING id",
    )
    .fetch_all(&pool)
    .await
    .expect("orgs");
    let machine = FakeMachine::new()
        .tag("fk-1")
        .site("s1")
        .profile("p")
        .create(&pool, orgs[0])
        .await;
    let insert = |org: i64| {
        FakeHold::on(machine)
            .order("fk-order")
            .bare()
            .reason("test")
            .hold_seconds(60)
            .try_create(&pool, org)
    };
    let err = insert(orgs[1])
        .await
        .expect_err("another organization's machine");
    assert_eq!(
        poolkeeper::db::sqlstate(&err).as_deref(),
        Some("23503"),
        "{err}"
    );
    insert(orgs[0])
        .await
        .expect("its own organization's machine");
}
