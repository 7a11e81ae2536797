//! Every page and link, search, the overview chart, the demo.

use std::collections::HashSet;

use scraper::Html;

use crate::helpers::{Cancelled, Converted, Expired, FakeHold, FakeMachine, Held, HoldState};
use crate::helpers::{create_org, hidden_field, spawn_app};

use super::{check_page_and_links, every_kind_pool, sel, text_of};

#[tokio::test]
async fn every_page_parses_shows_its_content_and_its_links_work() {
    let app = spawn_app().await;
    let pool = every_kind_pool(&app).await;
    // Another org's objects must never appear.
    FakeMachine::new()
        .tag("OTHER-1")
        .profile("epyc")
        .create(&app.pool, app.other.id)
        .await;
    FakeHold::on("OTHER-1")
        .order("ORD-OTHER")
        .create(&app.pool, app.other.id)
        .await;
    sqlx::query("INSERT INTO leases (key, holder, expires_at) VALUES ('sweep', 'web-2-abc', clock_timestamp() + interval '1 minute')")
        .execute(&app.pool)
        .await
        .expect("lease");
    sqlx::query("INSERT INTO sweep_runs (replica, lease_fence, finished_at, expired) VALUES ('web-2-abc', 1, clock_timestamp(), 3)")
        .execute(&app.pool)
        .await
        .expect("sweep run");
    sqlx::query("INSERT INTO lease_errors (key, replica, message) VALUES ('sweep', 'web-3', 'connection refused')")
        .execute(&app.pool)
        .await
        .expect("lease error");
    let c = app.staff("admin@acme.example", "admin").await;
    let mut seen = HashSet::new();
    crate::helpers::count_activity_now(&app.pool, app.org.id).await;

    let body = check_page_and_links(&c, "/", &mut seen).await;
    assert_eq!(text_of(&body, "section.site h2"), ["ams1", "fra1", "par1"]);
    // par1: 6 machines; sellable PK-001,003,004; held PK-007; sold PK-006;
    // not ready PK-005. By profile: epyc (5) and xeon (PK-004).
    let par1 = "section.site:nth-of-type(3)";
    assert_eq!(
        text_of(&body, &format!("{par1} tfoot td[data-k]")).join(" "),
        "3 1 1 1 6",
        "par1 counts"
    );
    assert_eq!(
        text_of(&body, &format!("{par1} tbody th")),
        ["epyc", "xeon"],
        "par1's profiles"
    );
    assert_eq!(
        text_of(&body, &format!("{par1} tbody tr[data-profile=epyc] td")).join(" "),
        "2 1 1 1 5 nothing kept 2 Run-out",
        "then the headroom (none), what an order without a segment may take and the pool's planning page"
    );
    assert_eq!(
        text_of(&body, &format!("{par1} tbody tr[data-profile=xeon] td")).join(" "),
        "1 0 0 0 1 nothing kept 1 Run-out"
    );
    // Each number once: the bar carries no text labels, the table has them.
    assert_eq!(
        Html::parse_document(&body)
            .select(&sel("svg.bar text"))
            .count(),
        0
    );
    // The 24-hour chart: ORD-HELD was created this hour at par1, as was
    // ORD-SOLD (converted at once).
    let day = Html::parse_document(&body)
        .select(&sel(&format!("{par1} p.day")))
        .next()
        .and_then(|p| p.value().attr("data-day").map(str::to_owned))
        .expect("the day's totals");
    assert_eq!(day, "2 1 0 0", "created, converted, expired, cancelled");
    assert!(
        Html::parse_document(&body)
            .select(&sel(&format!("{par1} svg.hours rect.created")))
            .count()
            == 1
    );
    assert!(!body.contains("OTHER-1"));

    let body = check_page_and_links(&c, "/machines", &mut seen).await;
    assert_eq!(
        Html::parse_document(&body)
            .select(&sel("tr[data-asset-tag]"))
            .count(),
        8
    );
    assert!(
        !body.contains("OTHER-1"),
        "another org's machine is not listed"
    );
    let body = check_page_and_links(&c, "/machines?status=maintenance", &mut seen).await;
    assert_eq!(text_of(&body, "tr[data-asset-tag] th"), ["PK-005"]);
    let body = check_page_and_links(
        &c,
        "/machines?spec_site=par1&spec_profile=epyc&spec_vendor=dell",
        &mut seen,
    )
    .await;
    assert!(body.contains("Candidate"));

    // A filter naming a site and a profile is an order spec too.
    let body = check_page_and_links(&c, "/machines?site=par1&profile=epyc", &mut seen).await;
    assert_eq!(
        text_of(&body, "td.verdict[data-kind=held] .reason").len(),
        1,
        "PK-007 is held for this order"
    );
    let body = check_page_and_links(&c, "/machines/PK-006", &mut seen).await;
    assert!(body.contains("SRV-6") && body.contains("ORD-SOLD"));

    let body = check_page_and_links(&c, "/reservations", &mut seen).await;
    let rows = text_of(&body, "tr[data-reservation]");
    assert_eq!(rows.len(), 1, "one held reservation in this org: {rows:?}");
    assert!(rows[0].contains("ORD-HELD") && rows[0].contains("PK-007"));
    let remaining: i64 = Html::parse_document(&body)
        .select(&sel("[data-remaining]"))
        .next()
        .and_then(|e| e.value().attr("data-remaining").map(str::to_owned))
        .expect("a countdown")
        .parse()
        .expect("seconds");
    assert!((880..=900).contains(&remaining), "remaining {remaining}");
    assert!(body.contains(&format!(
        "/reservations/{}/cancel?fence={}",
        pool.held_id, pool.held_fence
    )));

    let body =
        check_page_and_links(&c, &format!("/reservations/{}", pool.held_id), &mut seen).await;
    assert!(
        text_of(&body, "#answer")[0].starts_with("Held until"),
        "the sentence"
    );
    assert!(
        text_of(&body, "table.timeline td")
            .iter()
            .any(|t| t == "created")
    );

    let body = check_page_and_links(
        &c,
        &format!(
            "/reservations/{}/cancel?fence={}",
            pool.held_id, pool.held_fence
        ),
        &mut seen,
    )
    .await;
    assert_eq!(
        hidden_field(&body, "fence").as_deref(),
        Some(pool.held_fence.to_string().as_str())
    );
    assert!(body.contains("returns the machine to stock"));
    check_page_and_links(
        &c,
        &format!("/reservations/{}/convert", pool.held_id),
        &mut seen,
    )
    .await;

    let body = check_page_and_links(&c, "/search?q=PK-00", &mut seen).await;
    assert_eq!(text_of(&body, "table th[scope=row]").len(), 8);
    let body =
        check_page_and_links(&c, "/why-not?site=par1&profile=epyc&vendor=dell", &mut seen).await;
    assert_eq!(text_of(&body, "#answer"), ["Would reserve PK-001."]);
    check_page_and_links(&c, "/why-not", &mut seen).await;

    let body = check_page_and_links(&c, "/jobs", &mut seen).await;
    assert!(
        body.contains("web-2-abc") && body.contains("connection refused") && body.contains("Live")
    );
    let body = check_page_and_links(&c, "/settings", &mut seen).await;
    assert!(body.contains("Deployment switch") && body.contains("checked"));
    assert!(seen.contains("/static/app.css") && seen.contains("/static/app.js"));
}

