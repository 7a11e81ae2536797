//! The reservations pages and their actions: cancel, convert and extend
//! through the forms, CSRF and roles, stale forms, the live list and detail
//! page, audit rows, orders of several.

use std::collections::HashSet;

use poolkeeper::allocator::{self};
use scraper::Html;

use crate::helpers::{FakeHold, FakeMachine};
use crate::helpers::{hidden_field, spawn_app};

use super::{form_of, post, sel, text_of, with};

#[tokio::test]
async fn cancel_and_convert_through_the_forms() {
    let app = spawn_app().await;
    FakeMachine::new()
        .tag("PK-1")
        .profile("epyc")
        .create(&app.pool, app.org.id)
        .await;
    FakeMachine::new()
        .tag("PK-2")
        .profile("epyc")
        .create(&app.pool, app.org.id)
        .await;
    let a = FakeHold::on("PK-1")
        .order("ORD-A")
        .create(&app.pool, app.org.id)
        .await;
    let b = FakeHold::on("PK-2")
        .order("ORD-B")
        .create(&app.pool, app.org.id)
        .await;
    let c = app.staff("ana@acme.example", "support").await;

    // Cancel: the list links to a confirmation page with the POST form.
    let (_, list) = c.page("/reservations").await;
    let confirm = Html::parse_document(&list)
        .select(&sel(&format!(
            "tr[data-reservation=\"{a}\"] a[href*=\"/cancel\"]"
        )))
        .next()
        .and_then(|e| e.value().attr("href").map(str::to_owned))
        .expect("a cancel link");
    let (status, page) = c.page(&confirm).await;
    assert_eq!(status, 200);
    let (action, fields) = form_of(&page);
    // A reason is required: refused, nothing written.
    let r = post(&c, &action, &with(&fields, &[("reason", "   ")])).await;
    assert_eq!(r.status().as_u16(), 400);
    assert!(
        r.text()
            .await
            .expect("body")
            .contains("A reason is required")
    );
    assert_eq!(app.state_of(a).await, "held");
    let r = post(
        &c,
        &action,
        &with(&fields, &[("reason", "customer changed plan")]),
    )
    .await;
    assert_eq!(r.status().as_u16(), 303);
    let to = r.headers()["location"]
        .to_str()
        .expect("location")
        .to_owned();
    assert_eq!(to, format!("/reservations/{a}?flash=cancelled"));
    let (_, body) = c.page(&to).await;
    assert_eq!(text_of(&body, ".flash"), ["The reservation was cancelled."]);
    let sentence = text_of(&body, "#answer").remove(0);
    assert!(
        sentence.starts_with("Cancelled by ana@acme.example at ")
            && sentence.ends_with(": customer changed plan"),
        "{sentence}"
    );
    assert_eq!(app.state_of(a).await, "cancelled");
    assert_eq!(
        app.count("SELECT count(*) FROM audit_log WHERE action = 'reservation.cancel'")
            .await,
        1
    );

    // Convert: an invalid service reference is refused, then a good one.
    let (_, page) = c.page(&format!("/reservations/{b}/convert")).await;
    let (action, fields) = form_of(&page);
    let r = post(&c, &action, &with(&fields, &[("service_ref", "SRV 9!")])).await;
    assert_eq!(r.status().as_u16(), 400);
    assert_eq!(app.state_of(b).await, "held");
    let r = post(&c, &action, &with(&fields, &[("service_ref", "SRV-9")])).await;
    assert_eq!(r.status().as_u16(), 303);
    let (_, body) = c.page(&format!("/reservations/{b}")).await;
    let sentence = text_of(&body, "#answer").remove(0);
    assert!(
        sentence.contains("into service SRV-9 by ana@acme.example"),
        "{sentence}"
    );
    assert_eq!(app.state_of(b).await, "converted");
    assert_eq!(
        app.count(
            "SELECT count(*) FROM service_links WHERE service_ref = 'SRV-9' AND ended_at IS NULL"
        )
        .await,
        1
    );

    // Both are gone from the live list.
    let (_, list) = c.page("/reservations").await;
    assert!(list.contains("No reservation is held right now."));
}

