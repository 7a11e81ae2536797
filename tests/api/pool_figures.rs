//! R17's figures per pool (sql/pool_figures.sql): the machines per (org,
//! site, profile, vendor, status, in service), kept by statement triggers on
//! machines as appended deltas and folded by the sweep. They must equal a
//! full recount of the machines after any history, racing writers
//! included, and the capacity read from them must equal the same counts
//! made machine by machine.

use std::sync::Arc;

use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::sync::Barrier;

use poolkeeper::db::Db;
use poolkeeper::lease::{self, Claim, SWEEP_KEY};

use crate::helpers::{FakeHold, FakeMachine, PROFILE, SITE, TestApp, spawn_app};

const OTHER_SITE: &str = "ams9";
const OTHER_PROFILE: &str = "xeon-6430-512g";
const VENDORS: [&str; 3] = ["dell", "hpe", "supermicro"];

/// The figures that differ from a recount of the machines, as
/// `key: kept vs counted`, every organization.
async fn drift(pool: &Db) -> Vec<String> {
    sqlx::query_scalar(
        "WITH kept AS (SELECT org_id, site, profile, vendor, status, in_service, machines FROM pool_machines),
              counted AS (SELECT org_id, site, profile, vendor, status, in_service, count(*) AS machines
                            FROM machines GROUP BY 1, 2, 3, 4, 5, 6)
         SELECT concat_ws('/', org_id, site, profile, vendor, status, in_service)
                || ': ' || coalesce(k.machines, 0) || ' vs ' || coalesce(c.machines, 0)
           FROM kept k FULL JOIN counted c USING (org_id, site, profile, vendor, status, in_service)
          WHERE k.machines IS DISTINCT FROM c.machines
          ORDER BY 1",
    )
    .fetch_all(pool)
    .await
    .expect("compare the figures with a recount")
}

/// The pools whose R17 counts (`capacity_pools`, from the figures) differ
/// from the same counts made machine by machine, in one statement (one
/// snapshot), for every vendor filter.
async fn capacity_drift(pool: &Db, org: i64) -> Vec<String> {
    sqlx::query_scalar(
        "WITH v(vendor, vk) AS (SELECT NULL::text, 'any' UNION ALL SELECT u, u FROM unnest($2::text[]) u),
              live AS (SELECT r.machine_id FROM reservations r
                        WHERE r.org_id = $1 AND r.state = 'held' AND r.expires_at > clock_timestamp()),
              plain AS (
                SELECT v.vk, m.site, m.profile, count(*) AS total,
                       count(*) FILTER (WHERE m.status = 'ready' AND NOT m.in_service
                                          AND m.id NOT IN (SELECT machine_id FROM live)) AS sellable,
                       count(*) FILTER (WHERE NOT m.in_service AND m.id IN (SELECT machine_id FROM live)) AS held,
                       count(*) FILTER (WHERE m.in_service) AS sold
                  FROM v JOIN machines m ON m.org_id = $1 AND (v.vendor IS NULL OR m.vendor = v.vendor)
                 GROUP BY 1, 2, 3),
              kept AS (
                SELECT v.vk, c.site, c.profile, c.total, c.sellable, c.held, c.sold, c.not_ready
                  FROM v, capacity_pools($1, NULL, NULL, v.vendor, NULL) c)
         SELECT concat_ws('/', vk, site, profile) || ': kept '
                || concat_ws(',', k.total, k.sellable, k.held, k.sold, k.not_ready) || ' counted '
                || concat_ws(',', p.total, p.sellable, p.held, p.sold)
           FROM kept k FULL JOIN plain p USING (vk, site, profile)
          WHERE (k.total, k.sellable, k.held, k.sold) IS DISTINCT FROM (p.total, p.sellable, p.held, p.sold)
             OR k.total <> k.sellable + k.held + k.sold + k.not_ready
          ORDER BY 1",
    )
    .bind(org)
    .bind(VENDORS.to_vec())
    .fetch_all(pool)
    .await
    .expect("compare capacity with a recount")
}

