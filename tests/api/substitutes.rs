//! R20: substitutes declared by staff (`PUT`/`GET /api/v1/substitutes`,
//! validated, audited) and reserves that allow them: the asked pool first,
//! then the first substitute that can fill the whole order, in the
//! reserve's own transaction, with R4, R13, R18 and R19 holding for the
//! substitute as for the asked pool. Races are many tasks on their own
//! connections released by a barrier, then invariants checked in SQL.

use std::sync::Arc;

use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::sync::Barrier;

use crate::helpers::{
    Generated, POLL_BOUND, SITE, TestApp, generated_machines, literal, spawn_app, until,
};

/// The asked profile and its two declared substitutes.
const ASKED: &str = "epyc-9354-256g";
const BETTER: &str = "epyc-9354-512g";
const BEST: &str = "epyc-9354-1t";

/// `n` ready machines of (SITE, `profile`) named `{prefix}-{g}`.
async fn machines(app: &TestApp, prefix: &str, profile: &str, n: i64) {
    machines_at(app, SITE, prefix, profile, n).await;
}

/// `n` ready machines of (`site`, `profile`) named `{prefix}-{g}`.
async fn machines_at(app: &TestApp, site: &str, prefix: &str, profile: &str, n: i64) {
    if n == 0 {
        return;
    }
    let (site, profile) = (literal(site), literal(profile));
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

/// One retired machine of each profile: the profiles are known (a
/// declaration names only those) and nothing is sellable.
async fn seed(app: &TestApp) {
    for (i, profile) in [ASKED, BETTER, BEST].iter().enumerate() {
        machines(app, &format!("seed{i}"), profile, 1).await;
    }
    retire_all(app).await;
}

async fn put_substitutes(app: &TestApp, body: Value) -> (StatusCode, Value) {
    let r = app
        .http
        .put(app.url("/api/v1/substitutes"))
        .bearer_auth(&app.org.inventory_token)
        .json(&body)
        .send()
        .await
        .expect("PUT /substitutes");
    let status = r.status();
    (status, r.json().await.unwrap_or(Value::Null))
}

async fn declare(app: &TestApp, profile: &str, substitutes: &[&str], segments: &[&str]) {
    let (code, body) = put_substitutes(
        app,
        json!({"profile": profile, "substitutes": substitutes, "segments": segments}),
    )
    .await;
    assert_eq!(code, StatusCode::OK, "{body}");
}

async fn get(app: &TestApp, path: &str) -> (StatusCode, Value) {
    let r = app
        .http
        .get(app.url(path))
        .bearer_auth(&app.org.token)
        .send()
        .await
        .expect("GET");
    let status = r.status();
    (status, r.json().await.unwrap_or(Value::Null))
}

fn order(name: &str, profile: &str, quantity: u8, allowed: bool) -> Value {
    json!({"order_ref": name, "site": SITE, "profile": profile, "quantity": quantity,
           "substitutes": if allowed { "allowed" } else { "none" }})
}

/// The orders, each on a task of its own, released together.
async fn race(app: &Arc<TestApp>, orders: Vec<Value>) -> Vec<(Value, StatusCode, Value)> {
    let barrier = Arc::new(Barrier::new(orders.len()));
    let tasks: Vec<_> = orders
        .into_iter()
        .map(|body| {
            let (app, barrier) = (app.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                let (code, answer) = app.post_json("/api/v1/reservations", body.clone()).await;
                (body, code, answer)
            })
        })
        .collect();
    let mut answers = Vec::new();
    for t in tasks {
        answers.push(t.await.expect("order task"));
    }
    answers
}

/// After every round: no machine held twice, no order partly held, no
/// order of mixed profiles, every held order of the asked profile or a
/// substitute told as such, and every pool's counts add up.
async fn invariants(app: &TestApp, round: usize) {
    let (twice, partly, mixed, mistold, unbalanced): (i64, i64, i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM (SELECT machine_id FROM reservations WHERE state = 'held'
                                        GROUP BY machine_id HAVING count(*) > 1) t),
                (SELECT count(*) FROM (SELECT order_ref FROM reservations GROUP BY org_id, order_ref
                                        HAVING count(*) FILTER (WHERE state = 'held') NOT IN (0, max(quantity))) p),
                (SELECT count(*) FROM (SELECT r.order_ref FROM reservations r JOIN machines m ON m.id = r.machine_id
                                        WHERE r.state = 'held'
                                        GROUP BY r.org_id, r.order_ref HAVING count(DISTINCT m.profile) > 1) x),
                (SELECT count(*) FROM reservations r JOIN machines m ON m.id = r.machine_id
                  WHERE r.state = 'held'
                    AND (m.profile <> r.machine_snapshot->>'profile'
                         OR (r.profile_asked IS NOT NULL) <> (m.profile <> coalesce(r.profile_asked, m.profile))
                         OR m.profile = r.profile_asked)),
                (SELECT count(*) FROM capacity_pools($1, NULL, NULL, NULL, NULL) c
                  WHERE c.total <> c.sellable + c.held + c.sold + c.not_ready)",
    )
    .bind(app.org.id)
    .fetch_one(&app.pool)
    .await
    .expect("invariants");
    assert_eq!(
        (twice, partly, mixed, mistold, unbalanced),
        (0, 0, 0, 0, 0),
        "round {round}"
    );
}