#[tokio::test]
async fn missing_or_wrong_csrf_and_viewers_get_403() {
    let app = spawn_app().await;
    FakeMachine::new()
        .tag("PK-1")
        .profile("epyc")
        .create(&app.pool, app.org.id)
        .await;
    let (id, fence) = FakeHold::on("PK-1")
        .order("ORD-A")
        .create_with_fence(&app.pool, app.org.id)
        .await;
    let fence = fence.to_string();
    let c = app.staff("ana@acme.example", "support").await;
    let path = format!("/reservations/{id}/cancel");
    let r = c
        .post_form(&path, &[("fence", &fence), ("reason", "x")])
        .await;
    assert_eq!(r.status().as_u16(), 403, "missing CSRF");
    assert!(r.text().await.expect("body").contains("security token"));
    let r = c
        .post_form(
            &path,
            &[("csrf", "forged"), ("fence", &fence), ("reason", "x")],
        )
        .await;
    assert_eq!(r.status().as_u16(), 403, "wrong CSRF");
    // Another session's token is wrong for this one.
    let other = app.staff("bob@acme.example", "support").await;
    let others_token = other.csrf().await;
    let r = c
        .post_form(
            &path,
            &[("csrf", &others_token), ("fence", &fence), ("reason", "x")],
        )
        .await;
    assert_eq!(r.status().as_u16(), 403, "someone else's CSRF token");
    assert_eq!(app.state_of(id).await, "held");

    let viewer = app.staff("vic@acme.example", "viewer").await;
    let (_, list) = viewer.page("/reservations").await;
    assert!(list.contains("ORD-A"));
    assert!(
        !list.contains("/cancel") && !list.contains("/convert"),
        "viewers see no buttons"
    );
    let (_, detail) = viewer.page(&format!("/reservations/{id}")).await;
    assert!(!detail.contains("/cancel"));
    assert_eq!(
        viewer.get(&path).await.status().as_u16(),
        403,
        "no confirmation page either"
    );
    let csrf = viewer.csrf().await;
    let r = viewer
        .post_form(
            &path,
            &[("csrf", &csrf), ("fence", &fence), ("reason", "x")],
        )
        .await;
    assert_eq!(r.status().as_u16(), 403);
    let r = viewer
        .post_form(
            &format!("/reservations/{id}/convert"),
            &[("csrf", &csrf), ("fence", &fence), ("service_ref", "SRV-1")],
        )
        .await;
    assert_eq!(r.status().as_u16(), 403);
    assert_eq!(viewer.get("/settings").await.status().as_u16(), 403);
    assert_eq!(app.state_of(id).await, "held");
    assert_eq!(
        app.count("SELECT count(*) FROM reservation_events").await,
        1,
        "only 'created'"
    );
}

#[tokio::test]
async fn a_stale_form_gets_a_clear_message_not_a_500() {
    let app = spawn_app().await;
    FakeMachine::new()
        .tag("PK-1")
        .profile("epyc")
        .create(&app.pool, app.org.id)
        .await;
    FakeMachine::new()
        .tag("PK-2")
        .profile("epyc")
        .create(&app.pool, app.org.id)
        .await;
    let id = FakeHold::on("PK-1")
        .order("ORD-A")
        .create(&app.pool, app.org.id)
        .await;
    let c = app.staff("ana@acme.example", "support").await;
    let (_, page) = c.page(&format!("/reservations/{id}/cancel")).await;
    let (action, fields) = form_of(&page);

    // The fence changes under the open page.
    sqlx::query("UPDATE reservations SET fence = nextval('reservation_fence_seq') WHERE id = $1")
        .bind(id)
        .execute(&app.pool)
        .await
        .expect("new fence");
    let r = post(
        &c,
        &action,
        &with(&fields, &[("reason", "duplicate order")]),
    )
    .await;
    assert_eq!(r.status().as_u16(), 409);
    let body = r.text().await.expect("body");
    assert!(
        body.contains("changed since your page was loaded"),
        "{body}"
    );
    assert!(body.contains(&format!("href=\"/reservations/{id}\"")));
    assert_eq!(app.state_of(id).await, "held");

    // Already cancelled: the second click says so.
    let (_, page) = c.page(&format!("/reservations/{id}/cancel")).await;
    let (action, fields) = form_of(&page);
    let fields = with(&fields, &[("reason", "duplicate order")]);
    assert_eq!(post(&c, &action, &fields).await.status().as_u16(), 303);
    let r = post(&c, &action, &fields).await;
    assert_eq!(r.status().as_u16(), 409);
    assert!(r.text().await.expect("body").contains("already cancelled"));
    // The confirmation page of an ended reservation says so too.
    let r = c.get(&format!("/reservations/{id}/convert")).await;
    assert_eq!(r.status().as_u16(), 409);

    // Past its deadline: conversion is refused and the reservation expires.
    let late = FakeHold::on("PK-2")
        .order("ORD-B")
        .create(&app.pool, app.org.id)
        .await;
    let (_, page) = c.page(&format!("/reservations/{late}/convert")).await;
    let (action, fields) = form_of(&page);
    app.make_overdue(late).await;
    let r = post(&c, &action, &with(&fields, &[("service_ref", "SRV-9")])).await;
    assert_eq!(r.status().as_u16(), 409);
    assert!(
        r.text()
            .await
            .expect("body")
            .contains("had already expired")
    );
    assert_eq!(app.state_of(late).await, "expired");
    let (_, body) = c.page(&format!("/reservations/{late}")).await;
    let sentence = text_of(&body, "#answer").remove(0);
    assert!(
        sentence.starts_with("Timed out: conversion attempted at"),
        "{sentence}"
    );
}