/// Why not?'s totals per reason (`allocator::EXCLUDED_COUNTS_SQL`, from the
/// figures) beside R7's verdict of every machine, grouped, for a few specs.
async fn excluded_drift(pool: &Db, org: i64) -> Vec<String> {
    let mut out = Vec::new();
    for (site, profile) in [(SITE, PROFILE), (OTHER_SITE, OTHER_PROFILE)] {
        for vendor in [None, Some(VENDORS[0])] {
            let kept: (i64, i64, i64, i64, i64, i64, i64) =
                sqlx::query_as(poolkeeper::allocator::EXCLUDED_COUNTS_SQL)
                    .bind(org)
                    .bind(site)
                    .bind(profile)
                    .bind(vendor)
                    .fetch_one(pool)
                    .await
                    .expect("kept exclusions");
            let plain: Vec<(Option<String>, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(
                poolkeeper::allocator::excluded_counts_plain_sql(),
            ))
            .bind(org)
            .bind(site)
            .bind(profile)
            .bind(vendor)
            .fetch_all(pool)
            .await
            .expect("plain exclusions");
            let n = |k: Option<&str>| {
                plain
                    .iter()
                    .find(|(key, _)| key.as_deref() == k)
                    .map_or(0, |(_, n)| *n)
            };
            let counted = (
                n(Some("wrong_site")),
                n(Some("wrong_vendor")),
                n(Some("wrong_profile")),
                n(Some("not_ready")),
                n(Some("in_service")),
                n(None) + n(Some("held")),
                n(Some("held")),
            );
            if kept != counted {
                out.push(format!(
                    "{site}/{profile}/{vendor:?}: kept {kept:?} counted {counted:?}"
                ));
            }
        }
    }
    out
}

async fn check(app: &TestApp, when: &str) {
    assert_eq!(drift(&app.pool).await, Vec::<String>::new(), "{when}");
    assert_eq!(
        excluded_drift(&app.pool, app.org.id).await,
        Vec::<String>::new(),
        "{when}"
    );
    assert_eq!(
        capacity_drift(&app.pool, app.org.id).await,
        Vec::<String>::new(),
        "{when}"
    );
}

async fn machine(app: &TestApp, tag: &str, site: &str, profile: &str, vendor: &str) -> i64 {
    FakeMachine::new()
        .tag(tag)
        .site(site)
        .profile(profile)
        .vendor(vendor)
        .create(&app.pool, app.org.id)
        .await
}

/// Reserves one machine of (site, profile): `(id, fence)`, or None when
/// the pool had none to give.
async fn reserve(app: &TestApp, order_ref: &str, site: &str, profile: &str) -> Option<(i64, i64)> {
    let (status, body) = app
        .reserve(
            &app.org.token,
            json!({"order_ref": order_ref, "site": site, "profile": profile}),
        )
        .await;
    match status {
        StatusCode::CREATED => Some((
            body["id"].as_i64().expect("id"),
            body["fence"].as_i64().expect("fence"),
        )),
        StatusCode::CONFLICT => None,
        _ => panic!("reserve {order_ref}: {status} {body}"),
    }
}

/// Converts hold `(id, fence)`: the service's id, or None when the hold
/// was no longer live (healed, swept).
async fn convert(app: &TestApp, (id, fence): (i64, i64), service_ref: &str) -> Option<i64> {
    let (status, body) = app
        .convert(
            &app.org.token,
            id,
            json!({"fence": fence, "service_ref": service_ref}),
        )
        .await;
    assert!(!status.is_server_error(), "convert {id}: {status} {body}");
    (status == StatusCode::OK).then(|| body["service"]["id"].as_i64().expect("service id"))
}

async fn end_service(app: &TestApp, service: i64) -> (StatusCode, Value) {
    app.post_as(
        &app.org.token,
        &format!("/api/v1/services/{service}/end"),
        &json!({}),
    )
    .await
}

async fn change_status(app: &TestApp, tags: &[String], status: &str) -> (StatusCode, Value) {
    app.post_json(
        "/api/v1/status-changes",
        json!({"asset_tags": tags, "status": status}),
    )
    .await
}

/// Moves machines to another site, profile or vendor, as an operator's
/// script would (no endpoint moves a machine).
async fn move_machines(pool: &Db, ids: &[i64], column: &str, value: &str) {
    let sql = format!("UPDATE machines SET {column} = $2 WHERE id = ANY($1)");
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(ids)
        .bind(value)
        .execute(pool)
        .await
        .unwrap_or_else(|e| panic!("move {ids:?} to {column} {value}: {e}"));
}

