//! The machines page and why-not: the allocator's reasons, paging through
//! 50,000 machines.

use std::collections::HashSet;

use poolkeeper::allocator::{self, OrderSpec};
use poolkeeper::domain::{Profile, Site, Vendor};
use poolkeeper::inventory::MachineFilter;
use scraper::Html;

use crate::helpers::FakeMachine;
use crate::helpers::{TestApp, spawn_app};

use super::{every_kind_pool, sel, text_of};

#[tokio::test]
async fn the_machines_page_and_the_allocator_agree_on_every_reason() {
    let app = spawn_app().await;
    every_kind_pool(&app).await;
    let c = app.staff("dc@acme.example", "viewer").await;
    let (status, body) = c
        .page("/machines?spec_site=par1&spec_profile=epyc&spec_vendor=dell")
        .await;
    assert_eq!(status, 200);
    let doc = Html::parse_document(&body);
    let mut rendered = std::collections::BTreeMap::new();
    for row in doc.select(&sel("tr[data-asset-tag]")) {
        let tag = row.value().attr("data-asset-tag").expect("tag").to_owned();
        let cell = row
            .select(&sel("td.verdict"))
            .next()
            .expect("a verdict cell");
        let kind = cell.value().attr("data-kind").expect("kind").to_owned();
        let reason = cell
            .select(&sel(".reason"))
            .next()
            .map(|r| r.text().collect::<String>());
        rendered.insert(tag, (kind, reason));
    }
    let spec = OrderSpec {
        site: Site::parse("par1").expect("site"),
        profile: Profile::parse("epyc").expect("profile"),
        vendor: Some(Vendor::parse("dell").expect("vendor")),
    };
    let verdicts = allocator::explain(
        &app.pool,
        app.org.id,
        &spec,
        &MachineFilter::default(),
        None,
        1000,
    )
    .await
    .expect("explain");
    assert_eq!(verdicts.len(), rendered.len());
    let mut kinds = HashSet::new();
    for v in &verdicts {
        let (kind, reason) = rendered
            .get(&v.machine.asset_tag)
            .expect("every machine is on the page");
        match &v.exclusion {
            None => {
                assert_eq!(kind, "candidate", "{}", v.machine.asset_tag);
                assert!(reason.is_none());
            }
            Some(e) => {
                assert_eq!(kind, e.key().as_str(), "{}", v.machine.asset_tag);
                assert_eq!(
                    reason.as_deref(),
                    Some(e.describe().as_str()),
                    "{}",
                    v.machine.asset_tag
                );
            }
        }
        kinds.insert(kind.clone());
    }
    for k in [
        "candidate",
        "wrong_site",
        "wrong_vendor",
        "wrong_profile",
        "not_ready",
        "in_service",
        "held",
    ] {
        assert!(kinds.contains(k), "the pool has a {k} machine: {kinds:?}");
    }
}

#[tokio::test]
async fn why_not_gives_the_three_answers() {
    let app = spawn_app().await;
    FakeMachine::new()
        .tag("PK-1")
        .profile("epyc")
        .create(&app.pool, app.org.id)
        .await;
    FakeMachine::new()
        .tag("PK-2")
        .profile("xeon")
        .status("broken")
        .create(&app.pool, app.org.id)
        .await;
    let c = app.staff("dc@acme.example", "viewer").await;
    let (_, body) = c.page("/why-not?site=par1&profile=epyc").await;
    assert_eq!(text_of(&body, "#answer"), ["Would reserve PK-1."]);

    // Someone else holds the row lock of the only candidate right now.
    let mut tx = app.pool.begin().await.expect("tx");
    sqlx::query("SELECT id FROM machines WHERE asset_tag = 'PK-1' FOR UPDATE")
        .execute(&mut *tx)
        .await
        .expect("lock");
    let (_, body) = c.page("/why-not?site=par1&profile=epyc").await;
    assert!(
        text_of(&body, "#answer")[0].starts_with("Contended: retry"),
        "{body}"
    );
    tx.rollback().await.expect("rollback");

    let (_, body) = c.page("/why-not?site=par1&profile=xeon").await;
    assert!(text_of(&body, "#answer")[0].starts_with("Unavailable: buy hardware"));
    assert!(body.contains("data-kind=\"not_ready\""));
    // Half a spec is a clear 400.
    assert_eq!(c.get("/why-not?site=par1").await.status().as_u16(), 400);
    assert_eq!(
        c.get("/why-not?site=par%201&profile=x")
            .await
            .status()
            .as_u16(),
        400
    );
}

