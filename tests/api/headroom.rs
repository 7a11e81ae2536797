//! R18 and R19 under concurrency: headroom kept exactly for a segment, a
//! cap on one customer's live holds, both checked in the reserve's own
//! transaction under a turn, and healing that uses only its own segment's
//! and the repairs segment's headroom. Every race is many tasks on their
//! own connections released by a barrier, then invariants checked in SQL.

use std::sync::Arc;

use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::sync::Barrier;

use crate::helpers::{Generated, PROFILE, SITE, TestApp, generated_machines, literal, spawn_app};

/// `n` ready machines of the pool (SITE, PROFILE) named `{prefix}-{g}`.
async fn pool_of(app: &TestApp, prefix: &str, n: i64) {
    let (site, profile) = (literal(SITE), literal(PROFILE));
    let tag = format!("'{prefix}-' || g");
    generated_machines(
        &app.pool,
        app.org.id,
        n,
        Generated {
            tag: &tag,
            site: &site,
            vendor: "'dell'",
            profile: &profile,
            status: "'ready'",
        },
    )
    .await;
}

/// Keeps `machines` of the pool for `segment`, as `PUT /api/v1/headroom`
/// does: in the pool's turn.
async fn keep(app: &TestApp, segment: &str, machines: i32) {
    let mut tx = app.pool.begin().await.expect("begin");
    sqlx::query("SELECT pool_turn($1, $2, $3)")
        .bind(app.org.id)
        .bind(SITE)
        .bind(PROFILE)
        .execute(&mut *tx)
        .await
        .expect("the pool's turn");
    sqlx::query(
        "INSERT INTO headroom (org_id, site, profile, segment, machines, updated_by)
         VALUES ($1, $2, $3, $4, $5, 'test')
         ON CONFLICT (org_id, site, profile, segment)
         DO UPDATE SET machines = EXCLUDED.machines, updated_at = clock_timestamp()",
    )
    .bind(app.org.id)
    .bind(SITE)
    .bind(PROFILE)
    .bind(segment)
    .bind(machines)
    .execute(&mut *tx)
    .await
    .expect("keep");
    tx.commit().await.expect("commit");
}

fn order(name: &str, quantity: u8, segment: Option<&str>, customer: Option<&str>) -> Value {
    json!({"order_ref": name, "site": SITE, "profile": PROFILE, "quantity": quantity,
           "segment": segment, "customer_ref": customer})
}

/// The orders, each on a task of its own, released together.
async fn race(app: &Arc<TestApp>, orders: Vec<Value>) -> Vec<(StatusCode, Value)> {
    let barrier = Arc::new(Barrier::new(orders.len()));
    let tasks: Vec<_> = orders
        .into_iter()
        .map(|body| {
            let (app, barrier) = (app.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                app.post_json("/api/v1/reservations", body).await
            })
        })
        .collect();
    let mut answers = Vec::new();
    for t in tasks {
        answers.push(t.await.expect("order task"));
    }
    answers
}

fn count(answers: &[(StatusCode, Value)], code: StatusCode, error: Option<&str>) -> usize {
    answers
        .iter()
        .filter(|(c, b)| *c == code && error.is_none_or(|e| b["error"] == e))
        .count()
}

/// R1, R13 and R17 after every round: no machine held twice, no order
/// partly held, and every pool's counts add up.
async fn invariants(app: &TestApp, round: usize) {
    let (twice, partly, unbalanced): (i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM (SELECT machine_id FROM reservations WHERE state = 'held'
                                        GROUP BY machine_id HAVING count(*) > 1) t),
                (SELECT count(*) FROM (SELECT order_ref FROM reservations GROUP BY org_id, order_ref
                                        HAVING count(*) FILTER (WHERE state = 'held') NOT IN (0, max(quantity))) p),
                (SELECT count(*) FROM capacity_pools($1, NULL, NULL, NULL, NULL) c
                  WHERE c.total <> c.sellable + c.held + c.sold + c.not_ready)",
    )
    .bind(app.org.id)
    .fetch_one(&app.pool)
    .await
    .expect("invariants");
    assert_eq!((twice, partly, unbalanced), (0, 0, 0), "round {round}");
}

