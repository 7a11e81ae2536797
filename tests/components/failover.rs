//! Failover (F1-F4): poolkeeper on a Patroni cluster in strict
//! synchronous mode behind HAProxy (`tests/ha/cluster.rs`), under load from
//! 16 clients through two `poolkeeper serve` processes, while the leader's
//! postmaster is killed, a switchover is run, the leader is frozen past
//! Patroni's TTL, a replica is killed and a `serve` is killed. Every request
//! and its answer (or none) is logged, Jepsen-style; the invariants are
//! checked in SQL against the log on the healed cluster. The figures per
//! fault go to `target/failover/report.md` (RELIABILITY.md quotes a run).
//!
//! `FAILOVER_ROUNDS=N` repeats the five faults N times (the default run
//! does each once); `failover_long` (ignored) runs 5 rounds by hand.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use sqlx::{Connection, PgConnection};

use crate::ha_cluster::{HaCluster, TTL_SECONDS, signal};
use crate::helpers::receiver::Receiver;
use crate::helpers::replicas::Replica;
use crate::helpers::{FakeHold, FakeMachine};
use crate::soak::{Created, SoakReport, check_invariants, check_told};

const CLIENTS: usize = 16;
const MACHINES: i64 = 40;
/// Clients placing orders of several machines (R13), on machines of their
/// own profile: 2 or 3 each at a time.
const ORDER_CLIENTS: usize = 4;
const ORDER_MACHINES: i64 = 16;
/// `POOLKEEPER_LEASE_SECONDS` and `POOLKEEPER_SWEEP_SECONDS` of `Replica`.
const LEASE_SECONDS: u64 = 3;
const SWEEP_SECONDS: u64 = 1;
const ACQUIRE_SECONDS: u64 = 2;
/// A request with no answer in this long counts as hung.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(30);
/// A client gives up retrying one request after this long (a violation).
const RETRY_WINDOW: Duration = Duration::from_secs(120);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_acknowledged_write_is_lost_and_no_machine_is_sold_twice_across_failovers() {
    let rounds = std::env::var("FAILOVER_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    run(rounds).await;
}

/// The long variant, by hand: `cargo test --test components failover_long --
/// --ignored --nocapture` (5 rounds of the five faults).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn failover_long() {
    run(5).await;
}

/// One logged request.
#[derive(Clone, Debug)]
struct Entry {
    op: &'static str,
    /// Since the load started: when it was sent.
    at: Duration,
    latency: Duration,
    /// None: no answer (connection refused or reset, or past CLIENT_TIMEOUT).
    status: Option<u16>,
    code: String,
    /// A retry of a request whose outcome was not known.
    retry: bool,
}

