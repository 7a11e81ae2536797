//! Capacity as staff see it (R17-R19): the overview's headroom and what is
//! left to orders without a segment, "kept for" on why-not and the machines
//! page, lost demand's `reserved` and `customer_limit`, the customer of a
//! hold, and the settings that keep headroom and cap a customer.

use scraper::Html;

use super::{sel, text_of};
use crate::helpers::{FakeHold, FakeMachine, InService};
use crate::helpers::{StaffClient, TestApp, spawn_app};

async fn keep(app: &TestApp, site: &str, profile: &str, segment: &str, machines: i32) {
    sqlx::query(
        "INSERT INTO headroom (org_id, site, profile, segment, machines, updated_by)
         VALUES ($1, $2, $3, $4, $5, 'test')",
    )
    .bind(app.org.id)
    .bind(site)
    .bind(profile)
    .bind(segment)
    .bind(machines)
    .execute(&app.pool)
    .await
    .expect("headroom");
}

async fn ready(app: &TestApp, tags: &[&str], site: &str, profile: &str) {
    for tag in tags {
        FakeMachine::new()
            .tag(tag)
            .site(site)
            .profile(profile)
            .create(&app.pool, app.org.id)
            .await;
    }
}

/// The text of `td[data-k=key]` in the row of `row_selector`.
fn cell(html: &str, row_selector: &str, key: &str) -> String {
    text_of(html, &format!("{row_selector} td[data-k=\"{key}\"]"))
        .into_iter()
        .next()
        .unwrap_or_else(|| panic!("no {key} in {row_selector}"))
}

#[tokio::test]
async fn the_overview_says_the_headroom_kept_per_profile_and_what_is_left_without_a_segment() {
    let app = spawn_app().await;
    ready(&app, &["E-1", "E-2", "E-3"], "par1", "epyc").await;
    ready(&app, &["G-1"], "par1", "gpu").await;
    keep(&app, "par1", "epyc", "enterprise", 2).await;
    keep(&app, "par1", "epyc", "repairs", 1).await;
    let viewer = app.staff("vera@acme.example", "viewer").await;
    let (status, body) = viewer.page("/").await;
    assert_eq!(status, 200, "{body}");
    let epyc = "section.site table.profiles tr[data-profile=\"epyc\"]";
    assert_eq!(cell(&body, epyc, "kept"), "2 for enterprise, 1 for repairs");
    assert_eq!(cell(&body, epyc, "sellable"), "3");
    assert_eq!(
        cell(&body, epyc, "available"),
        "0",
        "3 sellable, 3 kept for segments: none for an order without one"
    );
    let gpu = "section.site table.profiles tr[data-profile=\"gpu\"]";
    assert_eq!(cell(&body, gpu, "kept"), "nothing kept");
    assert_eq!(cell(&body, gpu, "available"), "1");

    // Less headroom: what is left shows at once.
    sqlx::query("DELETE FROM headroom WHERE segment = 'repairs'")
        .execute(&app.pool)
        .await
        .expect("delete");
    let (_, body) = viewer.page("/").await;
    assert_eq!(cell(&body, epyc, "kept"), "2 for enterprise");
    assert_eq!(cell(&body, epyc, "available"), "1");
}

