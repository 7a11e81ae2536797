//! Lost demand: every `409 unavailable` and `409 contended` of the
//! reserve API leaves one refusal row (and nothing else does), the
//! dashboard reads them (overview, /demand), `/metrics` counts them with
//! labels bounded by the inventory, and the sweep worker purges old rows
//! under its lease.

use std::time::Duration;

use poolkeeper::db::Db;
use poolkeeper::lease::{self, Claim, Mandate, SWEEP_KEY};
use poolkeeper::metrics::Metrics;
use poolkeeper::metrics::{OTHER, RefusalLabels};
use poolkeeper::sweep::{self, SweepError};
use serde_json::{Value, json};
use sqlx::Connection;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::helpers::{FakeHold, FakeMachine};
use crate::helpers::{hidden_field, migrated_db, spawn_app, test_settings};

/// A refusal row: (org_id, reason, site, profile, vendor, excluded).
type Row = (i64, String, String, String, Option<String>, Value);

async fn refusals(pool: &Db) -> Vec<Row> {
    sqlx::query_as::<_, (i64, String, String, String, Option<String>, sqlx::types::Json<Value>)>(
        "SELECT org_id, reason, site, profile, vendor, excluded FROM reservation_refusals ORDER BY id",
    )
    .fetch_all(pool)
    .await
    .expect("refusals")
    .into_iter()
    .map(|(o, r, s, p, v, e)| (o, r, s, p, v, e.0))
    .collect()
}

fn refused(metrics: &Metrics, reason: &str, site: &str, profile: &str) -> u64 {
    metrics
        .reservations_refused
        .with_label_values(&[reason, "acme", site, profile])
        .get()
}