/// Ready machines of the pool with no live hold and no live service.
async fn sellable(app: &TestApp) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM machine_candidates($1, $2, $3, NULL, 100000)")
        .bind(app.org.id)
        .bind(SITE)
        .bind(PROFILE)
        .fetch_one(&app.pool)
        .await
        .expect("sellable")
}

async fn retire_all(app: &TestApp) {
    sqlx::query("UPDATE machines SET status = 'retired' WHERE status = 'ready'")
        .execute(&app.pool)
        .await
        .expect("retire");
}

/// 16 orders of no segment against 10 sellable machines of which 4 are kept
/// for `enterprise`: exactly 6 holds and 10 `409 reserved`, never one into
/// the headroom; then an order of the segment takes one. Orders of three in
/// the same race are never partly held and never reach into it either.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn orders_outside_a_segment_never_take_its_headroom_under_concurrency() {
    let app = Arc::new(spawn_app().await);
    keep(&app, "enterprise", 4).await;
    for round in 0..5 {
        pool_of(&app, &format!("H{round}"), 10).await;
        let answers = race(
            &app,
            (0..16)
                .map(|i| order(&format!("N-{round}-{i}"), 1, None, None))
                .collect(),
        )
        .await;
        assert_eq!(
            (
                count(&answers, StatusCode::CREATED, None),
                count(&answers, StatusCode::CONFLICT, Some("reserved"))
            ),
            (6, 10),
            "round {round}: {answers:?}"
        );
        let refused = answers
            .iter()
            .find(|(c, _)| *c == StatusCode::CONFLICT)
            .map(|(_, b)| b.clone())
            .unwrap_or_default();
        assert_eq!(refused["kept"], json!({"enterprise": 4}), "{refused}");
        assert_eq!(sellable(&app).await, 4, "round {round}");
        let (code, body) = app
            .post_json(
                "/api/v1/reservations",
                order(&format!("E-{round}"), 1, Some("enterprise"), None),
            )
            .await;
        assert_eq!(code, StatusCode::CREATED, "round {round}: {body}");
        invariants(&app, round).await;
        retire_all(&app).await;
    }
    // Orders of three: 10 sellable, 4 kept: two orders fit (6), the rest are
    // refused whole.
    pool_of(&app, "T", 10).await;
    let answers = race(
        &app,
        (0..6)
            .map(|i| order(&format!("TRIO-{i}"), 3, None, None))
            .collect(),
    )
    .await;
    assert_eq!(count(&answers, StatusCode::CREATED, None), 2, "{answers:?}");
    assert_eq!(
        count(&answers, StatusCode::CONFLICT, Some("reserved")),
        4,
        "{answers:?}"
    );
    assert_eq!(sellable(&app).await, 4);
    invariants(&app, 99).await;
    // Lost demand: every `reserved` refusal is recorded as such.
    let recorded: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM reservation_refusals WHERE reason = 'reserved' AND org_id = $1",
    )
    .bind(app.org.id)
    .fetch_one(&app.pool)
    .await
    .expect("refusals");
    assert_eq!(recorded, 5 * 10 + 4);
}