/// The overview counts what the capacity API tells the shop (R17), from
/// the same reading: per pool, every state, the headroom and what is
/// available; an overdue hold is sellable (the allocator takes it, R11),
/// a live one held, a live service sold.
#[tokio::test]
async fn the_overview_counts_every_pool_as_the_capacity_api_does() {
    let app = spawn_app().await;
    ready(&app, &["A-1", "A-2", "A-3", "A-4", "A-5"], "par1", "epyc").await;
    ready(&app, &["B-1", "B-2"], "ams9", "epyc").await;
    FakeMachine::new()
        .tag("A-6")
        .site("par1")
        .profile("epyc")
        .status("maintenance")
        .create(&app.pool, app.org.id)
        .await;
    FakeHold::on("A-1").create(&app.pool, app.org.id).await;
    FakeHold::on("A-2")
        .created_ago("20 minutes")
        .deadline("-1 minute")
        .create(&app.pool, app.org.id)
        .await;
    FakeHold::on("A-3")
        .state(InService)
        .create(&app.pool, app.org.id)
        .await;
    FakeHold::on("B-1").create(&app.pool, app.org.id).await;
    keep(&app, "par1", "epyc", "enterprise", 1).await;

    let r = app
        .http
        .get(app.url("/api/v1/capacity"))
        .bearer_auth(&app.org.orders_token)
        .send()
        .await
        .expect("GET /capacity");
    assert_eq!(r.status(), 200);
    let api: serde_json::Value = r.json().await.expect("json");
    let viewer = app.staff("vera@acme.example", "viewer").await;
    let (status, body) = viewer.page("/").await;
    assert_eq!(status, 200, "{body}");
    let pools = api["pools"].as_array().expect("pools");
    assert_eq!(pools.len(), 2, "{api}");
    for p in pools {
        let site = p["site"].as_str().expect("site");
        let row =
            format!("section.site[data-site=\"{site}\"] table.profiles tr[data-profile=\"epyc\"]");
        for key in [
            "sellable",
            "held",
            "sold",
            "not_ready",
            "total",
            "available",
        ] {
            assert_eq!(
                cell(&body, &row, key),
                p[key].to_string(),
                "{site} {key}: {api}"
            );
        }
    }
    // The figures themselves: par1 has A-2 (overdue), A-4, A-5 sellable.
    let par1 = "section.site[data-site=\"par1\"] table.profiles tr[data-profile=\"epyc\"]";
    let counts: Vec<String> = ["sellable", "held", "sold", "not_ready", "available"]
        .iter()
        .map(|k| cell(&body, par1, k))
        .collect();
    assert_eq!(counts, ["3", "1", "1", "1", "2"]);
}

#[tokio::test]
async fn why_not_and_the_machines_check_say_kept_for_where_headroom_leaves_the_order_nothing() {
    let app = spawn_app().await;
    ready(&app, &["E-1", "E-2"], "par1", "epyc").await;
    keep(&app, "par1", "epyc", "enterprise", 2).await;
    let viewer = app.staff("vera@acme.example", "viewer").await;

    let (status, body) = viewer.page("/why-not?site=par1&profile=epyc").await;
    assert_eq!(status, 200, "{body}");
    let answer = text_of(&body, "#answer").join("");
    assert!(
        answer.starts_with("Reserved: kept for enterprise."),
        "{answer}"
    );
    let verdicts = text_of(&body, "table.candidates td.verdict[data-kind=\"reserved\"]");
    assert_eq!(verdicts.len(), 2, "{body}");
    assert!(
        verdicts
            .iter()
            .all(|v| v.contains("Not a candidate: kept for enterprise")),
        "{verdicts:?}"
    );
    assert!(
        text_of(&body, "#kept")
            .join("")
            .contains("2 for enterprise")
    );

    // An order of the segment may take them.
    let (_, body) = viewer
        .page("/why-not?site=par1&profile=epyc&segment=enterprise")
        .await;
    assert!(
        text_of(&body, "#answer")
            .join("")
            .starts_with("Would reserve"),
        "{body}"
    );
    assert_eq!(
        text_of(&body, "td.verdict[data-kind=\"reserved\"]").len(),
        0
    );
    assert_eq!(
        text_of(&body, "td.verdict[data-kind=\"candidate\"]").len(),
        2
    );
    // Another segment is outside it, as no segment is.
    let (_, body) = viewer
        .page("/why-not?site=par1&profile=epyc&segment=repairs")
        .await;
    assert!(
        text_of(&body, "#answer")
            .join("")
            .starts_with("Reserved: kept for enterprise."),
        "{body}"
    );

    // With one more machine an order of one without a segment gets it, an
    // order of two does not.
    ready(&app, &["E-3"], "par1", "epyc").await;
    let (_, body) = viewer.page("/why-not?site=par1&profile=epyc").await;
    assert!(
        text_of(&body, "#answer")
            .join("")
            .starts_with("Would reserve"),
        "{body}"
    );
    assert_eq!(
        text_of(&body, "td.verdict[data-kind=\"candidate\"]").len(),
        3,
        "any one of them may be the one it takes"
    );
    let (_, body) = viewer
        .page("/why-not?site=par1&profile=epyc&quantity=2")
        .await;
    assert!(
        text_of(&body, "#answer")
            .join("")
            .starts_with("Reserved: kept for enterprise."),
        "{body}"
    );

    // The machines page's order check says the same, and takes a segment.
    keep(&app, "par1", "epyc", "repairs", 1).await;
    let (status, body) = viewer
        .page("/machines?spec_site=par1&spec_profile=epyc")
        .await;
    assert_eq!(status, 200, "{body}");
    let kept = text_of(&body, "td.verdict[data-kind=\"reserved\"]");
    assert_eq!(kept.len(), 3, "{body}");
    assert!(
        kept.iter()
            .all(|v| v.contains("kept for enterprise and repairs")),
        "{kept:?}"
    );
    let (_, body) = viewer
        .page("/machines?spec_site=par1&spec_profile=epyc&spec_segment=enterprise")
        .await;
    assert_eq!(
        text_of(&body, "td.verdict[data-kind=\"candidate\"]").len(),
        3,
        "an enterprise order leaves 1 for repairs and may take 2 of the 3: {body}"
    );
    sqlx::query("UPDATE headroom SET machines = 3 WHERE segment = 'repairs'")
        .execute(&app.pool)
        .await
        .expect("more for repairs");
    let (_, body) = viewer
        .page("/machines?spec_site=par1&spec_profile=epyc&spec_segment=enterprise")
        .await;
    let kept = text_of(&body, "td.verdict[data-kind=\"reserved\"]");
    assert_eq!(
        kept.len(),
        3,
        "3 kept for repairs leave an enterprise order none"
    );
    assert!(
        kept.iter().all(|v| v.contains("kept for repairs")),
        "{kept:?}"
    );
    let doc = Html::parse_document(&body);
    let field = doc
        .select(&sel("input#s-segment"))
        .next()
        .expect("the segment field");
    assert_eq!(field.value().attr("value"), Some("enterprise"));

    // A segment that is not one is refused, naming the field.
    for path in [
        "/why-not?site=par1&profile=epyc&segment=Not%20One",
        "/machines?spec_site=par1&spec_profile=epyc&spec_segment=Not%20One",
    ] {
        let (status, body) = viewer.page(path).await;
        assert_eq!(status, 400, "{path}: {body}");
        assert!(body.contains("segment"), "{body}");
    }
}