#[derive(Default)]
struct Log {
    entries: Vec<Entry>,
    created: Vec<Created>,
    told: Vec<(i64, &'static str)>,
    violations: Vec<String>,
    /// Writes answered 503 or not at all, then settled by their retry:
    /// (op, true when the retry showed the first had taken effect).
    settled: Vec<(&'static str, bool)>,
    /// Orders of several machines acknowledged: what each was told.
    orders: Vec<OrderTold>,
}

/// What a client was told about one order of several machines.
#[derive(Clone, Debug)]
struct OrderTold {
    order_ref: String,
    ids: Vec<i64>,
    /// The deadline an acknowledged extension (by `until`) answered.
    extended_to: Option<DateTime<Utc>>,
    /// The end an acknowledged convert or cancel answered.
    ended: Option<&'static str>,
}

struct Shared {
    start: Instant,
    urls: RwLock<Vec<String>>,
    token: String,
    log: Mutex<Log>,
    stop: AtomicBool,
    http: reqwest::Client,
    next: AtomicUsize,
}

struct Answer {
    status: Option<u16>,
    body: Value,
}

impl Shared {
    fn violation(&self, v: String) {
        self.log.lock().expect("log").violations.push(v);
    }

    /// One request to the next replica, logged.
    async fn call(
        &self,
        op: &'static str,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
        retry: bool,
    ) -> Answer {
        let urls = self.urls.read().expect("urls").clone();
        let i = self.next.fetch_add(1, Ordering::Relaxed) % urls.len();
        let mut req = self
            .http
            .request(method, format!("{}{path}", urls[i]))
            .bearer_auth(&self.token)
            .timeout(CLIENT_TIMEOUT);
        if let Some(b) = body {
            req = req.json(b);
        }
        let sent = Instant::now();
        let at = sent - self.start;
        let (status, body, retry_after) = match req.send().await {
            Ok(resp) => {
                let status = resp.status().as_u16();
                let retry_after = resp.headers().contains_key("retry-after");
                let body = resp.json::<Value>().await.unwrap_or(Value::Null);
                (Some(status), body, retry_after)
            }
            Err(_) => (None, Value::Null, false),
        };
        let code = body["error"].as_str().unwrap_or_default().to_owned();
        let entry = Entry {
            op,
            at,
            latency: sent.elapsed(),
            status,
            code: code.clone(),
            retry,
        };
        // Every 503 says when to retry and why (F2, F3); never a 500.
        if status == Some(503)
            && (!retry_after || !matches!(code.as_str(), "unavailable" | "outcome_unknown"))
        {
            self.violation(format!(
                "{op} {path}: 503 without Retry-After or code: {body}"
            ));
        }
        if status.is_some_and(|s| s >= 500 && s != 503) {
            self.violation(format!("{op} {path}: {status:?} {body}"));
        }
        self.log.lock().expect("log").entries.push(entry);
        Answer { status, body }
    }

    /// A write, retried unchanged (same order_ref, same fence) while it
    /// gets 503 or no answer; the final answer and whether an earlier
    /// attempt's outcome was unknown.
    /// After a convert: ends the service (a retry after an unknown outcome
    /// answers 200 whether or not the first end committed) and puts the machine back to
    /// `ready`, each settled; false, with the violation, when the end's
    /// answer is wrong.
    async fn end_and_put_back(&self, service: i64, tag: &str, profile: &str) -> bool {
        use reqwest::Method;
        let (a, _, _) = self
            .settle(
                "end_service",
                Method::POST,
                &format!("/api/v1/services/{service}/end"),
                &json!({}),
            )
            .await;
        // F3: a retried end answers the service as the first end left it.
        let ok = a.status == Some(200);
        if !ok {
            self.violation(format!("end service {service}: {:?} {}", a.status, a.body));
            return false;
        }
        let (a, _, _) = self
            .settle(
                "put_machine",
                Method::PUT,
                &format!("/api/v1/machines/{tag}"),
                &json!({"site": "par1", "vendor": "dell", "profile": profile, "status": "ready"}),
            )
            .await;
        if a.status != Some(200) {
            self.violation(format!("put machine {tag}: {:?} {}", a.status, a.body));
        }
        true
    }

    async fn settle(
        &self,
        op: &'static str,
        method: reqwest::Method,
        path: &str,
        body: &Value,
    ) -> (Answer, bool, DateTime<Utc>) {
        let began = Instant::now();
        let mut unknown = false;
        loop {
            let sent = Utc::now();
            let a = self
                .call(op, method.clone(), path, Some(body), unknown)
                .await;
            match a.status {
                Some(503) | None => {
                    unknown = true;
                    if began.elapsed() > RETRY_WINDOW {
                        self.violation(format!("{op} {path}: no answer in {RETRY_WINDOW:?}"));
                        return (a, unknown, sent);
                    }
                    // Retry-After says 1 s; a tighter retry measures the
                    // window more finely and is still only a retry.
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                Some(_) => return (a, unknown, sent),
            }
        }
    }
}

/// One client: new orders, each reserved then converted (and its service
/// ended, its machine put back) or cancelled with its fence; every fifth
/// walks away after a short hold (the sweep and the allocator expire it).
async fn client(n: usize, s: Arc<Shared>) {
    use reqwest::Method;
    let mut k = 0usize;
    while !s.stop.load(Ordering::Relaxed) {
        k += 1;
        let order_ref = format!("HA-{n}-{k}");
        let walk_away = k % 5 == 4;
        let hold = if walk_away { 2 } else { 300 };
        let body = json!({"order_ref": order_ref, "site": "par1", "profile": "r650", "hold_seconds": hold});
        let (a, unknown, _) = s
            .settle("reserve", Method::POST, "/api/v1/reservations", &body)
            .await;
        let Some(status) = a.status else { return };
        match status {
            201 | 200 => {}
            409 if matches!(a.body["error"].as_str(), Some("contended" | "unavailable")) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
            _ => {
                s.violation(format!("reserve {order_ref}: {status} {}", a.body));
                tokio::time::sleep(Duration::from_millis(250)).await;
                continue;
            }
        }
        // F3, R9: a 200 means the order existed, which only an earlier
        // attempt of this client can have done.
        if status == 200 && !unknown {
            s.violation(format!(
                "reserve {order_ref}: 200 on a first attempt: {}",
                a.body
            ));
        }
        let (Some(id), Some(fence), Some(tag)) = (
            a.body["id"].as_i64(),
            a.body["fence"].as_i64(),
            a.body["machine"]["asset_tag"].as_str(),
        ) else {
            s.violation(format!("reserve {order_ref}: body {}", a.body));
            continue;
        };
        if a.body["order_ref"] != order_ref.as_str() {
            s.violation(format!("reserve {order_ref}: another order {}", a.body));
        }
        {
            let mut log = s.log.lock().expect("log");
            log.created.push(Created {
                id,
                order_ref: order_ref.clone(),
                asset_tag: tag.to_owned(),
                fence,
            });
            if unknown {
                log.settled.push(("reserve", status == 200));
            }
        }
        if walk_away {
            continue;
        }
        let (op, path, body, state) = if k.is_multiple_of(2) {
            (
                "convert",
                format!("/api/v1/reservations/{id}/convert"),
                json!({"fence": fence, "service_ref": format!("SVC-{n}-{k}")}),
                "converted",
            )
        } else {
            (
                "cancel",
                format!("/api/v1/reservations/{id}/cancel"),
                json!({"fence": fence, "reason": "failover test"}),
                "cancelled",
            )
        };
        let (a, unknown, last_sent) = s.settle(op, Method::POST, &path, &body).await;
        // F3: the same action with the same fence answers 200 whether the
        // first attempt took effect (a replay) or not (done now).
        if a.status != Some(200) || a.body["state"] != state {
            s.violation(format!(
                "{op} {id} (retried: {unknown}): {:?} {}",
                a.status, a.body
            ));
            continue;
        }
        {
            let mut log = s.log.lock().expect("log");
            log.told.push((id, state));
            if unknown {
                // A replay answers the end an earlier attempt wrote: it
                // ended before the last attempt was sent (one host, one clock).
                let ended = a.body["ended_at"]
                    .as_str()
                    .and_then(|t| t.parse::<DateTime<Utc>>().ok());
                log.settled.push((op, ended.is_some_and(|t| t < last_sent)));
            }
        }
        if op == "convert" {
            let Some(service) = a.body["service"]["id"].as_i64() else {
                s.violation(format!("convert {id}: no service in {}", a.body));
                continue;
            };
            if !s.end_and_put_back(service, tag, "r650").await {
                continue;
            }
        }
    }
}

/// One client of orders of several machines (R13, R14, F3): reserve 2 or
/// 3 together, extend the order to an absolute deadline (`until`), then
/// convert it whole (and end its services, putting the machines back) or
/// cancel it whole; every fourth walks away with a short hold (the sweep
/// expires it whole). Every write is retried unchanged while its answer is
/// 503 or missing, and its final answer must be what the action did.
async fn order_client(n: usize, s: Arc<Shared>) {
    use reqwest::Method;
    let mut k = 0usize;
    while !s.stop.load(Ordering::Relaxed) {
        k += 1;
        let order_ref = format!("HA-O-{n}-{k}");
        let quantity = 2 + (k % 2) as i64;
        let walk_away = k % 4 == 3;
        let hold = if walk_away { 2 } else { 300 };
        let body = json!({"order_ref": order_ref, "site": "par1", "profile": "r760",
                          "hold_seconds": hold, "quantity": quantity});
        let (a, unknown, _) = s
            .settle("reserve_order", Method::POST, "/api/v1/reservations", &body)
            .await;
        match a.status {
            Some(201 | 200) => {}
            Some(409) if matches!(a.body["error"].as_str(), Some("contended" | "unavailable")) => {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            _ => {
                s.violation(format!("reserve {order_ref}: {:?} {}", a.status, a.body));
                tokio::time::sleep(Duration::from_millis(250)).await;
                continue;
            }
        }
        if a.status == Some(200) && !unknown {
            s.violation(format!(
                "reserve {order_ref}: 200 on a first attempt: {}",
                a.body
            ));
        }
        let Some(rs) = a.body["reservations"].as_array().cloned() else {
            s.violation(format!("reserve {order_ref}: not an order: {}", a.body));
            continue;
        };
        // R13: an order is in one state, never part of it held. A first
        // answer (201) holds them all; a replay (200, after an unknown
        // outcome) shows the order as it is now, which a short hold may
        // already have seen expire, whole.
        let states: BTreeSet<&str> = rs.iter().filter_map(|r| r["state"].as_str()).collect();
        let held = states.len() == 1 && states.contains("held");
        if rs.len() as i64 != quantity || states.len() != 1 || (a.status == Some(201) && !held) {
            s.violation(format!(
                "reserve {order_ref}: not all {quantity} in one state, held when new: {}",
                a.body
            ));
            continue;
        }
        if !held {
            continue;
        }
        if unknown {
            s.log
                .lock()
                .expect("log")
                .settled
                .push(("reserve_order", a.status == Some(200)));
        }
        let named: Vec<Value> = rs
            .iter()
            .map(|r| json!({"id": r["id"], "fence": r["fence"]}))
            .collect();
        let mut told = OrderTold {
            order_ref: order_ref.clone(),
            ids: rs.iter().filter_map(|r| r["id"].as_i64()).collect(),
            extended_to: None,
            ended: None,
        };
        if walk_away {
            s.log.lock().expect("log").orders.push(told);
            continue;
        }
        // An absolute deadline, to the microsecond the database keeps.
        let until = Utc::now() + chrono::Duration::seconds(600);
        let until = until.to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
        let body = json!({"reservations": named, "until": until, "reason": "failover test"});
        let path = format!("/api/v1/orders/{order_ref}/extend");
        let (a, unknown, _) = s.settle("extend_order", Method::POST, &path, &body).await;
        let wanted = until.parse::<DateTime<Utc>>().ok();
        let answered: Vec<Option<DateTime<Utc>>> = a.body["reservations"]
            .as_array()
            .map(|rs| {
                rs.iter()
                    .map(|r| r["expires_at"].as_str().and_then(|t| t.parse().ok()))
                    .collect()
            })
            .unwrap_or_default();
        if a.status != Some(200)
            || answered.len() as i64 != quantity
            || answered.iter().any(|t| *t != wanted)
        {
            s.violation(format!(
                "extend {order_ref} to {until} (retried: {unknown}): {:?} {}",
                a.status, a.body
            ));
            s.log.lock().expect("log").orders.push(told);
            continue;
        }
        told.extended_to = wanted;
        if unknown {
            s.log
                .lock()
                .expect("log")
                .settled
                .push(("extend_order", true));
        }
        let convert = k.is_multiple_of(2);
        let (op, body, state) = if convert {
            let items: Vec<Value> = rs
                .iter()
                .enumerate()
                .map(|(i, r)| {
                    json!({"id": r["id"], "fence": r["fence"],
                           "service_ref": format!("SVC-O-{n}-{k}-{i}")})
                })
                .collect();
            ("convert_order", json!({"reservations": items}), "converted")
        } else {
            (
                "cancel_order",
                json!({"reservations": named, "reason": "failover test"}),
                "cancelled",
            )
        };
        let action = if convert { "convert" } else { "cancel" };
        let path = format!("/api/v1/orders/{order_ref}/{action}");
        let (a, unknown, _) = s.settle(op, Method::POST, &path, &body).await;
        let ended: Vec<Value> = a.body["reservations"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if a.status != Some(200)
            || ended.len() as i64 != quantity
            || ended.iter().any(|r| r["state"] != state)
        {
            s.violation(format!(
                "{op} {order_ref} (retried: {unknown}): {:?} {}",
                a.status, a.body
            ));
            s.log.lock().expect("log").orders.push(told);
            continue;
        }
        told.ended = Some(state);
        {
            let mut log = s.log.lock().expect("log");
            log.orders.push(told);
            if unknown {
                log.settled.push((op, true));
            }
        }
        if !convert {
            continue;
        }
        for r in &ended {
            let (Some(service), Some(tag)) = (
                r["service"]["id"].as_i64(),
                r["machine"]["asset_tag"].as_str(),
            ) else {
                s.violation(format!("{op} {order_ref}: no service in {r}"));
                continue;
            };
            if !s.end_and_put_back(service, tag, "r760").await {
                continue;
            }
        }
    }
}

/// On the healed cluster: no order of several is partly held, converted or
/// expired (its reservations are all in one state, the sweep having had
/// time to expire the overdue ones); every acknowledged extension's
/// deadline is the one the client was given; every acknowledged end is the
/// order's state.
async fn check_orders(
    pool: &poolkeeper::db::Db,
    orders: &[OrderTold],
    violations: &mut Vec<String>,
) {
    let mixed: Vec<(String, Vec<String>)> = sqlx::query_as(
        "SELECT order_ref, array_agg(state ORDER BY slot) FROM reservations
          WHERE quantity > 1 GROUP BY order_ref HAVING count(DISTINCT state) > 1",
    )
    .fetch_all(pool)
    .await
    .expect("orders in several states");
    for (order_ref, states) in mixed {
        violations.push(format!("order {order_ref} is partly one state: {states:?}"));
    }
    for o in orders {
        let rows: Vec<(i64, String, DateTime<Utc>)> = sqlx::query_as(
            "SELECT id, state, expires_at FROM reservations WHERE order_ref = $1 ORDER BY slot",
        )
        .bind(&o.order_ref)
        .fetch_all(pool)
        .await
        .expect("an order");
        let ids: Vec<i64> = rows.iter().map(|r| r.0).collect();
        if ids != o.ids {
            violations.push(format!(
                "order {}: told {:?}, has {ids:?}",
                o.order_ref, o.ids
            ));
        }
        if let Some(until) = o.extended_to
            && rows.iter().any(|r| r.2 != until)
        {
            violations.push(format!(
                "order {}: extended to {until}, has {:?}",
                o.order_ref,
                rows.iter().map(|r| r.2).collect::<Vec<_>>()
            ));
        }
        if let Some(state) = o.ended
            && rows.iter().any(|r| r.1 != state)
        {
            violations.push(format!("order {}: told {state}, has {rows:?}", o.order_ref));
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum FaultKind {
    KillLeaderPostmaster,
    Switchover,
    FreezeLeader,
    KillReplica,
    KillServe,
}

impl FaultKind {
    const ALL: [FaultKind; 5] = [
        FaultKind::KillLeaderPostmaster,
        FaultKind::Switchover,
        FaultKind::FreezeLeader,
        FaultKind::KillReplica,
        FaultKind::KillServe,
    ];

    fn label(self) -> &'static str {
        match self {
            FaultKind::KillLeaderPostmaster => "kill -9 of the leader's postmaster",
            FaultKind::Switchover => "patronictl switchover",
            FaultKind::FreezeLeader => {
                "SIGSTOP of the leader (Patroni and PostgreSQL) past the TTL"
            }
            FaultKind::KillReplica => "kill -9 of the synchronous standby's postmaster",
            FaultKind::KillServe => "kill -9 of the poolkeeper serve holding the sweep lease",
        }
    }
}

struct Fault {
    kind: FaultKind,
    at: Duration,
    detail: String,
    /// When the cluster was healthy again (since the load started).
    healed: Duration,
}

/// The PIDs of a postmaster and its children (to freeze a whole node).
fn process_tree(root: i32) -> Vec<i32> {
    let mut pids = vec![root];
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
                continue;
            };
            let ppid = std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| {
                    let after = s.rsplit_once(')')?.1.to_owned();
                    after.split_whitespace().nth(1)?.parse::<i32>().ok()
                });
            if ppid == Some(root) {
                pids.push(pid);
            }
        }
    }
    pids
}

async fn sweep_holder(cluster: &HaCluster) -> Option<String> {
    let attempt = async {
        let mut conn = PgConnection::connect_with(&cluster.options("poolkeeper"))
            .await
            .ok()?;
        sqlx::query_scalar(
            "SELECT holder FROM leases WHERE key = 'sweep' AND expires_at > clock_timestamp()",
        )
        .fetch_optional(&mut conn)
        .await
        .ok()
        .flatten()
    };
    tokio::time::timeout(Duration::from_secs(3), attempt)
        .await
        .ok()
        .flatten()
}

fn serve_env(cluster: &HaCluster) -> Vec<(&'static str, String)> {
    vec![
        ("DATABASE_URL", cluster.url("poolkeeper")),
        ("POOLKEEPER_DB_ACQUIRE_SECONDS", ACQUIRE_SECONDS.to_string()),
        ("POOLKEEPER_WEBHOOK_ALLOW_PRIVATE", "on".to_owned()),
        ("POOLKEEPER_WEBHOOK_POLL_MS", "100".to_owned()),
        ("POOLKEEPER_WEBHOOK_BACKOFF_MS", "200".to_owned()),
        ("POOLKEEPER_WEBHOOK_LEASE_SECONDS", "3".to_owned()),
    ]
}

async fn run(rounds: usize) {
    let cluster = HaCluster::start(3).await;
    {
        let mut admin = PgConnection::connect_with(&cluster.options("postgres"))
            .await
            .expect("connect through HAProxy");
        sqlx::query("CREATE DATABASE poolkeeper")
            .execute(&mut admin)
            .await
            .expect("create the database");
        let _ = admin.close().await;
    }
    poolkeeper::db::migrate(&cluster.options("poolkeeper"))
        .await
        .expect("migrate through HAProxy");
    let pool = poolkeeper::db::connect(cluster.options("poolkeeper"), 4)
        .await
        .expect("the test's pool");
    let org = crate::helpers::create_org(&pool, "ha", true).await;
    for (n, tag, profile) in [
        (MACHINES, "'ha-' || g", "'r650'"),
        // For orders of several.
        (ORDER_MACHINES, "'ha-o-' || g", "'r760'"),
    ] {
        crate::helpers::generated_machines(
            &pool,
            org.id,
            n,
            crate::helpers::Generated {
                tag,
                site: "'par1'",
                vendor: "'dell'",
                profile,
                status: "'ready'",
            },
        )
        .await;
    }

    let env = serve_env(&cluster);
    let env_ref: Vec<(&str, String)> = env.iter().map(|(k, v)| (*k, v.clone())).collect();
    let mut serves = vec![
        Replica::start("ha-a-1", &env_ref).await,
        Replica::start("ha-b-1", &env_ref).await,
    ];
    let receiver = Receiver::start().await;
    let r = reqwest::Client::new()
        .put(serves[0].url("/api/v1/webhook"))
        .bearer_auth(&org.token)
        .json(&json!({"url": receiver.url()}))
        .send()
        .await
        .expect("register the webhook");
    assert!(r.status().is_success(), "webhook: {}", r.status());

    let shared = Arc::new(Shared {
        start: Instant::now(),
        urls: RwLock::new(serves.iter().map(|r| r.url("")).collect()),
        token: org.token.clone(),
        log: Mutex::new(Log::default()),
        stop: AtomicBool::new(false),
        http: reqwest::Client::new(),
        next: AtomicUsize::new(0),
    });
    let start_wall = Utc::now();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|n| tokio::spawn(client(n, shared.clone())))
        .chain((0..ORDER_CLIENTS).map(|n| tokio::spawn(order_client(n, shared.clone()))))
        .collect();

    let since = |s: &Shared| s.start.elapsed();
    let settle_load = Duration::from_secs(4);
    tokio::time::sleep(settle_load).await;
    let mut faults: Vec<Fault> = Vec::new();
    let mut generation = 1;
    for _ in 0..rounds {
        for kind in FaultKind::ALL {
            // Healthy, and both roles named by one reading of /cluster (a
            // second reading may catch Patroni re-electing the standby).
            let deadline = Instant::now() + Duration::from_secs(90);
            let (leader, sync) = loop {
                cluster.wait_healthy(Duration::from_secs(90)).await;
                if let (Some(l), Some(s)) = cluster.roles().await {
                    break (l, s);
                }
                assert!(
                    Instant::now() < deadline,
                    "no leader and standby named in 90 s"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            };
            let at = since(&shared);
            let detail;
            match kind {
                FaultKind::KillLeaderPostmaster => {
                    let pid = cluster.node(&leader).postmaster_pid().expect("postmaster");
                    assert!(signal(pid, libc::SIGKILL));
                    detail = format!("{leader}'s postmaster (pid {pid})");
                }
                FaultKind::Switchover => {
                    cluster
                        .switchover(&leader, &sync)
                        .await
                        .unwrap_or_else(|e| panic!("{e}\n{}", cluster.logs()));
                    detail = format!("{leader} -> {sync}");
                }
                FaultKind::FreezeLeader => {
                    let node = cluster.node(&leader);
                    let patroni = node.patroni_pid().expect("patroni");
                    let tree = process_tree(node.postmaster_pid().expect("postmaster"));
                    assert!(signal(patroni, libc::SIGSTOP));
                    for pid in &tree {
                        signal(*pid, libc::SIGSTOP);
                    }
                    // Past the TTL and the promotion after it: the old
                    // leader wakes up to find another one.
                    let frozen = Duration::from_secs(TTL_SECONDS + 8);
                    tokio::time::sleep(frozen).await;
                    for pid in &tree {
                        signal(*pid, libc::SIGCONT);
                    }
                    signal(patroni, libc::SIGCONT);
                    detail = format!(
                        "{leader} frozen {}s ({} processes), TTL {TTL_SECONDS}s",
                        frozen.as_secs(),
                        tree.len() + 1
                    );
                }
                FaultKind::KillReplica => {
                    let pid = cluster.node(&sync).postmaster_pid().expect("postmaster");
                    assert!(signal(pid, libc::SIGKILL));
                    detail = format!("{sync}'s postmaster (pid {pid})");
                }
                FaultKind::KillServe => {
                    // The previous fault may have left the lease lapsed for a
                    // moment (strict synchronous mode blocks its renewal until
                    // a standby is back): the fault is on whoever holds it next.
                    let deadline = Instant::now() + Duration::from_secs(60);
                    let holder = loop {
                        if let Some(h) = sweep_holder(&cluster).await {
                            break h;
                        }
                        assert!(
                            Instant::now() < deadline,
                            "no replica held the sweep lease within 60 s\n{}",
                            cluster.logs()
                        );
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    };
                    let i = serves
                        .iter()
                        .position(|r| r.name == holder)
                        .expect("the holder is ours");
                    let pid = serves[i].child.id().expect("running") as i32;
                    assert!(signal(pid, libc::SIGKILL));
                    let _ = serves[i].child.wait().await;
                    generation += 1;
                    let name = format!("ha-{}-{generation}", if i == 0 { "a" } else { "b" });
                    let fresh = Replica::start(&name, &env_ref).await;
                    shared.urls.write().expect("urls")[i] = fresh.url("");
                    serves[i] = fresh;
                    detail = format!("{holder} (pid {pid}), replaced by {name}");
                }
            }
            let new_leader = cluster.wait_healthy(Duration::from_secs(90)).await;
            let healed = since(&shared);
            // The frozen leader woke up to find another one and follows it;
            // a switchover hands over to the synchronous standby.
            let expected = match kind {
                FaultKind::FreezeLeader => new_leader != leader,
                FaultKind::Switchover => new_leader == sync,
                _ => true,
            };
            if !expected {
                shared.violation(format!(
                    "{}: leader {leader} (sync {sync}) became {new_leader}",
                    kind.label()
                ));
            }
            eprintln!(
                "failover: {} at {:.1}s: {detail}; healthy at {:.1}s, leader {new_leader}",
                kind.label(),
                at.as_secs_f64(),
                healed.as_secs_f64()
            );
            faults.push(Fault {
                kind,
                at,
                detail: format!("{detail}; leader after: {new_leader}"),
                healed,
            });
            // Load on the healed cluster before the next fault, and a 201
            // after this one.
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                tokio::time::sleep(Duration::from_millis(200)).await;
                let seen =
                    recovered(&shared.log.lock().expect("log").entries, at, healed).is_some();
                if seen && since(&shared) > healed + settle_load {
                    break;
                }
                assert!(Instant::now() < deadline, "no 201 within 60 s of healing");
            }
        }
    }
    shared.stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.await.expect("client");
    }
    let load = since(&shared);
    cluster.wait_healthy(Duration::from_secs(60)).await;

    // ---- Checked on the healed cluster, against the log ----
    // A fresh pool: the first one's idle connections died with the nodes.
    pool.close().await;
    let pool = poolkeeper::db::connect(cluster.options("poolkeeper"), 4)
        .await
        .expect("a pool on the healed cluster");
    let log = std::mem::take(&mut *shared.log.lock().expect("log"));
    let mut report = SoakReport::default();
    check_invariants(&pool, &log.created, &mut report).await;
    check_told(&pool, &log.told, &mut report).await;
    let mut violations = log.violations.clone();
    violations.extend(report.violations.iter().cloned());
    // R13, R14, F3: the orders of several machines, whole, with the
    // deadlines and ends their clients were told. The walk-away holds
    // (2 s) are past; the sweep (1 s period) has expired them by now.
    tokio::time::sleep(Duration::from_secs(LEASE_SECONDS + 2 * SWEEP_SECONDS + 2)).await;
    check_orders(&pool, &log.orders, &mut violations).await;

    // Sweep lease fences strictly increase over time, and the sweep runs
    // again within the lease plus one period after each fault.
    let runs: Vec<(String, i64, DateTime<Utc>)> = sqlx::query_as(
        "SELECT replica, lease_fence, started_at FROM sweep_runs ORDER BY started_at, id",
    )
    .fetch_all(&pool)
    .await
    .expect("sweep runs");
    for w in runs.windows(2) {
        if w[1].1 < w[0].1 {
            violations.push(format!(
                "sweep fence went back: {} by {} at {} after {} by {} at {}",
                w[1].1, w[1].0, w[1].2, w[0].1, w[0].0, w[0].2
            ));
        }
    }
    let fences: BTreeSet<i64> = runs.iter().map(|r| r.1).collect();
    let mut sweep_gaps = Vec::new();
    for f in &faults {
        // From when writes worked again (the first 201), or from the kill
        // itself when the database never stopped.
        let from = match f.kind {
            FaultKind::KillServe => f.at,
            _ => recovered(&log.entries, f.at, f.healed).unwrap_or(f.healed),
        };
        let from_wall = start_wall + chrono::Duration::from_std(from).unwrap_or_default();
        let next = runs.iter().find(|r| r.2 >= from_wall).map(|r| r.2);
        let gap = next.map(|t| (t - from_wall).to_std().unwrap_or_default());
        let bound = Duration::from_secs(LEASE_SECONDS + SWEEP_SECONDS + 1);
        if gap.is_none_or(|g| g > bound) {
            violations.push(format!(
                "after {}: the sweep ran again after {gap:?} (bound {bound:?})",
                f.kind.label()
            ));
        }
        sweep_gaps.push(gap);
    }

    // Every reservation event reaches the webhook receiver at least once.
    let events: BTreeSet<i64> = sqlx::query_scalar::<_, i64>(
        "SELECT e.id FROM reservation_events e JOIN reservations r ON r.id = e.reservation_id
          WHERE r.org_id = $1",
    )
    .bind(org.id)
    .fetch_all(&pool)
    .await
    .expect("events")
    .into_iter()
    .collect();
    // The worker drains what the load left behind at its own pace on this
    // machine: the check waits while deliveries keep arriving, and fails
    // on a stall (nothing new for 30 s) or after 5 minutes in all.
    let deadline = Instant::now() + Duration::from_secs(300);
    let (mut seen, mut progress_at) = (0, Instant::now());
    let missing = loop {
        let delivered = receiver.delivered();
        let missing: Vec<i64> = events.difference(&delivered).copied().collect();
        if delivered.len() > seen {
            (seen, progress_at) = (delivered.len(), Instant::now());
        }
        if missing.is_empty()
            || Instant::now() > deadline
            || progress_at.elapsed() > Duration::from_secs(30)
        {
            break missing;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let drained = since(&shared).saturating_sub(load);
    let webhooks = webhook_summary(&pool, org.id, &missing).await;
    if !missing.is_empty() {
        violations.push(format!(
            "{} of {} events never reached the receiver: {:?}",
            missing.len(),
            events.len(),
            &missing[..missing.len().min(20)]
        ));
    }

    let text = render(&Rendered {
        rounds,
        load,
        log: &log,
        faults: &faults,
        sweep_gaps: &sweep_gaps,
        fences: fences.len(),
        sweep_runs: runs.len(),
        events: events.len(),
        webhooks: format!(
            "{webhooks} Checked {:.1}s after the load stopped.",
            drained.as_secs_f64()
        ),
        report: &report,
        violations: &violations,
    });
    eprintln!("{text}");
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/failover");
    let _ = std::fs::create_dir_all(&dir);
    let _ = std::fs::write(dir.join("report.md"), &text);

    assert!(violations.is_empty(), "{text}");
    let kinds: BTreeSet<FaultKind> = faults.iter().map(|f| f.kind).collect();
    assert_eq!(kinds.len(), FaultKind::ALL.len(), "every fault ran");
    assert!(log.created.len() > 100, "too little load:\n{text}");
    drop(serves);
}

/// What the outbox says of the organization's deliveries: how many in each
/// state, how long a delivered event waited, who attempted how many, the
/// webhooks lease; and, for events the receiver never got, where their
/// deliveries stand. Diagnostics only: the verdict is the receiver's.
async fn webhook_summary(pool: &poolkeeper::db::Db, org_id: i64, missing: &[i64]) -> String {
    let mut out = String::new();
    let states: Result<Vec<(String, i64, Option<f64>, Option<f64>)>, _> = sqlx::query_as(
        "SELECT state, count(*),
                percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM finished_at - created_at))::float8,
                max(extract(epoch FROM finished_at - created_at))::float8
           FROM webhook_deliveries WHERE org_id = $1 GROUP BY state ORDER BY state",
    )
    .bind(org_id)
    .fetch_all(pool)
    .await;
    match states {
        Ok(rows) => {
            let parts: Vec<String> = rows
                .iter()
                .map(|(state, n, p50, max)| match (p50, max) {
                    (Some(p50), Some(max)) => {
                        format!("{state} {n} (created to finished: p50 {p50:.2}s, max {max:.2}s)")
                    }
                    _ => format!("{state} {n}"),
                })
                .collect();
            let _ = write!(out, "Webhook deliveries: {}.", parts.join(", "));
        }
        Err(e) => {
            let _ = write!(out, "Webhook deliveries unread: {e}.");
        }
    }
    let attempts: Result<Vec<(String, i64, i64, DateTime<Utc>)>, _> = sqlx::query_as(
        "SELECT replica, count(*), count(*) FILTER (WHERE error IS NOT NULL), max(at)
           FROM webhook_attempts WHERE org_id = $1 GROUP BY replica ORDER BY replica",
    )
    .bind(org_id)
    .fetch_all(pool)
    .await;
    if let Ok(rows) = attempts {
        let parts: Vec<String> = rows
            .iter()
            .map(|(r, n, failed, last)| format!("{r}: {n} ({failed} failed, last at {last})"))
            .collect();
        let _ = write!(out, " Attempts by replica: {}.", parts.join("; "));
    }
    let pace: Result<(Option<i64>, Option<f64>), _> = sqlx::query_as(
        "SELECT (SELECT max(n) FROM (SELECT count(*) AS n FROM webhook_attempts WHERE org_id = $1
                                      GROUP BY date_trunc('second', at)) s),
                percentile_cont(0.5) WITHIN GROUP (ORDER BY latency_ms)::float8
           FROM webhook_attempts WHERE org_id = $1",
    )
    .bind(org_id)
    .fetch_one(pool)
    .await;
    if let Ok((Some(busiest), Some(post))) = pace {
        let _ = write!(
            out,
            " Busiest second: {busiest} attempts recorded; a POST's p50 {post:.0} ms."
        );
    }
    let lease: Result<Option<(String, i64, bool)>, _> = sqlx::query_as(
        "SELECT holder, fence, expires_at > clock_timestamp() FROM leases WHERE key = 'webhooks'",
    )
    .fetch_optional(pool)
    .await;
    if let Ok(Some((holder, fence, live))) = lease {
        let _ = write!(
            out,
            " The webhooks lease: {holder}, fence {fence}, {}.",
            if live { "live" } else { "expired" }
        );
    }
    if !missing.is_empty() {
        let rows: Result<
            Vec<(
                Option<String>,
                Option<i32>,
                i64,
                Option<String>,
                Option<String>,
            )>,
            _,
        > = sqlx::query_as(
            "SELECT d.state, d.attempts, count(*),
                        min(d.created_at)::text || ' to ' || max(d.created_at)::text,
                        string_agg(DISTINCT coalesce(d.last_error, 'none'), '; ')
                   FROM unnest($1::bigint[]) AS m(event_id)
                   LEFT JOIN webhook_deliveries d ON d.event_id = m.event_id
                  GROUP BY 1, 2 ORDER BY 1, 2",
        )
        .bind(missing)
        .fetch_all(pool)
        .await;
        match rows {
            Ok(rows) => {
                let parts: Vec<String> = rows
                    .iter()
                    .map(|(state, attempts, n, created, errors)| {
                        format!(
                            "{n} {} after {} attempts, created {}, last errors: {}",
                            state.as_deref().unwrap_or("without a delivery row"),
                            attempts.unwrap_or(0),
                            created.as_deref().unwrap_or("-"),
                            errors.as_deref().unwrap_or("-")
                        )
                    })
                    .collect();
                let _ = write!(
                    out,
                    " The missing events' deliveries: {}.",
                    parts.join("; ")
                );
            }
            Err(e) => {
                let _ = write!(out, " The missing events' deliveries unread: {e}.");
            }
        }
    }
    out
}

