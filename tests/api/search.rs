//! The dashboard's search on indexes: asset tags and order refs by exact
//! value and by prefix whatever the case (`machines_asset_tag_prefix_idx`,
//! `reservations_order_ref_prefix_idx`), in the plan made for the value and
//! in the generic plan a prepared statement settles on.

use poolkeeper::dashboard::search::{machines_sql, reservations_sql};
use sqlx::PgConnection;

use crate::helpers::{Generated, generated_machines, spawn_app};

/// EXPLAIN of `sql` with the search's binds, in the plan mode `mode`.
async fn plan(
    conn: &mut PgConnection,
    mode: &str,
    sql: &str,
    org: i64,
    q: &str,
    id: Option<i64>,
) -> String {
    sqlx::query(sqlx::AssertSqlSafe(format!("SET plan_cache_mode = {mode}")))
        .execute(&mut *conn)
        .await
        .expect("plan mode");
    let mut explain = sqlx::query_scalar::<_, String>(sqlx::AssertSqlSafe(format!(
        "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) {sql}"
    )))
    .bind(org)
    .bind(q);
    if sql.contains("$4") {
        explain = explain.bind(id);
    }
    explain
        .bind(50_i64)
        .fetch_all(&mut *conn)
        .await
        .expect("explain")
        .join("\n")
}

/// 400,000 machines and 1,000,000 reservations of history (fleet size): both searches
/// answer from their indexes, never a scan of either table, and find by
/// prefix whatever the case.
#[tokio::test]
async fn search_stays_on_its_indexes_at_400000_machines_and_1000000_reservations() {
    let app = spawn_app().await;
    let org = app.org.id;
    let ids = generated_machines(
        &app.pool,
        org,
        400_000,
        Generated {
            tag: "'PK-' || lpad(g::text, 6, '0')",
            site: "'s' || lpad((g % 10)::text, 2, '0')",
            vendor: "'dell'",
            profile: "'epyc'",
            status: "'ready'",
        },
    )
    .await;
    let mut tx = app.pool.begin().await.expect("begin");
    sqlx::query("SET LOCAL statement_timeout = 0")
        .execute(&mut *tx)
        .await
        .expect("no statement timeout for the load");
    sqlx::query(
        "INSERT INTO reservations (org_id, order_ref, machine_id, spec, machine_snapshot, reason, hold_seconds,
                                   expires_at, state, ended_at, ended_by)
         SELECT $1, 'Ord-' || lpad(g::text, 7, '0'), $2 + g % 400000, '{}', '{}', 'history', 900,
                clock_timestamp() + interval '10 minutes', 'converted', clock_timestamp(), 'history'
           FROM generate_series(1, 1000000) g",
    )
    .bind(org)
    .bind(ids[0])
    .execute(&mut *tx)
    .await
    .expect("history");
    tx.commit().await.expect("commit the history");
    sqlx::query("ANALYZE")
        .execute(&app.pool)
        .await
        .expect("analyze");
    let mut conn = app.pool.acquire().await.expect("connection");
    let (machines, reservations) = (machines_sql(), reservations_sql());
    for mode in ["force_custom_plan", "force_generic_plan"] {
        for q in ["pk-0012", "PK-001234", "p"] {
            let p = plan(&mut conn, mode, &machines, org, q, None).await;
            assert!(
                p.contains("machines_asset_tag_prefix_idx") && !p.contains("Seq Scan"),
                "{mode} machines {q}:\n{p}"
            );
        }
        for (q, id) in [
            ("ord-00012", None),
            ("Ord-0001234", None),
            ("12345", Some(12345_i64)),
        ] {
            let p = plan(&mut conn, mode, &reservations, org, q, id).await;
            assert!(
                p.contains("reservations_order_ref_prefix_idx") && !p.contains("Seq Scan"),
                "{mode} reservations {q}:\n{p}"
            );
        }
    }
    // And what they find: by prefix whatever the case, exact first.
    let hits: Vec<(String, String, String, bool)> =
        sqlx::query_as(sqlx::AssertSqlSafe(machines.clone()))
            .bind(org)
            .bind("pk-0012")
            .bind(50_i64)
            .fetch_all(&mut *conn)
            .await
            .expect("machines");
    let tags: Vec<&str> = hits.iter().map(|h| h.0.as_str()).collect();
    assert_eq!(tags.len(), 50);
    assert_eq!(tags[0], "PK-001200");
    assert!(tags.iter().all(|t| t.starts_with("PK-0012")), "{tags:?}");
    let hits: Vec<(String, String, String, bool)> = sqlx::query_as(sqlx::AssertSqlSafe(machines))
        .bind(org)
        .bind("PK-001234")
        .bind(50_i64)
        .fetch_all(&mut *conn)
        .await
        .expect("machines");
    assert_eq!(hits.len(), 1);
    assert!(hits[0].3, "the exact tag is exact");
    let orders: Vec<(
        i64,
        String,
        String,
        String,
        chrono::DateTime<chrono::Utc>,
        bool,
    )> = sqlx::query_as(sqlx::AssertSqlSafe(reservations))
        .bind(org)
        .bind("ORD-000123")
        .bind(None::<i64>)
        .bind(50_i64)
        .fetch_all(&mut *conn)
        .await
        .expect("reservations");
    assert_eq!(orders.len(), 10, "Ord-0001230 to Ord-0001239: {orders:?}");
    assert!(orders.iter().all(|o| !o.5), "no ref is ORD-000123 exactly");
}