#[tokio::test]
async fn the_detail_page_says_who_ended_it_and_how() {
    let app = spawn_app().await;
    FakeMachine::new()
        .tag("PK-1")
        .profile("epyc")
        .create(&app.pool, app.org.id)
        .await;
    FakeMachine::new()
        .tag("PK-2")
        .profile("epyc")
        .create(&app.pool, app.org.id)
        .await;
    let swept = FakeHold::on("PK-1")
        .order("ORD-S")
        .create(&app.pool, app.org.id)
        .await;
    // What the sweep writes, with its replica and lease fence.
    sqlx::query(
        "WITH r AS (UPDATE reservations SET state = 'expired', ended_at = clock_timestamp(), ended_by = 'sweep'
                     WHERE id = $1 RETURNING id)
         INSERT INTO reservation_events (reservation_id, kind, from_state, to_state, actor, replica, lease_fence)
         SELECT id, 'expired', 'held', 'expired', 'sweep', 'web-2', 17 FROM r",
    )
    .bind(swept)
    .execute(&app.pool)
    .await
    .expect("sweep it");
    let found = FakeHold::on("PK-2")
        .order("ORD-F")
        .hold_seconds(600)
        .create(&app.pool, app.org.id)
        .await;
    sqlx::query("UPDATE reservations SET state = 'expired', ended_at = clock_timestamp(), ended_by = 'allocator' WHERE id = $1")
        .bind(found)
        .execute(&app.pool)
        .await
        .expect("expire at point of use");
    let c = app.staff("ops@acme.example", "viewer").await;
    let (_, body) = c.page(&format!("/reservations/{swept}")).await;
    let sentence = text_of(&body, "#answer").remove(0);
    assert!(sentence.starts_with("Timed out: expired at "), "{sentence}");
    assert!(
        sentence.contains("after a 15-minute hold, marked by the sweep on replica web-2"),
        "{sentence}"
    );
    assert!(
        text_of(&body, "table.timeline td")
            .iter()
            .any(|t| t == "web-2 (lease fence 17)")
    );
    let (_, body) = c.page(&format!("/reservations/{found}")).await;
    let sentence = text_of(&body, "#answer").remove(0);
    assert!(
        sentence.contains("after a 10-minute hold; a new order for the machine found it overdue"),
        "{sentence}"
    );
    // The overview's 24-hour chart counts both as created and expired.
    crate::helpers::count_activity_now(&app.pool, app.org.id).await;
    let (_, body) = c.page("/").await;
    let day = Html::parse_document(&body)
        .select(&sel("section.site p.day"))
        .next()
        .and_then(|p| p.value().attr("data-day").map(str::to_owned))
        .expect("the day's totals");
    assert_eq!(day, "2 0 2 0");
}

/// Every row of the live list shows its hold's fence, in its own column
/// under the heading "Fence", the one its cancel, convert and extend links
/// name; a viewer, who has no actions, sees it too.
#[tokio::test]
async fn the_live_list_shows_each_holds_fence() {
    let app = spawn_app().await;
    let mut holds = Vec::new();
    for (tag, order) in [("PK-1", "ORD-A"), ("PK-2", "ORD-B"), ("PK-3", "ORD-C")] {
        FakeMachine::new()
            .tag(tag)
            .profile("epyc")
            .create(&app.pool, app.org.id)
            .await;
        holds.push(
            FakeHold::on(tag)
                .order(order)
                .create_with_fence(&app.pool, app.org.id)
                .await,
        );
    }
    // Fences differ from ids, so that a row showing its id passes for none.
    sqlx::query("UPDATE reservations SET fence = fence + 1000 * id")
        .execute(&app.pool)
        .await
        .expect("distinct fences");
    let fences: Vec<(i64, i64)> = sqlx::query_as("SELECT id, fence FROM reservations ORDER BY id")
        .fetch_all(&app.pool)
        .await
        .expect("fences");
    assert_eq!(fences.len(), holds.len());
    for (role, email) in [
        ("support", "sam@acme.example"),
        ("viewer", "vera@acme.example"),
    ] {
        let c = app.staff(email, role).await;
        let (status, body) = c.page("/reservations").await;
        assert_eq!(status, 200);
        let doc = Html::parse_document(&body);
        let heads: Vec<String> = doc
            .select(&sel("table.live thead th"))
            .map(|h| h.text().collect::<String>())
            .collect();
        let column = heads
            .iter()
            .position(|h| h == "Fence")
            .unwrap_or_else(|| panic!("{role}: no Fence column in {heads:?}"));
        let rows: Vec<_> = doc.select(&sel("table.live tbody tr")).collect();
        assert_eq!(rows.len(), fences.len(), "{role}");
        for row in rows {
            let id: i64 = row
                .value()
                .attr("data-reservation")
                .and_then(|v| v.parse().ok())
                .expect("a row names its reservation");
            let fence = fences
                .iter()
                .find(|(i, _)| *i == id)
                .map(|(_, f)| *f)
                .expect("a held reservation");
            let cells: Vec<String> = row
                .select(&sel("th, td"))
                .filter(|c| c.parent().map(|p| p.id()) == Some(row.id()))
                .map(|c| c.text().collect::<String>().trim().to_owned())
                .collect();
            assert_eq!(cells.len(), heads.len(), "{role}: #{id}: {cells:?}");
            assert_eq!(cells[column], fence.to_string(), "{role}: #{id}");
            let links: Vec<&str> = row
                .select(&sel("a.button"))
                .filter_map(|a| a.value().attr("href"))
                .collect();
            assert_eq!(links.len(), if role == "support" { 3 } else { 0 }, "{role}");
            for href in links {
                assert!(href.ends_with(&format!("?fence={fence}")), "{href}");
            }
        }
    }
}