async fn insert_refusal(app: &TestApp, reason: &str, site: &str, profile: &str, ago: &str) {
    sqlx::query(
        "INSERT INTO reservation_refusals (org_id, at, reason, site, profile, excluded, segment, customer_ref)
         VALUES ($1, clock_timestamp() - $2::interval, $3, $4, $5, '{}'::jsonb, NULL,
                 CASE WHEN $3 = 'customer_limit' THEN 'CUST-1' END)",
    )
    .bind(app.org.id)
    .bind(ago)
    .bind(reason)
    .bind(site)
    .bind(profile)
    .execute(&app.pool)
    .await
    .expect("refusal");
}

#[tokio::test]
async fn lost_demand_counts_reserved_and_customer_limit_apart_from_unavailable() {
    let app = spawn_app().await;
    ready(&app, &["E-1"], "par1", "epyc").await;
    insert_refusal(&app, "unavailable", "par1", "epyc", "1 hour").await;
    for ago in ["10 minutes", "2 days"] {
        insert_refusal(&app, "reserved", "par1", "epyc", ago).await;
    }
    for ago in ["5 minutes", "20 minutes", "3 days"] {
        insert_refusal(&app, "customer_limit", "par1", "epyc", ago).await;
    }
    insert_refusal(&app, "contended", "par1", "epyc", "1 minute").await;
    let viewer = app.staff("vera@acme.example", "viewer").await;

    let (status, body) = viewer.page("/demand").await;
    assert_eq!(status, 200, "{body}");
    let row = "table.demand tr[data-site=\"par1\"][data-profile=\"epyc\"]";
    assert_eq!(cell(&body, row, "unavailable_7d"), "1");
    assert_eq!(cell(&body, row, "reserved_7d"), "2");
    assert_eq!(cell(&body, row, "customer_limit_7d"), "3");
    assert_eq!(cell(&body, row, "contended_7d"), "1");
    assert!(body.contains("Kept for a segment (7 days)"));
    let csv = viewer.get("/demand.csv").await.text().await.expect("csv");
    let mut lines = csv.lines();
    assert!(
        lines
            .next()
            .unwrap_or_default()
            .contains("unavailable_7d,reserved_7d,customer_limit_7d,contended_7d"),
        "{csv}"
    );
    assert!(
        lines.next().unwrap_or_default().contains(",1,2,3,1,"),
        "{csv}"
    );

    // The overview charts them apart: their own counts, their own bars.
    let (_, body) = viewer.page("/").await;
    let row = "section.demand-overview tr[data-site=\"par1\"][data-profile=\"epyc\"]";
    assert_eq!(cell(&body, row, "unavailable_7d"), "1");
    assert_eq!(cell(&body, row, "reserved_7d"), "2");
    assert_eq!(cell(&body, row, "customer_limit_7d"), "3");
    let doc = Html::parse_document(&body);
    let count = |css: &str| doc.select(&sel(css)).count();
    assert_eq!(count("svg.spark rect.spark-unavailable"), 1);
    assert_eq!(count("svg.spark rect.spark-reserved"), 2, "two hours");
    assert_eq!(
        count("svg.spark rect.spark-customer_limit"),
        2,
        "5 and 20 minutes ago share the last hour"
    );
    let titles = text_of(&body, "svg.spark rect.spark-customer_limit title");
    assert!(
        titles.contains(&"2 customer at its cap in the last hour".to_owned()),
        "{titles:?}"
    );
}