/// Two orders of one customer at the cap minus one, many rounds: exactly
/// one is held; the other is `409 customer_limit` naming the cap and the
/// customer's holds. Another customer is not limited by it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_customer_at_the_cap_minus_one_gets_exactly_one_more_hold() {
    let app = Arc::new(spawn_app().await);
    sqlx::query("UPDATE organizations SET customer_hold_limit = 3 WHERE id = $1")
        .bind(app.org.id)
        .execute(&app.pool)
        .await
        .expect("cap");
    for round in 0..10 {
        pool_of(&app, &format!("C{round}"), 8).await;
        let customer = format!("CUST-{round}");
        for i in 0..2 {
            let (code, body) = app
                .post_json(
                    "/api/v1/reservations",
                    order(&format!("P-{round}-{i}"), 1, None, Some(&customer)),
                )
                .await;
            assert_eq!(code, StatusCode::CREATED, "{body}");
        }
        let answers = race(
            &app,
            (0..2)
                .map(|i| order(&format!("R-{round}-{i}"), 1, None, Some(&customer)))
                .collect(),
        )
        .await;
        assert_eq!(
            count(&answers, StatusCode::CREATED, None),
            1,
            "round {round}: {answers:?}"
        );
        let (_, refused) = answers
            .iter()
            .find(|(c, _)| *c == StatusCode::CONFLICT)
            .expect("one refusal");
        assert_eq!(refused["error"], "customer_limit", "{refused}");
        assert_eq!(
            (refused["limit"].clone(), refused["holds"].clone()),
            (json!(3), json!(3))
        );
        let held: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM reservations WHERE customer_ref = $1 AND state = 'held'",
        )
        .bind(&customer)
        .fetch_one(&app.pool)
        .await
        .expect("held");
        assert_eq!(held, 3, "round {round}");
        let (code, body) = app
            .post_json(
                "/api/v1/reservations",
                order(&format!("O-{round}"), 1, None, Some("SOMEONE-ELSE")),
            )
            .await;
        assert_eq!(code, StatusCode::CREATED, "{body}");
        invariants(&app, round).await;
        retire_all(&app).await;
        sqlx::query("UPDATE reservations SET state = 'cancelled', ended_at = clock_timestamp(), ended_by = 'test', end_reason = 'next round' WHERE state = 'held'")
            .execute(&app.pool)
            .await
            .expect("end the round's holds");
    }
}

/// Headroom raised while orders race: the raise takes the pool's turn, so
/// every hold outside the segment was decided either before the raise (and
/// committed before it) or after it (and then saw it). Raised from 2 to all
/// 10 machines of the pool: no hold of no segment is created after the
/// raise, by the database clock of both writes (made in turn, so their
/// order is their commit order).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn headroom_raised_while_orders_race_is_never_undercut() {
    let app = Arc::new(spawn_app().await);
    keep(&app, "enterprise", 2).await;
    for round in 0..6 {
        pool_of(&app, &format!("U{round}"), 12).await;
        keep(&app, "enterprise", 2).await;
        let barrier = Arc::new(Barrier::new(9));
        let raise = {
            let (app, barrier) = (app.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                keep(&app, "enterprise", 12).await;
            })
        };
        let orders: Vec<_> = (0..8)
            .map(|i| {
                let (app, barrier) = (app.clone(), barrier.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    app.post_json(
                        "/api/v1/reservations",
                        order(&format!("Q-{round}-{i}"), 1, None, None),
                    )
                    .await
                })
            })
            .collect();
        raise.await.expect("raise");
        for o in orders {
            let (code, body) = o.await.expect("order");
            assert!(
                code == StatusCode::CREATED
                    || (code == StatusCode::CONFLICT && body["error"] == "reserved"),
                "round {round}: {code} {body}"
            );
        }
        let (after, before, kept_at): (i64, i64, i64) = sqlx::query_as(
            "SELECT (SELECT count(*) FROM reservations r
                      WHERE r.order_ref LIKE $1 AND r.state = 'held' AND r.created_at > h.updated_at),
                    (SELECT count(*) FROM reservations r
                      WHERE r.order_ref LIKE $1 AND r.state = 'held' AND r.created_at < h.updated_at),
                    h.machines::bigint
               FROM headroom h
              WHERE h.org_id = $2 AND h.segment = 'enterprise'",
        )
        .bind(format!("Q-{round}-%"))
        .bind(app.org.id)
        .fetch_one(&app.pool)
        .await
        .expect("holds around the raise");
        assert_eq!(after, 0, "round {round}: a hold after the raise");
        assert_eq!(kept_at, 12);
        assert_eq!(sellable(&app).await, 12 - before, "round {round}");
        invariants(&app, round).await;
        retire_all(&app).await;
    }
}