#[tokio::test]
async fn each_refusal_leaves_one_row_with_its_org_spec_and_counts_and_nothing_else_does() {
    let app = spawn_app().await;
    let org = app.org.id;
    // For par1 / epyc / dell: one held, one in maintenance, one of another
    // vendor, one at another site, one of another profile.
    FakeMachine::new()
        .tag("PK-1")
        .profile("epyc")
        .create(&app.pool, org)
        .await;
    FakeHold::on("PK-1")
        .order("ORD-H")
        .create(&app.pool, org)
        .await;
    FakeMachine::new()
        .tag("PK-2")
        .profile("epyc")
        .status("maintenance")
        .create(&app.pool, org)
        .await;
    FakeMachine::new()
        .tag("PK-3")
        .vendor("hp")
        .profile("epyc")
        .create(&app.pool, org)
        .await;
    FakeMachine::new()
        .tag("PK-4")
        .site("fra1")
        .profile("epyc")
        .create(&app.pool, org)
        .await;
    FakeMachine::new()
        .tag("PK-5")
        .profile("xeon")
        .create(&app.pool, org)
        .await;

    // 409 unavailable: one row, with the counts the API answered.
    let (status, body) = app
        .reserve(
            &app.org.token,
            json!({"order_ref": "ORD-U", "site": "par1", "profile": "epyc", "vendor": "dell"}),
        )
        .await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"], "unavailable");
    let expected = json!({"wrong_site": 1, "wrong_vendor": 1, "wrong_profile": 1,
                          "not_ready": 1, "in_service": 0, "held": 1});
    assert_eq!(body["excluded"], expected);
    assert_eq!(
        refusals(&app.pool).await,
        vec![(
            org,
            "unavailable".into(),
            "par1".into(),
            "epyc".into(),
            Some("dell".into()),
            expected.clone()
        )]
    );

    // 409 contended: PK-3 (hp) is a candidate for any vendor, locked by
    // another transaction, so the walk skips it and finds nothing.
    let mut locker = app.db.connection().await;
    let mut tx = locker.begin().await.expect("begin");
    sqlx::query("SELECT 1 FROM machines WHERE asset_tag = 'PK-3' FOR UPDATE")
        .execute(&mut *tx)
        .await
        .expect("lock PK-3");
    let (status, body) = app
        .reserve(
            &app.org.token,
            json!({"order_ref": "ORD-C", "site": "par1", "profile": "epyc"}),
        )
        .await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"], "contended");
    tx.rollback().await.expect("release PK-3");
    let rows = refusals(&app.pool).await;
    assert_eq!(rows.len(), 2);
    assert_eq!(
        rows[1],
        (
            org,
            "contended".into(),
            "par1".into(),
            "epyc".into(),
            None,
            json!({"candidates": 1})
        )
    );

    // 201 (and its 200 replay) and 400s leave no row.
    let (status, body) = app
        .reserve(
            &app.org.token,
            json!({"order_ref": "ORD-OK", "site": "par1", "profile": "epyc"}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let (status, _) = app
        .reserve(
            &app.org.token,
            json!({"order_ref": "ORD-OK", "site": "par1", "profile": "epyc"}),
        )
        .await;
    assert_eq!(status, 200);
    for bad in [
        json!({"order_ref": "ORD-B1", "site": "par1"}),
        json!({"order_ref": "ORD-B2", "site": "par1", "profile": "epyc", "hold_seconds": 0}),
        json!({"order_ref": "ORD-B3", "site": "par1", "profile": "epyc", "colour": "red"}),
        json!({"order_ref": "", "site": "par1", "profile": "epyc"}),
    ] {
        let (status, body) = app.reserve(&app.org.token, bad.clone()).await;
        assert_eq!(status, 400, "{bad}: {body}");
    }
    assert_eq!(refusals(&app.pool).await.len(), 2, "only the two 409s");

    // Another organization's refusal is its own.
    let (status, _) = app
        .reserve(
            &app.other.token,
            json!({"order_ref": "ORD-X", "site": "par1", "profile": "epyc"}),
        )
        .await;
    assert_eq!(status, 409);
    let rows = refusals(&app.pool).await;
    assert_eq!(rows.len(), 3);
    assert_eq!(rows[2].0, app.other.id);
    assert_eq!(rows[2].1, "unavailable");
    assert_eq!(
        rows[2].5["held"], 0,
        "the other org sees none of acme's machines"
    );

    // The metric counted the three refusals by reason, organization, site
    // and profile: the other organization's under its own slug, and as
    // `other`, for it has no par1/epyc machine.
    assert_eq!(refused(&app.metrics, "unavailable", "par1", "epyc"), 1);
    assert_eq!(refused(&app.metrics, "contended", "par1", "epyc"), 1);
    let text = app.metrics_text().await;
    for line in [
        r#"poolkeeper_reservations_refused_total{org="acme",profile="epyc",reason="unavailable",site="par1"} 1"#,
        r#"poolkeeper_reservations_refused_total{org="other",profile="other",reason="unavailable",site="other"} 1"#,
    ] {
        assert!(text.contains(line), "{line}: {text}");
    }
}

#[tokio::test]
async fn metric_labels_are_bounded_by_the_inventory() {
    let app = spawn_app().await;
    FakeMachine::new()
        .tag("PK-1")
        .profile("epyc")
        .status("maintenance")
        .create(&app.pool, app.org.id)
        .await;
    FakeMachine::new()
        .tag("OT-1")
        .site("fra1")
        .vendor("hp")
        .profile("xeon")
        .status("maintenance")
        .create(&app.pool, app.other.id)
        .await;
    // Twenty made-up sites and profiles: each a refusal, none a label.
    for i in 0..20 {
        let (status, _) = app.reserve(&app.org.token, json!({"order_ref": format!("ORD-{i}"), "site": format!("nowhere-{i}"), "profile": format!("p-{i}")}))
        .await;
        assert_eq!(status, 409);
    }
    // A known site with an unknown profile, and names known only from
    // another organization's inventory: `other` here, for this one's
    // inventory has none of them.
    for (order, site, profile) in [
        ("ORD-A", "par1", "made-up"),
        ("ORD-B", "par1", "epyc"),
        ("ORD-C", "fra1", "xeon"),
    ] {
        let (status, _) = app
            .reserve(
                &app.org.token,
                json!({"order_ref": order, "site": site, "profile": profile}),
            )
            .await;
        assert_eq!(status, 409);
    }
    assert_eq!(refused(&app.metrics, "unavailable", OTHER, OTHER), 21);
    assert_eq!(refused(&app.metrics, "unavailable", "par1", OTHER), 1);
    assert_eq!(refused(&app.metrics, "unavailable", "par1", "epyc"), 1);
    let text = app.metrics_text().await;
    let series = text
        .lines()
        .filter(|l| l.starts_with("poolkeeper_reservations_refused_total{"))
        .count();
    assert_eq!(series, 3, "{text}");
    assert!(!text.contains("nowhere"), "{text}");
    // Every refusal is still recorded with its real spec.
    assert_eq!(
        app.count("SELECT count(*) FROM reservation_refusals WHERE site LIKE 'nowhere-%'")
            .await,
        20
    );
}

#[tokio::test]
async fn the_known_set_is_read_once_and_again_on_refresh() {
    let db = migrated_db().await;
    let pool = db.pool().await;
    let (org, _) = crate::helpers::seed_org_with_machines(&pool, "acme", true, 1).await;
    let labels = RefusalLabels::default();
    let named =
        |site: &str, profile: &str| ("acme".to_owned(), site.to_owned(), profile.to_owned());
    // The first use reads the inventory (seed: par1 / r650).
    assert_eq!(
        labels.labels(&pool, org, "par1", "r650").await,
        named("par1", "r650")
    );
    FakeMachine::new()
        .tag("new-1")
        .site("ams1")
        .profile("gpu")
        .create(&pool, org)
        .await;
    // Within LABELS_MAX_AGE the set is not read again: no query per refusal.
    assert_eq!(
        labels.labels(&pool, org, "ams1", "gpu").await,
        named(OTHER, OTHER)
    );
    labels.refresh(&pool).await.expect("refresh");
    assert_eq!(
        labels.labels(&pool, org, "ams1", "gpu").await,
        named("ams1", "gpu")
    );
    // Another organization's pool names are not this one's: a rival that
    // has no ams1 machine labels ams1 `other`, under its own slug.
    let (rival, _) = crate::helpers::seed_org_with_machines(&pool, "rival", true, 0).await;
    labels.refresh(&pool).await.expect("refresh");
    assert_eq!(
        labels.labels(&pool, rival, "ams1", "gpu").await,
        ("rival".to_owned(), OTHER.to_owned(), OTHER.to_owned())
    );
}

/// Inserts a refusal `ago` before now (database clock).
async fn insert_refusal(
    pool: &Db,
    org: i64,
    reason: &str,
    site: &str,
    profile: &str,
    vendor: Option<&str>,
    ago: &str,
) {
    let excluded = if reason == "unavailable" {
        json!({"wrong_site": 0, "wrong_vendor": 0, "wrong_profile": 2, "not_ready": 1, "in_service": 0, "held": 3})
    } else {
        json!({"candidates": 2})
    };
    sqlx::query(
        "INSERT INTO reservation_refusals (org_id, at, reason, site, profile, vendor, excluded)
         VALUES ($1, clock_timestamp() - $2::interval, $3, $4, $5, $6, $7)",
    )
    .bind(org)
    .bind(ago)
    .bind(reason)
    .bind(site)
    .bind(profile)
    .bind(vendor)
    .bind(sqlx::types::Json(excluded))
    .execute(pool)
    .await
    .expect("insert refusal");
}

fn select<'a>(doc: &'a scraper::Html, css: &str) -> Vec<scraper::ElementRef<'a>> {
    let sel = scraper::Selector::parse(css).expect("selector");
    doc.select(&sel).collect()
}