#[tokio::test]
async fn overdue_reservations_are_marked_in_text() {
    let app = spawn_app().await;
    FakeMachine::new()
        .tag("PK-1")
        .profile("epyc")
        .create(&app.pool, app.org.id)
        .await;
    let id = FakeHold::on("PK-1")
        .order("ORD-A")
        .create(&app.pool, app.org.id)
        .await;
    app.make_overdue(id).await;
    let c = app.staff("ana@acme.example", "support").await;
    let (_, body) = c.page("/reservations").await;
    assert_eq!(
        text_of(&body, "tr[data-reservation] .badge.overdue"),
        ["Overdue"]
    );
    assert_eq!(
        Html::parse_document(&body)
            .select(&sel("[data-remaining]"))
            .count(),
        0
    );
    let (_, body) = c.page(&format!("/reservations/{id}")).await;
    assert!(text_of(&body, "#answer")[0].contains("overdue"));
}

/// The audit row of a cancellation commits with it or not at all: with the
/// audit table gone, the cancellation fails as a whole and the reservation
/// is still held.
#[tokio::test]
async fn a_cancellation_and_its_audit_row_commit_together() {
    let app = spawn_app().await;
    FakeMachine::new()
        .tag("PK-1")
        .profile("epyc")
        .create(&app.pool, app.org.id)
        .await;
    let a = FakeHold::on("PK-1")
        .order("ORD-A")
        .create(&app.pool, app.org.id)
        .await;
    let c = app.staff("ana@acme.example", "support").await;
    let (status, page) = c.page(&format!("/reservations/{a}/cancel")).await;
    assert_eq!(status, 200);
    let (action, fields) = form_of(&page);

    sqlx::query("ALTER TABLE audit_log RENAME TO audit_log_gone")
        .execute(&app.pool)
        .await
        .expect("rename");
    let r = post(&c, &action, &with(&fields, &[("reason", "customer left")])).await;
    assert_eq!(r.status().as_u16(), 500);
    assert_eq!(
        app.state_of(a).await,
        "held",
        "no cancellation without its audit row"
    );

    sqlx::query("ALTER TABLE audit_log_gone RENAME TO audit_log")
        .execute(&app.pool)
        .await
        .expect("rename back");
    let r = post(&c, &action, &with(&fields, &[("reason", "customer left")])).await;
    assert_eq!(r.status().as_u16(), 303);
    assert_eq!(app.state_of(a).await, "cancelled");
    let audited: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM audit_log WHERE action = 'reservation.cancel' AND object = $1",
    )
    .bind(format!("reservation:{a}"))
    .fetch_one(&app.pool)
    .await
    .expect("count");
    assert_eq!(audited, 1);
}