/// When the first 201 answered after `at` was sent (since the load began).
fn first_201_after(entries: &[Entry], at: Duration) -> Option<Duration> {
    entries
        .iter()
        .filter(|e| e.at >= at && e.status == Some(201))
        .map(|e| e.at + e.latency)
        .min()
}

/// When writes worked again after a fault at `at`, healed at `healed`:
/// the first 201 sent after the last request of the outage that failed
/// (503 or no answer, answered before the cluster was healthy again plus
/// a second). A killed postmaster's backends keep serving for a moment, so
/// the first 201 after the fault alone would hide the outage.
fn recovered(entries: &[Entry], at: Duration, healed: Duration) -> Option<Duration> {
    let last_failure = entries
        .iter()
        .filter(|e| e.at + e.latency >= at && e.at <= healed + Duration::from_secs(1))
        .filter(|e| matches!(e.status, None | Some(503)))
        .map(|e| e.at + e.latency)
        .max();
    first_201_after(entries, last_failure.unwrap_or(at))
}

struct Rendered<'a> {
    rounds: usize,
    load: Duration,
    log: &'a Log,
    faults: &'a [Fault],
    sweep_gaps: &'a [Option<Duration>],
    fences: usize,
    sweep_runs: usize,
    events: usize,
    /// What the outbox says of the deliveries (`webhook_summary`).
    webhooks: String,
    report: &'a SoakReport,
    violations: &'a [String],
}