fn cell(row: &scraper::ElementRef, key: &str) -> String {
    let sel = scraper::Selector::parse(&format!("td[data-k=\"{key}\"]")).expect("selector");
    row.select(&sel)
        .next()
        .map(|c| c.text().collect::<String>())
        .unwrap_or_default()
}

#[tokio::test]
async fn the_demand_page_lists_the_most_refused_specs_with_a_why_not_link() {
    let app = spawn_app().await;
    let (org, other) = (app.org.id, app.other.id);
    for ago in ["10 minutes", "2 hours", "3 days"] {
        insert_refusal(&app.pool, org, "unavailable", "par1", "gpu", None, ago).await;
    }
    insert_refusal(&app.pool, org, "contended", "par1", "gpu", None, "1 hour").await;
    insert_refusal(
        &app.pool,
        org,
        "unavailable",
        "par1",
        "epyc",
        Some("dell"),
        "30 hours",
    )
    .await;
    for _ in 0..3 {
        insert_refusal(
            &app.pool,
            org,
            "contended",
            "fra1",
            "xeon",
            None,
            "5 minutes",
        )
        .await;
    }
    // Outside the window, and another organization's: not shown.
    insert_refusal(
        &app.pool,
        org,
        "unavailable",
        "old1",
        "gone",
        None,
        "8 days",
    )
    .await;
    insert_refusal(
        &app.pool,
        other,
        "unavailable",
        "oth1",
        "theirs",
        None,
        "1 hour",
    )
    .await;

    let viewer = app.staff("vera@acme.example", "viewer").await;
    let (status, body) = viewer.page("/demand").await;
    assert_eq!(status, 200, "{body}");
    let doc = scraper::Html::parse_document(&body);
    let rows = select(&doc, "table.demand tbody tr");
    let specs: Vec<(String, String, String)> = rows
        .iter()
        .map(|r| {
            let a = |k: &str| r.value().attr(k).unwrap_or_default().to_owned();
            (a("data-site"), a("data-profile"), a("data-vendor"))
        })
        .collect();
    assert_eq!(
        specs,
        vec![
            ("par1".into(), "gpu".into(), "".into()),
            ("par1".into(), "epyc".into(), "dell".into()),
            ("fra1".into(), "xeon".into(), "".into()),
        ],
        "most refused as unavailable first, then contended"
    );
    assert_eq!(cell(&rows[0], "unavailable_24h"), "2");
    assert_eq!(cell(&rows[0], "unavailable_7d"), "3");
    assert_eq!(cell(&rows[0], "contended_7d"), "1");
    assert_eq!(cell(&rows[1], "unavailable_24h"), "0");
    assert_eq!(cell(&rows[1], "unavailable_7d"), "1");
    assert_eq!(cell(&rows[2], "contended_7d"), "3");
    assert!(
        rows[0].html().contains("not_ready 1, held 3"),
        "{}",
        rows[0].html()
    );
    let links: Vec<String> = select(&doc, "table.demand tbody a")
        .iter()
        .filter_map(|a| a.value().attr("href").map(str::to_owned))
        .collect();
    assert_eq!(
        links,
        vec![
            "/why-not?site=par1&profile=gpu",
            "/why-not?site=par1&profile=epyc&vendor=dell",
            "/why-not?site=fra1&profile=xeon",
        ]
    );
    assert!(!body.contains("old1") && !body.contains("oth1"), "{body}");
    // The link works: why-not explains that spec.
    let (status, why) = viewer.page(&links[1]).await;
    assert_eq!(status, 200);
    assert!(
        why.contains("Unavailable: buy hardware. No machine matches this order."),
        "{why}"
    );

    // An organization without refusals says so.
    app.create_staff(other, "root@other.example", "admin").await;
    let root = app.logged_in("root@other.example").await;
    let (_, theirs) = root.page("/demand").await;
    assert!(theirs.contains("oth1"));
    assert!(!theirs.contains("par1"));
}