/// (BENCHMARKS item 5 measures it) 1,000 held reservations come
/// 100 a page, soonest deadline first, in under 60 kB of HTML; the "next"
/// and "previous" links walk every row once and keep the filters.
#[tokio::test]
async fn a_thousand_holds_come_a_hundred_a_page_under_60_kb_with_filters_kept() {
    let app = spawn_app().await;
    let org = app.org.id;
    // Inserted in two statements (FakeHold writes one row per statement):
    // 1,000 machines (even ones at par1), and a hold on each: the first 300 with 4 to 6 minutes left, the rest 40
    // minutes or more, so the 15-minute filter keeps exactly 300 (150 at
    // par1) however slowly the test runs.
    crate::helpers::generated_machines(
        &app.pool,
        org,
        1000,
        crate::helpers::Generated {
            tag: "'PK-' || lpad(g::text, 5, '0')",
            site: "CASE WHEN g % 2 = 0 THEN 'par1' ELSE 'ams1' END",
            vendor: "'dell'",
            profile: "'epyc-9354-256g'",
            status: "'ready'",
        },
    )
    .await;
    sqlx::query(
        "INSERT INTO reservations (org_id, order_ref, machine_id, spec, machine_snapshot, reason,
                                   hold_seconds, expires_at)
         SELECT m.org_id, 'ORD-' || substr(m.asset_tag, 4), m.id, '{}'::jsonb, '{}'::jsonb,
                'PK matched site par1, vendor dell, profile epyc-9354-256g; a long frozen reason that must not be on the list',
                3600,
                clock_timestamp() + make_interval(secs => CASE WHEN n <= 300 THEN 240 + n * 0.4 ELSE 2400 + n END)
           FROM (SELECT m.*, row_number() OVER (ORDER BY m.id) AS n FROM machines m WHERE m.org_id = $1) m",
    )
    .bind(org)
    .execute(&app.pool)
    .await
    .expect("holds");
    let c = app.staff("ana@acme.example", "support").await;

    let row_ids = |body: &str| -> Vec<i64> {
        Html::parse_document(body)
            .select(&sel("tr[data-reservation]"))
            .map(|r| {
                r.value()
                    .attr("data-reservation")
                    .and_then(|v| v.parse().ok())
                    .expect("id")
            })
            .collect()
    };
    let remaining = |body: &str| -> Vec<i64> {
        Html::parse_document(body)
            .select(&sel("tr[data-reservation] [data-remaining]"))
            .map(|e| {
                e.value()
                    .attr("data-remaining")
                    .and_then(|v| v.parse().ok())
                    .expect("seconds")
            })
            .collect()
    };
    let link = |body: &str, rel: &str| -> Option<String> {
        Html::parse_document(body)
            .select(&sel(&format!("nav.pager a[rel={rel}]")))
            .next()
            .and_then(|a| a.value().attr("href").map(str::to_owned))
    };

    let (status, first) = c.page("/reservations").await;
    assert_eq!(status, 200);
    assert!(
        first.len() < 60_000,
        "first page is {} bytes (support, with buttons)",
        first.len()
    );
    eprintln!("/reservations with 1,000 held: {} bytes", first.len());
    assert_eq!(row_ids(&first).len(), 100);
    assert!(
        !first.contains("a long frozen reason"),
        "the reason is on the reservation's page"
    );
    let secs = remaining(&first);
    assert!(secs.windows(2).all(|w| w[0] <= w[1]), "soonest first");
    assert!(secs[0] <= 241, "{secs:?}");
    assert!(text_of(&first, "#live-count")[0].starts_with("1000 held"));
    assert!(link(&first, "prev").is_none());

    // Walk every page forwards: every hold once, in deadline order.
    let mut seen = Vec::new();
    let mut body = first.clone();
    let mut pages = 1;
    loop {
        seen.extend(row_ids(&body));
        match link(&body, "next") {
            Some(next) => {
                let (status, b) = c.page(&next.replace("&amp;", "&")).await;
                assert_eq!(status, 200, "{next}");
                body = b;
                pages += 1;
            }
            None => break,
        }
    }
    assert_eq!(pages, 10);
    let distinct: HashSet<i64> = seen.iter().copied().collect();
    assert_eq!((seen.len(), distinct.len()), (1000, 1000));
    // And back: the previous page of the second is the first.
    let (_, second) = c
        .page(&link(&first, "next").expect("next").replace("&amp;", "&"))
        .await;
    let (_, back) = c
        .page(&link(&second, "prev").expect("prev").replace("&amp;", "&"))
        .await;
    assert_eq!(row_ids(&back), row_ids(&first));

    // Filters: par1, deadline within 15 minutes: 150 holds, two pages.
    let (_, f1) = c.page("/reservations?site=par1&within=15").await;
    assert_eq!(row_ids(&f1).len(), 100);
    assert!(text_of(&f1, "#live-count")[0].starts_with("150 held at par1"));
    assert!(
        text_of(&f1, "table.live tbody td:nth-of-type(3)")
            .iter()
            .all(|s| s == "par1")
    );
    assert!(remaining(&f1).iter().all(|s| *s <= 900));
    let next = link(&f1, "next")
        .expect("a next page")
        .replace("&amp;", "&");
    assert!(
        next.contains("site=par1") && next.contains("within=15"),
        "{next}"
    );
    let (_, f2) = c.page(&next).await;
    assert_eq!(row_ids(&f2).len(), 50);
    assert!(link(&f2, "next").is_none());
    let prev = link(&f2, "prev").expect("prev").replace("&amp;", "&");
    assert!(
        prev.contains("site=par1") && prev.contains("within=15"),
        "{prev}"
    );
    // The form shows the filters in force.
    assert_eq!(
        Html::parse_document(&f2)
            .select(&sel("#l-within option[selected]"))
            .next()
            .and_then(|o| o.value().attr("value").map(str::to_owned))
            .as_deref(),
        Some("15")
    );
    // Bad filters are a clear 400.
    for bad in ["within=0", "within=abc", "after=nonsense", "site=par%201"] {
        assert_eq!(
            c.get(&format!("/reservations?{bad}"))
                .await
                .status()
                .as_u16(),
            400,
            "{bad}"
        );
    }
}