fn answer_key(e: &Entry) -> String {
    match e.status {
        None => "no answer".to_owned(),
        Some(s) if e.code.is_empty() => s.to_string(),
        Some(s) => format!("{s} {}", e.code),
    }
}

fn render(r: &Rendered<'_>) -> String {
    let mut out = String::new();
    let entries = &r.log.entries;
    let _ = writeln!(
        out,
        "# Failover run\n\n{} clients of orders of one and {} of orders of several, 2 `poolkeeper serve`, {} machines; \
         Patroni 3.0.2, 3 PostgreSQL 15 nodes, \
         synchronous_mode_strict, TTL {}s, HAProxy on /primary; {} round(s) of the five faults; load for {:.1}s.\n",
        CLIENTS,
        ORDER_CLIENTS,
        MACHINES + ORDER_MACHINES,
        TTL_SECONDS,
        r.rounds,
        r.load.as_secs_f64()
    );
    let _ = writeln!(
        out,
        "| fault | detail | first 201 after the fault | failed answers (503 or none) per second after the fault | first 201 after the last failed answer | answers from the fault to then | slowest answer in it | answers slower than the acquire timeout ({ACQUIRE_SECONDS}s) |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|");
    for f in r.faults {
        let first = recovered(entries, f.at, f.healed);
        let end = first.unwrap_or(f.healed);
        let window: Vec<&Entry> = entries
            .iter()
            .filter(|e| e.at + e.latency >= f.at && e.at <= end)
            .collect();
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        for e in &window {
            *counts.entry(answer_key(e)).or_default() += 1;
        }
        let slowest = window
            .iter()
            .filter(|e| e.status.is_some())
            .map(|e| e.latency)
            .max()
            .unwrap_or_default();
        let mut slow_by: BTreeMap<String, usize> = BTreeMap::new();
        for e in window
            .iter()
            .filter(|e| e.latency > Duration::from_secs(ACQUIRE_SECONDS))
        {
            *slow_by.entry(answer_key(e)).or_default() += 1;
        }
        let slow = if slow_by.is_empty() {
            "0".to_owned()
        } else {
            slow_by
                .iter()
                .map(|(k, n)| format!("{k}: {n}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let counts: Vec<String> = counts.iter().map(|(k, n)| format!("{k}: {n}")).collect();
        let mut per_second: BTreeMap<u64, usize> = BTreeMap::new();
        for e in window
            .iter()
            .filter(|e| matches!(e.status, None | Some(503)))
        {
            let after = (e.at + e.latency).saturating_sub(f.at).as_secs();
            *per_second.entry(after).or_default() += 1;
        }
        let per_second = if per_second.is_empty() {
            "none".to_owned()
        } else {
            per_second
                .iter()
                .map(|(t, n)| format!("{t}s: {n}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let secs = |t: Option<Duration>| {
            t.map(|t| format!("{:.2}s", t.saturating_sub(f.at).as_secs_f64()))
                .unwrap_or_else(|| "none".into())
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {per_second} | {} | {} | {:.2}s | {} |",
            f.kind.label(),
            f.detail,
            secs(first_201_after(entries, f.at)),
            secs(first),
            counts.join(", "),
            slowest.as_secs_f64(),
            slow
        );
    }
    let mut by_answer: BTreeMap<String, usize> = BTreeMap::new();
    let mut by_op: BTreeMap<&str, usize> = BTreeMap::new();
    for e in entries {
        *by_answer.entry(answer_key(e)).or_default() += 1;
        *by_op.entry(e.op).or_default() += 1;
    }
    let retries = entries.iter().filter(|e| e.retry).count();
    let acked_transitions = r.log.told.len();
    let settled_applied = r.log.settled.iter().filter(|(_, applied)| *applied).count();
    let double_holds = r
        .violations
        .iter()
        .filter(|v| v.starts_with("two holds"))
        .count();
    let lost = r
        .violations
        .iter()
        .filter(|v| v.contains("does not match the database") || v.contains("was answered"))
        .count();
    let max_latency = entries
        .iter()
        .filter(|e| e.status.is_some())
        .map(|e| e.latency)
        .max()
        .unwrap_or_default();
    let _ = writeln!(
        out,
        "\nTotals: {} requests ({:?}; by answer {:?}; {retries} of them retries of a write answered 503 or not at all); acknowledged writes: {} reservations and {} converts or cancels; \
         writes answered 503 or not at all and settled by their retry: {} ({} had taken effect, {} had not); \
         lost: {lost}; double holds: {double_holds}; slowest answer {:.2}s; \
         reservations ended: {:?}; sweep: {} runs under {} lease fences; {} reservation events, every one delivered to the webhook receiver: {}.",
        entries.len(),
        by_op,
        by_answer,
        r.log.created.len(),
        acked_transitions,
        r.log.settled.len(),
        settled_applied,
        r.log.settled.len() - settled_applied,
        max_latency.as_secs_f64(),
        r.report.ended,
        r.sweep_runs,
        r.fences,
        r.events,
        !r.violations.iter().any(|v| v.contains("receiver")),
    );
    let gaps: Vec<String> = r
        .faults
        .iter()
        .zip(r.sweep_gaps)
        .map(|(f, g)| {
            format!(
                "{}: {}",
                f.kind.label(),
                g.map(|g| format!("{:.2}s", g.as_secs_f64()))
                    .unwrap_or_else(|| "none".into())
            )
        })
        .collect();
    let _ = writeln!(
        out,
        "\nThe sweep ran again (bound: lease {LEASE_SECONDS}s + period {SWEEP_SECONDS}s): {}.",
        gaps.join("; ")
    );
    let _ = writeln!(out, "\n{}", r.webhooks);
    let _ = writeln!(out, "\nViolations: {}", r.violations.len());
    for v in r.violations.iter().take(60) {
        let _ = writeln!(out, "- {v}");
    }
    out
}

// ---- The server's part, deterministic (no Patroni needed) ----

/// F3: a cancel whose session is terminated while it waits (here on a row
/// lock the test holds; in production, on the synchronous standby) gets
/// `503 outcome_unknown` with Retry-After, valid by the document; its
/// retry with the same fence answers 200 with the reservation cancelled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_whose_connection_is_lost_gets_503_outcome_unknown_and_its_retry_tells() {
    let app = crate::helpers::spawn_app().await;
    FakeMachine::new()
        .tag("FO-1")
        .profile("epyc")
        .create(&app.pool, app.org.id)
        .await;
    let (id, fence) = FakeHold::on("FO-1")
        .order("ORD-FO-1")
        .create_with_fence(&app.pool, app.org.id)
        .await;
    let mut conformance = crate::helpers::conformance::Conformance::new(&app).await;

    // Hold the machine row: the cancel's statement blocks on it, sent.
    let mut blocker = app.db.connection().await;
    sqlx::query("BEGIN")
        .execute(&mut blocker)
        .await
        .expect("begin");
    sqlx::query("SELECT 1 FROM machines WHERE asset_tag = 'FO-1' FOR UPDATE")
        .execute(&mut blocker)
        .await
        .expect("lock the machine");
    let url = app.url(&format!("/api/v1/reservations/{id}/cancel"));
    let body = json!({"fence": fence, "reason": "customer left"});
    let request = {
        let http = app.http.clone();
        let token = app.org.token.clone();
        let body = body.clone();
        let url = url.clone();
        tokio::spawn(async move {
            http.post(url)
                .bearer_auth(token)
                .json(&body)
                .send()
                .await
                .expect("an answer")
        })
    };
    // The statement is on the server, waiting for the lock: terminate its
    // session (as a demoted leader's shutdown does).
    crate::helpers::terminate_session_where(
        &app.pool,
        "wait_event_type = 'Lock' AND query LIKE '%api_transition%'",
    )
    .await;
    let resp = request.await.expect("the request task");
    assert_eq!(resp.status().as_u16(), 503);
    assert_eq!(
        resp.headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok()),
        Some("1")
    );
    let retry_after = true;
    let answer: Value = resp.json().await.expect("json");
    assert_eq!(answer["error"], "outcome_unknown", "{answer}");
    conformance.record(
        "/api/v1/reservations/{id}/cancel",
        "post",
        503,
        retry_after,
        &answer,
    );
    assert!(
        conformance.failures.is_empty(),
        "{:?}",
        conformance.failures
    );
    sqlx::query("ROLLBACK")
        .execute(&mut blocker)
        .await
        .expect("rollback");
    // Here it did not take effect (the statement was still waiting); the
    // retry, unchanged, says so by doing it now.
    assert_eq!(app.state_of(id).await, "held");
    let retry = app
        .http
        .post(&url)
        .bearer_auth(&app.org.token)
        .json(&body)
        .send()
        .await
        .expect("retry");
    assert_eq!(retry.status().as_u16(), 200);
    let retried: Value = retry.json().await.expect("json");
    assert_eq!(retried["state"], "cancelled", "{retried}");
}

/// F2: a server whose sessions are read-only (here a database with
/// `default_transaction_read_only`, as a standby's are) is never handed
/// out: the request gets 503 unavailable with Retry-After within the
/// acquire timeout, nothing is written, and once the server takes writes
/// again the next request is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_server_is_never_handed_out_and_the_request_gets_503() {
    let app = crate::helpers::spawn_app().await;
    FakeMachine::new()
        .tag("RO-1")
        .profile("epyc")
        .create(&app.pool, app.org.id)
        .await;
    let name = &app.db.name;
    let mut admin = app.db.connection().await;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "ALTER DATABASE {name} SET default_transaction_read_only = on"
    )))
    .execute(&mut admin)
    .await
    .expect("read-only sessions");
    // A pool of its own: every connection it opens is read-only.
    let pool = poolkeeper::db::connect_with_acquire_timeout(
        app.db.options.clone(),
        2,
        Duration::from_secs(1),
    )
    .await;
    assert!(pool.is_err(), "connecting to a read-only server must fail");
    // The application's own pool, opening connections on demand.
    let lazy = poolkeeper::db::connect_lazy(app.db.options.clone(), 2, Duration::from_secs(1));
    let server = poolkeeper::startup::Application::build(poolkeeper::startup::AppState::new(
        app.settings.clone(),
        lazy,
        poolkeeper::metrics::Metrics::new(),
    ))
    .expect("build");
    let base = format!("http://127.0.0.1:{}", server.port());
    tokio::spawn(server.run_until_stopped());
    let reserve = || {
        app.http
            .post(format!("{base}/api/v1/reservations"))
            .bearer_auth(&app.org.token)
            .json(&json!({"order_ref": "ORD-RO-1", "site": "par1", "profile": "epyc"}))
            .send()
    };
    let sent = Instant::now();
    let resp = reserve().await.expect("an answer");
    assert_eq!(resp.status().as_u16(), 503);
    assert!(resp.headers().contains_key("retry-after"));
    assert!(
        sent.elapsed() < Duration::from_secs(5),
        "{:?}",
        sent.elapsed()
    );
    let body: Value = resp.json().await.expect("json");
    assert_eq!(body["error"], "unavailable", "{body}");
    let written: i64 = sqlx::query_scalar("SELECT count(*) FROM reservations")
        .fetch_one(&mut admin)
        .await
        .expect("count");
    assert_eq!(written, 0);

    sqlx::query(sqlx::AssertSqlSafe(format!(
        "ALTER DATABASE {name} RESET default_transaction_read_only"
    )))
    .execute(&mut admin)
    .await
    .expect("writable again");
    let resp = reserve().await.expect("an answer");
    assert_eq!(resp.status().as_u16(), 201);
}