#[tokio::test]
async fn search_redirects_on_one_exact_hit() {
    let app = spawn_app().await;
    FakeMachine::new()
        .tag("PK-1")
        .profile("epyc")
        .create(&app.pool, app.org.id)
        .await;
    FakeMachine::new()
        .tag("PK-10")
        .profile("epyc")
        .create(&app.pool, app.org.id)
        .await;
    let id = FakeHold::on("PK-1")
        .order("ORD-77")
        .create(&app.pool, app.org.id)
        .await;
    let c = app.staff("vic@acme.example", "viewer").await;
    let loc = |r: reqwest::Response| {
        assert_eq!(r.status().as_u16(), 303);
        r.headers()["location"]
            .to_str()
            .expect("location")
            .to_owned()
    };
    assert_eq!(
        loc(c.get("/search?q=ORD-77").await),
        format!("/reservations/{id}")
    );
    assert_eq!(
        loc(c.get(&format!("/search?q={id}")).await),
        format!("/reservations/{id}")
    );
    assert_eq!(loc(c.get("/search?q=PK-10").await), "/machines/PK-10");
    let (status, body) = c.page("/search?q=PK-1").await;
    assert_eq!(status, 303, "PK-1 is exact too: {body}");
    let (status, body) = c.page("/search?q=pk").await;
    assert_eq!(status, 200);
    assert_eq!(text_of(&body, "table th[scope=row]").len(), 2);
    let (_, body) = c.page("/search?q=%3Cscript%3E").await;
    assert!(!body.contains("<script>"), "escaped");
    assert!(text_of(&body, "main p").contains(&"Nothing found for “<script>”.".to_owned()));
}