/// The frozen reason moved to the reservation's page; a
/// hold under two minutes says so in words; the list says when it was read.
#[tokio::test]
async fn the_live_list_is_compact_and_says_urgency_in_words() {
    let app = spawn_app().await;
    FakeMachine::new()
        .tag("PK-1")
        .profile("epyc")
        .create(&app.pool, app.org.id)
        .await;
    let (id, fence) = FakeHold::on("PK-1")
        .order("ORD-SOON")
        .hold_seconds(90)
        .create_with_fence(&app.pool, app.org.id)
        .await;
    let c = app.staff("viewer@acme.example", "viewer").await;
    let (_, body) = c.page("/reservations").await;
    assert_eq!(
        text_of(&body, &format!("tr[data-reservation=\"{id}\"] td")),
        [
            "ORD-SOON",
            "PK-1",
            "par1",
            &format!("{} Expires soon", text_of(&body, ".countdown")[0]),
            &fence.to_string(),
        ]
    );
    assert_eq!(
        text_of(&body, "thead th"),
        [
            "Reservation",
            "Order",
            "Machine",
            "Site",
            "Time left",
            "Fence"
        ]
    );
    assert!(text_of(&body, "#live-status")[0].contains("Last refreshed at"));
    let (_, detail) = c.page(&format!("/reservations/{id}")).await;
    assert!(detail.contains("Why this machine (frozen at creation)"));
}

/// R13 and R14 on the dashboard: a reservation of an order of three shows
/// the order's other machines (live list and its page); support extends it
/// with a reason (the whole order, one deadline, an `extended` event per
/// machine and one audit row); a viewer sees no Extend button and gets 403;
/// a reason is required; converting from one reservation's page converts
/// the whole order, one service reference per machine.
#[tokio::test]
async fn orders_of_several_and_extensions_on_the_dashboard() {
    use poolkeeper::allocator::{Quantity, ReserveOutcome};
    let app = spawn_app().await;
    for i in 0..3 {
        FakeMachine::new()
            .tag(&format!("PK-{i}"))
            .profile("epyc")
            .create(&app.pool, app.org.id)
            .await;
    }
    let req = poolkeeper::allocator::ReserveRequest {
        quantity: Quantity::new(3).expect("three"),
        ..crate::helpers::request_for("ORD-TRIO", "epyc", None)
    };
    let order = match allocator::reserve(&app.pool, app.org.id, &req)
        .await
        .expect("reserve")
    {
        ReserveOutcome::Created {
            reservation,
            others,
            ..
        } => std::iter::once(reservation)
            .chain(others)
            .collect::<Vec<_>>(),
        other => panic!("expected an order of three, got {other:?}"),
    };
    let first = &order[0];
    let support = app.staff("ana@acme.example", "support").await;
    let viewer = app.staff("vic@acme.example", "viewer").await;

    let (status, live) = support.page("/reservations").await;
    assert_eq!(status, 200);
    assert!(
        live.contains("(1 of 3)") && live.contains("/search?q=ORD-TRIO"),
        "{live}"
    );
    assert!(live.contains(&format!(
        "/reservations/{}/extend?fence={}",
        first.id, first.fence
    )));
    let (_, page) = support
        .page(&format!("/reservations/{}", order[1].id))
        .await;
    assert!(page.contains("machine 2 of 3"), "{page}");
    for r in [&order[0], &order[2]] {
        assert!(
            page.contains(&format!("href=\"/reservations/{}\"", r.id)),
            "links its order"
        );
    }
    let (_, viewer_page) = viewer.page(&format!("/reservations/{}", first.id)).await;
    assert!(
        !viewer_page.contains("/extend?fence="),
        "no Extend button for a viewer"
    );
    let (status, _) = viewer
        .page(&format!(
            "/reservations/{}/extend?fence={}",
            first.id, first.fence
        ))
        .await;
    assert_eq!(status, 403);

    // The confirmation page names the whole order and carries each fence.
    let confirm = format!("/reservations/{}/extend?fence={}", first.id, first.fence);
    let (status, body) = support.page(&confirm).await;
    assert_eq!(status, 200);
    assert!(body.contains("Extend order ORD-TRIO?"), "{body}");
    let mut form: Vec<(String, String)> = vec![
        ("fence".into(), first.fence.to_string()),
        ("minutes".into(), "30".into()),
        ("reason".into(), " ".into()),
    ];
    for r in &order {
        let f = hidden_field(&body, &format!("fence_{}", r.id)).expect("a fence per machine");
        assert_eq!(f, r.fence.to_string());
        form.push((format!("fence_{}", r.id), f));
    }
    let post = |form: Vec<(String, String)>, path: String| {
        let support = &support;
        async move {
            let csrf = support.csrf().await;
            let mut fields = form;
            fields.push(("csrf".into(), csrf));
            support
                .http
                .post(support.url(&path))
                .form(&fields)
                .send()
                .await
                .expect("post")
        }
    };
    let extend_path = format!("/reservations/{}/extend", first.id);
    let r = post(form.clone(), extend_path.clone()).await;
    assert_eq!(r.status().as_u16(), 400, "a reason is required");
    form[2].1 = "3-D Secure challenge".into();
    let r = post(form.clone(), extend_path).await;
    assert_eq!(r.status().as_u16(), 303);
    let (deadlines, events, audits): (i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(DISTINCT expires_at) FROM reservations WHERE order_ref = 'ORD-TRIO'
                   AND expires_at > clock_timestamp() + interval '29 minutes'),
                (SELECT count(*) FROM reservation_events e JOIN reservations r ON r.id = e.reservation_id
                  WHERE r.order_ref = 'ORD-TRIO' AND e.kind = 'extended' AND e.actor = 'ana@acme.example'
                    AND e.detail LIKE '%: 3-D Secure challenge'),
                (SELECT count(*) FROM audit_log WHERE action = 'order.extend' AND object = 'order:ORD-TRIO')",
    )
    .fetch_one(&app.pool)
    .await
    .expect("after the extension");
    assert_eq!((deadlines, events, audits), (1, 3, 1));
    let (_, timeline) = support
        .page(&format!("/reservations/{}", order[2].id))
        .await;
    let timeline = text_of(&timeline, "table.timeline").join(" ");
    assert!(
        timeline.contains("extended") && timeline.contains("3-D Secure challenge"),
        "{timeline}"
    );

    // Convert the whole order from one reservation's page.
    let (_, body) = support
        .page(&format!(
            "/reservations/{}/convert?fence={}",
            first.id, first.fence
        ))
        .await;
    let mut form: Vec<(String, String)> = vec![("fence".into(), first.fence.to_string())];
    for (i, r) in order.iter().enumerate() {
        assert!(body.contains(&format!("name=\"service_ref_{}\"", r.id)));
        form.push((format!("fence_{}", r.id), r.fence.to_string()));
        form.push((format!("service_ref_{}", r.id), format!("SRV-T{i}")));
    }
    let r = post(form, format!("/reservations/{}/convert", first.id)).await;
    assert_eq!(r.status().as_u16(), 303);
    let converted: Vec<(String, String)> = sqlx::query_as(
        "SELECT r.state, s.service_ref FROM reservations r JOIN service_links s ON s.reservation_id = r.id
          WHERE r.order_ref = 'ORD-TRIO' ORDER BY r.slot",
    )
    .fetch_all(&app.pool)
    .await
    .expect("converted");
    assert_eq!(
        converted,
        (0..3)
            .map(|i| ("converted".to_owned(), format!("SRV-T{i}")))
            .collect::<Vec<_>>()
    );
}

