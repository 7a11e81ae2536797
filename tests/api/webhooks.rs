//! Reservation events for the order service. A real HTTP
//! receiver on 127.0.0.1 (actix-web, recording every request, answering 500
//! on demand), the real delivery worker (in-process, or inside real
//! `poolkeeper serve` processes), the real database.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Stdio;
use std::sync::atomic::Ordering;
use std::time::Duration;

use hmac::{Hmac, Mac};
use poolkeeper::db::Db;
use poolkeeper::metrics::Metrics;
use poolkeeper::settings::Settings;
use poolkeeper::webhooks::Step;
use serde_json::{Value, json};

use crate::webhook_history::CONVERTED_HISTORY_SQL;
use sha2::Sha256;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::helpers::receiver::{Received, Receiver};
use crate::helpers::{FakeHold, FakeMachine};
use crate::helpers::{TestApp, binary, spawn_app, spawn_app_with};

/// What the order service does (docs/webhooks.md, "Verifying a delivery"), written
/// independently of the server's code: HMAC-SHA256 with the secret over
/// "{t}.{raw body}", compared with v1 of the signature header, t equal to
/// the timestamp header.
fn verify(secret: &str, r: &Received) -> bool {
    let mut t = None;
    let mut v1 = None;
    for part in r.signature.split(',') {
        match part.split_once('=') {
            Some(("t", v)) => t = Some(v.to_owned()),
            Some(("v1", v)) => v1 = Some(v.to_owned()),
            _ => {}
        }
    }
    let (Some(t), Some(v1)) = (t, v1) else {
        return false;
    };
    if t != r.timestamp {
        return false;
    }
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("any key length");
    mac.update(t.as_bytes());
    mac.update(b".");
    mac.update(&r.body);
    let expected: String = mac
        .finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    expected == v1
}

// ---- Helpers ------------------------------------------------------------------

/// An app whose webhooks may call 127.0.0.1, with fast worker timings.
async fn webhook_app() -> TestApp {
    spawn_app_with(|s| {
        s.webhook_allow_private = true;
        s.webhook_poll = Duration::from_millis(20);
        s.webhook_backoff_base = Duration::from_millis(40);
        s.webhook_lease_duration = Duration::from_secs(5);
    })
    .await
}

/// The delivery worker of `app`'s settings, in this process.
fn start_worker(app: &TestApp) -> (watch::Sender<bool>, tokio::task::JoinHandle<()>) {
    let (stop, stopped) = watch::channel(false);
    let (pool, settings) = (app.pool.clone(), app.settings.clone());
    let task = tokio::spawn(async move {
        poolkeeper::webhooks::run(
            &pool,
            &settings,
            poolkeeper::metrics::Metrics::new(),
            stopped,
        )
        .await
    });
    (stop, task)
}

async fn stop_worker(worker: (watch::Sender<bool>, tokio::task::JoinHandle<()>)) {
    let _ = worker.0.send(true);
    tokio::time::timeout(Duration::from_secs(20), worker.1)
        .await
        .expect("the worker stops")
        .expect("worker task");
}

/// One step of the delivery worker of `settings` (`webhooks::run_once`):
/// every delivery due now attempted and recorded.
async fn step(pool: &Db, settings: &Settings) -> Step {
    let step = poolkeeper::webhooks::run_once(pool, settings, Metrics::new()).await;
    assert!(step.leased, "the step holds the webhooks lease: {step:?}");
    step
}

/// Steps the worker until `done` holds. A step attempts all that is due;
/// after a step that attempted nothing, the next one waits for the soonest
/// pending retry by the database clock: the backoff, never a poll interval.
/// Fails after 30 s.
async fn step_until<F, Fut>(pool: &Db, settings: &Settings, what: &str, mut done: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let attempted = step(pool, settings).await.attempted();
        if done().await {
            return;
        }
        assert!(Instant::now() < deadline, "timed out stepping until {what}");
        if attempted == 0 {
            let due_in: Option<f64> = sqlx::query_scalar(
                "SELECT extract(epoch FROM min(next_attempt_at) - clock_timestamp())::float8
                   FROM webhook_deliveries WHERE state = 'pending'",
            )
            .fetch_one(pool)
            .await
            .expect("the next retry");
            let wait = Duration::from_secs_f64(due_in.unwrap_or(0.0).clamp(0.0, 5.0));
            tokio::time::sleep(wait.max(Duration::from_millis(1))).await;
        }
    }
}

/// Registers `url` for the organization of `token`; returns the secret.
async fn register(app: &TestApp, token: &str, url: &str) -> String {
    let r = app
        .http
        .put(app.url("/api/v1/webhook"))
        .bearer_auth(token)
        .json(&json!({"url": url}))
        .send()
        .await
        .expect("PUT webhook");
    let status = r.status().as_u16();
    let body: Value = r.json().await.expect("json");
    assert!(status == 201 || status == 200, "{status} {body}");
    body["secret"].as_str().expect("a secret").to_owned()
}

async fn reserve(app: &TestApp, token: &str, order: &str) -> (i64, i64) {
    let r = app
        .http
        .post(app.url("/api/v1/reservations"))
        .bearer_auth(token)
        .json(&json!({"order_ref": order, "site": "par1", "profile": "r650"}))
        .send()
        .await
        .expect("reserve");
    assert_eq!(r.status().as_u16(), 201, "{order}");
    let b: Value = r.json().await.expect("json");
    (
        b["id"].as_i64().expect("id"),
        b["fence"].as_i64().expect("fence"),
    )
}

async fn cancel(app: &TestApp, token: &str, id: i64, fence: i64) {
    let r = app
        .http
        .post(app.url(&format!("/api/v1/reservations/{id}/cancel")))
        .bearer_auth(token)
        .json(&json!({"fence": fence, "reason": "customer left"}))
        .send()
        .await
        .expect("cancel");
    assert_eq!(r.status().as_u16(), 200);
}

async fn convert(app: &TestApp, token: &str, id: i64, fence: i64) {
    let r = app
        .http
        .post(app.url(&format!("/api/v1/reservations/{id}/convert")))
        .bearer_auth(token)
        .json(&json!({"fence": fence, "service_ref": format!("SRV-{id}")}))
        .send()
        .await
        .expect("convert");
    assert_eq!(r.status().as_u16(), 200);
}