/// Held machines of `profile` for orders named `like`.
async fn held_of(app: &TestApp, like: &str, profile: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM reservations r JOIN machines m ON m.id = r.machine_id
          WHERE r.org_id = $1 AND r.state = 'held' AND r.order_ref LIKE $2 AND m.profile = $3",
    )
    .bind(app.org.id)
    .bind(like)
    .bind(profile)
    .fetch_one(&app.pool)
    .await
    .expect("held")
}

async fn sellable(app: &TestApp, profile: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM machine_candidates($1, $2, $3, NULL, 100000)")
        .bind(app.org.id)
        .bind(SITE)
        .bind(profile)
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

async fn audit_rows(app: &TestApp) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM audit_log WHERE action LIKE 'substitutes.%'")
        .fetch_one(&app.pool)
        .await
        .expect("audit")
}

/// A profile listed as its own substitute, a duplicate, more than 8, a
/// malformed body: `400`; a profile of which the organization has no
/// machine: `422 unknown_profile`; nothing written, nothing audited. A good one is
/// written, listed and audited once; the same PUT again writes nothing; an
/// empty list removes it.
#[tokio::test]
async fn declarations_are_checked_audited_and_listed() {
    let app = spawn_app().await;
    machines(&app, "A", ASKED, 1).await;
    machines(&app, "B", BETTER, 1).await;
    machines(&app, "C", BEST, 1).await;
    let nine: Vec<String> = (0..9).map(|i| format!("p{i}")).collect();
    for bad in [
        json!({"profile": ASKED, "substitutes": [BETTER, ASKED]}),
        json!({"profile": ASKED, "substitutes": [BETTER, BEST, BETTER]}),
        json!({"profile": ASKED, "substitutes": nine}),
        json!({"profile": ASKED, "substitutes": [BETTER], "segments": ["Not A Segment"]}),
        json!({"profile": ASKED, "substitutes": BETTER}),
        // More than 16 segments as sent, even if they repeat.
        json!({"profile": ASKED, "substitutes": [BETTER], "segments": vec!["enterprise"; 17]}),
        json!({"profile": ASKED}),
    ] {
        let (code, body) = put_substitutes(&app, bad.clone()).await;
        assert_eq!(code, StatusCode::BAD_REQUEST, "{bad} gave {body}");
        assert_eq!(body["error"], "invalid", "{body}");
    }
    // A profile of which the organization has no machine: 422, nothing written.
    for unknown in [
        json!({"profile": ASKED, "substitutes": [BETTER, "epyc-unknown"]}),
        json!({"profile": "epyc-unknown", "substitutes": [BETTER]}),
    ] {
        let (code, body) = put_substitutes(&app, unknown.clone()).await;
        assert_eq!(
            code,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{unknown} gave {body}"
        );
        assert_eq!(body["error"], "unknown_profile", "{body}");
        assert!(
            body["message"]
                .as_str()
                .is_some_and(|m| m.contains("epyc-unknown")),
            "{body}"
        );
    }
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM substitutes")
        .fetch_one(&app.pool)
        .await
        .expect("rows");
    assert_eq!((rows, audit_rows(&app).await), (0, 0));

    let body = json!({"profile": ASKED, "substitutes": [BETTER, BEST], "segments": ["enterprise"]});
    let (code, first) = put_substitutes(&app, body.clone()).await;
    assert_eq!(code, StatusCode::OK, "{first}");
    assert_eq!(first["substitutes"], json!([BETTER, BEST]));
    assert_eq!(first["segments"], json!(["enterprise"]));
    assert_eq!(first["updated_by"], "inventory-only");
    let (code, again) = put_substitutes(&app, body).await;
    assert_eq!((code, &again), (StatusCode::OK, &first));
    assert_eq!(audit_rows(&app).await, 1);
    let (code, listed) = get(&app, "/api/v1/substitutes").await;
    assert_eq!(code, StatusCode::OK, "{listed}");
    assert_eq!(listed["substitutes"], json!([first]));
    let (actor, action, object): (String, String, String) = sqlx::query_as(
        "SELECT actor, action, object FROM audit_log WHERE action LIKE 'substitutes.%' ORDER BY id",
    )
    .fetch_one(&app.pool)
    .await
    .expect("audit row");
    assert_eq!(
        (actor.as_str(), action.as_str(), object.as_str()),
        (
            "token:inventory-only",
            "substitutes.set",
            "profile:epyc-9354-256g"
        )
    );
    // The orders token has no inventory scope.
    let r = app
        .http
        .get(app.url("/api/v1/substitutes"))
        .bearer_auth(&app.org.orders_token)
        .send()
        .await
        .expect("GET");
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    // Another organization sees none of it.
    let r = app
        .http
        .get(app.url("/api/v1/substitutes"))
        .bearer_auth(&app.other.token)
        .send()
        .await
        .expect("GET");
    let other: Value = r.json().await.expect("json");
    assert_eq!(other["substitutes"], json!([]));

    let (code, removed) = put_substitutes(&app, json!({"profile": ASKED, "substitutes": []})).await;
    assert_eq!(code, StatusCode::OK, "{removed}");
    assert_eq!(removed["substitutes"], json!([]));
    let (_, listed) = get(&app, "/api/v1/substitutes").await;
    assert_eq!(listed["substitutes"], json!([]));
    assert_eq!(audit_rows(&app).await, 2);
}