#[tokio::test]
async fn the_live_list_and_a_reservation_show_the_customer_and_the_segment() {
    let app = spawn_app().await;
    ready(&app, &["E-1", "E-2"], "par1", "epyc").await;
    let named = FakeHold::on("E-1")
        .order("ORD-C")
        .create(&app.pool, app.org.id)
        .await;
    let plain = FakeHold::on("E-2")
        .order("ORD-P")
        .hold_seconds(1200)
        .create(&app.pool, app.org.id)
        .await;
    sqlx::query(
        "UPDATE reservations SET customer_ref = 'CUST-42', segment = 'enterprise' WHERE id = $1",
    )
    .bind(named)
    .execute(&app.pool)
    .await
    .expect("name the customer");
    let viewer = app.staff("vera@acme.example", "viewer").await;

    let (status, body) = viewer.page("/reservations").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        text_of(
            &body,
            &format!("tr[data-reservation=\"{named}\"] .customer")
        ),
        vec!["for CUST-42 (enterprise)"]
    );
    assert!(
        text_of(
            &body,
            &format!("tr[data-reservation=\"{plain}\"] .customer")
        )
        .is_empty(),
        "a hold of no named customer says nothing more"
    );
    let csv = viewer
        .get("/reservations.csv")
        .await
        .text()
        .await
        .expect("csv");
    assert!(
        csv.lines()
            .next()
            .unwrap_or_default()
            .ends_with("customer_ref,segment,profile,profile_asked")
    );
    assert!(csv.contains(",CUST-42,enterprise,"), "{csv}");

    let (_, body) = viewer.page(&format!("/reservations/{named}")).await;
    assert_eq!(text_of(&body, "#customer"), vec!["CUST-42"]);
    assert_eq!(text_of(&body, "#segment"), vec!["enterprise"]);
    let (_, body) = viewer.page(&format!("/reservations/{plain}")).await;
    assert_eq!(text_of(&body, "#customer"), vec!["none named"]);
    assert!(text_of(&body, "#segment").is_empty());
}

async fn org_caps(app: &TestApp) -> (i32, Option<String>) {
    sqlx::query_as("SELECT customer_hold_limit, repairs_segment FROM organizations WHERE id = $1")
        .bind(app.org.id)
        .fetch_one(&app.pool)
        .await
        .expect("org")
}

async fn audit_count(app: &TestApp, action: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM audit_log WHERE action = $1")
        .bind(action)
        .fetch_one(&app.pool)
        .await
        .expect("audit")
}

async fn settings_post(c: &StaffClient, fields: &[(&str, &str)]) -> u16 {
    let csrf = c.csrf().await;
    let mut form = vec![("csrf", csrf.as_str()), ("datacenter", "on")];
    form.extend_from_slice(fields);
    c.post_form("/settings", &form).await.status().as_u16()
}

