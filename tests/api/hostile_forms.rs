//! No input a person can type makes a page fail. The demo's
//! search prefixes, a NUL in a token's name, the database's own refusal of
//! a value (the second net), and the crawler (helpers/crawler.rs) that
//! finds every form reachable from the overview as viewer, support and
//! admin and submits each one with hostile values, one field at a time.

use std::time::Instant;

use scraper::{Html, Selector};

use crate::helpers::crawler;
use crate::helpers::{FakeHold, FakeMachine};
use crate::helpers::{StaffClient, TestApp, spawn_app};

fn sel(s: &str) -> Selector {
    Selector::parse(s).expect("selector")
}

/// A client of the demo organization, logged in with the demo's password.
async fn demo_client(app: &TestApp, email: &str) -> StaffClient {
    app.logged_in_with(email, poolkeeper::demo::PASSWORD).await
}

/// Every prefix of `s`, shortest first, and each in lower case too.
fn prefixes(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (i, _) in s.char_indices().skip(1).chain([(s.len(), ' ')]) {
        out.push(s[..i].to_owned());
        out.push(s[..i].to_lowercase());
    }
    out
}

#[tokio::test]
async fn every_prefix_of_a_demo_order_ref_and_asset_tag_is_a_search_not_a_500() {
    let app = spawn_app().await;
    poolkeeper::demo::load(&app.pool).await.expect("demo");
    let c = demo_client(&app, "support@demo.example").await;
    let refs: Vec<(i64, String)> = sqlx::query_as(
        "SELECT r.id, r.order_ref FROM reservations r JOIN organizations o ON o.id = r.org_id
          WHERE o.slug = 'demo' AND r.order_ref IN ('DEMO-HOLD-0001', 'DEMO-CANCEL-1', 'DEMO-CONVERT-1')",
    )
    .fetch_all(&app.pool)
    .await
    .expect("demo refs");
    assert_eq!(refs.len(), 3, "the demo's story: {refs:?}");
    let tag = "PK-00002";
    let mut targets: Vec<(String, String)> = refs
        .iter()
        .map(|(id, r)| (r.clone(), format!("/reservations/{id}")))
        .collect();
    targets.push((tag.to_owned(), format!("/machines/{tag}")));
    let mut searched = 0;
    for (full, page) in &targets {
        for p in prefixes(full) {
            let r = c
                .http
                .get(c.url("/search"))
                .query(&[("q", &p)])
                .send()
                .await
                .expect("search");
            let status = r.status().as_u16();
            let location = r
                .headers()
                .get("location")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            let body = r.text().await.unwrap_or_default();
            searched += 1;
            if &p == full {
                assert_eq!(status, 303, "{p}: one exact hit opens it: {body}");
                assert_eq!(location.as_deref(), Some(page.as_str()), "{p}");
            } else {
                assert!(
                    status == 200 || status == 303,
                    "searching {p:?} answered {status}: {body}"
                );
            }
            if status == 200 {
                // The prefix of a ref lists it among the hits (at most 50
                // of each kind, most recent first: only checked when the
                // list is not full).
                let doc = Html::parse_document(&body);
                let hits = doc.select(&sel("table th[scope=row]")).count();
                let listed = body.contains(full.as_str());
                assert!(
                    listed || hits >= 50,
                    "searching {p:?} did not list {full}: {hits} hits"
                );
            }
        }
    }
    assert!(searched > 60, "{searched} searches");
}

#[tokio::test]
async fn a_nul_in_a_token_name_is_a_400_naming_the_field_and_writes_nothing() {
    let app = spawn_app().await;
    let c = app.staff("root@acme.example", "admin").await;
    let csrf = c.csrf().await;
    let before = app.count("SELECT count(*) FROM api_tokens").await;
    for name in ["ci\0token", "\0", "bell\u{7}", "esc\u{1b}[31m"] {
        let r = c
            .post_form(
                "/tokens",
                &[("csrf", &csrf), ("name", name), ("orders", "on")],
            )
            .await;
        assert_eq!(r.status().as_u16(), 400, "{name:?}");
        let body = r.text().await.expect("body");
        assert!(body.contains("“name”"), "names the field: {body}");
        assert!(body.contains("/static/app.css"), "the dashboard's page");
    }
    assert_eq!(app.count("SELECT count(*) FROM api_tokens").await, before);
    // The same field with storable text still works.
    let r = c
        .post_form(
            "/tokens",
            &[("csrf", &csrf), ("name", "ci 😀 'token'"), ("orders", "on")],
        )
        .await;
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(
        app.count("SELECT count(*) FROM api_tokens").await,
        before + 1
    );
}