async fn fold(pool: &Db) -> i64 {
    poolkeeper::capacity::fold_figures(pool)
        .await
        .expect("fold")
}

type Task = tokio::task::JoinHandle<String>;

fn spawn(
    barrier: &Arc<Barrier>,
    work: impl std::future::Future<Output = String> + Send + 'static,
) -> Task {
    let barrier = barrier.clone();
    tokio::spawn(async move {
        barrier.wait().await;
        work.await
    })
}

/// Racks of 4 machines each (tags `F-ii`), two pools per rack, and machine
/// ids per tag.
fn tags(range: std::ops::Range<usize>) -> Vec<String> {
    range.map(|i| format!("F-{i:02}")).collect()
}

/// Many writers on separate connections released together: status changes
/// of racks that share pools (in both directions), machines moved between
/// pools, reserves, converts, ends of services and folds. None fails (a
/// deadlock would be a 500 or an error here), and the figures then equal a
/// recount and R17's counts equal the same made machine by machine.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_writers_leave_the_figures_equal_to_a_recount() {
    let app = Arc::new(spawn_app().await);
    let mut ids = Vec::new();
    for i in 0..48 {
        let vendor = VENDORS[i % 2];
        ids.push(machine(&app, &format!("F-{i:02}"), SITE, PROFILE, vendor).await);
    }
    for i in 0..8 {
        machine(&app, &format!("O-{i:02}"), OTHER_SITE, PROFILE, VENDORS[2]).await;
    }
    // 6 sold, then 8 held; the allocator takes the lowest ids (F-00..F-13).
    let mut services = Vec::new();
    for i in 0..6 {
        let hold = reserve(&app, &format!("SOLD-{i}"), SITE, PROFILE).await;
        let hold = hold.expect("a free machine");
        services.push(
            convert(&app, hold, &format!("SRV-{i}"))
                .await
                .expect("sold"),
        );
    }
    let mut holds = Vec::new();
    for i in 0..8 {
        holds.push(
            reserve(&app, &format!("HELD-{i}"), SITE, PROFILE)
                .await
                .expect("held"),
        );
    }
    check(&app, "before the race").await;

    let barrier = Arc::new(Barrier::new(4 + 4 + 3 + 4 + 6 + 2));
    let mut tasks = Vec::new();
    // Racks, some under holds (healed or cancelled), in and out of service.
    for (n, (rack, status)) in [
        (tags(8..12), "maintenance"),
        (tags(12..16), "broken"),
        (tags(16..20), "maintenance"),
        (tags(2..6), "maintenance"),
    ]
    .into_iter()
    .enumerate()
    {
        let app = app.clone();
        tasks.push(spawn(&barrier, async move {
            let (status_code, body) = change_status(&app, &rack, status).await;
            assert_eq!(status_code, StatusCode::OK, "rack {n}: {body}");
            format!("rack {n}")
        }));
    }
    // Free machines moved between pools by hand, both ways.
    for (n, (from, column, value)) in [
        (20usize, "site", OTHER_SITE),
        (24, "profile", OTHER_PROFILE),
        (28, "vendor", VENDORS[2]),
        (32, "status", "retired"),
    ]
    .into_iter()
    .enumerate()
    {
        let (app, moved) = (app.clone(), ids[from..from + 4].to_vec());
        tasks.push(spawn(&barrier, async move {
            move_machines(&app.pool, &moved, column, value).await;
            format!("move {n}")
        }));
    }
    for &service in &services[..3] {
        let app = app.clone();
        tasks.push(spawn(&barrier, async move {
            let (status, body) = end_service(&app, service).await;
            assert_eq!(status, StatusCode::OK, "end {service}: {body}");
            format!("end {service}")
        }));
    }
    for (i, &hold) in holds[..4].iter().enumerate() {
        let app = app.clone();
        tasks.push(spawn(&barrier, async move {
            convert(&app, hold, &format!("SRV-NEW-{i}")).await;
            format!("convert {i}")
        }));
    }
    for i in 0..6 {
        let app = app.clone();
        let site = if i % 2 == 0 { SITE } else { OTHER_SITE };
        tasks.push(spawn(&barrier, async move {
            reserve(&app, &format!("NEW-{i}"), site, PROFILE).await;
            format!("reserve {i}")
        }));
    }
    for i in 0..2 {
        let app = app.clone();
        tasks.push(spawn(&barrier, async move {
            for _ in 0..5 {
                fold(&app.pool).await;
            }
            format!("fold {i}")
        }));
    }
    for t in tasks {
        t.await.expect("a writer failed");
    }
    check(&app, "after the race, before a fold").await;
    fold(&app.pool).await;
    check(&app, "after the race and a fold").await;
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM pool_figure_deltas")
        .fetch_one(&app.pool)
        .await
        .expect("deltas");
    assert_eq!(left, 0, "a fold with no writer running folds every delta");
}