/// `demo` tells every state with the real functions,
/// once; a second run writes nothing; a later run tops the live holds up.
#[tokio::test]
async fn the_demo_tells_every_state_once_and_tops_up_its_holds() {
    let app = spawn_app().await;
    let pool = &app.pool;
    let first = poolkeeper::demo::load(pool).await.expect("demo");
    let org: i64 = sqlx::query_scalar("SELECT id FROM organizations WHERE slug = 'demo'")
        .fetch_one(pool)
        .await
        .expect("demo org");
    let one = |sql: &'static str| async move {
        sqlx::query_scalar::<_, i64>(sql)
            .bind(org)
            .fetch_one(pool)
            .await
            .expect(sql)
    };
    let live =
        "SELECT count(*) FROM reservations WHERE org_id = $1 AND order_ref LIKE 'DEMO-HOLD-%'
                  AND state = 'held' AND expires_at > clock_timestamp()";
    assert_eq!(one(live).await, poolkeeper::demo::HOLDS as i64);
    // R13, R14: an order of three held together, one deadline, extended by
    // support with a reason (an event per machine).
    let trio_live =
        "SELECT count(*) FROM reservations WHERE org_id = $1 AND order_ref LIKE 'DEMO-TRIO-%'
                       AND quantity = 3 AND state = 'held' AND expires_at > clock_timestamp()";
    assert_eq!(one(trio_live).await, 3);
    assert_eq!(
        one("SELECT count(DISTINCT expires_at) FROM reservations WHERE org_id = $1 AND order_ref = 'DEMO-TRIO-1'")
            .await,
        1
    );
    assert_eq!(
        one("SELECT count(*) FROM reservation_events e JOIN reservations r ON r.id = e.reservation_id
              WHERE r.org_id = $1 AND e.kind = 'extended' AND e.actor = 'support@demo.example'")
        .await,
        3
    );
    assert_eq!(
        one(
            "SELECT count(*) FROM reservations WHERE org_id = $1 AND state = 'held'
              AND expires_at < clock_timestamp() + interval '2 minutes'"
        )
        .await,
        2,
        "two holds with under 2 minutes left"
    );
    assert_eq!(
        one("SELECT count(DISTINCT created_at) FROM reservations WHERE org_id = $1 AND order_ref LIKE 'DEMO-HOLD-%'").await,
        poolkeeper::demo::HOLDS as i64,
        "staggered"
    );
    assert_eq!(
        one("SELECT count(*) FROM reservations r JOIN reservation_events e ON e.reservation_id = r.id
              WHERE r.org_id = $1 AND r.state = 'expired' AND r.ended_by = 'sweep'
                AND e.kind = 'expired' AND e.replica LIKE 'demo-%' AND e.lease_fence IS NOT NULL").await,
        2,
        "expired by the sweep, under its lease"
    );
    assert_eq!(
        one(
            "SELECT count(*) FROM reservations a JOIN reservations b ON b.machine_id = a.machine_id
              WHERE a.org_id = $1 AND a.order_ref = 'DEMO-LATE-1' AND a.state = 'expired'
                AND a.ended_by = 'allocator' AND b.order_ref = 'DEMO-LATE-2' AND b.state = 'held'"
        )
        .await,
        1,
        "expired at the point of use by the next order for its machine"
    );
    assert_eq!(
        one(
            "SELECT count(*) FROM reservations WHERE org_id = $1 AND state = 'cancelled'
              AND ended_by = 'support@demo.example' AND end_reason <> ''"
        )
        .await,
        1
    );
    assert_eq!(
        one(
            "SELECT count(*) FROM reservations r JOIN service_links s ON s.reservation_id = r.id
              WHERE r.org_id = $1 AND r.state = 'converted' AND s.ended_at IS NULL
                AND r.order_ref LIKE 'DEMO-%'"
        )
        .await,
        2,
        "a live service, and the GPU order's (the planning story's sales are PLAN-...)"
    );
    // R21: the planning story, through the forecast the page reads: par1
    // runs out in about nine days, fra1 sold out a week ago and keeps its
    // rate of 1 a day, ams1 restocked halfway keeps its rate, par2's asked
    // profile (served by substitutes) is flagged with nothing of its own.
    // The rates of 2 days in 3 and 1 in 3 are the line's value on the last
    // day of a 28-day window that ends mid-pattern (0.65, 0.29).
    let f = poolkeeper::forecast::read_from(pool, org, None, None)
        .await
        .expect("forecast");
    let story: Vec<String> = f
        .pools
        .iter()
        .filter(|p| {
            ["epyc-9754-768g", "xeon-6430-768g", "xeon-6430-512g"].contains(&p.profile.as_str())
        })
        .map(|p| {
            format!(
                "{}/{} {} {:.2} {:.1} {}",
                p.site,
                p.profile,
                p.available,
                p.demand_per_day.unwrap_or(-1.0),
                p.days_left.unwrap_or(-1.0),
                p.flagged
            )
        })
        .collect();
    assert_eq!(
        story,
        [
            "fra1/epyc-9754-768g 0 1.00 0.0 true",
            "par2/xeon-6430-768g 0 0.29 0.0 true",
            "par1/epyc-9754-768g 6 0.65 9.3 true",
            "ams1/epyc-9754-768g 20 0.65 31.0 true",
            "par2/xeon-6430-512g 10 0.00 -1.0 false",
        ],
        "{:#?}",
        f.pools
    );
    assert_eq!(
        one(
            "SELECT count(*) FROM reservations r JOIN service_links s ON s.reservation_id = r.id
              JOIN machines m ON m.id = s.machine_id
              WHERE r.org_id = $1 AND s.ended_at IS NOT NULL AND m.status = 'provisioning'
                AND r.order_ref = 'DEMO-ENDED-1'"
        )
        .await,
        1,
        "a service ended, its machine back to provisioning"
    );
    // R17-R19: a pool with headroom, a repairs segment, a customer cap.
    assert_eq!(
        one(
            "SELECT sum(machines)::bigint FROM headroom WHERE org_id = $1 AND site = 'par1'
              AND profile = 'gpu-h100-8x' AND segment = 'enterprise'"
        )
        .await,
        i64::from(poolkeeper::demo::HEADROOM_MACHINES)
    );
    assert_eq!(
        one(
            "SELECT count(*) FROM organizations WHERE id = $1 AND repairs_segment = 'repairs'
              AND customer_hold_limit = 2"
        )
        .await,
        1
    );
    // Through the real reserve path: an enterprise hold with its customer,
    // a customer at the cap, and one refusal of each code.
    assert_eq!(
        one(
            "SELECT count(*) FROM reservations WHERE org_id = $1 AND order_ref = 'DEMO-ENT-1'
              AND state = 'held' AND segment = 'enterprise' AND customer_ref = 'CUST-ORBIT'"
        )
        .await,
        1
    );
    assert_eq!(
        one(
            "SELECT count(*) FROM reservations WHERE org_id = $1 AND state = 'held'
              AND customer_ref = 'CUST-NOVA'"
        )
        .await,
        2,
        "the cap"
    );
    // R20: the exact order refused beside the GPU one, and the order a
    // substitute served.
    for (reason, expected) in [
        ("unavailable", 2),
        ("contended", 1),
        ("reserved", 1),
        ("customer_limit", 1),
        ("substituted", 1),
    ] {
        let n: i64 = sqlx::query_scalar(
            // Besides the planning story's, in pools of their own.
            "SELECT count(*) FROM reservation_refusals WHERE org_id = $1 AND reason = $2
                AND profile NOT IN ('epyc-9754-768g', 'xeon-6430-768g')",
        )
        .bind(org)
        .bind(reason)
        .fetch_one(pool)
        .await
        .expect("refusals");
        assert_eq!(n, expected, "{reason} refusals");
    }
    assert_eq!(
        one(
            "SELECT count(*) FROM reservations r JOIN machines m ON m.id = r.machine_id
              WHERE r.org_id = $1 AND r.order_ref = 'DEMO-UP-1' AND r.state = 'held'
                AND r.profile_asked = 'epyc-9124-128g' AND m.profile = 'epyc-9124-256g'"
        )
        .await,
        1,
        "an order served by a substitute"
    );
    assert_eq!(
        one("SELECT count(*) FROM substitutes WHERE org_id = $1").await,
        1
    );
    let rows = "SELECT (SELECT count(*) FROM reservations WHERE org_id = $1)
                     + (SELECT count(*) FROM reservation_events e JOIN reservations r ON r.id = e.reservation_id WHERE r.org_id = $1)
                     + (SELECT count(*) FROM service_links WHERE org_id = $1)
                     + (SELECT count(*) FROM machines WHERE org_id = $1)
                     + (SELECT count(*) FROM users WHERE org_id = $1)
                     + (SELECT count(*) FROM api_tokens WHERE org_id = $1)
                     + (SELECT count(*) FROM headroom WHERE org_id = $1)
                     + (SELECT count(*) FROM substitutes WHERE org_id = $1)
                     + (SELECT count(*) FROM reservation_refusals WHERE org_id = $1)";
    let before = one(rows).await;
    let again = poolkeeper::demo::load(pool).await.expect("demo again");
    assert_eq!(again.reservations, first.reservations);
    assert!(again.token.is_none() && first.token.is_some());
    assert_eq!(one(rows).await, before, "a second run writes nothing");

    // Later, the holds have run out: a re-run tops them up, and the ended
    // chapters are not written twice.
    sqlx::query(
        "UPDATE reservations SET created_at = created_at - interval '1 hour',
                expires_at = expires_at - interval '1 hour'
          WHERE org_id = $1 AND state = 'held'",
    )
    .bind(org)
    .execute(pool)
    .await
    .expect("time passes");
    assert_eq!(one(live).await, 0);
    let ended = "SELECT count(*) FROM reservations WHERE org_id = $1
                   AND order_ref NOT LIKE 'DEMO-HOLD-%' AND order_ref NOT LIKE 'DEMO-TRIO-%'";
    let ended_before = one(ended).await;
    poolkeeper::demo::load(pool).await.expect("demo later");
    assert_eq!(one(live).await, poolkeeper::demo::HOLDS as i64);
    assert_eq!(one(ended).await, ended_before);
    // The order of three is topped up like the live holds: a new one.
    assert_eq!(one(trio_live).await, 3);
    assert_eq!(
        one("SELECT count(DISTINCT order_ref) FROM reservations WHERE org_id = $1 AND order_ref LIKE 'DEMO-TRIO-%'")
            .await,
        2
    );
    assert_eq!(
        one("SELECT count(*) FROM reservations WHERE org_id = $1 AND order_ref LIKE 'DEMO-HOLD-%'")
            .await,
        2 * poolkeeper::demo::HOLDS as i64
    );
}

/// The overview's 24-hour chart counts each reservation created in the
/// window and each one ended in it, by its end state, from one range of
/// `reservations_recent_activity_idx`: a reservation created
/// before the window and ended in it counts once (its end), one created and
/// ended in it twice, one wholly before it not at all, and another
/// organization's never.
#[tokio::test]
async fn the_overview_chart_counts_what_was_created_and_what_ended_in_the_last_24_hours() {
    let app = spawn_app().await;
    let org = app.org.id;
    let other = create_org(&app.pool, "chart-other", true).await.id;
    // (order, created this long ago, state, ended this long ago)
    let rows: [(&str, &str, HoldState, Option<&str>); 6] = [
        ("held-now", "2 hours", Held, None),
        ("cancelled-now", "3 hours", Cancelled, Some("1 hour")),
        ("converted-now", "2 hours", Converted, Some("90 minutes")),
        ("expired-late", "30 hours", Expired, Some("5 hours")),
        ("converted-old", "40 hours", Converted, Some("30 hours")),
        ("cancelled-old", "50 hours", Cancelled, Some("49 hours")),
    ];
    for (i, (order, created, state, ended)) in rows.iter().enumerate() {
        let tag = format!("CH-{i}");
        FakeMachine::new()
            .tag(&tag)
            .profile("epyc")
            .create(&app.pool, org)
            .await;
        let mut hold = FakeHold::on(&tag)
            .order(order)
            .state(*state)
            .bare()
            .reason("test")
            .created_ago(created);
        if let Some(ended) = ended {
            hold = hold.ended_ago(ended);
        }
        hold.create(&app.pool, org).await;
    }
    FakeMachine::new()
        .tag("CH-O")
        .profile("epyc")
        .create(&app.pool, other)
        .await;
    FakeHold::on("CH-O")
        .order("theirs")
        .state(Cancelled)
        .bare()
        .reason("test")
        .created_ago("1 hour")
        .ended_ago("10 minutes")
        .create(&app.pool, other)
        .await;

    app.create_staff(org, "chart@example.com", "viewer").await;
    let c = app.logged_in("chart@example.com").await;
    let said =
        "par1, last 24 hours, per hour: 3 created, 1 converted, 1 expired, 1 cancelled in all";
    // Rows dated in the past, behind the count: nothing until they are
    // counted again (as the demo does).
    let (status, html) = c.page("/").await;
    assert_eq!(status, 200);
    assert!(!html.contains(said), "{html}");
    poolkeeper::activity::recount(&app.pool, org)
        .await
        .expect("recount");
    let (_, html) = c.page("/").await;
    assert!(html.contains(said), "{html}");

    // The sweep's holder counts what happened since the last count, a
    // minute behind the clock, once: moved back three hours, the count
    // adds those hours to what the recount wrote (the rows of the last
    // three hours: one cancelled, one converted, and the creation of the
    // three created two and three hours ago), and a second count adds
    // nothing.
    sqlx::query(
        "UPDATE activity_counted SET counted_until = clock_timestamp() - interval '3 hours 30 minutes'",
    )
    .execute(&app.pool)
    .await
    .expect("move the count back");
    let mandate = match poolkeeper::lease::claim(
        &app.pool,
        poolkeeper::lease::SWEEP_KEY,
        "chart-counter",
        std::time::Duration::from_secs(60),
    )
    .await
    .expect("claim")
    {
        poolkeeper::lease::Claim::Acquired(m) => m,
        poolkeeper::lease::Claim::HeldByOther => panic!("the sweep lease is taken"),
    };
    // Another replica's fence writes nothing.
    let stale = poolkeeper::activity::count(&app.pool, "chart-counter", mandate.fence + 1).await;
    assert!(matches!(stale, Ok(None)), "{stale:?}");
    let counted =
        "par1, last 24 hours, per hour: 6 created, 2 converted, 1 expired, 2 cancelled in all";
    for step in ["count", "count again"] {
        let wrote = poolkeeper::activity::count(&app.pool, "chart-counter", mandate.fence)
            .await
            .expect(step);
        assert!(wrote.is_some(), "{step}: the mandate is live");
        let (_, html) = c.page("/").await;
        assert!(html.contains(counted), "{step}: {html}");
    }
}

/// The chart's count and a recount of the same organization, released
/// together by a barrier on separate connections, round after round: each
/// waits for the other (the row of `activity_counted`), so the hours end
/// as the reservations say, up to `counted_until`: nothing lost, nothing
/// counted twice, and no recount refused for a key the count wrote
/// meanwhile (without the wait, about one run in two of 60 rounds was).
#[tokio::test]
async fn counts_and_recounts_racing_leave_the_hours_exact() {
    let app = spawn_app().await;
    let org = app.org.id;
    for i in 0..12 {
        let tag = format!("RACE-{i}");
        FakeMachine::new()
            .tag(&tag)
            .site(["par1", "ams1"][i % 2])
            .profile("epyc")
            .create(&app.pool, org)
            .await;
        let state = [Held, Cancelled, Converted, Expired][i % 4];
        let mut hold = FakeHold::on(&tag)
            .state(state)
            .bare()
            .reason("test")
            .created_ago(&format!("{} minutes", 40 + 15 * i));
        if state != Held {
            hold = hold.ended_ago(&format!("{} minutes", 5 + 10 * i));
        }
        hold.create(&app.pool, org).await;
    }
    let mandate = match poolkeeper::lease::claim(
        &app.pool,
        poolkeeper::lease::SWEEP_KEY,
        "race-counter",
        std::time::Duration::from_secs(120),
    )
    .await
    .expect("claim")
    {
        poolkeeper::lease::Claim::Acquired(m) => m,
        poolkeeper::lease::Claim::HeldByOther => panic!("the sweep lease is taken"),
    };
    // What the hours must hold: every creation and end before
    // counted_until, by hour, site and kind.
    let truth = "SELECT date_trunc('hour', e.at) AS hour, m.site, e.kind, count(*)
                   FROM reservations r JOIN machines m ON m.id = r.machine_id
                  CROSS JOIN LATERAL (VALUES ('created', r.created_at), (r.state, r.ended_at)) e (kind, at)
                  WHERE r.org_id = $1 AND e.at IS NOT NULL
                    AND e.at < (SELECT counted_until FROM activity_counted)
                  GROUP BY 1, 2, 3
                 EXCEPT ALL
                 SELECT hour, site, kind, n FROM activity_hours WHERE org_id = $1";
    let hours = "SELECT hour, site, kind, n FROM activity_hours WHERE org_id = $1
                 EXCEPT ALL
                 SELECT date_trunc('hour', e.at), m.site, e.kind, count(*)
                   FROM reservations r JOIN machines m ON m.id = r.machine_id
                  CROSS JOIN LATERAL (VALUES ('created', r.created_at), (r.state, r.ended_at)) e (kind, at)
                  WHERE r.org_id = $1 AND e.at IS NOT NULL
                    AND e.at < (SELECT counted_until FROM activity_counted)
                  GROUP BY 1, 2, 3";
    for round in 0..60 {
        // Each round the count has the last four hours to add.
        sqlx::query(
            "UPDATE activity_counted SET counted_until = clock_timestamp() - interval '4 hours'",
        )
        .execute(&app.pool)
        .await
        .expect("move the count back");
        let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(8));
        let mut tasks = Vec::new();
        for t in 0..8 {
            let (pool, barrier, fence) = (app.pool.clone(), barrier.clone(), mandate.fence);
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                if t % 2 == 0 {
                    poolkeeper::activity::count(&pool, "race-counter", fence)
                        .await
                        .expect("count")
                        .expect("the mandate is live");
                } else {
                    poolkeeper::activity::recount(&pool, org)
                        .await
                        .expect("recount");
                }
            }));
        }
        for task in tasks {
            task.await.expect("task");
        }
        for (what, sql) in [
            ("missing from the hours", truth),
            ("counted too often", hours),
        ] {
            let off: Vec<(chrono::DateTime<chrono::Utc>, String, String, i64)> =
                sqlx::query_as(sql)
                    .bind(org)
                    .fetch_all(&app.pool)
                    .await
                    .expect(what);
            assert!(off.is_empty(), "round {round}: {what}: {off:?}");
        }
    }
}