/// The second net: whatever reaches PostgreSQL and is refused as a data
/// exception (SQLSTATE class 22) is a 400 at both boundaries, not a 500.
#[tokio::test]
async fn a_value_the_database_refuses_is_a_400_at_both_boundaries() {
    use actix_web::ResponseError;
    let app = spawn_app().await;
    for (sql, state) in [
        ("SELECT int4 '99999999999'", "22003"),
        ("SELECT 'abc'::bigint", "22P02"),
        ("SELECT convert_from('\\xff'::bytea, 'UTF8')", "22021"),
    ] {
        let e = sqlx::query(sql)
            .execute(&app.pool)
            .await
            .expect_err("a data exception");
        assert_eq!(
            poolkeeper::db::sqlstate(&e).as_deref(),
            Some(state),
            "{sql}"
        );
        let dash = poolkeeper::dashboard::DashError::from(
            sqlx::query(sql)
                .execute(&app.pool)
                .await
                .expect_err("again"),
        );
        assert_eq!(dash.status_code().as_u16(), 400, "{sql}: {dash:?}");
        let api = poolkeeper::error::ApiError::from(e);
        assert_eq!(api.status_code().as_u16(), 400, "{sql}: {api:?}");
        assert_eq!(api.code(), "invalid");
    }
    // Other database errors keep their answers.
    let e = sqlx::query("SELECT * FROM no_such_table")
        .execute(&app.pool)
        .await
        .expect_err("undefined table");
    let dash = poolkeeper::dashboard::DashError::from(e);
    assert_eq!(dash.status_code().as_u16(), 500);
}

/// A path segment is checked like a field (a NUL in an asset tag reached
/// PostgreSQL as well).
#[tokio::test]
async fn a_control_character_in_a_path_segment_is_a_400() {
    let app = spawn_app().await;
    let c = app.staff("dc@acme.example", "viewer").await;
    for path in ["/machines/PK%00X", "/machines/%1B"] {
        let (status, body) = c.page(path).await;
        assert_eq!(status, 400, "{path}: {body}");
        assert!(body.contains("control character"), "{body}");
    }
    assert_eq!(c.page("/machines/no-such").await.0, 404);
}

#[tokio::test]
async fn every_form_survives_hostile_values_as_every_role() {
    let started = Instant::now();
    let app = spawn_app().await;
    poolkeeper::demo::load(&app.pool).await.expect("demo");
    let values = crawler::demo_values(&app).await;
    let mut log = crawler::Crawl::new();
    let mut found = crawler::FormsFound::new();
    // The admin last: its forms change the organization (a new token, a
    // user), which must not change what the other roles see first.
    for email in [
        "viewer@demo.example",
        "support@demo.example",
        "admin@demo.example",
    ] {
        let c = demo_client(&app, email).await;
        crawler::as_client(&c, email, &values, &mut log, &mut found).await;
    }
    crawler::as_anonymous(&app.address, &values, &mut log).await;

    let r = app
        .http
        .get(app.url("/readyz"))
        .send()
        .await
        .expect("readyz");
    assert_eq!(r.status().as_u16(), 200, "the server still answers");
    eprintln!(
        "crawler: {} requests in {:?}; forms per role: {found:#?}",
        log.requests,
        started.elapsed()
    );
    crawler::assert_held(&log, &found);
}

/// A browser sends a textarea's lines as CRLF: a reason typed on two lines
/// cancels, and is stored with plain line breaks.
#[tokio::test]
async fn a_reason_typed_on_several_lines_cancels() {
    let app = spawn_app().await;
    FakeMachine::new()
        .tag("PK-1")
        .profile("epyc")
        .create(&app.pool, app.org.id)
        .await;
    let (id, fence) = FakeHold::on("PK-1")
        .order("ORD-1")
        .create_with_fence(&app.pool, app.org.id)
        .await;
    let c = app.staff("ana@acme.example", "support").await;
    let csrf = c.csrf().await;
    let r = c
        .post_form(
            &format!("/reservations/{id}/cancel"),
            &[
                ("csrf", &csrf),
                ("fence", &fence.to_string()),
                ("reason", "Customer left.\r\nNew order follows."),
            ],
        )
        .await;
    assert_eq!(r.status().as_u16(), 303);
    let reason: String = sqlx::query_scalar("SELECT end_reason FROM reservations WHERE id = $1")
        .bind(id)
        .fetch_one(&app.pool)
        .await
        .expect("reason");
    assert_eq!(reason, "Customer left.\nNew order follows.");
}
