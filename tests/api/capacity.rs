//! R17 and R18 through the API: `GET /api/v1/capacity` (counts that add up
//! in one snapshot, what an order may take under a headroom, the
//! alternatives, the ETag), `GET`/`PUT /api/v1/headroom` (audited, under
//! the pool's turn, a retry answers the same row), and
//! `poolkeeper org set`.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{FakeHold, FakeMachine, InService};
use crate::helpers::{PROFILE, SITE, TestApp, binary, spawn_app};

/// `GET /api/v1/capacity{query}` with the orders token: the status and the body.
pub(crate) async fn capacity(app: &TestApp, query: &str) -> (StatusCode, Value) {
    let r = app
        .http
        .get(app.url(&format!("/api/v1/capacity{query}")))
        .bearer_auth(&app.org.orders_token)
        .send()
        .await
        .expect("GET /capacity");
    let status = r.status();
    (status, r.json().await.unwrap_or(Value::Null))
}

async fn put_headroom(app: &TestApp, body: Value) -> (StatusCode, Value) {
    let r = app
        .http
        .put(app.url("/api/v1/headroom"))
        .bearer_auth(&app.org.inventory_token)
        .json(&body)
        .send()
        .await
        .expect("PUT /headroom");
    let status = r.status();
    (status, r.json().await.unwrap_or(Value::Null))
}

async fn keep(app: &TestApp, site: &str, profile: &str, segment: &str, machines: i64) {
    let (status, body) = put_headroom(
        app,
        json!({"site": site, "profile": profile, "segment": segment, "machines": machines}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

fn pool<'a>(body: &'a Value, site: &str, profile: &str) -> &'a Value {
    body["pools"]
        .as_array()
        .expect("pools")
        .iter()
        .find(|p| p["site"] == site && p["profile"] == profile)
        .unwrap_or_else(|| panic!("no pool {site}/{profile} in {body}"))
}

/// Machines of every state in several pools: each pool's counts add up
/// (R17), an overdue hold's ready machine is sellable (R11), and another
/// organization's machines are not counted.
#[tokio::test]
async fn the_counts_of_every_pool_add_up() {
    let app = spawn_app().await;
    let org = app.org.id;
    for (tag, site, profile, status) in [
        ("E-1", "par1", "epyc", "ready"),
        ("E-2", "par1", "epyc", "ready"),
        ("E-3", "par1", "epyc", "ready"),
        ("E-4", "par1", "epyc", "broken"),
        ("E-5", "par1", "epyc", "ready"),
        ("E-6", "par1", "epyc", "maintenance"),
        ("X-1", "par1", "xeon", "provisioning"),
        ("X-2", "par1", "xeon", "ready"),
        ("A-1", "ams1", "epyc", "ready"),
        ("A-2", "ams1", "epyc", "ready"),
    ] {
        FakeMachine::new()
            .tag(tag)
            .site(site)
            .profile(profile)
            .status(status)
            .create(&app.pool, org)
            .await;
    }
    FakeMachine::new()
        .tag("O-1")
        .profile("epyc")
        .create(&app.pool, app.other.id)
        .await;
    FakeHold::on("E-2")
        .order("ORD-held")
        .create(&app.pool, org)
        .await;
    FakeHold::on("E-3")
        .order("ORD-sold")
        .state(InService)
        .service_ref("SRV-1")
        .create(&app.pool, org)
        .await;
    let overdue = FakeHold::on("E-5")
        .order("ORD-overdue")
        .create(&app.pool, org)
        .await;
    app.make_overdue(overdue).await;
    FakeHold::on("X-2")
        .order("ORD-xeon")
        .create(&app.pool, org)
        .await;

    let (status, body) = capacity(&app, "").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body["as_of"].is_string(), "{body}");
    assert_eq!(body["alternatives"], json!([]), "{body}");
    let pools = body["pools"].as_array().expect("pools");
    assert_eq!(pools.len(), 3, "{body}");
    for p in pools {
        let sum = ["sellable", "held", "sold", "not_ready"]
            .iter()
            .map(|k| p[k].as_i64().expect("a count"))
            .sum::<i64>();
        assert_eq!(p["total"].as_i64(), Some(sum), "{p}");
    }
    let epyc = pool(&body, "par1", "epyc");
    assert_eq!(
        epyc,
        &json!({"site": "par1", "profile": "epyc", "total": 6, "sellable": 2, "held": 1,
                "sold": 1, "not_ready": 2, "reserved": {}, "available": 2}),
    );
    let xeon = pool(&body, "par1", "xeon");
    assert_eq!(
        (
            &xeon["total"],
            &xeon["held"],
            &xeon["not_ready"],
            &xeon["available"]
        ),
        (&json!(2), &json!(1), &json!(1), &json!(0)),
        "{xeon}"
    );
    assert_eq!(pool(&body, "ams1", "epyc")["available"], 2, "{body}");

    // The filters narrow the pools; a vendor with no machine there, none.
    let (_, body) = capacity(&app, "?site=par1&profile=epyc").await;
    assert_eq!(body["pools"].as_array().map(Vec::len), Some(1), "{body}");
    let (_, body) = capacity(&app, "?vendor=hpe").await;
    assert_eq!(body["pools"], json!([]), "{body}");
    let (_, body) = capacity(&app, "?site=&profile=&vendor=dell").await;
    assert_eq!(body["pools"].as_array().map(Vec::len), Some(3), "{body}");
}