/// The first substitute that can fill the WHOLE order serves it (one that
/// could fill part of it is passed over); the answer, the reads by id and
/// by order_ref, and the event say what was asked and what served; the
/// demand of the asked pool records it as `substituted`. Without
/// `"substitutes": "allowed"` the same order is refused; a replay answers
/// the order; a replay that changes the setting is `422`.
#[tokio::test]
async fn the_first_substitute_that_fills_the_whole_order_serves_it_and_is_told() {
    let app = spawn_app().await;
    machines(&app, "A", ASKED, 1).await;
    machines(&app, "B", BETTER, 1).await;
    machines(&app, "C", BEST, 3).await;
    declare(&app, ASKED, &[BETTER, BEST], &[]).await;

    let (code, refused) = app
        .post_json("/api/v1/reservations", order("EXACT", ASKED, 2, false))
        .await;
    assert_eq!(code, StatusCode::CONFLICT, "{refused}");
    assert_eq!(refused["error"], "unavailable");

    let (code, served) = app
        .post_json("/api/v1/reservations", order("ORD-2", ASKED, 2, true))
        .await;
    assert_eq!(code, StatusCode::CREATED, "{served}");
    let members = served["reservations"].as_array().expect("an order of two");
    assert_eq!(members.len(), 2, "{served}");
    for r in members {
        assert_eq!(r["machine"]["profile"], BEST, "{r}");
        assert_eq!(r["profile_asked"], ASKED, "{r}");
        assert_eq!(r["substituted"], true, "{r}");
        assert!(
            r["reason"]
                .as_str()
                .is_some_and(|s| s.contains("substitute for profile epyc-9354-256g")),
            "{r}"
        );
    }
    // An order of one the asked pool can fill: served by it, told so.
    let (code, own) = app
        .post_json("/api/v1/reservations", order("ORD-1", ASKED, 1, true))
        .await;
    assert_eq!(code, StatusCode::CREATED, "{own}");
    assert_eq!(
        (
            &own["machine"]["profile"],
            &own["profile_asked"],
            &own["substituted"]
        ),
        (&json!(ASKED), &json!(ASKED), &json!(false))
    );
    // The next one of one: the asked pool is empty now, BETTER serves.
    let (code, one) = app
        .post_json("/api/v1/reservations", order("ORD-3", ASKED, 1, true))
        .await;
    assert_eq!(code, StatusCode::CREATED, "{one}");
    assert_eq!(one["machine"]["profile"], BETTER);
    assert_eq!(one["substituted"], true);

    let id = one["id"].as_i64().expect("id");
    let (_, by_id) = get(&app, &format!("/api/v1/reservations/{id}")).await;
    let (_, by_ref) = get(&app, "/api/v1/reservations?order_ref=ORD-3").await;
    for read in [&by_id, &by_ref] {
        assert_eq!(read["profile_asked"], ASKED, "{read}");
        assert_eq!(read["substituted"], true, "{read}");
        assert_eq!(read["machine"]["profile"], BETTER, "{read}");
    }
    let (_, order2) = get(&app, "/api/v1/orders/ORD-2").await;
    assert_eq!(
        order2["reservations"][0]["profile_asked"], ASKED,
        "{order2}"
    );
    let (_, events) = get(&app, &format!("/api/v1/reservations/{id}/events")).await;
    assert!(
        events
            .to_string()
            .contains("served by epyc-9354-512g, asked epyc-9354-256g"),
        "{events}"
    );

    // R6: the replay answers the order; another setting is another request.
    let (code, replay) = app
        .post_json("/api/v1/reservations", order("ORD-3", ASKED, 1, true))
        .await;
    assert_eq!((code, &replay["id"]), (StatusCode::OK, &one["id"]));
    let (code, mismatch) = app
        .post_json("/api/v1/reservations", order("ORD-3", ASKED, 1, false))
        .await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{mismatch}");
    assert_eq!(mismatch["fields"], json!(["substitutes"]));

    // Demand: one `substituted` row per order served by a substitute,
    // against the asked pool, naming the profile served.
    let rows: Vec<(String, String, i32, Option<String>)> = sqlx::query_as(
        "SELECT reason, profile, quantity::int, profile_served FROM reservation_refusals
          WHERE org_id = $1 ORDER BY id",
    )
    .bind(app.org.id)
    .fetch_all(&app.pool)
    .await
    .expect("demand");
    assert_eq!(
        rows,
        vec![
            ("unavailable".into(), ASKED.into(), 2, None),
            ("substituted".into(), ASKED.into(), 2, Some(BEST.into())),
            ("substituted".into(), ASKED.into(), 1, Some(BETTER.into())),
        ]
    );
    // Counted per pool asked and pool served.
    let text = app.metrics_text().await;
    let served = |profile: &str, substituted: &str| -> Vec<String> {
        text.lines()
            .filter(|l| {
                l.starts_with("poolkeeper_orders_served_total{")
                    && l.contains("profile_asked=\"epyc-9354-256g\"")
                    && l.contains(&format!("profile_served=\"{profile}\""))
                    && l.contains(&format!("substituted=\"{substituted}\""))
            })
            .map(|l| l.rsplit(' ').next().unwrap_or_default().to_owned())
            .collect()
    };
    assert_eq!(served(BEST, "true"), vec!["1"], "{text}");
    assert_eq!(served(BETTER, "true"), vec!["1"], "{text}");
    assert_eq!(served(ASKED, "false"), vec!["1"], "{text}");
    // Nothing left of any of them: refused, counted against the asked pool.
    let (code, none) = app
        .post_json("/api/v1/reservations", order("ORD-4", ASKED, 2, true))
        .await;
    assert_eq!(code, StatusCode::CONFLICT, "{none}");
    assert_eq!(none["error"], "unavailable", "{none}");
}