/// A small deterministic generator (an LCG): the same history every run.
struct Steps(u64);

impl Steps {
    fn next(&mut self, n: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((self.0 >> 33) % n as u64) as usize
    }
}

/// What the history has made so far.
#[derive(Default)]
struct History {
    machines: Vec<(i64, String)>,
    holds: Vec<(i64, i64)>,
    services: Vec<i64>,
}

async fn take_sweep(pool: &Db) -> i64 {
    let long = std::time::Duration::from_secs(600);
    match lease::claim(pool, SWEEP_KEY, "replica-a", long)
        .await
        .expect("claim")
    {
        Claim::Acquired(m) => m.fence,
        Claim::HeldByOther => panic!("the sweep lease is free in a fresh database"),
    }
}

/// One generated step of inventory, orders or upkeep.
async fn step(app: &TestApp, rng: &mut Steps, h: &mut History, fence: i64, i: usize) {
    let sites = [SITE, OTHER_SITE];
    let profiles = [PROFILE, OTHER_PROFILE];
    let pick = |rng: &mut Steps, h: &History| h.machines[rng.next(h.machines.len())].clone();
    match rng.next(10) {
        0 => {
            let (site, profile) = (sites[rng.next(2)], profiles[rng.next(2)]);
            let vendor = VENDORS[rng.next(3)];
            let tag = format!("G-{i:03}");
            h.machines
                .push((machine(app, &tag, site, profile, vendor).await, tag));
        }
        1 => {
            let tags: Vec<String> = (0..1 + rng.next(3)).map(|_| pick(rng, h).1).collect();
            let status = ["ready", "maintenance", "broken", "ready"][rng.next(4)];
            let (code, body) = change_status(app, &tags, status).await;
            assert!(
                !code.is_server_error(),
                "status change {tags:?}: {code} {body}"
            );
        }
        2 => {
            let (id, _) = pick(rng, h);
            let (column, value) = match rng.next(3) {
                0 => ("site", sites[rng.next(2)]),
                1 => ("profile", profiles[rng.next(2)]),
                _ => ("vendor", VENDORS[rng.next(3)]),
            };
            move_machines(&app.pool, &[id], column, value).await;
        }
        3 => {
            // A machine that never had a reservation may be removed.
            let (id, _) = pick(rng, h);
            sqlx::query(
                "DELETE FROM machines m WHERE m.id = $1
                    AND NOT EXISTS (SELECT 1 FROM reservations r WHERE r.machine_id = m.id)",
            )
            .bind(id)
            .execute(&app.pool)
            .await
            .expect("delete a machine");
            let gone: bool =
                sqlx::query_scalar("SELECT NOT EXISTS (SELECT 1 FROM machines WHERE id = $1)")
                    .bind(id)
                    .fetch_one(&app.pool)
                    .await
                    .expect("gone");
            if gone {
                h.machines.retain(|(m, _)| *m != id);
            }
        }
        4 | 5 => {
            let (site, profile) = (sites[rng.next(2)], profiles[rng.next(2)]);
            if let Some(hold) = reserve(app, &format!("H-{i:03}"), site, profile).await {
                h.holds.push(hold);
            }
        }
        6 if !h.holds.is_empty() => {
            let hold = h.holds.swap_remove(rng.next(h.holds.len()));
            if let Some(service) = convert(app, hold, &format!("S-{i:03}")).await {
                h.services.push(service);
            }
        }
        7 if !h.services.is_empty() => {
            let service = h.services.swap_remove(rng.next(h.services.len()));
            let (code, body) = end_service(app, service).await;
            assert!(!code.is_server_error(), "end {service}: {code} {body}");
        }
        8 => {
            // An overdue hold on a free machine, then the sweep expires it.
            let (id, _) = pick(rng, h);
            let _ = FakeHold::on(id)
                .deadline("-1 second")
                .try_create(&app.pool, app.org.id)
                .await;
            poolkeeper::sweep::sweep(&app.pool, "replica-a", fence, 100)
                .await
                .expect("sweep");
        }
        _ => {
            fold(&app.pool).await;
        }
    }
}