/// R18: the headroom is kept from orders without a segment and from other
/// segments, never from its own, and `reserved` names it.
#[tokio::test]
async fn available_leaves_the_headroom_of_other_segments() {
    let app = spawn_app().await;
    for tag in ["H-1", "H-2", "H-3"] {
        FakeMachine::new()
            .tag(tag)
            .profile("epyc")
            .create(&app.pool, app.org.id)
            .await;
    }
    FakeMachine::new()
        .tag("H-4")
        .vendor("hpe")
        .profile("epyc")
        .create(&app.pool, app.org.id)
        .await;
    keep(&app, "par1", "epyc", "enterprise", 2).await;
    let available = async |query: &str| {
        let (status, body) = capacity(&app, query).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let p = pool(&body, "par1", "epyc");
        (p["available"].as_i64().expect("available"), p.clone())
    };
    let (none, p) = available("").await;
    assert_eq!(none, 2, "{p}");
    assert_eq!(p["reserved"], json!({"enterprise": 2}), "{p}");
    assert_eq!(p["sellable"], 4, "{p}");
    assert_eq!(available("?segment=enterprise").await.0, 4);
    assert_eq!(available("?segment=repairs").await.0, 2);
    // The headroom is the pool's, whatever the vendor: 3 dell machines
    // sellable, 2 of the 4 kept.
    assert_eq!(available("?vendor=dell").await.0, 2);
    assert_eq!(available("?vendor=hpe").await.0, 1);
    assert_eq!(available("?vendor=hpe&segment=enterprise").await.0, 1);

    keep(&app, "par1", "epyc", "repairs", 2).await;
    let (none, p) = available("").await;
    assert_eq!(none, 0, "{p}");
    assert_eq!(p["reserved"], json!({"enterprise": 2, "repairs": 2}), "{p}");
    assert_eq!(available("?segment=enterprise").await.0, 2);
    assert_eq!(available("?segment=repairs").await.0, 2);

    // More kept than sellable: never below 0.
    keep(&app, "par1", "epyc", "repairs", 50).await;
    assert_eq!(available("?segment=enterprise").await.0, 0);
    assert_eq!(available("?segment=repairs").await.0, 2);
}