/// A declaration for some segments serves only their orders; a vendor
/// named on the order applies to the substitutes too.
#[tokio::test]
async fn a_declaration_for_a_segment_and_a_named_vendor_bind_the_substitutes() {
    let app = spawn_app().await;
    machines(&app, "B", BETTER, 2).await;
    machines(&app, "A", ASKED, 1).await;
    sqlx::query("UPDATE machines SET status = 'retired' WHERE profile = $1")
        .bind(ASKED)
        .execute(&app.pool)
        .await
        .expect("retire the asked pool");
    declare(&app, ASKED, &[BETTER], &["enterprise"]).await;
    let (code, body) = app
        .post_json("/api/v1/reservations", order("NOSEG", ASKED, 1, true))
        .await;
    assert_eq!(
        (code, &body["error"]),
        (StatusCode::CONFLICT, &json!("unavailable"))
    );
    let mut ent = order("ENT", ASKED, 1, true);
    ent["segment"] = json!("enterprise");
    let (code, body) = app.post_json("/api/v1/reservations", ent).await;
    assert_eq!(code, StatusCode::CREATED, "{body}");
    assert_eq!(body["machine"]["profile"], BETTER);
    let mut hpe = order("HPE", ASKED, 1, true);
    hpe["segment"] = json!("enterprise");
    hpe["vendor"] = json!("hpe");
    let (code, body) = app.post_json("/api/v1/reservations", hpe).await;
    assert_eq!(
        (code, &body["error"]),
        (StatusCode::CONFLICT, &json!("unavailable"))
    );
}