#[tokio::test]
async fn the_overview_shows_unavailable_refusals_per_site_and_profile_beside_sellable_stock() {
    let app = spawn_app().await;
    let org = app.org.id;
    FakeMachine::new()
        .tag("PK-1")
        .profile("epyc")
        .create(&app.pool, org)
        .await;
    FakeMachine::new()
        .tag("PK-2")
        .profile("epyc")
        .create(&app.pool, org)
        .await;
    FakeHold::on("PK-2")
        .order("ORD-H")
        .create(&app.pool, org)
        .await;
    FakeMachine::new()
        .tag("PK-3")
        .profile("epyc")
        .status("broken")
        .create(&app.pool, org)
        .await;
    FakeMachine::new()
        .tag("PK-4")
        .site("fra1")
        .vendor("hp")
        .profile("xeon")
        .create(&app.pool, org)
        .await;
    for ago in [
        "30 minutes",
        "5 hours 10 minutes",
        "72 hours 30 minutes",
        "8 days",
    ] {
        insert_refusal(&app.pool, org, "unavailable", "par1", "epyc", None, ago).await;
    }
    // Contended is another signal: not counted here.
    insert_refusal(&app.pool, org, "contended", "par1", "epyc", None, "1 hour").await;
    // A profile never stocked.
    insert_refusal(
        &app.pool,
        org,
        "unavailable",
        "par1",
        "gpu",
        Some("dell"),
        "2 hours",
    )
    .await;
    insert_refusal(
        &app.pool,
        org,
        "unavailable",
        "par1",
        "gpu",
        None,
        "3 hours",
    )
    .await;

    let viewer = app.staff("vera@acme.example", "viewer").await;
    let (status, body) = viewer.page("/").await;
    assert_eq!(status, 200, "{body}");
    let doc = scraper::Html::parse_document(&body);
    let rows = select(&doc, "section.demand-overview tbody tr");
    let keys: Vec<(String, String)> = rows
        .iter()
        .map(|r| {
            (
                r.value().attr("data-site").unwrap_or_default().to_owned(),
                r.value()
                    .attr("data-profile")
                    .unwrap_or_default()
                    .to_owned(),
            )
        })
        .collect();
    assert_eq!(
        keys,
        vec![
            ("par1".to_owned(), "epyc".to_owned()),
            ("par1".to_owned(), "gpu".to_owned()),
            ("fra1".to_owned(), "xeon".to_owned()),
        ]
    );
    let figures = |r: &scraper::ElementRef| {
        (
            cell(r, "sellable"),
            cell(r, "unavailable_24h"),
            cell(r, "unavailable_7d"),
        )
    };
    assert_eq!(figures(&rows[0]), ("1".into(), "2".into(), "3".into()));
    assert_eq!(figures(&rows[1]), ("0".into(), "2".into(), "2".into()));
    assert_eq!(figures(&rows[2]), ("1".into(), "0".into(), "0".into()));
    // One bar per hour with refusals, the last hour on the right: 0, 5 and
    // 72 hours ago, each of height 1 out of a peak of 1.
    let bars: Vec<(String, String)> = rows[0]
        .select(&scraper::Selector::parse("svg.spark rect.spark-bar").expect("selector"))
        .map(|b| {
            (
                b.value().attr("x").unwrap_or_default().to_owned(),
                b.value().attr("height").unwrap_or_default().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        bars,
        vec![
            ("501".to_owned(), "32.00".to_owned()),
            ("486".to_owned(), "32.00".to_owned()),
            ("285".to_owned(), "32.00".to_owned()),
        ]
    );
    assert!(
        select(&doc, "svg.spark title")[0]
            .text()
            .collect::<String>()
            .contains("2 orders refused as unavailable in the last 24 hours, 3 in 7 days")
    );
    assert!(select(&doc, "section.demand-overview a[href=\"/demand\"]").len() == 1);
    let why_not: Vec<String> = select(&doc, "section.demand-overview tbody a")
        .iter()
        .filter_map(|a| a.value().attr("href").map(str::to_owned))
        .collect();
    assert_eq!(
        why_not,
        vec![
            "/why-not?site=par1&profile=epyc",
            "/why-not?site=par1&profile=gpu",
            "/why-not?site=fra1&profile=xeon",
        ]
    );
    // The CSRF field of the layout is still there (the page is whole).
    assert!(hidden_field(&body, "csrf").is_some());
}

// ---------------------------------------------------------------------------
// Retention
// ---------------------------------------------------------------------------

async fn take_sweep_lease(pool: &Db, holder: &str) -> Mandate {
    match lease::claim(pool, SWEEP_KEY, holder, Duration::from_secs(60))
        .await
        .expect("claim")
    {
        Claim::Acquired(m) => m,
        Claim::HeldByOther => panic!("{holder} could not take the sweep lease"),
    }
}

/// Ages (in days, by the database clock) of the refusal rows left.
async fn ages(pool: &Db) -> Vec<i32> {
    sqlx::query_scalar(
        "SELECT extract(day FROM clock_timestamp() - at)::int FROM reservation_refusals ORDER BY at",
    )
    .fetch_all(pool)
    .await
    .expect("ages")
}

#[tokio::test]
async fn refusals_past_retention_are_purged_in_fenced_batches_oldest_first() {
    let db = migrated_db().await;
    let pool = db.pool().await;
    let (org, _) = crate::helpers::seed_org_with_machines(&pool, "acme", true, 0).await;
    for days in [400, 200, 120, 95, 91, 89, 30, 0] {
        insert_refusal(
            &pool,
            org,
            "unavailable",
            "par1",
            "epyc",
            None,
            &format!("{days} days 1 hour"),
        )
        .await;
    }
    let m = take_sweep_lease(&pool, "replica-a").await;
    // Batches of 2: the oldest go first, and a short batch means done.
    assert_eq!(
        sweep::purge_refusals_batch(&pool, "replica-a", m.fence, 90, 2)
            .await
            .expect("batch"),
        2
    );
    assert_eq!(ages(&pool).await, vec![120, 95, 91, 89, 30, 0]);

    // A stale mandate deletes nothing: another replica took the lease.
    sqlx::query("UPDATE leases SET expires_at = clock_timestamp() WHERE key = 'sweep'")
        .execute(&pool)
        .await
        .expect("expire the lease");
    let b = take_sweep_lease(&pool, "replica-b").await;
    assert!(matches!(
        sweep::purge_refusals_batch(&pool, "replica-a", m.fence, 90, 2).await,
        Err(SweepError::Lost)
    ));
    assert_eq!(ages(&pool).await.len(), 6);

    assert_eq!(
        sweep::purge_refusals_batch(&pool, "replica-b", b.fence, 90, 2)
            .await
            .expect("batch"),
        2
    );
    assert_eq!(
        sweep::purge_refusals_batch(&pool, "replica-b", b.fence, 90, 2)
            .await
            .expect("batch"),
        1,
        "a short batch: nothing older is left"
    );
    assert_eq!(ages(&pool).await, vec![89, 30, 0]);
    // A shorter retention reaches further.
    assert_eq!(
        sweep::purge_refusals_batch(&pool, "replica-b", b.fence, 7, 100)
            .await
            .expect("batch"),
        2
    );
    assert_eq!(ages(&pool).await, vec![0]);
}

#[tokio::test]
async fn the_sweep_worker_purges_refusals_past_the_configured_retention() {
    let db = migrated_db().await;
    let pool = db.pool().await;
    let (org, _) = crate::helpers::seed_org_with_machines(&pool, "acme", true, 0).await;
    // More than one batch past 10 days, and rows inside it.
    sqlx::query(
        "INSERT INTO reservation_refusals (org_id, at, reason, site, profile, excluded)
         SELECT $1, clock_timestamp() - interval '11 days' - make_interval(mins => g),
                'unavailable', 'par1', 'epyc', '{}'
           FROM generate_series(1, $2) g",
    )
    .bind(org)
    .bind(sweep::PURGE_BATCH_SIZE as i32 + 7)
    .execute(&pool)
    .await
    .expect("old rows");
    for days in ["9 days", "1 hour"] {
        insert_refusal(&pool, org, "contended", "par1", "epyc", None, days).await;
    }
    let mut settings = test_settings();
    settings.sweep_period = Duration::from_secs(1);
    settings.lease_duration = Duration::from_secs(5);
    settings.refusal_retention_days = 10;
    let metrics = Metrics::new();
    let (stop, stopped) = watch::channel(false);
    let worker = {
        let (pool, settings, metrics) = (pool.clone(), settings.clone(), metrics.clone());
        tokio::spawn(async move { sweep::run(&pool, &settings, metrics, stopped).await })
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let left: i64 = sqlx::query_scalar("SELECT count(*) FROM reservation_refusals")
            .fetch_one(&pool)
            .await
            .expect("count");
        if left == 2 {
            break;
        }
        assert!(Instant::now() < deadline, "{left} rows left after 20 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = stop.send(true);
    tokio::time::timeout(Duration::from_secs(15), worker)
        .await
        .expect("worker stops")
        .expect("worker task");
    assert_eq!(ages(&pool).await, vec![9, 0]);
    assert_eq!(metrics.lease_acquired.get(), 1);
}