async fn machines(app: &TestApp, org_id: i64, prefix: &str, n: usize) {
    for i in 0..n {
        FakeMachine::new()
            .tag(&format!("{prefix}-{i}"))
            .profile("r650")
            .create(&app.pool, org_id)
            .await;
    }
}

/// Polls `check` until it holds or `within` passes (no sleep stands in for
/// synchronisation: the condition is what the test waits for).
async fn wait_for<F, Fut>(what: &str, within: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    loop {
        if check().await {
            return;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn scalar(pool: &Db, sql: &'static str, org: i64) -> i64 {
    sqlx::query_scalar(sql)
        .bind(org)
        .fetch_one(pool)
        .await
        .expect("scalar")
}

/// Event ids of an organization's reservations.
async fn events_of(pool: &Db, org: i64) -> BTreeSet<i64> {
    sqlx::query_scalar::<_, i64>(
        "SELECT e.id FROM reservation_events e JOIN reservations r ON r.id = e.reservation_id
          WHERE r.org_id = $1",
    )
    .bind(org)
    .fetch_all(pool)
    .await
    .expect("events")
    .into_iter()
    .collect()
}

// ---- Tests ----------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_event_is_delivered_signed_and_the_receiver_can_verify_it() {
    let app = webhook_app().await;
    let receiver = Receiver::start().await;
    machines(&app, app.org.id, "wh", 4).await;
    // Before a webhook exists, events write no delivery rows.
    let (early, _) = reserve(&app, &app.org.token, "ORD-EARLY").await;
    assert_eq!(
        scalar(
            &app.pool,
            "SELECT count(*) FROM webhook_deliveries WHERE org_id = $1",
            app.org.id
        )
        .await,
        0
    );
    let secret = register(&app, &app.org.orders_token, &receiver.url()).await;
    assert!(secret.starts_with("whsec_") && secret.len() > 40);

    // created + converted, created + cancelled, created + expired by the
    // sweep's batch statement (the trigger covers every writer).
    let (a, fa) = reserve(&app, &app.org.token, "ORD-A").await;
    convert(&app, &app.org.token, a, fa).await;
    let (b, fb) = reserve(&app, &app.org.token, "ORD-B").await;
    cancel(&app, &app.org.token, b, fb).await;
    let (c, _) = reserve(&app, &app.org.token, "ORD-C").await;
    app.make_overdue(c).await;
    let mandate = match poolkeeper::lease::claim(
        &app.pool,
        poolkeeper::lease::SWEEP_KEY,
        "test-sweeper",
        Duration::from_secs(60),
    )
    .await
    .expect("claim")
    {
        poolkeeper::lease::Claim::Acquired(m) => m,
        other => panic!("sweep lease: {other:?}"),
    };
    let report = poolkeeper::sweep::sweep(&app.pool, "test-sweeper", mandate.fence, 500)
        .await
        .expect("sweep");
    assert_eq!(report.expired, 1);

    // Every event after the registration: all of acme's but ORD-EARLY's.
    let expected: BTreeSet<i64> = events_of(&app.pool, app.org.id)
        .await
        .difference(&events_of_reservation(&app.pool, early).await)
        .copied()
        .collect();
    assert_eq!(expected.len(), 6, "six events after registration");
    assert_eq!(
        scalar(
            &app.pool,
            "SELECT count(*) FROM webhook_deliveries WHERE org_id = $1 AND state = 'pending'",
            app.org.id
        )
        .await,
        6,
        "one outbox row per event, written with the event"
    );

    // Two steps: the three 'created' events, then the event after each
    // (one event of a reservation at a time).
    let first = step(&app.pool, &app.settings).await;
    let second = step(&app.pool, &app.settings).await;
    assert_eq!((first.delivered, second.delivered), (3, 3));
    assert_eq!(receiver.delivered().len(), 6, "six deliveries");
    assert_eq!(
        scalar(
            &app.pool,
            "SELECT count(*) FROM webhook_deliveries WHERE org_id = $1 AND state = 'delivered'",
            app.org.id,
        )
        .await,
        6,
        "the attempts recorded"
    );

    let requests = receiver.requests();
    assert_eq!(receiver.delivered(), expected);
    // Each body matches the OpenAPI document's ReservationEventDelivery.
    let mut doc: Value = app
        .http
        .get(app.url("/api/openapi.json"))
        .send()
        .await
        .expect("openapi")
        .json()
        .await
        .expect("json");
    doc["$ref"] = json!("#/components/schemas/ReservationEventDelivery");
    let schema = jsonschema::validator_for(&doc).expect("the document compiles");
    let mut kinds = BTreeMap::new();
    for r in &requests {
        let errors: Vec<String> = schema
            .iter_errors(&r.json())
            .map(|e| e.to_string())
            .collect();
        assert!(errors.is_empty(), "event {}: {errors:?}", r.event_id);
        assert!(verify(&secret, r), "signature of event {}", r.event_id);
        assert!(!verify("whsec_wrong", r), "a wrong secret does not verify");
        let mut tampered = r.clone();
        tampered.body.extend_from_slice(b" ");
        assert!(
            !verify(&secret, &tampered),
            "a changed body does not verify"
        );
        let body = r.json();
        assert_eq!(body["event_id"].as_i64(), Some(r.event_id));
        assert_eq!(body["organization"], "acme");
        assert_eq!(r.attempt, 1);
        let kind = body["event"]["kind"].as_str().expect("kind").to_owned();
        assert_eq!(body["type"], format!("reservation.{kind}"));
        assert_eq!(body["reservation"]["state"], body["event"]["to_state"]);
        assert!(
            body["occurred_at"]
                .as_str()
                .is_some_and(|t| t.ends_with('Z'))
        );
        let order = body["reservation"]["order_ref"]
            .as_str()
            .expect("order")
            .to_owned();
        kinds.entry(order).or_insert_with(Vec::new).push((
            kind,
            body["event"]["actor"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        ));
    }
    assert_eq!(
        kinds["ORD-A"]
            .iter()
            .map(|k| k.0.as_str())
            .collect::<Vec<_>>(),
        ["created", "converted"]
    );
    assert_eq!(
        kinds["ORD-B"]
            .iter()
            .map(|k| k.0.as_str())
            .collect::<Vec<_>>(),
        ["created", "cancelled"]
    );
    assert_eq!(
        kinds["ORD-C"][1],
        ("expired".to_owned(), "sweep".to_owned())
    );
    // Every attempt recorded: status, latency, the replica and its fence.
    let (attempts, ok, fenced): (i64, i64, i64) = sqlx::query_as(
        "SELECT count(*), count(*) FILTER (WHERE status = 200 AND error IS NULL),
                count(*) FILTER (WHERE lease_fence > 0 AND replica = $1 AND latency_ms >= 0)
           FROM webhook_attempts WHERE org_id = $2",
    )
    .bind(&app.settings.replica)
    .bind(app.org.id)
    .fetch_one(&app.pool)
    .await
    .expect("attempts");
    assert_eq!((attempts, ok, fenced), (6, 6, 6));
}

async fn events_of_reservation(pool: &Db, id: i64) -> BTreeSet<i64> {
    sqlx::query_scalar::<_, i64>("SELECT id FROM reservation_events WHERE reservation_id = $1")
        .bind(id)
        .fetch_all(pool)
        .await
        .expect("events")
        .into_iter()
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_answered_500_is_retried_with_backoff_and_every_attempt_is_recorded() {
    let app = webhook_app().await;
    let receiver = Receiver::start().await;
    receiver.fail_next.store(3, Ordering::SeqCst);
    machines(&app, app.org.id, "rt", 1).await;
    register(&app, &app.org.orders_token, &receiver.url()).await;
    reserve(&app, &app.org.token, "ORD-R").await;
    step_until(
        &app.pool,
        &app.settings,
        "the delivery after three 500s",
        || async {
            scalar(
                &app.pool,
                "SELECT count(*) FROM webhook_deliveries WHERE org_id = $1 AND state = 'delivered'",
                app.org.id,
            )
            .await
                == 1
        },
    )
    .await;

    let requests = receiver.requests();
    let answered: Vec<(u16, u32)> = requests.iter().map(|r| (r.answered, r.attempt)).collect();
    assert_eq!(answered, [(500, 1), (500, 2), (500, 3), (200, 4)]);
    assert!(
        requests.iter().all(|r| r.event_id == requests[0].event_id),
        "one stable event id"
    );
    let rows: Vec<(Option<i32>, Option<String>, i32)> = sqlx::query_as(
        "SELECT status, error, latency_ms FROM webhook_attempts WHERE org_id = $1 ORDER BY id",
    )
    .bind(app.org.id)
    .fetch_all(&app.pool)
    .await
    .expect("attempts");
    let summary: Vec<(Option<i32>, Option<String>)> =
        rows.iter().map(|(s, e, _)| (*s, e.clone())).collect();
    let failed = (Some(500), Some("HTTP 500".to_owned()));
    assert_eq!(
        summary,
        [failed.clone(), failed.clone(), failed, (Some(200), None)]
    );
    let (attempts, last_status): (i32, Option<i32>) =
        sqlx::query_as("SELECT attempts, last_status FROM webhook_deliveries WHERE org_id = $1")
            .bind(app.org.id)
            .fetch_one(&app.pool)
            .await
            .expect("delivery");
    assert_eq!((attempts, last_status), (4, Some(200)));
    // The backoff: each retry waited at least half its doubled delay (40,
    // 80, 160 ms, equal jitter), measured by the database clock.
    let gaps: Vec<f64> = sqlx::query_scalar(
        "SELECT extract(epoch FROM at - lag(at) OVER (ORDER BY id))::float8 * 1000
           FROM webhook_attempts WHERE org_id = $1 ORDER BY id OFFSET 1",
    )
    .bind(app.org.id)
    .fetch_all(&app.pool)
    .await
    .expect("gaps");
    for (i, gap) in gaps.iter().enumerate() {
        let floor = 40.0 * f64::from(1u32 << i) / 2.0;
        assert!(
            *gap >= floor,
            "retry {} came after {gap} ms, before {floor} ms",
            i + 1
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_of_one_reservation_are_never_sent_ahead_of_an_earlier_one() {
    let app = webhook_app().await;
    let receiver = Receiver::start().await;
    machines(&app, app.org.id, "ord", 6).await;
    register(&app, &app.org.orders_token, &receiver.url()).await;
    // Both events of each reservation are pending before the worker starts,
    // and the receiver refuses the first deliveries it gets.
    for i in 0..6 {
        let (id, fence) = reserve(&app, &app.org.token, &format!("ORD-{i}")).await;
        cancel(&app, &app.org.token, id, fence).await;
    }
    receiver.fail_next.store(8, Ordering::SeqCst);
    step_until(&app.pool, &app.settings, "twelve deliveries", || async {
        scalar(
            &app.pool,
            "SELECT count(*) FROM webhook_deliveries WHERE org_id = $1 AND state = 'delivered'",
            app.org.id,
        )
        .await
            == 12
    })
    .await;

    let requests = receiver.requests();
    assert!(
        requests.iter().any(|r| r.answered == 500),
        "the receiver refused some"
    );
    let mut per_reservation: BTreeMap<i64, Vec<(String, u16)>> = BTreeMap::new();
    for r in &requests {
        let body = r.json();
        per_reservation
            .entry(body["reservation"]["id"].as_i64().expect("id"))
            .or_default()
            .push((
                body["event"]["kind"].as_str().expect("kind").to_owned(),
                r.answered,
            ));
    }
    assert_eq!(per_reservation.len(), 6);
    for (id, seen) in per_reservation {
        // Every request before the first 'cancelled' one is a 'created', and
        // the last of those was answered 200.
        let first_cancel = seen
            .iter()
            .position(|(k, _)| k == "cancelled")
            .expect("the cancellation was delivered");
        assert!(first_cancel > 0, "{id}: {seen:?}");
        assert!(
            seen[..first_cancel].iter().all(|(k, _)| k == "created"),
            "{id}: {seen:?}"
        );
        assert_eq!(
            seen[first_cancel - 1].1,
            200,
            "{id}: cancelled sent before created was delivered: {seen:?}"
        );
        assert!(
            seen[first_cancel..].iter().all(|(k, _)| k == "cancelled"),
            "{id}: {seen:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_organizations_events_never_reach_another_and_its_failing_endpoint_blocks_nobody() {
    let app = webhook_app().await;
    let (acme_rx, other_rx) = (Receiver::start().await, Receiver::start().await);
    // acme's endpoint fails every time; other's works.
    acme_rx.fail_next.store(usize::MAX, Ordering::SeqCst);
    machines(&app, app.org.id, "acme", 3).await;
    machines(&app, app.other.id, "oth", 3).await;
    let acme_secret = register(&app, &app.org.orders_token, &acme_rx.url()).await;
    let other_secret = register(&app, &app.other.orders_token, &other_rx.url()).await;
    assert_ne!(acme_secret, other_secret);
    for i in 0..3 {
        reserve(&app, &app.org.token, &format!("A-{i}")).await;
        let (id, fence) = reserve(&app, &app.other.token, &format!("O-{i}")).await;
        cancel(&app, &app.other.token, id, fence).await;
    }
    let other_events = events_of(&app.pool, app.other.id).await;
    step_until(
        &app.pool,
        &app.settings,
        "other's six events despite acme's failures",
        || async { other_rx.delivered() == other_events },
    )
    .await;
    step_until(&app.pool, &app.settings, "acme retried", || async {
        acme_rx.requests().len() >= 6
    })
    .await;

    let acme_events = events_of(&app.pool, app.org.id).await;
    for r in acme_rx.requests() {
        assert!(
            acme_events.contains(&r.event_id),
            "acme got event {}",
            r.event_id
        );
        assert_eq!(r.json()["organization"], "acme");
        assert!(verify(&acme_secret, &r));
    }
    for r in other_rx.requests() {
        assert!(
            other_events.contains(&r.event_id),
            "other got event {}",
            r.event_id
        );
        assert_eq!(r.json()["organization"], "other");
        assert!(verify(&other_secret, &r) && !verify(&acme_secret, &r));
    }
    assert_eq!(
        scalar(
            &app.pool,
            "SELECT count(*) FROM webhook_deliveries WHERE org_id = $1 AND state = 'pending'",
            app.org.id
        )
        .await,
        3,
        "acme's deliveries stay pending for retry"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn internal_addresses_and_bad_urls_are_refused_at_registration_and_at_delivery() {
    // The default deployment: internal addresses refused.
    let app = spawn_app().await;
    let put = |url: &'static str| {
        app.http
            .put(app.url("/api/v1/webhook"))
            .bearer_auth(&app.org.orders_token)
            .json(&json!({"url": url}))
            .send()
    };
    for url in [
        "http://127.0.0.1:9/hook",
        "http://localhost/hook",
        "http://10.0.0.1/hook",
        "http://172.16.5.4/hook",
        "http://192.168.1.1/hook",
        "http://169.254.169.254/latest/meta-data",
        "http://0.0.0.0/hook",
        "http://[::1]/hook",
        "http://[fe80::1]/hook",
        "http://[::ffff:10.0.0.1]/hook",
        "ftp://hooks.example/x",
        "file:///etc/passwd",
        "https://user:pw@hooks.example/x",
        "not a url",
    ] {
        // Well-formed JSON of the documented shape: the URL itself is
        // refused, 422 (the document cannot say which URLs resolve inward).
        let r = put(url).await.expect("PUT");
        assert_eq!(r.status().as_u16(), 422, "{url}");
        let body: Value = r.json().await.expect("json");
        assert_eq!(body["error"], "url_refused", "{url}: {body}");
    }
    let r = put("http://10.0.0.1/hook").await.expect("PUT");
    let body: Value = r.json().await.expect("json");
    assert!(
        body["message"]
            .as_str()
            .is_some_and(|m| m.contains("POOLKEEPER_WEBHOOK_ALLOW_PRIVATE")),
        "{body}"
    );
    assert_eq!(
        app.count("SELECT count(*) FROM webhooks").await,
        0,
        "nothing written"
    );
    assert_eq!(
        app.count("SELECT count(*) FROM audit_log WHERE action LIKE 'org.webhook%'")
            .await,
        0
    );

    // Registered while allowed, delivered by a worker that is not allowed:
    // refused at delivery, for a literal address and for a name that
    // resolves to one (the check runs on the resolved address).
    let receiver = Receiver::start().await;
    let allowed = webhook_app().await;
    machines(&allowed, allowed.org.id, "dv", 2).await;
    machines(&allowed, allowed.other.id, "dw", 2).await;
    register(&allowed, &allowed.org.orders_token, &receiver.url()).await;
    let by_name = format!("http://localhost:{}/hook", receiver.port);
    register(&allowed, &allowed.other.orders_token, &by_name).await;
    reserve(&allowed, &allowed.org.token, "ORD-L").await;
    reserve(&allowed, &allowed.other.token, "ORD-N").await;
    let mut strict = allowed.settings.clone();
    strict.webhook_allow_private = false;
    step_until(&allowed.pool, &strict, "two refused attempts", || async {
        allowed
            .count(
                "SELECT count(DISTINCT org_id) FROM webhook_attempts WHERE error LIKE '%loopback%'",
            )
            .await
            == 2
    })
    .await;
    assert!(
        receiver.requests().is_empty(),
        "nothing reached the internal address"
    );
    assert_eq!(
        allowed
            .count("SELECT count(*) FROM webhook_attempts WHERE status IS NOT NULL")
            .await,
        0
    );
}

#[tokio::test]
async fn the_webhook_is_set_changed_and_removed_through_the_api_with_audit_rows() {
    let app = webhook_app().await;
    let api = app.url("/api/v1/webhook");
    let t = &app.org.orders_token;
    let get = || app.http.get(&api).bearer_auth(t).send();
    assert_eq!(get().await.expect("get").status().as_u16(), 404);
    let r = app
        .http
        .put(&api)
        .bearer_auth(t)
        .json(&json!({"url": "http://127.0.0.1:1/a"}))
        .send()
        .await
        .expect("put");
    assert_eq!(r.status().as_u16(), 201);
    let first: Value = r.json().await.expect("json");
    let r = app
        .http
        .put(&api)
        .bearer_auth(t)
        .json(&json!({"url": "http://127.0.0.1:1/b"}))
        .send()
        .await
        .expect("put");
    assert_eq!(r.status().as_u16(), 200);
    let moved: Value = r.json().await.expect("json");
    assert_eq!(moved["url"], "http://127.0.0.1:1/b");
    assert_eq!(moved["secret"], first["secret"], "moving keeps the secret");
    let r = app
        .http
        .put(&api)
        .bearer_auth(t)
        .json(&json!({"url": "http://127.0.0.1:1/b", "rotate_secret": true}))
        .send()
        .await
        .expect("put");
    let rotated: Value = r.json().await.expect("json");
    assert_ne!(rotated["secret"], first["secret"]);
    let got: Value = get().await.expect("get").json().await.expect("json");
    assert_eq!(got["secret"], rotated["secret"]);
    // Unknown fields and wrong types write nothing.
    for bad in [
        json!({"url": 5}),
        json!({"url": "http://127.0.0.1/", "x": 1}),
        json!({}),
    ] {
        let r = app
            .http
            .put(&api)
            .bearer_auth(t)
            .json(&bad)
            .send()
            .await
            .expect("put");
        assert_eq!(r.status().as_u16(), 400, "{bad}");
    }
    // The other organization sees none of it.
    let r = app
        .http
        .get(&api)
        .bearer_auth(&app.other.orders_token)
        .send()
        .await
        .expect("get");
    assert_eq!(r.status().as_u16(), 404);
    let r = app
        .http
        .delete(&api)
        .bearer_auth(t)
        .send()
        .await
        .expect("delete");
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(get().await.expect("get").status().as_u16(), 404);
    let r = app
        .http
        .delete(&api)
        .bearer_auth(t)
        .send()
        .await
        .expect("delete");
    assert_eq!(r.status().as_u16(), 404);
    let actions: Vec<(String, String)> = sqlx::query_as(
        "SELECT action, actor FROM audit_log WHERE org_id = $1 AND action LIKE 'org.webhook%' ORDER BY id",
    )
    .bind(app.org.id)
    .fetch_all(&app.pool)
    .await
    .expect("audit");
    let want: Vec<(String, String)> = [
        "org.webhook_set",
        "org.webhook_set",
        "org.webhook_set",
        "org.webhook_removed",
    ]
    .iter()
    .map(|a| (a.to_string(), "token:orders-only".to_owned()))
    .collect();
    assert_eq!(actions, want);
    assert_eq!(
        app.count("SELECT count(*) FROM audit_log WHERE detail LIKE '%whsec_%'")
            .await,
        0,
        "the secret is never in the audit log"
    );
}

// ---- A real replica killed with -9 mid-batch ------------------------------------

struct Replica {
    name: String,
    child: tokio::process::Child,
    log: std::path::PathBuf,
}

impl Replica {
    fn spawn(url: &str, name: &str, dir: &std::path::Path) -> Replica {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let log = dir.join(format!("{name}.log"));
        let file = std::fs::File::create(&log).expect("log file");
        let child = tokio::process::Command::new(binary())
            .arg("serve")
            .env("DATABASE_URL", url)
            .env("POOLKEEPER_BIND", format!("127.0.0.1:{port}"))
            .env("POOLKEEPER_REPLICA", name)
            .env("POOLKEEPER_WEBHOOK_ALLOW_PRIVATE", "on")
            .env("POOLKEEPER_WEBHOOK_POLL_MS", "20")
            .env("POOLKEEPER_WEBHOOK_BACKOFF_MS", "50")
            .env("POOLKEEPER_WEBHOOK_LEASE_SECONDS", "2")
            .env("RUST_LOG", "info,sqlx=warn,actix_server=warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(file))
            .kill_on_drop(true)
            .spawn()
            .expect("spawn poolkeeper serve");
        Replica {
            name: name.to_owned(),
            child,
            log,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_delivery_is_lost_when_the_delivering_replica_is_killed_mid_batch() {
    let app = webhook_app().await;
    let receiver = Receiver::start().await;
    // Slow answers: many deliveries are in flight when the holder dies.
    receiver.delay_ms.store(100, Ordering::SeqCst);
    register(&app, &app.org.orders_token, &receiver.url()).await;
    // 120 reservations, 240 events, written in SQL (the trigger writes the
    // outbox whatever the writer).
    machines(&app, app.org.id, "k", 120).await;
    for i in 0..120 {
        let (id, fence) = FakeHold::on(format!("k-{i}"))
            .order(&format!("K-{i}"))
            .create_with_fence(&app.pool, app.org.id)
            .await;
        if i % 2 == 0 {
            sqlx::query(
                "WITH r AS (UPDATE reservations SET state = 'cancelled', ended_at = clock_timestamp(),
                                   ended_by = 'checkout', end_reason = 'test'
                             WHERE id = $1 AND fence = $2 RETURNING id)
                 INSERT INTO reservation_events (reservation_id, kind, from_state, to_state, actor, detail)
                 SELECT id, 'cancelled', 'held', 'cancelled', 'checkout', 'test' FROM r",
            )
            .bind(id)
            .bind(fence)
            .execute(&app.pool)
            .await
            .expect("cancel in SQL");
        }
    }
    let total = app.count("SELECT count(*) FROM webhook_deliveries").await;
    assert_eq!(total, 180);

    let dir = tempdir();
    let url = app.db.url();
    let mut replicas = vec![
        Replica::spawn(&url, "wh-a", &dir),
        Replica::spawn(&url, "wh-b", &dir),
    ];
    // Kill the holder once it has delivered some but not all.
    wait_for(
        "a first part delivered",
        Duration::from_secs(60),
        || async {
            app.count("SELECT count(*) FROM webhook_deliveries WHERE state = 'delivered'")
                .await
                >= 20
        },
    )
    .await;
    let (holder, fence): (String, i64) = sqlx::query_as(
        "SELECT holder, fence FROM leases WHERE key = 'webhooks' AND expires_at > clock_timestamp()",
    )
    .fetch_one(&app.pool)
    .await
    .expect("a live webhooks lease");
    let victim = replicas
        .iter()
        .position(|r| r.name == holder)
        .expect("the holder is one of ours");
    let pid = replicas[victim].child.id().expect("running");
    // SAFETY: plain signal delivery to our own child.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGKILL) }, 0);
    let _ = replicas[victim].child.wait().await;
    let delivered_at_kill = app
        .count("SELECT count(*) FROM webhook_deliveries WHERE state = 'delivered'")
        .await;
    assert!(
        delivered_at_kill < total,
        "killed mid-batch ({delivered_at_kill} of {total})"
    );

    wait_for(
        "every delivery recorded",
        Duration::from_secs(90),
        || async {
            app.count("SELECT count(*) FROM webhook_deliveries WHERE state = 'delivered'")
                .await
                == total
        },
    )
    .await;
    let survivor = &replicas[1 - victim];
    // In SQL: the survivor took over under a newer fence and recorded the rest.
    let (survivor_fence, by_survivor): (Option<i64>, i64) = sqlx::query_as(
        "SELECT max(lease_fence), count(*) FROM webhook_attempts WHERE replica = $1",
    )
    .bind(&survivor.name)
    .fetch_one(&app.pool)
    .await
    .expect("attempts");
    assert!(survivor_fence.is_some_and(|f| f > fence), "a newer mandate");
    assert!(by_survivor > 0);
    // At the receiver: every event arrived at least once (duplicates allowed).
    let expected = events_of(&app.pool, app.org.id).await;
    let got = receiver.delivered();
    eprintln!(
        "kill -9: {delivered_at_kill} of {total} recorded at the kill, {} requests received for {} events, survivor attempts {by_survivor}",
        receiver.requests().len(),
        expected.len()
    );
    let missing: Vec<_> = expected.difference(&got).collect();
    assert!(
        missing.is_empty(),
        "lost: {missing:?}\n{}",
        std::fs::read_to_string(&survivor.log).unwrap_or_default()
    );
    // And per reservation, no event went ahead of an earlier undelivered one.
    let mut created_ok: BTreeSet<i64> = BTreeSet::new();
    for r in receiver.requests() {
        let body = r.json();
        let id = body["reservation"]["id"].as_i64().expect("id");
        match body["event"]["kind"].as_str() {
            Some("created") if r.answered == 200 => {
                created_ok.insert(id);
            }
            Some("cancelled") => assert!(
                created_ok.contains(&id),
                "cancelled of {id} ahead of created"
            ),
            _ => {}
        }
    }
    for mut r in replicas {
        let _ = r.child.start_kill();
        let _ = r.child.wait().await;
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn tempdir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("pk-webhooks-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

// ---- The dashboard ----------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_sets_rotates_and_removes_the_webhook_on_the_settings_page() {
    let app = webhook_app().await;
    let admin = app.staff("ada@acme.example", "admin").await;
    let support = app.staff("sam@acme.example", "support").await;
    let (status, body) = admin.page("/settings").await;
    assert_eq!(status, 200);
    assert!(body.contains("id=\"no-webhook\""), "{body}");
    let csrf = admin.csrf().await;
    let url = "http://127.0.0.1:9/hooks";

    // No CSRF token, or not an admin: refused, nothing written.
    let r = admin
        .post_form("/settings/webhook", &[("action", "save"), ("url", url)])
        .await;
    assert_eq!(r.status().as_u16(), 403);
    let support_csrf = support.csrf().await;
    let r = support
        .post_form(
            "/settings/webhook",
            &[("csrf", &support_csrf), ("action", "save"), ("url", url)],
        )
        .await;
    assert_eq!(r.status().as_u16(), 403);
    // A bad URL: the page again, with the reason, nothing written.
    let r = admin
        .post_form(
            "/settings/webhook",
            &[
                ("csrf", &csrf),
                ("action", "save"),
                ("url", "ftp://x.example/"),
            ],
        )
        .await;
    assert_eq!(r.status().as_u16(), 400);
    let body = r.text().await.expect("body");
    assert!(
        body.contains("id=\"webhook-error\"") && body.contains("http:// or https://"),
        "{body}"
    );
    let r = admin
        .post_form(
            "/settings/webhook",
            &[("csrf", &csrf), ("action", "explode")],
        )
        .await;
    assert_eq!(r.status().as_u16(), 400);
    assert_eq!(app.count("SELECT count(*) FROM webhooks").await, 0);

    let r = admin
        .post_form(
            "/settings/webhook",
            &[("csrf", &csrf), ("action", "save"), ("url", url)],
        )
        .await;
    assert_eq!(r.status().as_u16(), 303);
    assert_eq!(r.headers()["location"], "/settings?flash=webhook_saved");
    let secret = |body: &str| {
        let doc = scraper::Html::parse_document(body);
        let sel = scraper::Selector::parse("#webhook-secret").expect("selector");
        doc.select(&sel)
            .next()
            .map(|e| e.text().collect::<String>())
    };
    let (_, body) = admin.page("/settings").await;
    let stored: String = sqlx::query_scalar("SELECT secret FROM webhooks WHERE org_id = $1")
        .bind(app.org.id)
        .fetch_one(&app.pool)
        .await
        .expect("secret");
    assert_eq!(secret(&body).as_deref(), Some(stored.as_str()));
    assert!(body.contains(url));

    let r = admin
        .post_form(
            "/settings/webhook",
            &[("csrf", &csrf), ("action", "rotate")],
        )
        .await;
    assert_eq!(r.headers()["location"], "/settings?flash=webhook_rotated");
    let (_, body) = admin.page("/settings").await;
    let rotated = secret(&body).expect("a secret shown");
    assert_ne!(rotated, stored);

    let r = admin
        .post_form(
            "/settings/webhook",
            &[("csrf", &csrf), ("action", "remove")],
        )
        .await;
    assert_eq!(r.headers()["location"], "/settings?flash=webhook_removed");
    let r = admin
        .post_form(
            "/settings/webhook",
            &[("csrf", &csrf), ("action", "remove")],
        )
        .await;
    assert_eq!(r.headers()["location"], "/settings?flash=webhook_absent");
    assert_eq!(app.count("SELECT count(*) FROM webhooks").await, 0);
    let actions: Vec<String> = sqlx::query_scalar(
        "SELECT action FROM audit_log WHERE action LIKE 'org.webhook%' AND actor = 'ada@acme.example' ORDER BY id",
    )
    .fetch_all(&app.pool)
    .await
    .expect("audit");
    assert_eq!(
        actions,
        [
            "org.webhook_set",
            "org.webhook_secret_rotated",
            "org.webhook_removed"
        ]
    );
    assert_eq!(
        app.count("SELECT count(*) FROM audit_log WHERE detail LIKE '%whsec_%'")
            .await,
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_shows_the_delivery_lease_the_backlog_and_only_the_own_organizations_failures() {
    let app = webhook_app().await;
    let receiver = Receiver::start().await;
    receiver.fail_next.store(usize::MAX, Ordering::SeqCst);
    machines(&app, app.org.id, "j", 1).await;
    register(&app, &app.org.orders_token, &receiver.url()).await;
    reserve(&app, &app.org.token, "ORD-J").await;
    let worker = start_worker(&app);
    wait_for("a failed attempt", Duration::from_secs(30), || async {
        app.count("SELECT count(*) FROM webhook_attempts WHERE status = 500")
            .await
            >= 1
    })
    .await;
    let viewer = app.staff("vera@acme.example", "viewer").await;
    let (status, body) = viewer.page("/jobs").await;
    assert_eq!(status, 200);
    let doc = scraper::Html::parse_document(&body);
    let text = |sel: &str| {
        let s = scraper::Selector::parse(sel).expect("selector");
        doc.select(&s)
            .next()
            .map(|e| e.text().collect::<String>())
            .unwrap_or_default()
    };
    assert!(
        text("#webhooks-lease").contains(&app.settings.replica),
        "{body}"
    );
    assert!(
        text("#webhooks-backlog").contains("Pending1"),
        "{}",
        text("#webhooks-backlog")
    );
    assert!(text("#webhooks-failures").contains("HTTP 500"), "{body}");
    stop_worker(worker).await;
    // The other organization's staff see the lease and the counts, never
    // acme's failures (they carry its URL).
    app.create_staff(app.other.id, "root@other.example", "admin")
        .await;
    let other = app.logged_in("root@other.example").await;
    let (_, body) = other.page("/jobs").await;
    assert!(body.contains("webhooks-backlog"));
    assert!(
        !body.contains("HTTP 500") && !body.contains(&receiver.url()),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_outbox_row_commits_or_rolls_back_with_its_event() {
    let app = webhook_app().await;
    register(
        &app,
        &app.org.orders_token,
        "http://127.0.0.1:9/never-called",
    )
    .await;
    FakeMachine::new()
        .tag("tx-1")
        .profile("r650")
        .create(&app.pool, app.org.id)
        .await;
    let id = FakeHold::on("tx-1")
        .order("ORD-TX")
        .create(&app.pool, app.org.id)
        .await;
    let mut writer = app.db.connection().await;
    for outcome in ["ROLLBACK", "COMMIT"] {
        sqlx::query("BEGIN")
            .execute(&mut writer)
            .await
            .expect("begin");
        sqlx::query(
            "INSERT INTO reservation_events (reservation_id, kind, from_state, to_state, actor)
             VALUES ($1, 'cancelled', 'held', 'cancelled', 'tx-test')",
        )
        .bind(id)
        .execute(&mut writer)
        .await
        .expect("event");
        let inside: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM webhook_deliveries d JOIN reservation_events e ON e.id = d.event_id
              WHERE e.actor = 'tx-test'",
        )
        .fetch_one(&mut writer)
        .await
        .expect("count inside");
        assert_eq!(inside, 1, "written by the event's own statement");
        assert_eq!(
            app.count(
                "SELECT count(*) FROM webhook_deliveries d JOIN reservation_events e ON e.id = d.event_id
                  WHERE e.actor = 'tx-test'"
            )
            .await,
            0,
            "invisible outside before {outcome}"
        );
        sqlx::query(outcome)
            .execute(&mut writer)
            .await
            .expect("end");
    }
    assert_eq!(
        app.count(
            "SELECT count(*) FROM webhook_deliveries d JOIN reservation_events e ON e.id = d.event_id
              WHERE e.actor = 'tx-test'"
        )
        .await,
        1,
        "the rolled-back event left no delivery, the committed one did"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_that_keeps_failing_is_given_up_after_the_retry_window() {
    let app = spawn_app_with(|s| {
        s.webhook_allow_private = true;
        s.webhook_poll = Duration::from_millis(20);
        s.webhook_backoff_base = Duration::from_millis(20);
        s.webhook_lease_duration = Duration::from_secs(5);
        s.webhook_give_up = Duration::from_millis(500);
    })
    .await;
    let receiver = Receiver::start().await;
    receiver.fail_next.store(usize::MAX, Ordering::SeqCst);
    machines(&app, app.org.id, "gu", 1).await;
    register(&app, &app.org.orders_token, &receiver.url()).await;
    reserve(&app, &app.org.token, "ORD-GU").await;
    step_until(
        &app.pool,
        &app.settings,
        "the delivery given up",
        || async {
            app.count("SELECT count(*) FROM webhook_deliveries WHERE state = 'failed'")
                .await
                == 1
        },
    )
    .await;
    let attempts = app.count("SELECT count(*) FROM webhook_attempts").await;
    step(&app.pool, &app.settings).await;
    assert!(attempts >= 2, "retried before giving up: {attempts}");
    // Given up after the window, by the database clock; nothing after it
    // (the last attempt is the one that gave up).
    let late: bool = sqlx::query_scalar(
        "SELECT finished_at >= created_at + interval '500 milliseconds' FROM webhook_deliveries",
    )
    .fetch_one(&app.pool)
    .await
    .expect("delivery");
    assert!(late);
    assert_eq!(
        app.count("SELECT count(*) FROM webhook_attempts").await,
        attempts,
        "no attempt once given up"
    );
    assert_eq!(receiver.requests().len() as i64, attempts);
}

/// Rows read from `webhook_deliveries` by the plan `p` (EXPLAIN ANALYZE,
/// JSON): kept and filtered out, over every loop, and whether the poll's
/// index was used.
fn deliveries_read(p: &Value, rows: &mut f64, on_index: &mut bool) {
    if p["Relation Name"] == "webhook_deliveries" {
        let loops = p["Actual Loops"].as_f64().unwrap_or(1.0);
        let kept = p["Actual Rows"].as_f64().unwrap_or(0.0);
        let removed = p["Rows Removed by Filter"].as_f64().unwrap_or(0.0)
            + p["Rows Removed by Index Recheck"].as_f64().unwrap_or(0.0);
        *rows += (kept + removed) * loops;
        *on_index |= p["Index Name"] == "webhook_deliveries_due_by_org_idx";
    }
    for child in p["Plans"].as_array().into_iter().flatten() {
        deliveries_read(child, rows, on_index);
    }
}

/// The poll reads a page per organization, not the backlog: 40,000
/// deliveries of one organization (two events of each reservation, the
/// second waiting for the first) and 5,000 of another waiting out a
/// backoff. In the plan made for the values and in the generic plan a
/// prepared statement settles on, it reads a few dozen rows; and it finds
/// what is due, in order, one event per reservation.
#[tokio::test]
async fn the_poll_reads_one_page_per_organization_whatever_the_backlog() {
    let app = webhook_app().await;
    let other = crate::helpers::create_org(&app.pool, "backoff", false).await;
    // The planner first knows the outbox as a fresh deployment's autovacuum
    // last saw it: empty. The worker must not wait for statistics to keep up.
    for sql in [
        "ALTER TABLE webhook_deliveries SET (autovacuum_enabled = false)",
        "ANALYZE webhook_deliveries",
    ] {
        sqlx::query(sql).execute(&app.pool).await.expect(sql);
    }
    for (org, tag) in [(app.org.id, "wb-a-1"), (other.id, "wb-b-1")] {
        FakeMachine::new()
            .tag(tag)
            .profile("r650")
            .create(&app.pool, org)
            .await;
    }
    let mut tx = app.pool.begin().await.expect("begin");
    for org in [app.org.id, other.id] {
        sqlx::query(
            "INSERT INTO webhooks (org_id, url, secret, updated_by)
             VALUES ($1, 'http://127.0.0.1:9/never-called', repeat('s', 32), 'test')",
        )
        .bind(org)
        .execute(&mut *tx)
        .await
        .expect("webhook");
    }
    // History: converted reservations, each with its two events in one
    // statement, so the outbox interleaves them.
    for (org, n) in [(app.org.id, 20_000_i64), (other.id, 5_003)] {
        sqlx::query(CONVERTED_HISTORY_SQL)
            .bind(org)
            .bind(n)
            .bind("WB-")
            .execute(&mut *tx)
            .await
            .expect("history");
    }
    // The other organization's endpoint is failing: all but three of its
    // reservations wait out a backoff.
    sqlx::query(
        "UPDATE webhook_deliveries SET next_attempt_at = clock_timestamp() + interval '1 hour', attempts = 5
          WHERE org_id = $1
            AND reservation_id NOT IN (SELECT id FROM reservations WHERE org_id = $1 ORDER BY id LIMIT 3)",
    )
    .bind(other.id)
    .execute(&mut *tx)
    .await
    .expect("backoff");
    tx.commit().await.expect("commit");
    assert_eq!(
        app.count("SELECT count(*) FROM webhook_deliveries WHERE state = 'pending'")
            .await,
        50_006
    );

    let mut conn = app.pool.acquire().await.expect("connection");
    for (stats, mode) in [
        ("empty", "force_custom_plan"),
        ("empty", "force_generic_plan"),
        ("fresh", "force_custom_plan"),
        ("fresh", "force_generic_plan"),
    ] {
        if stats == "fresh" {
            sqlx::query("ANALYZE")
                .execute(&mut *conn)
                .await
                .expect("analyze");
        }
        sqlx::query(sqlx::AssertSqlSafe(format!("SET plan_cache_mode = {mode}")))
            .execute(&mut *conn)
            .await
            .expect("plan mode");
        let plan: Value = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "EXPLAIN (ANALYZE, FORMAT JSON) {}",
            poolkeeper::webhooks::DUE_SQL
        )))
        .bind(Vec::<i64>::new())
        .bind(8_i64)
        .bind(72_i64)
        .fetch_one(&mut *conn)
        .await
        .expect("explain");
        let (mut rows, mut on_index) = (0.0, false);
        deliveries_read(&plan[0]["Plan"], &mut rows, &mut on_index);
        eprintln!(
            "statistics {stats}, {mode}: {rows} rows read in {} ms",
            plan[0]["Execution Time"]
        );
        assert!(
            on_index && rows <= 200.0,
            "statistics {stats}, {mode}: {rows} rows of webhook_deliveries read, on the poll's index: {on_index}\n{plan:#}"
        );
    }

    let due = poolkeeper::webhooks::due(&app.pool, &[], 8, 72)
        .await
        .expect("due");
    let of = |org: i64| -> Vec<&poolkeeper::webhooks::Due> {
        due.iter().filter(|d| d.org_id == org).collect()
    };
    let (first, second) = (of(app.org.id), of(other.id));
    assert_eq!(first.len(), 8, "a page of the first: {due:?}");
    assert_eq!(second.len(), 3, "the second's three due: {due:?}");
    for page in [&first, &second] {
        let reservations: BTreeSet<i64> = page.iter().map(|d| d.reservation_id).collect();
        assert_eq!(reservations.len(), page.len(), "one event per reservation");
        assert!(
            page.iter()
                .all(|d| d.body.contains("\"reservation.created\"")),
            "the first event of each, never the second ahead of it: {page:?}"
        );
        assert!(
            page.windows(2).all(|w| w[0].event_id < w[1].event_id),
            "in order: {page:?}"
        );
    }
    // A delivery in flight is left out: the next one in order comes instead.
    let skip = vec![first[0].id];
    let due = poolkeeper::webhooks::due(&app.pool, &skip, 8, 72)
        .await
        .expect("due");
    assert!(due.iter().all(|d| d.id != first[0].id));
    assert_eq!(due.iter().filter(|d| d.org_id == app.org.id).count(), 8);
}