/// F3 on the dashboard: a staff cancellation whose session is terminated
/// while its COMMIT waits (here on an advisory lock a deferred trigger
/// takes at commit time; in production, on the synchronous standby) gets
/// a page, not a 500: `503`, saying the change may or may not have been
/// made, with a link to do the same again; done again, it is done once.
/// A statement that breaks before the commit says nothing was changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_staff_action_killed_mid_commit_gets_a_page_offering_it_again() {
    let app = spawn_app().await;
    FakeMachine::new()
        .tag("MC-1")
        .profile("epyc")
        .create(&app.pool, app.org.id)
        .await;
    let a = FakeHold::on("MC-1")
        .order("ORD-MC-1")
        .create(&app.pool, app.org.id)
        .await;
    let c = app.staff("ana@acme.example", "support").await;
    let (status, page) = c.page(&format!("/reservations/{a}/cancel")).await;
    assert_eq!(status, 200);
    let (action, fields) = form_of(&page);
    let fields = with(&fields, &[("reason", "customer left")]);
    // At commit, the audit row's deferred trigger waits for lock 4242.
    sqlx::raw_sql(
        "CREATE FUNCTION test_wait_at_commit() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN PERFORM pg_advisory_xact_lock(4242); RETURN NULL; END $$;
         CREATE CONSTRAINT TRIGGER test_wait_at_commit AFTER INSERT ON audit_log
         DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION test_wait_at_commit();",
    )
    .execute(&app.pool)
    .await
    .expect("the trigger");
    let mut blocker = app.db.connection().await;
    sqlx::query("SELECT pg_advisory_lock(4242)")
        .execute(&mut blocker)
        .await
        .expect("lock");
    let request = {
        let http = c.http.clone();
        let url = c.url(&action);
        let fields = fields.clone();
        tokio::spawn(async move {
            http.post(url)
                .form(&fields)
                .send()
                .await
                .expect("an answer")
        })
    };
    crate::helpers::terminate_session_where(
        &app.pool,
        "wait_event_type = 'Lock' AND wait_event = 'advisory' AND application_name = 'poolkeeper'",
    )
    .await;
    let resp = request.await.expect("the request task");
    assert_eq!(resp.status().as_u16(), 503);
    assert!(resp.headers().contains_key("retry-after"));
    let body = resp.text().await.expect("page");
    assert!(body.contains("may or may not have been made"), "{body}");
    assert!(
        body.contains(&format!("href=\"/reservations/{a}/cancel\"")),
        "the same action, offered again: {body}"
    );
    sqlx::query("SELECT pg_advisory_unlock(4242)")
        .execute(&mut blocker)
        .await
        .expect("unlock");
    sqlx::raw_sql("DROP TRIGGER test_wait_at_commit ON audit_log")
        .execute(&app.pool)
        .await
        .expect("drop the trigger");
    // Terminated before its commit finished: not made. Done again, it is.
    assert_eq!(app.state_of(a).await, "held");
    let (status, page) = c.page(&format!("/reservations/{a}/cancel")).await;
    assert_eq!(status, 200);
    let (action, again) = form_of(&page);
    let r = post(&c, &action, &with(&again, &[("reason", "customer left")])).await;
    assert_eq!(r.status().as_u16(), 303);
    assert_eq!(app.state_of(a).await, "cancelled");
    let audited: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM audit_log WHERE action = 'reservation.cancel' AND object = $1",
    )
    .bind(format!("reservation:{a}"))
    .fetch_one(&app.pool)
    .await
    .expect("count");
    assert_eq!(audited, 1);

    // Done again after it took effect: the page says it ended, no 500.
    let r = post(&c, &action, &with(&again, &[("reason", "customer left")])).await;
    assert_eq!(r.status().as_u16(), 409);
}