/// 20 orders with substitutes allowed and 20 without, released together
/// against 5 machines of the asked profile and 5 of its first substitute,
/// many rounds: exactly 10 holds, 5 of each profile; an order without
/// substitutes is never served by one; every refusal is `unavailable` or
/// `contended` (R4), and once the race is over nothing is left to refuse
/// for.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn twenty_orders_on_five_and_five_take_exactly_ten_machines() {
    let app = Arc::new(spawn_app().await);
    seed(&app).await;
    declare(&app, ASKED, &[BETTER], &[]).await;
    for round in 0..6 {
        machines(&app, &format!("A{round}"), ASKED, 5).await;
        machines(&app, &format!("B{round}"), BETTER, 5).await;
        let mut orders: Vec<Value> = (0..20)
            .map(|i| order(&format!("S-{round}-{i}"), ASKED, 1, true))
            .collect();
        orders.extend((0..20).map(|i| order(&format!("X-{round}-{i}"), ASKED, 1, false)));
        let answers = race(&app, orders).await;
        let created = answers
            .iter()
            .filter(|(_, c, _)| *c == StatusCode::CREATED)
            .count();
        assert_eq!(created, 10, "round {round}: {answers:?}");
        for (asked, code, body) in &answers {
            if *code == StatusCode::CREATED {
                let exact = asked["substitutes"] == "none";
                assert!(
                    !exact || body["machine"]["profile"] == ASKED,
                    "round {round}: an exact order was substituted: {body}"
                );
                assert_eq!(
                    body["substituted"],
                    json!(body["machine"]["profile"] != ASKED),
                    "{body}"
                );
            } else {
                assert_eq!(*code, StatusCode::CONFLICT, "round {round}: {body}");
                assert!(
                    body["error"] == "unavailable" || body["error"] == "contended",
                    "round {round}: {body}"
                );
            }
        }
        let pattern = format!("%-{round}-%");
        assert_eq!(held_of(&app, &pattern, ASKED).await, 5, "round {round}");
        assert_eq!(held_of(&app, &pattern, BETTER).await, 5, "round {round}");
        assert_eq!(
            (sellable(&app, ASKED).await, sellable(&app, BETTER).await),
            (0, 0)
        );
        invariants(&app, round).await;
        retire_all(&app).await;
    }
}

/// Orders of 3 racing on a pool of 4 whose substitute has 3: never an
/// order of mixed profiles, never part of one; one order of each pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn orders_of_three_on_four_and_three_are_never_mixed() {
    let app = Arc::new(spawn_app().await);
    seed(&app).await;
    declare(&app, ASKED, &[BETTER], &[]).await;
    for round in 0..6 {
        machines(&app, &format!("A{round}"), ASKED, 4).await;
        machines(&app, &format!("B{round}"), BETTER, 3).await;
        let answers = race(
            &app,
            (0..8)
                .map(|i| order(&format!("T-{round}-{i}"), ASKED, 3, true))
                .collect(),
        )
        .await;
        let created: Vec<&Value> = answers
            .iter()
            .filter(|(_, c, _)| *c == StatusCode::CREATED)
            .map(|(_, _, b)| b)
            .collect();
        assert_eq!(created.len(), 2, "round {round}: {answers:?}");
        let pattern = format!("T-{round}-%");
        assert_eq!(held_of(&app, &pattern, ASKED).await, 3, "round {round}");
        assert_eq!(held_of(&app, &pattern, BETTER).await, 3, "round {round}");
        invariants(&app, round).await;
        retire_all(&app).await;
    }
}

/// The substitute pool keeps 2 for `enterprise`: orders of no segment
/// never take those 2 through substitution, under concurrency; an order of
/// the segment may.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_substitutes_headroom_is_kept_from_orders_it_serves() {
    let app = Arc::new(spawn_app().await);
    seed(&app).await;
    declare(&app, ASKED, &[BETTER], &[]).await;
    let (code, body) = app
        .http
        .put(app.url("/api/v1/headroom"))
        .bearer_auth(&app.org.inventory_token)
        .json(&json!({"site": SITE, "profile": BETTER, "segment": "enterprise", "machines": 2}))
        .send()
        .await
        .map(|r| (r.status(), ()))
        .expect("PUT /headroom");
    assert_eq!(code, StatusCode::OK, "{body:?}");
    for round in 0..6 {
        machines(&app, &format!("A{round}"), ASKED, 1).await;
        machines(&app, &format!("B{round}"), BETTER, 6).await;
        let answers = race(
            &app,
            (0..12)
                .map(|i| order(&format!("H-{round}-{i}"), ASKED, 1, true))
                .collect(),
        )
        .await;
        let created = answers
            .iter()
            .filter(|(_, c, _)| *c == StatusCode::CREATED)
            .count();
        assert_eq!(created, 1 + 4, "round {round}: {answers:?}");
        assert_eq!(sellable(&app, BETTER).await, 2, "round {round}");
        assert!(
            answers.iter().any(|(_, _, b)| b["error"] == "reserved"),
            "round {round}: {answers:?}"
        );
        let mut ent = order(&format!("E-{round}"), ASKED, 1, true);
        ent["segment"] = json!("enterprise");
        let (code, body) = app.post_json("/api/v1/reservations", ent).await;
        assert_eq!(code, StatusCode::CREATED, "{body}");
        assert_eq!(body["machine"]["profile"], BETTER);
        invariants(&app, round).await;
        retire_all(&app).await;
    }
}