#[tokio::test]
async fn admins_set_the_customer_cap_and_the_repairs_segment_audited_and_bad_values_write_nothing()
{
    let app = spawn_app().await;
    let admin = app.staff("root@acme.example", "admin").await;
    let status = settings_post(
        &admin,
        &[("customer_hold_limit", "5"), ("repairs_segment", "repairs")],
    )
    .await;
    assert_eq!(status, 303);
    assert_eq!(org_caps(&app).await, (5, Some("repairs".into())));
    assert_eq!(audit_count(&app, "org.customer_hold_limit").await, 1);
    assert_eq!(audit_count(&app, "org.repairs_segment").await, 1);
    let (_, page) = admin.page("/settings").await;
    let doc = Html::parse_document(&page);
    let value = |id: &str| {
        doc.select(&sel(&format!("input#{id}")))
            .next()
            .and_then(|e| e.value().attr("value").map(str::to_owned))
    };
    assert_eq!(value("customer_hold_limit").as_deref(), Some("5"));
    assert_eq!(value("repairs_segment").as_deref(), Some("repairs"));

    // The same values again change nothing and audit nothing more.
    settings_post(
        &admin,
        &[("customer_hold_limit", "5"), ("repairs_segment", "repairs")],
    )
    .await;
    assert_eq!(audit_count(&app, "org.customer_hold_limit").await, 1);

    for (field, value) in [
        ("customer_hold_limit", "10001"),
        ("customer_hold_limit", "-1"),
        ("customer_hold_limit", "many"),
        ("repairs_segment", "Not A Segment"),
        ("repairs_segment", "-x"),
    ] {
        let other = if field == "customer_hold_limit" {
            ("repairs_segment", "")
        } else {
            ("customer_hold_limit", "0")
        };
        let status = settings_post(&admin, &[(field, value), other]).await;
        assert_eq!(status, 400, "{field}={value}");
        assert_eq!(
            org_caps(&app).await,
            (5, Some("repairs".into())),
            "{field}={value} wrote nothing, not even the other field"
        );
    }
    assert_eq!(audit_count(&app, "org.customer_hold_limit").await, 1);

    // Empty clears the repairs segment; 0 removes the cap.
    settings_post(
        &admin,
        &[("customer_hold_limit", "0"), ("repairs_segment", "")],
    )
    .await;
    assert_eq!(org_caps(&app).await, (0, None));
    assert_eq!(audit_count(&app, "org.repairs_segment").await, 2);

    // Support cannot.
    let support = app.staff("sam@acme.example", "support").await;
    assert_eq!(
        settings_post(&support, &[("customer_hold_limit", "9")]).await,
        403
    );
    assert_eq!(org_caps(&app).await.0, 0);
}

async fn headroom_post(c: &StaffClient, fields: &[(&str, &str)]) -> reqwest::Response {
    let csrf = c.csrf().await;
    let mut form = vec![("csrf", csrf.as_str())];
    form.extend_from_slice(fields);
    c.post_form("/settings/headroom", &form).await
}

async fn headroom_of(app: &TestApp) -> Vec<(String, String, String, i32)> {
    sqlx::query_as(
        "SELECT site, profile, segment, machines FROM headroom WHERE org_id = $1 ORDER BY 1, 2, 3",
    )
    .bind(app.org.id)
    .fetch_all(&app.pool)
    .await
    .expect("headroom")
}