/// R17: with a site, a profile and a quantity, the other sites whose pool
/// could fill the order now, most available first; otherwise none.
#[tokio::test]
async fn alternatives_list_the_other_sites_most_available_first() {
    let app = spawn_app().await;
    let mut n = 0;
    for (site, ready) in [
        ("par1", 2),
        ("ams1", 3),
        ("fra1", 1),
        ("waw1", 4),
        ("lon1", 3),
    ] {
        for _ in 0..ready {
            n += 1;
            FakeMachine::new()
                .tag(&format!("S-{n}"))
                .site(site)
                .profile("epyc")
                .create(&app.pool, app.org.id)
                .await;
        }
    }
    FakeMachine::new()
        .tag("S-x")
        .site("lon1")
        .profile("xeon")
        .create(&app.pool, app.org.id)
        .await;
    keep(&app, "waw1", "epyc", "enterprise", 2).await;

    let (status, body) = capacity(&app, "?site=par1&profile=epyc&quantity=2").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body["alternatives"],
        json!([{"site": "ams1", "profile": "epyc", "available": 3}, {"site": "lon1", "profile": "epyc", "available": 3},
               {"site": "waw1", "profile": "epyc", "available": 2}]),
    );
    assert_eq!(body["pools"].as_array().map(Vec::len), Some(1), "{body}");
    let (_, body) = capacity(
        &app,
        "?site=par1&profile=epyc&quantity=2&segment=enterprise",
    )
    .await;
    assert_eq!(
        body["alternatives"],
        json!([{"site": "waw1", "profile": "epyc", "available": 4}, {"site": "ams1", "profile": "epyc", "available": 3},
               {"site": "lon1", "profile": "epyc", "available": 3}]),
    );
    let (_, body) = capacity(&app, "?site=par1&profile=epyc&quantity=4").await;
    assert_eq!(body["alternatives"], json!([]), "{body}");
    let (_, body) = capacity(&app, "?site=ams1&profile=epyc&quantity=1&vendor=dell").await;
    assert_eq!(
        body["alternatives"],
        json!([{"site": "lon1", "profile": "epyc", "available": 3}, {"site": "par1", "profile": "epyc", "available": 2},
               {"site": "waw1", "profile": "epyc", "available": 2}, {"site": "fra1", "profile": "epyc", "available": 1}]),
    );
    for query in [
        "?site=par1&profile=epyc",
        "?profile=epyc&quantity=1",
        "?site=par1&quantity=1",
    ] {
        let (_, body) = capacity(&app, query).await;
        assert_eq!(body["alternatives"], json!([]), "{query}: {body}");
    }
}