/// A customer at the cap minus one, two orders at once on different
/// profiles of one substitute list (each may be served by the other's
/// pool): exactly one hold (R19 counts every profile).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_customer_at_the_cap_minus_one_gets_one_hold_across_profiles() {
    let app = Arc::new(spawn_app().await);
    seed(&app).await;
    declare(&app, ASKED, &[BETTER], &[]).await;
    declare(&app, BETTER, &[ASKED], &[]).await;
    sqlx::query("UPDATE organizations SET customer_hold_limit = 2 WHERE id = $1")
        .bind(app.org.id)
        .execute(&app.pool)
        .await
        .expect("cap");
    for round in 0..8 {
        retire_all(&app).await;
        machines(&app, &format!("A{round}"), ASKED, 2).await;
        machines(&app, &format!("B{round}"), BETTER, 2).await;
        let customer = format!("CUST-{round}");
        let mut first = order(&format!("P-{round}"), ASKED, 1, true);
        first["customer_ref"] = json!(customer);
        let (code, body) = app.post_json("/api/v1/reservations", first).await;
        assert_eq!(code, StatusCode::CREATED, "{body}");
        let orders = [ASKED, BETTER]
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let mut o = order(&format!("R-{round}-{i}"), p, 1, true);
                o["customer_ref"] = json!(customer);
                o
            })
            .collect();
        let answers = race(&app, orders).await;
        let created = answers
            .iter()
            .filter(|(_, c, _)| *c == StatusCode::CREATED)
            .count();
        assert_eq!(created, 1, "round {round}: {answers:?}");
        assert!(
            answers
                .iter()
                .any(|(_, _, b)| b["error"] == "customer_limit"),
            "{answers:?}"
        );
        invariants(&app, round).await;
    }
}

/// Opposite lists (A served by B, B by A), both pools keeping headroom,
/// orders of several of both racing: every turn is taken in key order, so
/// no reserve deadlocks (a deadlock is a `503`), and nothing is mixed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn opposite_lists_with_headroom_queue_instead_of_deadlocking() {
    let app = Arc::new(spawn_app().await);
    seed(&app).await;
    declare(&app, ASKED, &[BETTER], &[]).await;
    declare(&app, BETTER, &[ASKED], &[]).await;
    for profile in [ASKED, BETTER] {
        let r = app
            .http
            .put(app.url("/api/v1/headroom"))
            .bearer_auth(&app.org.inventory_token)
            .json(
                &json!({"site": SITE, "profile": profile, "segment": "enterprise", "machines": 1}),
            )
            .send()
            .await
            .expect("PUT /headroom");
        assert_eq!(r.status(), StatusCode::OK);
    }
    for round in 0..6 {
        retire_all(&app).await;
        machines(&app, &format!("A{round}"), ASKED, 5).await;
        machines(&app, &format!("B{round}"), BETTER, 5).await;
        // Ten orders: every one of them takes both pools' turns, so they
        // run one after the other, within the connections' lock_timeout
        // (5 s) on a loaded machine too.
        let orders = (0..10)
            .map(|i| {
                let p = if i % 2 == 0 { ASKED } else { BETTER };
                order(&format!("D-{round}-{i}"), p, 1 + (i % 3) as u8, true)
            })
            .collect();
        let answers = race(&app, orders).await;
        for (_, code, body) in &answers {
            assert!(
                *code == StatusCode::CREATED || *code == StatusCode::CONFLICT,
                "round {round}: {code} {body}"
            );
        }
        invariants(&app, round).await;
    }
}