/// R15 with R18: a rack into maintenance heals into the headroom of the
/// repairs segment the organization names, never into another segment's.
/// Pool of 4: 2 held (no segment), 2 sellable, 1 kept for `repairs`, 1 for
/// `enterprise`. The first hold moves (into the repairs headroom); the
/// second would take the enterprise machine: its order is cancelled.
#[tokio::test]
async fn healing_uses_the_repairs_headroom_and_never_another_segments() {
    let app = spawn_app().await;
    sqlx::query("UPDATE organizations SET repairs_segment = 'repairs' WHERE id = $1")
        .bind(app.org.id)
        .execute(&app.pool)
        .await
        .expect("repairs segment");
    pool_of(&app, "K", 2).await;
    for i in 0..2 {
        let (code, body) = app
            .post_json(
                "/api/v1/reservations",
                order(&format!("K-ORD-{i}"), 1, None, None),
            )
            .await;
        assert_eq!(code, StatusCode::CREATED, "{body}");
    }
    pool_of(&app, "S", 2).await;
    keep(&app, "repairs", 1).await;
    keep(&app, "enterprise", 1).await;
    let (code, changed) = app
        .post_json(
            "/api/v1/status-changes",
            json!({"asset_tags": ["K-1", "K-2"], "status": "maintenance"}),
        )
        .await;
    assert_eq!(code, StatusCode::OK, "{changed}");
    let mut outcomes: Vec<&str> = changed["holds"]
        .as_array()
        .expect("holds")
        .iter()
        .map(|h| h["outcome"].as_str().unwrap_or_default())
        .collect();
    outcomes.sort_unstable();
    assert_eq!(outcomes, ["cancelled", "moved"], "{changed}");
    // The cancelled order is told why: a machine is left, but it is kept
    // for another segment, not "no equivalent machine".
    let cancelled = changed["holds"]
        .as_array()
        .expect("holds")
        .iter()
        .find(|h| h["outcome"] == "cancelled")
        .expect("a cancelled hold");
    let reason = cancelled["reason"].as_str().unwrap_or_default();
    assert!(
        reason.ends_with("; the equivalent machines left in par1 are kept for segment enterprise"),
        "{changed}"
    );
    assert_eq!(sellable(&app).await, 1, "the enterprise machine is left");
    invariants(&app, 0).await;
}

/// R17's alternatives on a refusal: sold out in one site, the order's
/// answer names the sites whose same pool could fill it now, most first,
/// and leaves out a site that could not (too few, or kept for a segment).
#[tokio::test]
async fn a_refused_order_names_the_sites_that_could_fill_it() {
    let app = spawn_app().await;
    let profile = literal(PROFILE);
    for (site, n) in [("ams9", 12), ("fra2", 5), ("lon1", 2)] {
        let (s, tag) = (literal(site), format!("'{site}-' || g"));
        generated_machines(
            &app.pool,
            app.org.id,
            n,
            Generated {
                tag: &tag,
                site: &s,
                vendor: "'dell'",
                profile: &profile,
                status: "'ready'",
            },
        )
        .await;
    }
    // fra2 keeps 3 for enterprise: 2 available to an order of no segment.
    sqlx::query(
        "INSERT INTO headroom (org_id, site, profile, segment, machines, updated_by)
         VALUES ($1, 'fra2', $2, 'enterprise', 3, 'test')",
    )
    .bind(app.org.id)
    .bind(PROFILE)
    .execute(&app.pool)
    .await
    .expect("headroom");
    let (code, body) = app
        .post_json("/api/v1/reservations", order("SOLD-OUT", 2, None, None))
        .await;
    assert_eq!(code, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"], "unavailable", "{body}");
    assert_eq!(
        body["alternatives"],
        json!([{"site": "ams9", "profile": PROFILE, "available": 12}, {"site": "fra2", "profile": PROFILE, "available": 2}, {"site": "lon1", "profile": PROFILE, "available": 2}]),
        "{body}"
    );
    // Of the enterprise segment, fra2 offers all 5.
    let (code, body) = app
        .post_json(
            "/api/v1/reservations",
            order("SOLD-OUT-E", 3, Some("enterprise"), None),
        )
        .await;
    assert_eq!(code, StatusCode::CONFLICT, "{body}");
    assert_eq!(
        body["alternatives"],
        json!([{"site": "ams9", "profile": PROFILE, "available": 12}, {"site": "fra2", "profile": PROFILE, "available": 5}]),
        "{body}"
    );
}