/// F3: a convert or a cancel replayed unchanged (same fence, same
/// service_ref, same token) answers 200 with the reservation as that action
/// left it; the same action with another service_ref is 422
/// idempotency_mismatch; any other action on the ended reservation stays
/// 409 not_held, and nothing is written twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transition_replayed_with_its_fence_answers_what_it_did() {
    let app = crate::helpers::spawn_app().await;
    for tag in ["RP-1", "RP-2"] {
        FakeMachine::new()
            .tag(tag)
            .profile("epyc")
            .create(&app.pool, app.org.id)
            .await;
    }
    let (converted, fence_c) = FakeHold::on("RP-1")
        .order("ORD-RP-1")
        .create_with_fence(&app.pool, app.org.id)
        .await;
    let (cancelled, fence_x) = FakeHold::on("RP-2")
        .order("ORD-RP-2")
        .create_with_fence(&app.pool, app.org.id)
        .await;
    let post = |token: &str, path: String, body: Value| {
        let req = app
            .http
            .post(app.url(&format!("/api/v1/reservations/{path}")))
            .bearer_auth(token)
            .json(&body);
        async move {
            let r = req.send().await.expect("answer");
            let status = r.status().as_u16();
            (status, r.json::<Value>().await.expect("json"))
        }
    };
    let token = &app.org.token;
    let convert = json!({"fence": fence_c, "service_ref": "SRV-RP-1"});
    let cancel = json!({"fence": fence_x, "reason": "customer left"});

    let (s1, first) = post(token, format!("{converted}/convert"), convert.clone()).await;
    assert_eq!(s1, 200, "{first}");
    let (s2, again) = post(token, format!("{converted}/convert"), convert.clone()).await;
    assert_eq!(s2, 200, "a replayed convert: {again}");
    assert_eq!(again["state"], "converted");
    assert_eq!(again["service"], first["service"], "the same service link");
    assert_eq!(again["ended_at"], first["ended_at"], "ended once");

    let (s1, first) = post(token, format!("{cancelled}/cancel"), cancel.clone()).await;
    assert_eq!(s1, 200, "{first}");
    let (s2, again) = post(token, format!("{cancelled}/cancel"), cancel.clone()).await;
    assert_eq!(s2, 200, "a replayed cancel: {again}");
    assert_eq!(again["state"], "cancelled");
    assert_eq!(again["ended_at"], first["ended_at"], "ended once");

    // The same action by the same caller with another service: another
    // request under the same key, refused and nothing written.
    let (status, answer) = post(
        token,
        format!("{converted}/convert"),
        json!({"fence": fence_c, "service_ref": "SRV-OTHER"}),
    )
    .await;
    assert_eq!(
        (status, answer["error"].as_str()),
        (422, Some("idempotency_mismatch")),
        "{answer}"
    );
    // Not the same action (another action, or another actor): refused,
    // the replay above notwithstanding.
    let refusals = [
        (
            token.as_str(),
            format!("{converted}/cancel"),
            json!({"fence": fence_c, "reason": "too late"}),
        ),
        (
            token.as_str(),
            format!("{cancelled}/convert"),
            json!({"fence": fence_x, "service_ref": "SRV-RP-2"}),
        ),
        // Another token (another actor) did not cancel it.
        (
            app.org.orders_token.as_str(),
            format!("{cancelled}/cancel"),
            cancel.clone(),
        ),
    ];
    for (token, path, body) in refusals {
        let (status, answer) = post(token, path.clone(), body).await;
        assert_eq!(status, 409, "{path}: {answer}");
        assert_eq!(answer["error"], "not_held", "{path}: {answer}");
    }
    // A wrong fence is still a stale fence, ended or not.
    let (status, answer) = post(
        token,
        format!("{cancelled}/cancel"),
        json!({"fence": fence_x + 1000, "reason": "customer left"}),
    )
    .await;
    assert_eq!(
        (status, answer["error"].as_str()),
        (409, Some("stale_fence"))
    );

    // Written once: one terminal event each, one service link.
    let events: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM reservation_events WHERE reservation_id = ANY($1) AND kind <> 'created'",
    )
    .bind(vec![converted, cancelled])
    .fetch_one(&app.pool)
    .await
    .expect("events");
    assert_eq!(events, 2);
    assert_eq!(
        app.count("SELECT count(*) FROM service_links").await,
        1,
        "one service link"
    );
}