#[tokio::test]
async fn the_machines_page_pages_through_50000_machines_quickly() {
    let app = spawn_app().await;
    crate::helpers::generated_machines(
        &app.pool,
        app.org.id,
        50_000,
        crate::helpers::Generated {
            tag: "'M-' || lpad(g::text, 6, '0')",
            site: "(ARRAY['par1','par2','ams1','fra1'])[1 + g % 4]",
            vendor: "(ARRAY['dell','hpe'])[1 + g % 2]",
            profile: "(ARRAY['epyc','xeon'])[1 + (g / 2) % 2]",
            status: "CASE WHEN g % 10 = 0 THEN 'maintenance' ELSE 'ready' END",
        },
    )
    .await;
    sqlx::query("ANALYZE machines")
        .execute(&app.pool)
        .await
        .expect("analyze");
    let c = app.staff("dc@acme.example", "viewer").await;
    let mut path = "/machines?site=fra1&status=ready".to_owned();
    let mut pages = 0;
    let mut last_first = String::new();
    while pages < 5 {
        let (status, body) = c.page(&path).await;
        assert_eq!(status, 200);
        let tags = text_of(&body, "tr[data-asset-tag] th");
        assert_eq!(tags.len(), 100);
        assert!(tags[0] > last_first, "keyset pages move forward");
        last_first = tags[0].clone();
        let next = Html::parse_document(&body)
            .select(&sel("a[rel=next]"))
            .next()
            .and_then(|a| a.value().attr("href").map(str::to_owned))
            .expect("a next link");
        path = next;
        pages += 1;
    }
    let (status, body) = c
        .page("/machines?spec_site=par1&spec_profile=epyc&after=M-025000")
        .await;
    assert_eq!(status, 200);
    assert_eq!(text_of(&body, "tr[data-asset-tag] th")[0], "M-025001");
    // An index, not a scan of 50,000 rows per page: the plans of the
    // statements these pages ran (a page and one more row) never read
    // machines whole. The page's counts and facets have their plan test in
    // machines_list.rs.
    let limit = poolkeeper::dashboard::machines::PAGE_SIZE + 1;
    let fra1_ready = MachineFilter {
        site: Some(Site::parse("fra1").expect("site")),
        status: Some(poolkeeper::domain::MachineStatus::parse("ready").expect("status")),
        ..MachineFilter::default()
    };
    for after in [None, Some(last_first.as_str())] {
        let sql = poolkeeper::inventory::list_pooled_sql(&fra1_ready, after.is_some(), limit);
        let plan = plan_of(&app, &sql, |q| {
            q.bind(app.org.id)
                .bind("fra1")
                .bind(None::<&str>)
                .bind(None::<&str>)
                .bind("ready")
                .bind(after)
        })
        .await;
        assert!(
            plan.contains("Index Scan") && !plan.contains("Seq Scan on machines"),
            "{after:?}:\n{plan}"
        );
    }
    let sql = allocator::explain_sql(&MachineFilter::default(), true, limit);
    let plan = plan_of(&app, &sql, |q| {
        q.bind(app.org.id)
            .bind("par1")
            .bind("epyc")
            .bind(None::<&str>)
            .bind(None::<&str>)
            .bind(None::<&str>)
            .bind(None::<&str>)
            .bind(None::<&str>)
            .bind(None::<&str>)
            .bind("M-025000")
    })
    .await;
    assert!(
        plan.contains("Index Scan") && !plan.contains("Seq Scan on machines"),
        "spec:\n{plan}"
    );
    // Why not?'s groups of the ordered pool walk the pool in asset tag
    // order, a page at a time: not the organization's asset tags keeping
    // one machine in hundreds (41,000 rows for a page at 400,000 machines
    // in 600 pools), nor the whole pool sorted.
    let spec = OrderSpec {
        site: Site::parse("par1").expect("site"),
        profile: Profile::parse("epyc").expect("profile"),
        vendor: None,
    };
    for key in ["candidate", "held", "in_service", "not_ready"] {
        let filter = poolkeeper::dashboard::why_not::group_filter(&spec, key);
        for after in [None, Some("M-025000")] {
            let first_chunk = 2 * poolkeeper::dashboard::machines::PAGE_SIZE + 1;
            let sql = allocator::explain_sql(&filter, after.is_some(), first_chunk);
            let plan = plan_of(&app, &sql, |q| {
                q.bind(app.org.id)
                    .bind("par1")
                    .bind("epyc")
                    .bind(None::<&str>)
                    .bind("par1")
                    .bind(None::<&str>)
                    .bind("epyc")
                    .bind(filter.status.map(|s| s.as_str()))
                    .bind(None::<&str>)
                    .bind(after)
            })
            .await;
            assert!(
                plan.contains("machines_pool_by_tag_idx") && !plan.contains("Sort"),
                "{key} after {after:?}:\n{plan}"
            );
        }
    }
}