#[tokio::test]
async fn the_headroom_form_keeps_and_removes_under_the_pools_turn_audited() {
    let app = spawn_app().await;
    let admin = app.staff("root@acme.example", "admin").await;
    // A pool with no machine keeps nothing: refused, nothing written.
    let r = headroom_post(
        &admin,
        &[
            ("site", "par1"),
            ("profile", "epyc"),
            ("segment", "enterprise"),
            ("machines", "2"),
        ],
    )
    .await;
    assert_eq!(r.status().as_u16(), 400);
    assert!(
        r.text()
            .await
            .expect("body")
            .contains("headroom is kept only for a pool that has machines")
    );
    assert!(headroom_of(&app).await.is_empty());
    FakeMachine::new()
        .tag("HF-1")
        .profile("epyc")
        .create(&app.pool, app.org.id)
        .await;
    // The form's site and profile are the organization's own values.
    let (_, page) = admin.page("/settings").await;
    assert_eq!(
        text_of(&page, "#headroom-site option[value=\"par1\"]"),
        vec!["par1"]
    );
    assert_eq!(
        text_of(&page, "#headroom-profile option[value=\"epyc\"]"),
        vec!["epyc"]
    );
    let pool_fields = |machines: &'static str| {
        [
            ("site", "par1"),
            ("profile", "epyc"),
            ("segment", "enterprise"),
            ("machines", machines),
        ]
    };
    let r = headroom_post(&admin, &pool_fields("2")).await;
    assert_eq!(r.status().as_u16(), 303);
    assert_eq!(
        headroom_of(&app).await,
        vec![("par1".into(), "epyc".into(), "enterprise".into(), 2)]
    );
    assert_eq!(audit_count(&app, "headroom.set").await, 1);
    let (_, page) = admin.page("/settings").await;
    assert_eq!(
        text_of(
            &page,
            "#headroom-list tr[data-pool=\"par1/epyc/enterprise\"] td.num"
        ),
        vec!["2"]
    );

    // Bad values: 400, nothing written.
    for (field, value) in [
        ("machines", "-1"),
        ("machines", "100001"),
        ("machines", "two"),
        ("machines", "+3"),
        ("segment", "Enterprise"),
        ("site", ""),
        ("profile", ""),
    ] {
        let mut fields = pool_fields("3").to_vec();
        for f in &mut fields {
            if f.0 == field {
                f.1 = value;
            }
        }
        let r = headroom_post(&admin, &fields).await;
        assert_eq!(r.status().as_u16(), 400, "{field}={value}");
        assert_eq!(headroom_of(&app).await[0].3, 2, "{field}={value}");
    }
    assert_eq!(audit_count(&app, "headroom.set").await, 1);

    // The form waits for the pool's turn: while another transaction holds
    // it, the change is not made; once it ends, it is.
    let mut holder = app.pool.begin().await.expect("begin");
    sqlx::query("SELECT pool_turn($1, 'par1', 'epyc')")
        .bind(app.org.id)
        .execute(&mut *holder)
        .await
        .expect("turn");
    let csrf = admin.csrf().await;
    let post = {
        let admin_http = admin.http.clone();
        let url = admin.url("/settings/headroom");
        let csrf = csrf.clone();
        tokio::spawn(async move {
            admin_http
                .post(url)
                .form(&[
                    ("csrf", csrf.as_str()),
                    ("site", "par1"),
                    ("profile", "epyc"),
                    ("segment", "enterprise"),
                    ("machines", "5"),
                ])
                .send()
                .await
                .expect("POST")
                .status()
                .as_u16()
        })
    };
    // Wait until the form's transaction is seen waiting on an advisory lock.
    let mut waited = false;
    for _ in 0..500 {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity
              WHERE datname = current_database() AND wait_event = 'advisory'
                AND query LIKE '%pool_turn%'",
        )
        .fetch_one(&app.pool)
        .await
        .expect("activity");
        if n > 0 {
            waited = true;
            break;
        }
        tokio::task::yield_now().await;
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(waited, "the headroom form waits for the pool's turn");
    assert_eq!(headroom_of(&app).await[0].3, 2, "not changed while waiting");
    holder.rollback().await.expect("end the turn");
    assert_eq!(post.await.expect("join"), 303);
    assert_eq!(headroom_of(&app).await[0].3, 5);
    assert_eq!(audit_count(&app, "headroom.set").await, 2);

    // 0 removes it, audited under the API's name for a removal.
    let r = headroom_post(&admin, &pool_fields("0")).await;
    assert_eq!(r.status().as_u16(), 303);
    assert!(headroom_of(&app).await.is_empty());
    assert_eq!(audit_count(&app, "headroom.set").await, 2);
    assert_eq!(audit_count(&app, "headroom.removed").await, 1);
    let (_, page) = admin.page("/settings").await;
    assert!(page.contains("id=\"no-headroom\""));

    // Only admins.
    let support = app.staff("sam@acme.example", "support").await;
    let r = headroom_post(&support, &pool_fields("1")).await;
    assert_eq!(r.status().as_u16(), 403);
    assert!(headroom_of(&app).await.is_empty());
}