/// A generated history of inventory changes (new machines, status changes,
/// moves between pools, removals), reserves, converts, ends of services,
/// overdue holds swept and folds: after every step the figures equal a
/// recount, and R17's counts the same made machine by machine.
#[tokio::test]
async fn the_figures_equal_a_recount_after_a_generated_history() {
    let app = spawn_app().await;
    let mut h = History::default();
    for i in 0..24 {
        let tag = format!("B-{i:02}");
        let id = machine(&app, &tag, SITE, PROFILE, VENDORS[i % 3]).await;
        h.machines.push((id, tag));
    }
    let fence = take_sweep(&app.pool).await;
    let mut rng = Steps(50);
    for i in 0..240 {
        if h.machines.is_empty() {
            break;
        }
        step(&app, &mut rng, &mut h, fence, i).await;
        check(&app, &format!("after step {i}")).await;
    }
    fold(&app.pool).await;
    check(&app, "after the last fold").await;
}

/// The figures are filled from the machines when the triggers are
/// attached: a database whose figures drifted (written by hand) is mended
/// by applying the definitions again.
#[tokio::test]
async fn attaching_the_triggers_fills_the_figures_from_the_machines() {
    let app = spawn_app().await;
    for i in 0..5 {
        machine(&app, &format!("A-{i}"), SITE, PROFILE, VENDORS[i % 3]).await;
    }
    sqlx::query(
        "INSERT INTO pool_figure_deltas VALUES ($1, 'nowhere', 'none', 'dell', 'ready', false, 7)",
    )
    .bind(app.org.id)
    .execute(&app.pool)
    .await
    .expect("drift");
    assert_eq!(drift(&app.pool).await.len(), 1);
    sqlx::raw_sql(include_str!("../../sql/pool_figures.sql"))
        .execute(&app.pool)
        .await
        .expect("apply pool_figures.sql");
    assert_eq!(drift(&app.pool).await, Vec::<String>::new());
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM pool_figures")
        .fetch_one(&app.pool)
        .await
        .expect("rows");
    assert_eq!(rows, 3, "one row per vendor of the one pool");
}

/// The sweep worker's holder folds the deltas every period: after a load of
/// machines and a status change, the deltas drain into the figures, which
/// still equal a recount.
#[tokio::test]
async fn the_sweep_worker_folds_the_deltas() {
    let app = spawn_app().await;
    for i in 0..6 {
        machine(&app, &format!("W-{i}"), SITE, PROFILE, VENDORS[i % 3]).await;
    }
    let (code, body) = change_status(&app, &["W-1".to_owned()], "maintenance").await;
    assert_eq!(code, StatusCode::OK, "{body}");
    let mut settings = app.settings.clone();
    settings.sweep_period = std::time::Duration::from_secs(1);
    settings.lease_duration = std::time::Duration::from_secs(5);
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let worker = {
        let (pool, settings) = (app.pool.clone(), settings.clone());
        let metrics = poolkeeper::metrics::Metrics::new();
        tokio::spawn(
            async move { poolkeeper::sweep::run(&pool, &settings, metrics, stopped).await },
        )
    };
    crate::helpers::until(
        "the sweep to fold the deltas",
        crate::helpers::POLL_BOUND,
        || async {
            let left: i64 = sqlx::query_scalar("SELECT count(*) FROM pool_figure_deltas")
                .fetch_one(&app.pool)
                .await
                .expect("deltas");
            (left == 0).then_some(())
        },
    )
    .await;
    let _ = stop.send(true);
    tokio::time::timeout(std::time::Duration::from_secs(15), worker)
        .await
        .expect("the worker stops")
        .expect("the worker ends cleanly");
    let folded: i64 =
        sqlx::query_scalar("SELECT coalesce(sum(machines), 0)::bigint FROM pool_figures")
            .fetch_one(&app.pool)
            .await
            .expect("figures");
    assert_eq!(folded, 6);
    check(&app, "after the worker folded").await;
}