/// What the code guarantees when staff change a list while orders race: a
/// reserve holds the declaration's turn (shared) until it commits, so a change
/// waits for it, and a reserve that comes after the change reads the new
/// list. Shown both ways with an open transaction on each side; then a
/// race of changes and orders where every hold's profile was allowed by a
/// list in force.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_change_of_the_list_and_the_reserves_that_use_it_take_turns() {
    let app = Arc::new(spawn_app().await);
    machines(&app, "B", BETTER, 4).await;
    machines(&app, "C", BEST, 4).await;
    machines(&app, "A", ASKED, 1).await;
    sqlx::query("UPDATE machines SET status = 'retired' WHERE profile = $1")
        .bind(ASKED)
        .execute(&app.pool)
        .await
        .expect("retire the asked pool");
    declare(&app, ASKED, &[BETTER], &[]).await;

    // A reserve open on BETTER: the change to BEST waits for its commit.
    let mut tx = app.pool.begin().await.expect("begin");
    let req = poolkeeper::allocator::ReserveRequest {
        substitutes: poolkeeper::domain::SubstitutesMode::Allowed,
        ..crate::helpers::request_for("OPEN-1", ASKED, None)
    };
    let outcome = poolkeeper::allocator::reserve_on(&mut *tx, app.org.id, &req)
        .await
        .expect("reserve");
    let poolkeeper::allocator::ReserveOutcome::Created { reservation, .. } = outcome else {
        panic!("expected a hold, got {outcome:?}");
    };
    assert_eq!(reservation.machine.profile, BETTER);
    let change = {
        let app = app.clone();
        tokio::spawn(async move {
            put_substitutes(&app, json!({"profile": ASKED, "substitutes": [BEST]})).await
        })
    };
    waiting_on_a_lock(&app, "%substitutes%").await;
    assert!(!change.is_finished());
    tx.commit().await.expect("commit");
    let (code, body) = change.await.expect("change");
    assert_eq!(code, StatusCode::OK, "{body}");

    // A change open: the reserve waits for it and then reads BEST.
    let mut tx = app.pool.begin().await.expect("begin");
    let (_, change) = poolkeeper::capacity::set_substitutes(
        &mut tx,
        app.org.id,
        &poolkeeper::domain::Profile::parse(ASKED).expect("profile"),
        &[poolkeeper::domain::Profile::parse(BETTER).expect("profile")],
        &[],
        "test",
    )
    .await
    .expect("set");
    assert_eq!(change, poolkeeper::capacity::SubstitutesChange::Set);
    let reserve = {
        let app = app.clone();
        tokio::spawn(async move {
            app.post_json("/api/v1/reservations", order("OPEN-2", ASKED, 1, true))
                .await
        })
    };
    // api_reserve_order_request's statement (its text is longer than
    // what pg_stat_activity keeps).
    waiting_on_a_lock(&app, "SELECT c.caller, (c.answer).outcome%").await;
    assert!(!reserve.is_finished());
    tx.commit().await.expect("commit");
    let (code, body) = reserve.await.expect("reserve");
    assert_eq!(code, StatusCode::CREATED, "{body}");
    assert_eq!(
        body["machine"]["profile"], BETTER,
        "the list in force: {body}"
    );

    // A race: changes back and forth between BETTER and BEST while orders
    // run; every hold is of one of them, never of another profile.
    for round in 0..4 {
        machines(&app, &format!("B{round}x"), BETTER, 3).await;
        machines(&app, &format!("C{round}x"), BEST, 3).await;
        let barrier = Arc::new(Barrier::new(10));
        let changes: Vec<_> = (0..2)
            .map(|i| {
                let (app, barrier) = (app.clone(), barrier.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    let list = if i == 0 { BEST } else { BETTER };
                    put_substitutes(&app, json!({"profile": ASKED, "substitutes": [list]})).await
                })
            })
            .collect();
        let orders: Vec<_> = (0..8)
            .map(|i| {
                let (app, barrier) = (app.clone(), barrier.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    app.post_json(
                        "/api/v1/reservations",
                        order(&format!("L-{round}-{i}"), ASKED, 1, true),
                    )
                    .await
                })
            })
            .collect();
        for c in changes {
            let (code, body) = c.await.expect("change");
            assert_eq!(code, StatusCode::OK, "{body}");
        }
        for o in orders {
            let (code, body) = o.await.expect("order");
            assert!(
                code == StatusCode::CREATED || code == StatusCode::CONFLICT,
                "{code} {body}"
            );
        }
        invariants(&app, round).await;
    }
}

/// Waits (bounded) until a session whose query is like `query` waits on a
/// lock.
async fn waiting_on_a_lock(app: &TestApp, query: &str) {
    let what = format!("a session running {query} waiting on a lock");
    until(&what, POLL_BOUND, || async {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity
              WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE $1",
        )
        .bind(query)
        .fetch_one(&app.pool)
        .await
        .expect("pg_stat_activity");
        (n > 0).then_some(())
    })
    .await;
}