type Explain<'q> =
    sqlx::query::QueryScalar<'q, sqlx::Postgres, String, sqlx::postgres::PgArguments>;

/// The plan PostgreSQL chooses for `sql` with the values `bind` gives it.
async fn plan_of<'q>(
    app: &'q TestApp,
    sql: &str,
    bind: impl FnOnce(Explain<'q>) -> Explain<'q>,
) -> String {
    let explain = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("EXPLAIN (COSTS OFF) {sql}")));
    bind(explain)
        .fetch_all(&app.pool)
        .await
        .expect("explain")
        .join("\n")
}

/// The summary comes first, in words, with the API's
/// counts, and each group's link lists exactly that group.
#[tokio::test]
async fn why_not_summarises_by_reason_in_words_and_links_each_group() {
    let app = spawn_app().await;
    every_kind_pool(&app).await;
    let c = app.staff("dc@acme.example", "viewer").await;
    let spec = "/why-not?site=par1&profile=epyc&vendor=dell";
    let (status, body) = c.page(spec).await;
    assert_eq!(status, 200);
    assert_eq!(
        text_of(&body, "table.summary tbody tr"),
        [
            "candidate 1 candidate Show the 1 candidate",
            "at another site 2 wrong_site Show the 2 at another site",
            "other vendor 1 wrong_vendor Show the 1 other vendor",
            "other profile 1 wrong_profile Show the 1 other profile",
            "not ready 1 not_ready Show the 1 not ready",
            "in service 1 in_service Show the 1 in service",
            "held 1 held Show the 1 held",
        ]
    );
    assert_eq!(text_of(&body, "table.summary tfoot td")[0], "8");
    // Candidates first, then the rest of par1 only: no machine of ams1/fra1.
    assert_eq!(text_of(&body, "table.candidates tbody th"), ["PK-001"]);
    assert_eq!(
        text_of(&body, "table.rest tbody th"),
        ["PK-003", "PK-004", "PK-005", "PK-006", "PK-007"]
    );
    assert_eq!(
        text_of(&body, "table.rest td.verdict .badge"),
        [
            "Not a candidate: other vendor",
            "Not a candidate: other profile",
            "Not a candidate: not ready",
            "Not a candidate: in service",
            "Not a candidate: held",
        ]
    );
    assert!(!body.contains("wrong_site 2"), "no codes in sentences");
    // Each group's link lists exactly that group, other sites included.
    let doc = Html::parse_document(&body);
    for row in doc.select(&sel("table.summary tbody tr")) {
        let key = row.value().attr("data-reason").expect("key").to_owned();
        let href = row
            .select(&sel("a"))
            .next()
            .and_then(|a| a.value().attr("href"))
            .expect("a link")
            .to_owned();
        let (status, group) = c.page(&href).await;
        assert_eq!(status, 200, "{href}");
        let kinds: Vec<String> = Html::parse_document(&group)
            .select(&sel("table.rest td.verdict"))
            .map(|td| td.value().attr("data-kind").unwrap_or("").to_owned())
            .collect();
        let expected = if key == "wrong_site" { 2 } else { 1 };
        assert_eq!(kinds.len(), expected, "{key}: {kinds:?}");
        assert!(kinds.iter().all(|k| *k == key), "{key}: {kinds:?}");
    }
    assert_eq!(
        c.get(&format!("{spec}&reason=nonsense"))
            .await
            .status()
            .as_u16(),
        400
    );
}