/// An audit row only for what changed: a staff extension shorter than the
/// time left changes nothing and is not audited; a longer one is, once.
#[tokio::test]
async fn an_extension_that_changed_nothing_writes_no_audit_row() {
    let app = spawn_app().await;
    FakeMachine::new()
        .tag("AX-1")
        .profile("epyc")
        .create(&app.pool, app.org.id)
        .await;
    let (a, fence) = FakeHold::on("AX-1")
        .order("ORD-AX-1")
        .create_with_fence(&app.pool, app.org.id)
        .await;
    let c = app.staff("ana@acme.example", "support").await;
    let audited = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM audit_log WHERE action = 'reservation.extend' AND object = $1",
        )
        .bind(format!("reservation:{a}"))
        .fetch_one(&app.pool)
        .await
        .expect("count")
    };
    for (minutes, expected) in [("1", 0), ("30", 1)] {
        let (status, page) = c
            .page(&format!("/reservations/{a}/extend?fence={fence}"))
            .await;
        assert_eq!(status, 200);
        let (action, fields) = form_of(&page);
        let r = post(
            &c,
            &action,
            &with(
                &fields,
                &[("minutes", minutes), ("reason", "payment pending")],
            ),
        )
        .await;
        assert_eq!(r.status().as_u16(), 303, "{minutes} min");
        assert_eq!(audited().await, expected, "{minutes} min");
    }
}

/// R19 for support: the live list filters by end customer and says where
/// the customer stands against the organization's cap; search finds a
/// customer with live holds and links to them.
#[tokio::test]
async fn support_finds_a_customers_holds_and_sees_them_against_the_cap() {
    let app = spawn_app().await;
    for i in 0..4 {
        FakeMachine::new()
            .tag(&format!("CU-{i}"))
            .profile("epyc")
            .create(&app.pool, app.org.id)
            .await;
    }
    sqlx::query("UPDATE organizations SET customer_hold_limit = 2 WHERE id = $1")
        .bind(app.org.id)
        .execute(&app.pool)
        .await
        .expect("cap");
    for (order, customer) in [("CU-A", "CUST-1"), ("CU-B", "CUST-1"), ("CU-C", "CUST-2")] {
        let (status, body) = app
            .reserve(
                &app.org.token,
                serde_json::json!({"order_ref": order, "site": "par1", "profile": "epyc",
                                   "customer_ref": customer}),
            )
            .await;
        assert_eq!(status, 201, "{body}");
    }
    let c = app.staff("sam@acme.example", "support").await;
    let (status, body) = c.page("/reservations?customer=CUST-1").await;
    assert_eq!(status, 200);
    let doc = Html::parse_document(&body);
    let orders: HashSet<String> = doc
        .select(&sel("table.live tbody tr td:nth-child(2)"))
        .map(|td| td.text().collect::<String>())
        .map(|t| t.split_whitespace().next().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(
        orders,
        HashSet::from(["CU-A".to_owned(), "CU-B".to_owned()]),
        "{body}"
    );
    let standing = text_of(&body, "#customer-cap").join(" ");
    assert!(
        standing.contains("holds 2 live machines of the 2 the organization allows one customer")
            && standing.contains("at the cap"),
        "{standing}"
    );
    // The CSV and the page links keep the filter.
    assert!(body.contains("/reservations.csv?customer=CUST-1"), "{body}");
    let (_, body) = c.page("/search?q=CUST-2").await;
    assert_eq!(
        text_of(&body, "#customer-hit a"),
        vec!["1 live hold of customer CUST-2"]
    );
    assert!(
        body.contains("href=\"/reservations?customer=CUST-2\""),
        "{body}"
    );
    let (status, _) = c.page("/reservations?customer=CUST%201").await;
    assert_eq!(status, 400);
}
