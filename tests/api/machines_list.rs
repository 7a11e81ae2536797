//! The machines list says what each machine is doing
//! (sellable, held, sold, not ready) with links and counts; the filters
//! are selects of the organization's inventory; CSV exports hold what the
//! pages list, with their filters.

use scraper::{Html, Selector};

use crate::helpers::{FakeHold, FakeMachine, InService};
use crate::helpers::{TestApp, spawn_app};

fn sel(s: &str) -> Selector {
    Selector::parse(s).expect("selector")
}

fn texts(html: &str, selector: &str) -> Vec<String> {
    Html::parse_document(html)
        .select(&sel(selector))
        .map(|e| {
            e.text()
                .collect::<String>()
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect()
}

fn attrs(html: &str, selector: &str, attr: &str) -> Vec<String> {
    Html::parse_document(html)
        .select(&sel(selector))
        .filter_map(|e| e.value().attr(attr).map(str::to_owned))
        .collect()
}

/// A CSV file as rows of cells (RFC 4180: quotes, doubled quotes, CRLF).
fn parse_csv(text: &str) -> Vec<Vec<String>> {
    let mut rows = Vec::new();
    let mut row = Vec::new();
    let mut cell = String::new();
    let mut quoted = false;
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match (quoted, c) {
            (true, '"') if chars.peek() == Some(&'"') => {
                chars.next();
                cell.push('"');
            }
            (true, '"') => quoted = false,
            (true, c) => cell.push(c),
            (false, '"') => quoted = true,
            (false, ',') => row.push(std::mem::take(&mut cell)),
            (false, '\r') => {}
            (false, '\n') => {
                row.push(std::mem::take(&mut cell));
                rows.push(std::mem::take(&mut row));
            }
            (false, c) => cell.push(c),
        }
    }
    rows
}

/// par1: sellable PK-001 and -003, not ready PK-005, sold PK-006 (SRV-6),
/// held PK-007 (ORD-HELD); ams1: sellable PK-002; fra1: not ready PK-008.
/// Another organization has a site of its own (lon9).
async fn pool(app: &TestApp) -> (i64, i64) {
    let org = app.org.id;
    for (tag, site, vendor, profile, status) in [
        ("PK-001", "par1", "dell", "epyc", "ready"),
        ("PK-002", "ams1", "dell", "epyc", "ready"),
        ("PK-003", "par1", "hpe", "xeon", "ready"),
        ("PK-005", "par1", "dell", "epyc", "maintenance"),
        ("PK-006", "par1", "dell", "epyc", "ready"),
        ("PK-007", "par1", "dell", "epyc", "ready"),
        ("PK-008", "fra1", "supermicro", "epyc", "broken"),
    ] {
        FakeMachine::new()
            .tag(tag)
            .site(site)
            .vendor(vendor)
            .profile(profile)
            .status(status)
            .create(&app.pool, org)
            .await;
    }
    let sold = FakeHold::on("PK-006")
        .order("ORD-SOLD")
        .state(InService)
        .service_ref("SRV-6")
        .create(&app.pool, org)
        .await;
    let held = FakeHold::on("PK-007")
        .order("ORD-HELD")
        .create(&app.pool, org)
        .await;
    FakeMachine::new()
        .tag("OT-1")
        .site("lon9")
        .vendor("lenovo")
        .profile("arm")
        .create(&app.pool, app.other.id)
        .await;
    // Held by the other organization: counted there, never here.
    FakeHold::on("OT-1")
        .order("OT-HELD")
        .create(&app.pool, app.other.id)
        .await;
    (held, sold)
}

#[tokio::test]
async fn each_machine_says_what_it_is_doing_with_links_counts_and_a_filter() {
    let app = spawn_app().await;
    let (held, sold) = pool(&app).await;
    let c = app.staff("dc@acme.example", "viewer").await;
    let (status, body) = c.page("/machines").await;
    assert_eq!(status, 200);
    let state_of = |body: &str, tag: &str| {
        attrs(
            body,
            &format!("tr[data-asset-tag=\"{tag}\"] td.pool"),
            "data-state",
        )
        .pop()
        .unwrap_or_default()
    };
    for (tag, state) in [
        ("PK-001", "sellable"),
        ("PK-002", "sellable"),
        ("PK-005", "not_ready"),
        ("PK-006", "sold"),
        ("PK-007", "held"),
        ("PK-008", "not_ready"),
    ] {
        assert_eq!(state_of(&body, tag), state, "{tag}");
    }
    let held_cell = texts(&body, "tr[data-asset-tag=\"PK-007\"] td.pool")
        .pop()
        .unwrap_or_default();
    assert!(
        held_cell.contains("ORD-HELD") && held_cell.contains("left"),
        "{held_cell}"
    );
    let remaining: i64 = attrs(
        &body,
        "tr[data-asset-tag=\"PK-007\"] td.pool [data-remaining]",
        "data-remaining",
    )
    .pop()
    .expect("a countdown")
    .parse()
    .expect("seconds");
    assert!((850..=900).contains(&remaining), "{remaining}");
    assert_eq!(
        attrs(&body, "tr[data-asset-tag=\"PK-007\"] td.pool a", "href"),
        [format!("/reservations/{held}")]
    );
    let sold_cell = texts(&body, "tr[data-asset-tag=\"PK-006\"] td.pool")
        .pop()
        .unwrap_or_default();
    assert!(sold_cell.contains("SRV-6"), "{sold_cell}");
    assert_eq!(
        attrs(&body, "tr[data-asset-tag=\"PK-006\"] td.pool a", "href"),
        [format!("/reservations/{sold}")]
    );
    // Counts above the table, each linking to its filter.
    let count = |body: &str, state: &str| -> i64 {
        texts(body, &format!("#state-counts a[data-state={state}] .num"))
            .pop()
            .expect("a count")
            .parse()
            .expect("a number")
    };
    assert_eq!(
        ["sellable", "held", "sold", "not_ready"].map(|s| count(&body, s)),
        [3, 1, 1, 2]
    );
    let (_, par1) = c.page("/machines?site=par1").await;
    assert_eq!(
        ["sellable", "held", "sold", "not_ready"].map(|s| count(&par1, s)),
        [2, 1, 1, 1],
        "the counts follow the filters"
    );
    for (state, tags) in [
        ("held", vec!["PK-007"]),
        ("sold", vec!["PK-006"]),
        ("sellable", vec!["PK-001", "PK-002", "PK-003"]),
        ("not_ready", vec!["PK-005", "PK-008"]),
    ] {
        let link = attrs(
            &body,
            &format!("#state-counts a[data-state={state}]"),
            "href",
        )
        .pop()
        .expect("a link");
        let (status, page) = c.page(&link).await;
        assert_eq!(status, 200);
        assert_eq!(texts(&page, "tr[data-asset-tag] th"), tags, "{state}");
    }
    // With an order, the state is said beside the verdict; and the state
    // filter narrows the verdicts.
    let (_, spec) = c
        .page("/machines?spec_site=par1&spec_profile=epyc&state=held")
        .await;
    assert_eq!(texts(&spec, "tr[data-asset-tag] th"), ["PK-007"]);
    assert_eq!(state_of(&spec, "PK-007"), "held");
    assert_eq!(
        attrs(
            &spec,
            "tr[data-asset-tag=\"PK-007\"] td.verdict",
            "data-kind"
        ),
        ["held"]
    );
    let (status, _) = c.page("/machines?state=lost").await;
    assert_eq!(status, 400, "an unknown state is refused");
}

#[tokio::test]
async fn filters_are_selects_of_the_organizations_inventory() {
    let app = spawn_app().await;
    pool(&app).await;
    let c = app.staff("dc@acme.example", "viewer").await;
    let options = |body: &str, id: &str| {
        attrs(body, &format!("select#{id} option"), "value")
            .into_iter()
            .filter(|v| !v.is_empty())
            .collect::<Vec<_>>()
    };
    let (_, body) = c.page("/machines?site=par1").await;
    assert_eq!(options(&body, "f-site"), ["ams1", "fra1", "par1"]);
    assert_eq!(options(&body, "f-vendor"), ["dell", "hpe", "supermicro"]);
    assert_eq!(options(&body, "f-profile"), ["epyc", "xeon"]);
    assert_eq!(
        options(&body, "f-state"),
        ["sellable", "held", "sold", "not_ready"]
    );
    assert_eq!(options(&body, "s-site"), ["ams1", "fra1", "par1"]);
    assert_eq!(
        attrs(&body, "select#f-site option[selected]", "value"),
        ["par1"]
    );
    assert!(
        !body.contains("lon9"),
        "another organization's site is not offered"
    );
    let (_, body) = c.page("/why-not").await;
    assert_eq!(options(&body, "w-site"), ["ams1", "fra1", "par1"]);
    assert_eq!(options(&body, "w-profile"), ["epyc", "xeon"]);
    assert_eq!(attrs(&body, "select#w-site", "required").len(), 1);
    let (_, body) = c.page("/reservations?site=par1").await;
    assert_eq!(options(&body, "l-site"), ["ams1", "fra1", "par1"]);
    assert_eq!(
        attrs(&body, "select#l-site option[selected]", "value"),
        ["par1"]
    );
    // A value from an old link that is no longer in the inventory stays
    // shown and selected.
    let (_, body) = c.page("/machines?site=gone1").await;
    assert_eq!(
        attrs(&body, "select#f-site option[selected]", "value"),
        ["gone1"]
    );
}

#[tokio::test]
async fn csv_exports_hold_what_the_pages_list_with_their_filters() {
    let app = spawn_app().await;
    pool(&app).await;
    // A spreadsheet would run a cell starting with '-' as a formula.
    FakeMachine::new()
        .tag("-2+3")
        .profile("epyc")
        .create(&app.pool, app.org.id)
        .await;
    FakeHold::on("-2+3")
        .order("-HYPER")
        .hold_seconds(600)
        .create(&app.pool, app.org.id)
        .await;
    let c = app.staff("dc@acme.example", "viewer").await;
    let get_csv = |path: String| {
        let c = &c;
        async move {
            let r = c.get(&path).await;
            assert_eq!(r.status().as_u16(), 200, "{path}");
            let disposition = r.headers()["content-disposition"]
                .to_str()
                .expect("header")
                .to_owned();
            assert!(disposition.starts_with("attachment;"), "{disposition}");
            assert!(
                r.headers()["content-type"]
                    .to_str()
                    .expect("type")
                    .starts_with("text/csv")
            );
            parse_csv(&r.text().await.expect("body"))
        }
    };
    // Machines: the link on the page, with its filters.
    let (_, body) = c.page("/machines?site=par1&state=held").await;
    let link = attrs(&body, "a[href^=\"/machines.csv\"]", "href")
        .pop()
        .expect("a CSV link");
    assert_eq!(link, "/machines.csv?site=par1&state=held");
    let rows = get_csv(link).await;
    assert_eq!(
        rows[0][..6],
        ["asset_tag", "site", "vendor", "profile", "status", "state"]
    );
    let tags: Vec<&str> = rows[1..].iter().map(|r| r[0].as_str()).collect();
    assert_eq!(tags, ["'-2+3", "PK-007"], "formula cells are text");
    let unguarded: Vec<&str> = tags.iter().map(|t| t.trim_start_matches('\'')).collect();
    assert_eq!(
        unguarded,
        texts(&body, "tr[data-asset-tag] th"),
        "the page's rows"
    );
    for r in &rows[1..] {
        assert_eq!((r[1].as_str(), r[5].as_str()), ("par1", "held"));
    }
    assert_eq!(rows[1][7], "'-HYPER");
    assert_eq!(rows[2][7], "ORD-HELD");
    let all = get_csv("/machines.csv".into()).await;
    assert_eq!(
        all.len() - 1,
        8,
        "every machine of the organization, no other"
    );
    let with_spec = get_csv("/machines.csv?spec_site=par1&spec_profile=epyc".into()).await;
    assert_eq!(with_spec[0].last().map(String::as_str), Some("why"));
    assert!(
        with_spec
            .iter()
            .any(|r| r[0] == "PK-001" && r[10] == "candidate")
    );

    // Reservations: the held list with its site filter.
    let (_, body) = c.page("/reservations?site=par1").await;
    let link = attrs(&body, "a[href^=\"/reservations.csv\"]", "href")
        .pop()
        .expect("a CSV link");
    let rows = get_csv(link).await;
    let ids: Vec<String> = rows[1..].iter().map(|r| r[0].clone()).collect();
    let on_page: Vec<String> = attrs(&body, "tr[data-reservation]", "data-reservation");
    assert_eq!(ids, on_page);
    assert_eq!(ids.len(), 2);
    let (_, ams) = c.page("/reservations?site=ams1").await;
    let link = attrs(&ams, "a[href^=\"/reservations.csv\"]", "href")
        .pop()
        .expect("a CSV link");
    assert_eq!(
        get_csv(link).await.len(),
        1,
        "only the header: nothing held at ams1"
    );

    // Demand: the page's rows.
    sqlx::query(
        "INSERT INTO reservation_refusals (org_id, site, profile, vendor, reason, excluded)
         VALUES ($1, 'par1', 'epyc', NULL, 'unavailable', '{\"held\": 1}'),
                ($1, 'ams1', '=cmd', 'dell', 'contended', '{\"candidates\": 1}')",
    )
    .bind(app.org.id)
    .execute(&app.pool)
    .await
    .expect("refusals");
    let (_, body) = c.page("/demand").await;
    let rows = get_csv("/demand.csv".into()).await;
    let pairs: Vec<String> = rows[1..]
        .iter()
        .map(|r| format!("{} {}", r[0], r[1]))
        .collect();
    let page_pairs: Vec<String> = attrs(&body, "table.demand tbody tr", "data-site")
        .into_iter()
        .zip(attrs(&body, "table.demand tbody tr", "data-profile"))
        .map(|(s, p)| format!("{s} {p}"))
        .collect();
    assert_eq!(pairs.len(), 2);
    assert_eq!(pairs[0], page_pairs[0]);
    assert_eq!(pairs[1], "ams1 '=cmd");
    assert!(attrs(&body, "a[href=\"/demand.csv\"]", "href").len() == 1);
}

/// EXPLAIN (ANALYZE) of the list's three statements at fleet size,
/// 400,000 machines, 1,000 held and 1,000 sold: the page walks
/// an index and stops after 101 rows (no scan of the pool, no query per
/// row), the selects are skip scans; the counts read the filtered machines
/// once. Times are printed for the report, plans asserted.
#[tokio::test]
async fn the_list_stays_on_indexes_at_400000_machines() {
    let app = spawn_app().await;
    let org = app.org.id;
    crate::helpers::generated_machines(
        &app.pool,
        org,
        400_000,
        crate::helpers::Generated {
            tag: "'M-' || lpad(g::text, 6, '0')",
            site: "'s' || lpad((g % 10)::text, 2, '0')",
            vendor: "(ARRAY['dell','hpe'])[1 + g % 2]",
            profile: "(ARRAY['epyc','xeon'])[1 + (g / 2) % 2]",
            status: "CASE WHEN g % 7 = 3 THEN 'maintenance' ELSE 'ready' END",
        },
    )
    .await;
    // 1,000 held and 1,000 sold, spread over the pool, in one statement
    // (FakeHold writes one row per statement).
    sqlx::query(
        "WITH held AS (
            INSERT INTO reservations (org_id, order_ref, machine_id, spec, machine_snapshot, reason, hold_seconds, expires_at)
            SELECT $1, 'H-' || m.id, m.id, '{}', '{}', 'bench', 900, clock_timestamp() + interval '10 minutes'
              FROM machines m WHERE m.org_id = $1 AND m.id % 400 = 1 RETURNING id),
          sold AS (
            INSERT INTO reservations (org_id, order_ref, machine_id, spec, machine_snapshot, reason, hold_seconds,
                                      expires_at, state, ended_at, ended_by)
            SELECT $1, 'S-' || m.id, m.id, '{}', '{}', 'bench', 900, clock_timestamp() + interval '10 minutes',
                   'converted', clock_timestamp(), 'bench'
              FROM machines m WHERE m.org_id = $1 AND m.id % 400 = 2 RETURNING id, machine_id)
         INSERT INTO service_links (org_id, machine_id, reservation_id, service_ref)
         SELECT $1, machine_id, id, 'SRV-' || id FROM sold",
    )
    .bind(org)
    .execute(&app.pool)
    .await
    .expect("holds and services");
    // VACUUM as autovacuum would after the load: the visibility map is what
    // lets the counts stay index-only. VACUUM marks a page all-visible only
    // once the commits of its rows are on disk (the test cluster commits
    // asynchronously: one synchronous commit flushes them) and no
    // transaction that may not see them is still open in this database.
    let mut conn = app.pool.acquire().await.expect("connection");
    sqlx::query("SET synchronous_commit = on")
        .execute(&mut *conn)
        .await
        .expect("synchronous");
    sqlx::query("SELECT txid_current()")
        .execute(&mut *conn)
        .await
        .expect("a synchronous commit");
    // A worker of the app that took its snapshot before the load committed
    // holds that back: VACUUM again until every page is all-visible (each
    // pass lasts as long as a read of the table; the workers' transactions
    // are shorter).
    let mut tries = 0;
    loop {
        sqlx::query("VACUUM ANALYZE machines")
            .execute(&mut *conn)
            .await
            .expect("vacuum");
        let all_visible: bool = sqlx::query_scalar(
            "SELECT relallvisible >= relpages FROM pg_class WHERE oid = 'machines'::regclass",
        )
        .fetch_one(&mut *conn)
        .await
        .expect("visibility");
        tries += 1;
        if all_visible {
            break;
        }
        assert!(
            tries < 200,
            "VACUUM left pages of machines not all-visible 200 times: an old transaction stays open"
        );
    }
    drop(conn);
    // The sweep's fold, as every period: the figures per pool, not the
    // deltas of the load.
    poolkeeper::capacity::fold_figures(&app.pool)
        .await
        .expect("fold");
    sqlx::query("ANALYZE")
        .execute(&app.pool)
        .await
        .expect("analyze");
    let explain = |sql: String, binds: Vec<Option<String>>| {
        let app = &app;
        async move {
            let mut q = sqlx::query_scalar::<_, String>(sqlx::AssertSqlSafe(format!(
                "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) {sql}"
            )))
            .bind(org);
            for b in binds {
                q = q.bind(b);
            }
            q.fetch_all(&app.pool).await.expect("explain").join("\n")
        }
    };
    use poolkeeper::inventory::PoolState;
    let none = || None::<String>;
    let time = |plan: &str| {
        plan.lines()
            .find(|l| l.contains("Execution Time"))
            .unwrap_or("")
            .trim()
            .to_owned()
    };
    let list_of = |site: Option<&str>, status: Option<&str>, _state: Option<&str>| {
        vec![
            site.map(str::to_owned),
            none(),
            none(),
            status.map(str::to_owned),
            none(),
        ]
    };
    // The statement for the filter the binds set (site $2, status $5).
    let filter_of =
        |binds: &[Option<String>], state: Option<PoolState>| poolkeeper::inventory::MachineFilter {
            site: binds[0]
                .as_deref()
                .map(|s| poolkeeper::domain::Site::parse(s).expect("site")),
            status: binds[3]
                .as_deref()
                .map(|s| poolkeeper::domain::MachineStatus::parse(s).expect("status")),
            state,
            ..Default::default()
        };
    let page_sql = |state: Option<PoolState>, binds: &[Option<String>]| {
        poolkeeper::inventory::list_pooled_sql(&filter_of(binds, state), binds[4].is_some(), 101)
    };
    for (what, state, binds) in [
        ("all", None, list_of(None, None, None)),
        (
            "site=s03&status=ready",
            None,
            list_of(Some("s03"), Some("ready"), None),
        ),
        (
            "state=sellable",
            Some(PoolState::Sellable),
            list_of(None, None, Some("sellable")),
        ),
        (
            "state=not_ready",
            Some(PoolState::NotReady),
            list_of(None, None, Some("not_ready")),
        ),
        (
            "state=held",
            Some(PoolState::Held),
            list_of(None, None, Some("held")),
        ),
        (
            "state=sold",
            Some(PoolState::Sold),
            list_of(None, None, Some("sold")),
        ),
    ] {
        let plan = explain(page_sql(state, &binds), binds).await;
        eprintln!("/machines?{what}: {}", time(&plan));
        // Held and sold start from their own rows and probe each machine;
        // the others walk the asset tag index and stop after a page.
        assert!(!plan.contains("Seq Scan on machines"), "{what}:\n{plan}");
        if state == Some(PoolState::Held) || state == Some(PoolState::Sold) {
            // By id: the primary key, or the (id, org_id) key that
            // reservations reference (either is a probe of one machine).
            assert!(
                plan.contains("machines_pkey")
                    || plan.contains("machines_id_of_org_unique")
                    || plan.contains("machines_pool_probe_idx"),
                "{what}:\n{plan}"
            );
        }
    }
    let plain = poolkeeper::inventory::count_by_state_plain_sql();
    let plan = explain(plain, vec![none(), none(), none(), none()]).await;
    eprintln!("plain counts all: {}", time(&plan));
    for (what, binds) in [
        ("all", vec![none(), none(), none(), none()]),
        (
            "site=s03&status=ready",
            vec![Some("s03".into()), none(), none(), Some("ready".into())],
        ),
    ] {
        let counts = poolkeeper::inventory::count_by_state_sql(&filter_of(&binds, None));
        let plan = explain(counts, binds).await;
        eprintln!("counts {what}: {}", time(&plan));
        // The filter's machines (and which of them are in service) from
        // the figures kept per pool, never a scan of the machines; each
        // held machine from machines_pool_probe_idx; no read of the
        // machines' heap (what made the counts 7-8 ms of the page).
        assert!(
            plan.contains("on pool_figures") && !plan.contains("machines_pool_counts_idx"),
            "counts {what}:\n{plan}"
        );
        if what != "all" {
            assert!(
                plan.contains("Index Only Scan using machines_pool_probe_idx"),
                "counts {what}:\n{plan}"
            );
            assert!(
                !plan.contains("Heap Scan on machines") && !plan.contains("Seq Scan on machines"),
                "counts {what}:\n{plan}"
            );
            // What is sold is the machines' own copy, not a probe per
            // live service (1,000 here; most of the pool in a shop).
            assert!(!plan.contains("service_links"), "counts {what}:\n{plan}");
        }
        if std::env::var_os("PK_SHOW_PLANS").is_some() {
            eprintln!("{plan}");
        }
    }
    let facets = poolkeeper::inventory::facets_sql().replace("$2", "$2::text::bigint");
    let plan = explain(facets, vec![Some("500".into())]).await;
    eprintln!("facets: {}", time(&plan));
    assert!(
        !plan.contains("Seq Scan on machines"),
        "skip scans:\n{plan}"
    );
    // The live list (/reservations): the page of holds first, from their
    // deadline index (or, should the planner prefer it, a sort of the held
    // ones), then each machine probed by key; never a hash of every
    // machine (11 ms here).
    for backwards in [false, true] {
        let plan: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) {}",
            poolkeeper::holds::held_page_sql(backwards)
        )))
        .bind(org)
        .bind(None::<String>)
        .bind(None::<i32>)
        .bind(None::<chrono::DateTime<chrono::Utc>>)
        .bind(0_i64)
        .bind(101_i64)
        .bind(None::<String>)
        .fetch_all(&app.pool)
        .await
        .expect("explain the live list");
        let plan = plan.join("\n");
        eprintln!("/reservations (backwards: {backwards}): {}", time(&plan));
        assert!(
            !plan.contains("Seq Scan on machines") && !plan.contains("Hash Join"),
            "live list:\n{plan}"
        );
    }
    // Without EXPLAIN's per-row timing: the median of 21 runs of each
    // function the page calls, through the pool.
    use poolkeeper::domain::{MachineStatus, Site};
    use poolkeeper::inventory::{self, MachineFilter};
    let filters = [
        ("all", MachineFilter::default()),
        (
            "site=s03&status=ready",
            MachineFilter {
                site: Some(Site::parse("s03").expect("site")),
                status: Some(MachineStatus::Ready),
                ..Default::default()
            },
        ),
        (
            "state=held",
            MachineFilter {
                state: Some(PoolState::Held),
                ..Default::default()
            },
        ),
        (
            "state=sold",
            MachineFilter {
                state: Some(PoolState::Sold),
                ..Default::default()
            },
        ),
    ];
    let median = |mut v: Vec<std::time::Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    for (what, f) in &filters {
        let (mut page, mut counts) = (Vec::new(), Vec::new());
        for _ in 0..21 {
            let t = std::time::Instant::now();
            let rows = inventory::list_pooled(&app.pool, org, f, None, 101)
                .await
                .expect("page");
            page.push(t.elapsed());
            assert_eq!(rows.len(), 101, "{what}");
            let t = std::time::Instant::now();
            inventory::count_by_state(&app.pool, org, f)
                .await
                .expect("counts");
            counts.push(t.elapsed());
        }
        eprintln!(
            "median of 21, {what}: page {:?}, counts {:?}",
            median(page),
            median(counts)
        );
    }
    // The counts agree with the plain form (every machine grouped by its
    // state) for each filter.
    for (what, f) in &filters {
        let plain: Vec<(String, i64)> =
            sqlx::query_as(sqlx::AssertSqlSafe(inventory::count_by_state_plain_sql()))
                .bind(org)
                .bind(f.site.as_ref().map(Site::as_str))
                .bind(None::<String>)
                .bind(None::<String>)
                .bind(f.status.map(MachineStatus::as_str))
                .fetch_all(&app.pool)
                .await
                .expect("plain counts");
        let counts = inventory::count_by_state(&app.pool, org, f)
            .await
            .expect("counts");
        for (st, n) in counts {
            let expected = plain
                .iter()
                .find(|(k, _)| k == st.as_str())
                .map_or(0, |(_, n)| *n);
            assert_eq!(n, expected, "{what}: {st:?}");
        }
    }
    let mut f = Vec::new();
    for _ in 0..21 {
        let t = std::time::Instant::now();
        inventory::facets(&app.pool, org).await.expect("facets");
        f.push(t.elapsed());
    }
    eprintln!("median of 21, facets: {:?}", median(f));
    // And the page itself, end to end.
    let c = app.staff("dc@acme.example", "viewer").await;
    for path in [
        "/machines",
        "/machines?site=s03&status=ready",
        "/machines?state=held",
    ] {
        let started = std::time::Instant::now();
        let (status, body) = c.page(path).await;
        assert_eq!(status, 200);
        assert_eq!(texts(&body, "tr[data-asset-tag] th").len(), 100, "{path}");
        eprintln!("GET {path}: {:?} (debug build)", started.elapsed());
    }
}