/// A shop front polls capacity: the same capacity keeps its ETag (whatever
/// `as_of` says) and answers `304` to it; a reserve changes it.
#[tokio::test]
async fn the_etag_stays_while_capacity_does_and_changes_after_a_reserve() {
    let app = spawn_app().await;
    for tag in ["T-1", "T-2"] {
        FakeMachine::new()
            .tag(tag)
            .profile("epyc")
            .create(&app.pool, app.org.id)
            .await;
    }
    let get = async |tag: Option<&str>| {
        let mut req = app
            .http
            .get(app.url("/api/v1/capacity?site=par1"))
            .bearer_auth(&app.org.orders_token);
        if let Some(tag) = tag {
            req = req.header("If-None-Match", tag);
        }
        let r = req.send().await.expect("GET /capacity");
        let status = r.status();
        let etag = r
            .headers()
            .get("etag")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        (status, etag, r.text().await.expect("body"))
    };
    let (status, first, body) = get(None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let first = first.expect("an ETag");
    assert!(first.starts_with("W/\"") && first.ends_with('"'), "{first}");
    let (status, again, body_again) = get(None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(again.as_deref(), Some(first.as_str()));
    let as_of = |b: &str| serde_json::from_str::<Value>(b).expect("json")["as_of"].clone();
    assert_ne!(as_of(&body), as_of(&body_again), "as_of moves");

    let (status, tag, body) = get(Some(&first)).await;
    assert_eq!(status, StatusCode::NOT_MODIFIED);
    assert_eq!(tag.as_deref(), Some(first.as_str()));
    assert_eq!(body, "");
    // The strong form and a list name it too.
    let strong = first.trim_start_matches("W/").to_owned();
    assert_eq!(get(Some(&strong)).await.0, StatusCode::NOT_MODIFIED);
    let list = format!("\"other\", {first}");
    assert_eq!(get(Some(&list)).await.0, StatusCode::NOT_MODIFIED);
    assert_eq!(get(Some("\"other\"")).await.0, StatusCode::OK);

    let (status, reserved) = app
        .post_json(
            "/api/v1/reservations",
            json!({"order_ref": "ET-1", "site": "par1", "profile": "epyc"}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{reserved}");
    let (status, after, body) = get(Some(&first)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_ne!(after.as_deref(), Some(first.as_str()));
    let body: Value = serde_json::from_str(&body).expect("json");
    assert_eq!(pool(&body, "par1", "epyc")["held"], 1, "{body}");
}

/// Bad filters are `400 invalid`.
#[tokio::test]
async fn bad_capacity_filters_are_invalid() {
    let app = spawn_app().await;
    for query in [
        "?quantity=",
        "?quantity=0",
        "?quantity=17",
        "?quantity=1.5",
        "?quantity=01",
        "?quantity=two",
        "?site=par%201",
        "?profile=%00",
        "?segment=Enterprise",
        "?segment=-x",
        "?vendor=a%2Fb",
        "?colour=red",
    ] {
        let (status, body) = capacity(&app, query).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}: {body}");
        assert_eq!(body["error"], "invalid", "{query}: {body}");
    }
}

/// R18's API: a PUT keeps machines for a segment, a retry answers the same
/// row and writes nothing, 0 removes it; each change is audited in its own
/// transaction; bad values write nothing.
#[tokio::test]
async fn headroom_is_set_listed_removed_and_audited_and_a_retry_answers_the_same_row() {
    let app = spawn_app().await;
    for (tag, site) in [("HP-1", "par1"), ("HA-1", "ams1")] {
        FakeMachine::new()
            .tag(tag)
            .site(site)
            .profile("epyc")
            .create(&app.pool, app.org.id)
            .await;
    }
    let audited = async || -> Vec<(String, String, String)> {
        sqlx::query_as(
            "SELECT action, actor, detail FROM audit_log
              WHERE org_id = $1 AND action LIKE 'headroom.%' ORDER BY id",
        )
        .bind(app.org.id)
        .fetch_all(&app.pool)
        .await
        .expect("audit")
    };
    let body = json!({"site": "par1", "profile": "epyc", "segment": "enterprise", "machines": 3});
    let (status, first) = put_headroom(&app, body.clone()).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    assert_eq!(first["machines"], 3);
    assert_eq!(first["updated_by"], "inventory-only");
    let (status, retry) = put_headroom(&app, body.clone()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(retry, first, "a retry answers the same row");
    assert_eq!(
        audited().await,
        vec![(
            "headroom.set".to_owned(),
            "token:inventory-only".to_owned(),
            "3 machines kept for enterprise".to_owned()
        )]
    );
    keep(&app, "par1", "epyc", "repairs", 1).await;
    // A number with a zero fraction is the same integer, as in every body.
    let (status, answer) = put_headroom(
        &app,
        json!({"site": "ams1", "profile": "epyc", "segment": "enterprise", "machines": 2.0}),
    )
    .await;
    assert_eq!(
        (status, &answer["machines"]),
        (StatusCode::OK, &json!(2)),
        "{answer}"
    );
    let r = app
        .http
        .get(app.url("/api/v1/headroom"))
        .bearer_auth(&app.org.inventory_token)
        .send()
        .await
        .expect("GET /headroom");
    assert_eq!(r.status(), StatusCode::OK);
    let listed: Value = r.json().await.expect("json");
    let keys: Vec<(String, String, i64)> = listed["headroom"]
        .as_array()
        .expect("headroom")
        .iter()
        .map(|h| {
            (
                format!(
                    "{}/{}",
                    h["site"].as_str().unwrap_or("?"),
                    h["profile"].as_str().unwrap_or("?")
                ),
                h["segment"].as_str().unwrap_or("?").to_owned(),
                h["machines"].as_i64().unwrap_or(-1),
            )
        })
        .collect();
    assert_eq!(
        keys,
        vec![
            ("ams1/epyc".to_owned(), "enterprise".to_owned(), 2),
            ("par1/epyc".to_owned(), "enterprise".to_owned(), 3),
            ("par1/epyc".to_owned(), "repairs".to_owned(), 1),
        ]
    );
    // Another organization sees none of it.
    let r = app
        .http
        .get(app.url("/api/v1/headroom"))
        .bearer_auth(&app.other.token)
        .send()
        .await
        .expect("GET /headroom");
    assert_eq!(
        r.json::<Value>().await.expect("json"),
        json!({"headroom": []})
    );

    let removal =
        json!({"site": "par1", "profile": "epyc", "segment": "enterprise", "machines": 0});
    let (status, removed) = put_headroom(&app, removal.clone()).await;
    assert_eq!(status, StatusCode::OK, "{removed}");
    assert_eq!(
        removed,
        json!({"site": "par1", "profile": "epyc", "segment": "enterprise", "machines": 0,
               "updated_at": null, "updated_by": null})
    );
    let (status, again) = put_headroom(&app, removal).await;
    assert_eq!((status, &again), (StatusCode::OK, &removed));
    let actions: Vec<String> = audited().await.into_iter().map(|a| a.0).collect();
    assert_eq!(
        actions,
        [
            "headroom.set",
            "headroom.set",
            "headroom.set",
            "headroom.removed"
        ]
    );

    let rows = async || app.count("SELECT count(*) FROM headroom").await;
    let before = (rows().await, audited().await.len());
    for bad in [
        json!({"site": "par1", "profile": "epyc", "segment": "enterprise", "machines": -1}),
        json!({"site": "par1", "profile": "epyc", "segment": "enterprise", "machines": 100001}),
        json!({"site": "par1", "profile": "epyc", "segment": "enterprise", "machines": 1.5}),
        json!({"site": "par1", "profile": "epyc", "segment": "enterprise", "machines": "2"}),
        json!({"site": "par1", "profile": "epyc", "segment": "Enterprise", "machines": 2}),
        json!({"site": "par1", "profile": "epyc", "segment": "", "machines": 2}),
        json!({"site": "par 1", "profile": "epyc", "segment": "enterprise", "machines": 2}),
        json!({"site": "par1", "profile": "epyc", "machines": 2}),
        json!({"site": "par1", "profile": "epyc", "segment": "enterprise", "machines": 2, "vendor": "dell"}),
        // An array of the fields, by position, is not the object.
        json!(["par1", "epyc", "enterprise", 2]),
    ] {
        let (status, answer) = put_headroom(&app, bad.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {answer}");
        assert_eq!(answer["error"], "invalid", "{bad}: {answer}");
    }
    assert_eq!((rows().await, audited().await.len()), before);
    // A pool with no machine: headroom there would keep nothing (and
    // would only add metric series per invented segment).
    for unknown in [
        json!({"site": "nowhere", "profile": "epyc", "segment": "enterprise", "machines": 2}),
        json!({"site": "par1", "profile": "xeon", "segment": "invented-1", "machines": 2}),
    ] {
        let (status, answer) = put_headroom(&app, unknown.clone()).await;
        assert_eq!(
            status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{unknown}: {answer}"
        );
        assert_eq!(answer["error"], "unknown_pool", "{unknown}: {answer}");
    }
    assert_eq!((rows().await, audited().await.len()), before);
    // The orders scope does not set headroom.
    let r = app
        .http
        .put(app.url("/api/v1/headroom"))
        .bearer_auth(&app.org.orders_token)
        .json(&body)
        .send()
        .await
        .expect("PUT /headroom");
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
}

/// Waits until a session of the server waits for an advisory lock (a
/// pool's turn); fails after `POLL_BOUND` when none does.
async fn until_waiting(app: &TestApp) {
    crate::helpers::until(
        "a session of the server waiting for a pool's turn (an advisory lock)",
        crate::helpers::POLL_BOUND,
        || async {
            let waiting: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity
                  WHERE datname = current_database() AND wait_event_type = 'Lock'
                    AND wait_event = 'advisory' AND pid <> pg_backend_pid()",
            )
            .fetch_one(&app.pool)
            .await
            .expect("pg_stat_activity");
            (waiting > 0).then_some(())
        },
    )
    .await
}

/// R18: a change of headroom takes its pool's turn before it writes, so
/// that it and a reserve into the pool decide one after the other; the
/// turn is the pool's only, another pool's change does not wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_of_headroom_waits_for_its_pools_turn() {
    let app = spawn_app().await;
    for (tag, site, org) in [
        ("TW-1", "par1", app.org.id),
        ("TW-2", "ams1", app.org.id),
        ("TW-3", "par1", app.other.id),
    ] {
        FakeMachine::new()
            .tag(tag)
            .site(site)
            .profile("epyc")
            .create(&app.pool, org)
            .await;
    }
    let mut turn = app.pool.begin().await.expect("begin");
    sqlx::query("SELECT pool_turn($1, 'par1', 'epyc')")
        .bind(app.org.id)
        .execute(&mut *turn)
        .await
        .expect("take the pool's turn");
    let put = {
        let http = app.http.clone();
        let url = app.url("/api/v1/headroom");
        let token = app.org.inventory_token.clone();
        tokio::spawn(async move {
            http.put(url)
                .bearer_auth(token)
                .json(&json!({"site": "par1", "profile": "epyc", "segment": "enterprise", "machines": 2}))
                .send()
                .await
                .expect("PUT /headroom")
                .status()
        })
    };
    until_waiting(&app).await;
    // Another pool, and the same pool of another organization: not held up.
    keep(&app, "ams1", "epyc", "enterprise", 1).await;
    let (status, _) = {
        let r = app
            .http
            .put(app.url("/api/v1/headroom"))
            .bearer_auth(&app.other.token)
            .json(
                &json!({"site": "par1", "profile": "epyc", "segment": "enterprise", "machines": 1}),
            )
            .send()
            .await
            .expect("PUT /headroom");
        (r.status(), ())
    };
    assert_eq!(status, StatusCode::OK);
    let waiting_pool: i64 =
        sqlx::query_scalar("SELECT count(*) FROM headroom WHERE org_id = $1 AND site = 'par1'")
            .bind(app.org.id)
            .fetch_one(&app.pool)
            .await
            .expect("count");
    assert_eq!(waiting_pool, 0, "written before its turn");
    turn.commit().await.expect("end the turn");
    assert_eq!(put.await.expect("join"), StatusCode::OK);
    assert_eq!(
        app.count("SELECT count(*) FROM headroom WHERE site = 'par1'")
            .await,
        2
    );
}

/// `poolkeeper org set`: the customer cap (R19) and the repairs segment
/// (R18), each change audited; out of range or malformed, nothing changes.
#[tokio::test]
async fn org_set_changes_the_cap_and_the_repairs_segment() {
    let app = spawn_app().await;
    let run = async |args: &[&str]| {
        let out = tokio::process::Command::new(binary())
            .args(["org", "set", "acme"])
            .args(args)
            .env("DATABASE_URL", app.db.url())
            .env("RUST_LOG", "warn")
            .output()
            .await
            .expect("run poolkeeper org set");
        let log = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        (out.status.success(), log)
    };
    let settings = async || -> (i32, Option<String>) {
        sqlx::query_as(
            "SELECT customer_hold_limit, repairs_segment FROM organizations WHERE id = $1",
        )
        .bind(app.org.id)
        .fetch_one(&app.pool)
        .await
        .expect("organization")
    };
    let (ok, log) = run(&["--customer-hold-limit", "5", "--repairs-segment", "repairs"]).await;
    assert!(ok, "{log}");
    assert!(
        log.contains("customer hold limit 5, repairs segment repairs"),
        "{log}"
    );
    assert_eq!(settings().await, (5, Some("repairs".to_owned())));
    for bad in [
        &["--customer-hold-limit", "10001"][..],
        &["--customer-hold-limit", "-1"],
        &["--repairs-segment", "Repairs"],
        &[],
    ] {
        let (ok, log) = run(bad).await;
        assert!(!ok, "{bad:?}: {log}");
        assert_eq!(settings().await, (5, Some("repairs".to_owned())), "{bad:?}");
    }
    let (ok, log) = run(&["--repairs-segment", "", "--customer-hold-limit", "0"]).await;
    assert!(ok, "{log}");
    assert_eq!(settings().await, (0, None));
    let audit: Vec<(String, String, Option<String>)> = sqlx::query_as(
        "SELECT action, actor, detail FROM audit_log WHERE org_id = $1 AND action LIKE 'org.%' ORDER BY id",
    )
    .bind(app.org.id)
    .fetch_all(&app.pool)
    .await
    .expect("audit");
    let audit: Vec<(&str, &str, Option<&str>)> = audit
        .iter()
        .map(|(a, b, c)| (a.as_str(), b.as_str(), c.as_deref()))
        .collect();
    assert_eq!(
        audit,
        vec![
            ("org.customer_hold_limit", "command line", Some("5")),
            ("org.repairs_segment", "command line", Some("repairs")),
            ("org.customer_hold_limit", "command line", Some("0")),
            ("org.repairs_segment", "command line", Some("")),
        ]
    );
}

/// R17 for a shop front polling on every page view: with the cache on, a
/// process answers the same question from the snapshot it read, dated by
/// its `as_of`, until the period ends, even after a reserve; with it off
/// (the other tests), every request reads.
#[tokio::test]
async fn a_cached_capacity_answer_is_one_snapshot_dated_by_as_of() {
    let app = crate::helpers::spawn_app_with(|s| {
        s.capacity_cache = std::time::Duration::from_secs(3600);
    })
    .await;
    for i in 0..3 {
        app.put_machine(
            &app.org.token,
            &format!("CACHE-{i}"),
            SITE,
            "dell",
            PROFILE,
            "ready",
        )
        .await;
    }
    let path = format!("/api/v1/capacity?site={SITE}&profile={PROFILE}");
    let read = || async {
        let r = app
            .http
            .get(app.url(&path))
            .bearer_auth(&app.org.token)
            .send()
            .await
            .expect("capacity");
        assert_eq!(r.status(), 200);
        r.json::<serde_json::Value>().await.expect("json")
    };
    let first = read().await;
    assert_eq!(first["pools"][0]["sellable"], 3, "{first}");
    let (code, body) = app
        .post_json(
            "/api/v1/reservations",
            serde_json::json!({"order_ref": "CACHE-ORD", "site": SITE, "profile": PROFILE}),
        )
        .await;
    assert_eq!(code, 201, "{body}");
    let again = read().await;
    assert_eq!(again, first, "the same snapshot, as_of included");
    // Another question is read afresh: it sees the hold.
    let other = app
        .http
        .get(app.url(&format!("{path}&vendor=dell")))
        .bearer_auth(&app.org.token)
        .send()
        .await
        .expect("capacity")
        .json::<serde_json::Value>()
        .await
        .expect("json");
    assert_eq!(
        (
            other["pools"][0]["sellable"].clone(),
            other["pools"][0]["held"].clone()
        ),
        (serde_json::json!(2), serde_json::json!(1)),
        "{other}"
    );
}

/// The cache reads ahead: for half its period a question is answered from
/// its snapshot alone; past half, still from the snapshot, while one read
/// behind the answer replaces it; a question not asked for a whole period
/// is read in the request. The clock is the test's (`read_at`).
#[tokio::test]
async fn the_capacity_cache_reads_a_snapshot_ahead_past_half_its_period() {
    use poolkeeper::capacity::{Cache, Filter};
    use std::time::{Duration, Instant};

    let app = spawn_app().await;
    let sellable = |s: &poolkeeper::capacity::Snapshot| -> i64 {
        s.pool_rows()
            .expect("pools")
            .iter()
            .map(|p| p.sellable)
            .sum()
    };
    let add = |tag: &'static str| {
        let app = &app;
        async move {
            app.put_machine(&app.org.token, tag, SITE, "dell", PROFILE, "ready")
                .await;
        }
    };
    let period = Duration::from_secs(60);
    let cache = Cache::new(period);
    let ask = |at: Instant| {
        let (cache, app) = (&cache, &app);
        async move {
            cache
                .read_at(&app.pool, app.org.id, &Filter::default(), at)
                .await
                .expect("capacity")
        }
    };
    let t0 = Instant::now();
    add("AHEAD-1").await;
    let first = ask(t0).await;
    assert_eq!(sellable(&first), 1);
    add("AHEAD-2").await;

    let early = ask(t0 + period / 3).await;
    assert_eq!(
        early.as_of, first.as_of,
        "before half the period: the snapshot"
    );

    let half = t0 + period * 2 / 3;
    let late = ask(half).await;
    assert_eq!(late.as_of, first.as_of, "past half: still the snapshot");
    // The read behind it lands (no new read starts: its age is 0 then).
    let deadline = Instant::now() + Duration::from_secs(10);
    let ahead = loop {
        let s = ask(half).await;
        if s.as_of != first.as_of {
            break s;
        }
        assert!(Instant::now() < deadline, "the read ahead never landed");
        tokio::task::yield_now().await;
    };
    assert_eq!(sellable(&ahead), 2, "the read ahead counts the new machine");

    add("AHEAD-3").await;
    let kept = ask(half + period / 3).await;
    assert_eq!(kept.as_of, ahead.as_of, "aged from when it was read");
    let fresh = ask(half + period + Duration::from_secs(1)).await;
    assert_ne!(fresh.as_of, ahead.as_of, "a whole period later: read now");
    assert_eq!(sellable(&fresh), 3);
}

/// The capacity cache is bounded per organization: one tenant asking more
/// different questions than the bound forgets its own oldest ones, never
/// another tenant's answer.
#[tokio::test]
async fn one_tenants_many_questions_never_evict_anothers_answer() {
    use poolkeeper::capacity::{CACHE_ENTRIES_PER_ORG, Cache, Filter};
    use poolkeeper::domain::Site;
    use std::time::{Duration, Instant};

    let app = spawn_app().await;
    let cache = Cache::new(Duration::from_secs(3600));
    let t0 = Instant::now();
    let theirs = cache
        .read_at(&app.pool, app.other.id, &Filter::default(), t0)
        .await
        .expect("capacity");
    for i in 0..=CACHE_ENTRIES_PER_ORG {
        let filter = Filter {
            site: Some(Site::parse(&format!("s{i}")).expect("site")),
            ..Filter::default()
        };
        let at = t0 + Duration::from_millis(i as u64 + 1);
        cache
            .read_at(&app.pool, app.org.id, &filter, at)
            .await
            .expect("capacity");
    }
    assert_eq!(cache.entries_of(app.org.id), CACHE_ENTRIES_PER_ORG);
    assert_eq!(cache.entries_of(app.other.id), 1);
    let again = cache
        .read_at(&app.pool, app.other.id, &Filter::default(), t0)
        .await
        .expect("capacity");
    assert_eq!(
        again.as_of, theirs.as_of,
        "the other tenant's answer is kept"
    );
}