/// R17 with R20: capacity asked with `substitutes=allowed` tells, for each
/// pool, what its substitutes could serve now, in the declared order, and
/// its alternatives name first the substitutes at the same site that could
/// fill the order; a refused exact order names them first too.
#[tokio::test]
async fn capacity_and_refusals_name_the_substitutes_that_could_serve() {
    let app = spawn_app().await;
    seed(&app).await;
    machines(&app, "B", BETTER, 3).await;
    machines(&app, "C", BEST, 1).await;
    machines_at(&app, "ams1", "AMS", ASKED, 2).await;
    declare(&app, ASKED, &[BETTER, BEST], &[]).await;

    let (code, body) = crate::capacity::capacity(
        &app,
        "?site=par1&profile=epyc-9354-256g&quantity=2&substitutes=allowed",
    )
    .await;
    assert_eq!(code, StatusCode::OK, "{body}");
    assert_eq!(
        body["pools"][0]["substitutes"],
        json!([{"profile": BETTER, "available": 3}, {"profile": BEST, "available": 1}]),
        "{body}"
    );
    let alternatives = json!([
        {"site": SITE, "profile": BETTER, "available": 3},
        {"site": "ams1", "profile": ASKED, "available": 2},
    ]);
    assert_eq!(body["alternatives"], alternatives, "{body}");
    let (_, plain) =
        crate::capacity::capacity(&app, "?site=par1&profile=epyc-9354-256g&quantity=2").await;
    assert!(plain["pools"][0].get("substitutes").is_none(), "{plain}");
    assert_eq!(
        plain["alternatives"],
        json!([{"site": "ams1", "profile": ASKED, "available": 2}])
    );
    let (code, _) = crate::capacity::capacity(&app, "?substitutes=maybe").await;
    assert_eq!(code, StatusCode::BAD_REQUEST);

    let (code, refused) = app
        .post_json("/api/v1/reservations", order("EXACT", ASKED, 2, false))
        .await;
    assert_eq!(code, StatusCode::CONFLICT, "{refused}");
    assert_eq!(refused["alternatives"], alternatives, "{refused}");
}

/// R15 with R20: a held machine breaks and its pool has no equivalent
/// machine left: the hold of an order that allowed substitutes moves to a
/// machine of a declared substitute of its asked profile, told in the
/// event, the reads and the webhook; an order that asked for the exact
/// hardware is cancelled instead.
#[tokio::test]
async fn healing_moves_a_hold_onto_a_substitute_only_when_its_order_allowed_them() {
    let app = crate::helpers::spawn_app_with(|s| s.webhook_allow_private = true).await;
    seed(&app).await;
    machines(&app, "A", ASKED, 2).await;
    // Two: one is left when the exact order's machine breaks.
    machines(&app, "B", BETTER, 2).await;
    declare(&app, ASKED, &[BETTER], &[]).await;
    let r = app
        .http
        .put(app.url("/api/v1/webhook"))
        .bearer_auth(&app.org.token)
        .json(&json!({"url": "http://127.0.0.1:9/hooks"}))
        .send()
        .await
        .expect("PUT /webhook");
    assert!(r.status().is_success(), "{:?}", r.text().await);
    let (_, allowed) = app
        .post_json("/api/v1/reservations", order("HEAL-1", ASKED, 1, true))
        .await;
    let (_, exact) = app
        .post_json("/api/v1/reservations", order("HEAL-2", ASKED, 1, false))
        .await;
    for (body, tag) in [
        (&allowed, &allowed["machine"]["asset_tag"]),
        (&exact, &exact["machine"]["asset_tag"]),
    ] {
        assert_eq!(body["machine"]["profile"], ASKED, "{body}");
        let r = app
            .put_machine(
                &app.org.token,
                tag.as_str().expect("tag"),
                SITE,
                "dell",
                ASKED,
                "broken",
            )
            .await;
        assert!(r.status().is_success());
    }
    let (_, moved) = get(&app, &format!("/api/v1/reservations/{}", allowed["id"])).await;
    assert_eq!(moved["state"], "held", "{moved}");
    assert_eq!(moved["machine"]["profile"], BETTER, "{moved}");
    assert_eq!(
        (&moved["profile_asked"], &moved["substituted"]),
        (&json!(ASKED), &json!(true))
    );
    let (_, events) = get(
        &app,
        &format!("/api/v1/reservations/{}/events", allowed["id"]),
    )
    .await;
    assert!(
        events
            .to_string()
            .contains("served by epyc-9354-512g, asked epyc-9354-256g"),
        "{events}"
    );
    let payload: Value = sqlx::query_scalar(
        "SELECT d.payload FROM webhook_deliveries d
          WHERE d.reservation_id = $1 AND d.payload->>'type' = 'reservation.machine_replaced'",
    )
    .bind(allowed["id"].as_i64())
    .fetch_one(&app.pool)
    .await
    .expect("the webhook of the move");
    assert_eq!(payload["reservation"]["substituted"], true, "{payload}");
    assert_eq!(payload["reservation"]["profile_asked"], ASKED, "{payload}");
    assert_eq!(
        payload["reservation"]["machine"]["profile"], BETTER,
        "{payload}"
    );

    let (_, cancelled) = get(&app, &format!("/api/v1/reservations/{}", exact["id"])).await;
    assert_eq!(cancelled["state"], "cancelled", "{cancelled}");
    assert_eq!(sellable(&app, BETTER).await, 1);
    invariants(&app, 0).await;
}
