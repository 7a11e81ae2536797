//! F3 for every write of the API and the dashboard, at the commit: each write route of the
//! published document is sent while its commit waits for a synchronous
//! standby that never answers, and its backend is terminated in that wait
//! (as a leader's shutdown or a failover does). The commit is then durable
//! locally but was never acknowledged: the answer must be `503
//! outcome_unknown` with Retry-After, and the same request retried must
//! answer what happened (here: it had happened, so every retry is a
//! replay). `writes.rs` does the same with the statement waiting before
//! its commit (nothing happened). A write route of the document without a
//! case here fails the test. The same for every form of the dashboard: its
//! page must say the change may have been made and where to see it.

use std::collections::BTreeSet;
use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};
use sqlx::Connection;

use poolkeeper::metrics::Metrics;
use poolkeeper::startup::{AppState, Application};

use crate::helpers::{FakeHold, FakeMachine};
use crate::helpers::{STAFF_PASSWORD, StaffClient, TestApp, spawn_app_with};

/// No standby of this name ever connects: a commit that waits for it
/// waits until its session ends.
const NEVER: &str = "poolkeeper_test_never_attached";

/// One write of the API, and what its retry must answer.
struct Case {
    method: Method,
    /// The document's path template, and the path sent.
    template: &'static str,
    path: String,
    body: Option<Value>,
    /// The status of the retry, and a check of its body.
    retry_status: u16,
}

async fn send(
    app_address: &str,
    token: &str,
    method: Method,
    path: &str,
    body: &Option<Value>,
) -> reqwest::Response {
    let client = reqwest::Client::new();
    let mut req = client
        .request(method, format!("{app_address}{path}"))
        .bearer_auth(token);
    if let Some(b) = body {
        req = req.json(b);
    }
    req.send().await.expect("an answer")
}

fn named_first(order: &Value) -> Value {
    match order.get("reservations") {
        Some(rs) => rs[0].clone(),
        None => order.clone(),
    }
}

async fn json_of(resp: reqwest::Response) -> (u16, Value) {
    let status = resp.status().as_u16();
    let body = resp.json().await.unwrap_or(Value::Null);
    (status, body)
}

/// The cluster waits for a standby named `NEVER` whenever a session asks
/// for synchronous commit (the test cluster's default is off, so no other
/// test waits). Waits until a new session sees the setting.
async fn require_a_standby(app: &TestApp) {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "ALTER SYSTEM SET synchronous_standby_names = '{NEVER}'"
    )))
    .execute(&app.pool)
    .await
    .expect("ALTER SYSTEM (the test cluster's role is a superuser)");
    sqlx::query("SELECT pg_reload_conf()")
        .execute(&app.pool)
        .await
        .expect("reload");
    // The setting reaches the sessions, and the flag that makes commits
    // wait, some time after the reload: probe with a commit that asks for
    // a standby until one waits (a commit that wrote no WAL never waits,
    // hence the insert).
    sqlx::query("CREATE TABLE standby_probe (at timestamptz)")
        .execute(&app.pool)
        .await
        .expect("probe table");
    let synchronous = app
        .db
        .options
        .clone()
        .options([("synchronous_commit", "on")]);
    for _ in 0..10_000 {
        let mut conn = sqlx::PgConnection::connect_with(&synchronous)
            .await
            .expect("probe connection");
        let probe = tokio::spawn(async move {
            let _ = sqlx::query("INSERT INTO standby_probe VALUES (clock_timestamp())")
                .execute(&mut conn)
                .await;
        });
        while !probe.is_finished() {
            let waiting: Option<i32> = sqlx::query_scalar(
                "SELECT pid FROM pg_stat_activity
                  WHERE datname = current_database() AND wait_event = 'SyncRep'",
            )
            .fetch_optional(&app.pool)
            .await
            .expect("pg_stat_activity");
            if let Some(pid) = waiting {
                sqlx::query("SELECT pg_terminate_backend($1)")
                    .bind(pid)
                    .execute(&app.pool)
                    .await
                    .expect("terminate the probe");
                let _ = probe.await;
                return;
            }
            tokio::task::yield_now().await;
        }
    }
    panic!("no commit ever waited for the standby: synchronous_standby_names not taken");
}

/// A second server on the same database whose sessions commit
/// synchronously: each of its commits waits for the missing standby.
async fn waiting_server(app: &TestApp) -> String {
    let options = app
        .db
        .options
        .clone()
        .options([("synchronous_commit", "on")]);
    let pool = poolkeeper::db::connect(options, 4)
        .await
        .expect("the waiting server's pool");
    let server = Application::build(AppState::new(app.settings.clone(), pool, Metrics::new()))
        .expect("build the waiting server");
    let address = format!("http://127.0.0.1:{}", server.port());
    tokio::spawn(server.run_until_stopped());
    address
}

/// Terminates the session whose commit waits for the standby, once there
/// is one, and says which statement it was.
async fn terminate_the_waiting_commit<T>(
    app: &TestApp,
    request: &tokio::task::JoinHandle<T>,
) -> String {
    let deadline = tokio::time::Instant::now() + crate::helpers::POLL_BOUND;
    while !request.is_finished() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "waited {:?} for a commit waiting on the standby (SyncRep), and the request still runs",
            crate::helpers::POLL_BOUND
        );
        let waiting: Option<(i32, String)> = sqlx::query_as(
            "SELECT pid, query FROM pg_stat_activity
              WHERE datname = current_database() AND wait_event = 'SyncRep'",
        )
        .fetch_optional(&app.pool)
        .await
        .expect("pg_stat_activity");
        if let Some((pid, first)) = waiting {
            // pg_stat_activity reads `query` from a snapshot taken as the
            // statement starts and `wait_event` live, so a backend that
            // entered its commit meanwhile shows its previous statement.
            // Read again: it still waits (the standby never answers), and
            // the new snapshot names what it waits in.
            let query: String = sqlx::query_scalar(
                "SELECT query FROM pg_stat_activity WHERE pid = $1 AND wait_event = 'SyncRep'",
            )
            .bind(pid)
            .fetch_optional(&app.pool)
            .await
            .expect("pg_stat_activity")
            .unwrap_or(first);
            let done: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
                .bind(pid)
                .fetch_one(&app.pool)
                .await
                .expect("terminate");
            assert!(done, "terminate {pid}");
            return query;
        }
        tokio::task::yield_now().await;
    }
    String::new()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_write_whose_commit_is_lost_answers_outcome_unknown_and_its_retry_replays() {
    let app = spawn_app_with(|s| s.webhook_allow_private = true).await;
    let token = app.org.token.clone();
    // A second profile, retired: what a declaration of substitutes names.
    FakeMachine::new()
        .tag("RT-BIG")
        .profile("epyc-big")
        .status("retired")
        .create(&app.pool, app.org.id)
        .await;
    for tag in [
        "RT-1", "RT-2", "RT-3", "RT-4", "RT-5", "RT-6", "RT-7", "RT-8", "RT-9", "RT-10", "RT-11",
        "RT-12",
    ] {
        FakeMachine::new()
            .tag(tag)
            .profile("epyc")
            .create(&app.pool, app.org.id)
            .await;
    }
    // Reservations to act on, made on the ordinary server.
    let reserve = async |order: &str, quantity: i64| -> Value {
        let (status, body) = json_of(
            send(
                &app.address,
                &token,
                Method::POST,
                "/api/v1/reservations",
                &Some(json!({"order_ref": order, "site": "par1", "profile": "epyc", "quantity": quantity})),
            )
            .await,
        )
        .await;
        assert_eq!(status, 201, "{body}");
        body
    };
    let one = |b: &Value| {
        (
            b["id"].as_i64().unwrap_or(0),
            b["fence"].as_i64().unwrap_or(0),
        )
    };
    // An order of one answers as its reservation, an order of several
    // with its reservations.
    let named = |b: &Value| -> Vec<Value> {
        b["reservations"]
            .as_array()
            .cloned()
            .unwrap_or_else(|| vec![b.clone()])
            .iter()
            .map(|r| json!({"id": r["id"], "fence": r["fence"]}))
            .collect()
    };
    let to_convert = reserve("RT-CONVERT", 1).await;
    let to_cancel = reserve("RT-CANCEL", 1).await;
    let to_extend = reserve("RT-EXTEND", 1).await;
    let order_convert = reserve("RT-ORDER-CONVERT", 2).await;
    let order_cancel = reserve("RT-ORDER-CANCEL", 1).await;
    let to_end = reserve("RT-END", 1).await;
    let to_move = reserve("RT-MOVE", 1).await;
    let moving_tag = to_move["machine"]["asset_tag"].clone();
    let (end_id, end_fence) = one(&to_end);
    let (status, converted) = json_of(
        send(
            &app.address,
            &token,
            Method::POST,
            &format!("/api/v1/reservations/{end_id}/convert"),
            &Some(json!({"fence": end_fence, "service_ref": "SRV-RT-END"})),
        )
        .await,
    )
    .await;
    assert_eq!(status, 200, "{converted}");
    let service = converted["service"]["id"].as_i64().unwrap_or(0);
    let until = |b: &Value| -> String {
        let at = chrono::DateTime::parse_from_rfc3339(b["expires_at"].as_str().unwrap_or(""))
            .expect("expires_at");
        (at + chrono::Duration::seconds(600)).to_rfc3339()
    };
    let (c_id, c_fence) = one(&to_convert);
    let (x_id, x_fence) = one(&to_cancel);
    let (e_id, e_fence) = one(&to_extend);
    let e_until = until(&to_extend);
    let order_until = until(&order_cancel);
    let mut order_convert_body = named(&order_convert);
    for (i, r) in order_convert_body.iter_mut().enumerate() {
        r["service_ref"] = json!(format!("SRV-RT-O{i}"));
    }

    let cases = vec![
        Case {
            method: Method::PUT,
            template: "/api/v1/machines/{asset_tag}",
            path: "/api/v1/machines/RT-NEW".into(),
            body: Some(
                json!({"site": "par1", "vendor": "dell", "profile": "epyc", "status": "maintenance"}),
            ),
            retry_status: 200,
        },
        Case {
            method: Method::POST,
            template: "/api/v1/reservations",
            path: "/api/v1/reservations".into(),
            body: Some(json!({"order_ref": "RT-NEW", "site": "par1", "profile": "epyc"})),
            retry_status: 200,
        },
        Case {
            method: Method::POST,
            template: "/api/v1/reservations/{id}/convert",
            path: format!("/api/v1/reservations/{c_id}/convert"),
            body: Some(json!({"fence": c_fence, "service_ref": "SRV-RT-1"})),
            retry_status: 200,
        },
        Case {
            method: Method::POST,
            template: "/api/v1/reservations/{id}/cancel",
            path: format!("/api/v1/reservations/{x_id}/cancel"),
            body: Some(json!({"fence": x_fence, "reason": "the customer left"})),
            retry_status: 200,
        },
        Case {
            method: Method::POST,
            template: "/api/v1/reservations/{id}/extend",
            path: format!("/api/v1/reservations/{e_id}/extend"),
            body: Some(json!({"fence": e_fence, "until": e_until})),
            retry_status: 200,
        },
        Case {
            method: Method::POST,
            template: "/api/v1/orders/{order_ref}/convert",
            path: "/api/v1/orders/RT-ORDER-CONVERT/convert".into(),
            body: Some(json!({"reservations": order_convert_body})),
            retry_status: 200,
        },
        Case {
            method: Method::POST,
            template: "/api/v1/orders/{order_ref}/extend",
            path: "/api/v1/orders/RT-ORDER-CANCEL/extend".into(),
            body: Some(json!({"reservations": named(&order_cancel), "until": order_until})),
            retry_status: 200,
        },
        Case {
            method: Method::POST,
            template: "/api/v1/orders/{order_ref}/cancel",
            path: "/api/v1/orders/RT-ORDER-CANCEL/cancel".into(),
            body: Some(json!({"reservations": named(&order_cancel), "reason": "payment declined"})),
            retry_status: 200,
        },
        Case {
            method: Method::POST,
            template: "/api/v1/services/{id}/end",
            path: format!("/api/v1/services/{service}/end"),
            body: None,
            // F3: the same end again answers the service as it left it.
            retry_status: 200,
        },
        Case {
            method: Method::PUT,
            template: "/api/v1/webhook",
            path: "/api/v1/webhook".into(),
            body: Some(json!({"url": "http://127.0.0.1:9/poolkeeper"})),
            retry_status: 200,
        },
        // The webhook is gone: the retry says there is none.
        Case {
            method: Method::DELETE,
            template: "/api/v1/webhook",
            path: "/api/v1/webhook".into(),
            body: None,
            retry_status: 404,
        },
        // The headroom is kept: the retry answers the same row, and writes
        // nothing again.
        Case {
            method: Method::PUT,
            template: "/api/v1/headroom",
            path: "/api/v1/headroom".into(),
            body: Some(
                json!({"site": "par1", "profile": "epyc", "segment": "enterprise", "machines": 2}),
            ),
            retry_status: 200,
        },
        // The declaration is kept: the retry answers the same row, and
        // writes nothing again.
        Case {
            method: Method::PUT,
            template: "/api/v1/substitutes",
            path: "/api/v1/substitutes".into(),
            body: Some(json!({"profile": "epyc", "substitutes": ["epyc-big"]})),
            retry_status: 200,
        },
        // The machine is in maintenance and the hold has moved: the retry
        // answers the machine as it is, and moves nothing again.
        Case {
            method: Method::POST,
            template: "/api/v1/status-changes",
            path: "/api/v1/status-changes".into(),
            body: Some(json!({"asset_tags": [moving_tag], "status": "maintenance"})),
            retry_status: 200,
        },
    ];

    // Every write route of the document has its case.
    let writes = crate::writes::write_operations(&app).await;
    let covered: BTreeSet<(String, String)> = cases
        .iter()
        .map(|c| (c.template.to_owned(), c.method.as_str().to_lowercase()))
        .collect();
    assert_eq!(
        writes, covered,
        "every write route of the document is killed mid-commit here: add a case"
    );

    while_commits_can_wait(&app, async {
        let waiting = waiting_server(&app).await;
        for case in &cases {
            let what = format!("{} {}", case.method, case.path);
            let request = {
                let (waiting, token, method, path, body) = (
                    waiting.clone(),
                    token.clone(),
                    case.method.clone(),
                    case.path.clone(),
                    case.body.clone(),
                );
                tokio::spawn(async move {
                    json_of(send(&waiting, &token, method, &path, &body).await).await
                })
            };
            let statement = terminate_the_waiting_commit(&app, &request).await;
            let (status, body) = tokio::time::timeout(Duration::from_secs(30), request)
                .await
                .expect("the request answers once its session is gone")
                .expect("the request task");
            assert_eq!(
                (status, body["error"].as_str()),
                (503, Some("outcome_unknown")),
                "{what} (its commit waited in {statement:?}): {body}"
            );
            // The same request on a server whose commits are acknowledged.
            let (retry_status, retried) = json_of(
                send(
                    &app.address,
                    &token,
                    case.method.clone(),
                    &case.path,
                    &case.body,
                )
                .await,
            )
            .await;
            assert_eq!(
                retry_status, case.retry_status,
                "the retry of {what}: {retried}"
            );
        }

        // What the retries said is what happened, once.
        let count = |sql: &'static str| app.count(sql);
        assert_eq!(
            count("SELECT count(*) FROM machines WHERE asset_tag = 'RT-NEW'").await,
            1
        );
        assert_eq!(
            count("SELECT count(*) FROM reservations WHERE order_ref = 'RT-NEW'").await,
            1
        );
        assert_eq!(app.state_of(c_id).await, "converted");
        assert_eq!(app.state_of(x_id).await, "cancelled");
        assert_eq!(
            count("SELECT count(*) FROM service_links WHERE service_ref LIKE 'SRV-RT-%'").await,
            4,
            "one link per conversion (RT-1, two of the order, RT-END)"
        );
        assert_eq!(
            count(
                "SELECT count(*) FROM reservations WHERE order_ref = 'RT-ORDER-CANCEL' AND state = 'cancelled'"
            )
            .await,
            1
        );
        assert_eq!(
            count("SELECT count(*) FROM reservation_events WHERE kind = 'extended'").await,
            2,
            "each extension by until wrote once, its retry nothing"
        );
        assert_eq!(count("SELECT count(*) FROM webhooks").await, 0);
        assert_eq!(
            count("SELECT count(*) FROM headroom WHERE machines = 2").await,
            1
        );
        assert_eq!(
            count("SELECT count(*) FROM audit_log WHERE action = 'headroom.set'").await,
            1,
            "the headroom's retry audited nothing again"
        );
        assert_eq!(
            count("SELECT count(*) FROM audit_log WHERE action = 'substitutes.set'").await,
            1,
            "the declaration's retry audited nothing again"
        );
        assert_eq!(
            count(
                "SELECT count(*) FROM reservations r JOIN machines m ON m.id = r.machine_id
                  WHERE r.order_ref = 'RT-MOVE' AND r.state = 'held' AND m.status = 'ready'
                    AND (SELECT count(*) FROM reservation_events e
                          WHERE e.reservation_id = r.id AND e.kind = 'machine_replaced') = 1"
            )
            .await,
            1,
            "the hold moved once, to a ready machine"
        );
        // Each extension by until has the deadline its client was given.
        for (id, until) in [
            (e_id, &e_until),
            (one(&named_first(&order_cancel)).0, &order_until),
        ] {
            let same: bool = sqlx::query_scalar(
                "SELECT expires_at = $2::timestamptz FROM reservations WHERE id = $1",
            )
            .bind(id)
            .bind(until)
            .fetch_one(&app.pool)
            .await
            .expect("deadline");
            assert!(same, "reservation {id} holds until {until}");
        }
    })
    .await;
}

/// One test at a time sets the standby: the setting is the cluster's, and
/// one test's reset would end another's waits.
static STANDBY: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Runs `checks` while sessions that ask for synchronous commit wait for
/// the missing standby; the setting is the whole server's, so it is put
/// back even when a check fails (with DATABASE_URL, the server is not the
/// test's own).
async fn while_commits_can_wait(app: &TestApp, checks: impl std::future::Future<Output = ()>) {
    let _only_us = STANDBY.lock().await;
    require_a_standby(app).await;
    let outcome = futures_util::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(checks)).await;
    sqlx::query("ALTER SYSTEM RESET synchronous_standby_names")
        .execute(&app.pool)
        .await
        .expect("reset");
    sqlx::query("SELECT pg_reload_conf()")
        .execute(&app.pool)
        .await
        .expect("reload");
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

/// One form of the dashboard, posted while its commit waits.
struct Form {
    /// Names the form in a failure.
    name: &'static str,
    /// Its route in `dashboard::ROUTES`.
    route: &'static str,
    path: String,
    fields: Vec<(&'static str, String)>,
    /// Posted by a browser of its own that logs in on the waiting server
    /// (the login form), or by a session of this user.
    by: &'static str,
    /// The page that shows whether it was made: a link of the answer and
    /// its words.
    check: (&'static str, &'static str),
    /// Words the answer must say besides the common ones.
    says: &'static str,
    /// SQL that is true once the write is in the database.
    written: String,
}

/// F3 for every dashboard write: each form of `dashboard::ROUTES` that
/// writes is posted to a server whose commits wait for a synchronous
/// standby that never attaches, and its backend is terminated in that
/// wait. The commit is durable locally but was never acknowledged: the
/// page must be `503` with Retry-After saying the change may or may not
/// have been made, what it was and which page shows it (a link), never
/// "nothing was changed"; and the write is indeed in the database. A
/// dashboard POST route without a row fails the test.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_dashboard_write_whose_commit_is_lost_says_it_may_have_been_made() {
    let app = spawn_app_with(|s| s.webhook_allow_private = true).await;
    for tag in ["DL-1", "DL-2", "DL-3", "DL-4"] {
        FakeMachine::new()
            .tag(tag)
            .profile("epyc")
            .create(&app.pool, app.org.id)
            .await;
    }
    // A second profile, retired: what a declaration of substitutes names.
    FakeMachine::new()
        .tag("DL-BIG")
        .profile("epyc-big")
        .status("retired")
        .create(&app.pool, app.org.id)
        .await;
    let (to_cancel, cancel_fence) = FakeHold::on("DL-1")
        .order("DL-CANCEL")
        .create_with_fence(&app.pool, app.org.id)
        .await;
    let (to_convert, convert_fence) = FakeHold::on("DL-2")
        .order("DL-CONVERT")
        .create_with_fence(&app.pool, app.org.id)
        .await;
    let (to_extend, extend_fence) = FakeHold::on("DL-3")
        .order("DL-EXTEND")
        .create_with_fence(&app.pool, app.org.id)
        .await;
    let admin = app.staff("boss@acme.example", "admin").await;
    for (email, role) in [
        ("late@acme.example", "support"),
        ("leaving@acme.example", "support"),
        ("gone@acme.example", "support"),
    ] {
        app.create_staff(app.org.id, email, role).await;
    }
    let leaving = app.logged_in("leaving@acme.example").await;
    let gone: i64 = sqlx::query_scalar("SELECT id FROM users WHERE email = 'gone@acme.example'")
        .fetch_one(&app.pool)
        .await
        .expect("user");
    let (old_token, _) = poolkeeper::tokens::create(
        &app.pool,
        app.org.id,
        Some("old-token"),
        &[poolkeeper::domain::Scope::Orders],
    )
    .await
    .expect("token");
    let old_token: i64 = sqlx::query_scalar("SELECT id FROM api_tokens WHERE name = $1")
        .bind(&old_token)
        .fetch_one(&app.pool)
        .await
        .expect("token id");
    // A webhook to rotate, change and remove, set through its form.
    let csrf = admin.csrf().await;
    let r = admin
        .post_form(
            "/settings/webhook",
            &[
                ("csrf", &csrf),
                ("action", "save"),
                ("url", "http://127.0.0.1:9/first"),
            ],
        )
        .await;
    assert_eq!(r.status().as_u16(), 303, "the webhook is set");
    let secret: String = sqlx::query_scalar("SELECT secret FROM webhooks WHERE org_id = $1")
        .bind(app.org.id)
        .fetch_one(&app.pool)
        .await
        .expect("secret");
    let leaving_csrf = leaving.csrf().await;
    let org = app.org.id;

    let c = || ("csrf", csrf.clone());
    let forms = vec![
        Form {
            name: "login",
            route: "/login",
            path: "/login".into(),
            fields: vec![],
            by: "late@acme.example",
            check: ("/login", "Log in"),
            says: "not logged in",
            written: "(SELECT count(*) FROM sessions s JOIN users u ON u.id = s.user_id
                        WHERE u.email = 'late@acme.example') = 1
                      AND (SELECT count(*) FROM audit_log
                            WHERE action = 'login' AND actor = 'late@acme.example') = 1"
                .into(),
        },
        Form {
            name: "reservation: cancel",
            route: "/reservations/{id}/cancel",
            path: format!("/reservations/{to_cancel}/cancel"),
            fields: vec![
                c(),
                ("fence", cancel_fence.to_string()),
                ("reason", "customer left".into()),
            ],
            by: "boss@acme.example",
            check: ("/reservations/{id}/cancel", "Do the same again"),
            says: "the cancellation of reservation",
            written: format!(
                "(SELECT state FROM reservations WHERE id = {to_cancel}) = 'cancelled'"
            ),
        },
        Form {
            name: "reservation: convert",
            route: "/reservations/{id}/convert",
            path: format!("/reservations/{to_convert}/convert"),
            fields: vec![
                c(),
                ("fence", convert_fence.to_string()),
                ("service_ref", "SRV-DL-1".into()),
            ],
            by: "boss@acme.example",
            check: ("/reservations/{id}/convert", "Do the same again"),
            says: "the conversion of reservation",
            written: format!(
                "(SELECT state FROM reservations WHERE id = {to_convert}) = 'converted'"
            ),
        },
        Form {
            name: "reservation: extend",
            route: "/reservations/{id}/extend",
            path: format!("/reservations/{to_extend}/extend"),
            fields: vec![
                c(),
                ("fence", extend_fence.to_string()),
                ("minutes", "30".into()),
                ("reason", "payment pending".into()),
            ],
            by: "boss@acme.example",
            check: ("/reservations/{id}/extend", "Do the same again"),
            says: "the extension of reservation",
            written: format!(
                "(SELECT count(*) FROM reservation_events
                   WHERE reservation_id = {to_extend} AND kind = 'extended') = 1"
            ),
        },
        Form {
            name: "status change",
            route: "/status-changes",
            path: "/status-changes".into(),
            fields: vec![
                c(),
                ("tags", "DL-4".into()),
                ("status", "maintenance".into()),
            ],
            by: "boss@acme.example",
            check: (
                "/status-changes?tags=DL-4&#38;status=maintenance",
                "Review the change again",
            ),
            says: "the status change of DL-4",
            written: "(SELECT status FROM machines WHERE asset_tag = 'DL-4') = 'maintenance'"
                .into(),
        },
        Form {
            name: "settings: webhook secret rotation",
            route: "/settings/webhook",
            path: "/settings/webhook".into(),
            fields: vec![c(), ("action", "rotate".into())],
            by: "boss@acme.example",
            check: ("/settings", "Open the settings"),
            says: "give the new secret to your receivers",
            written: format!(
                "(SELECT secret FROM webhooks WHERE org_id = {org}) <> '{secret}'
                 AND (SELECT count(*) FROM audit_log
                       WHERE action = 'org.webhook_secret_rotated') = 1"
            ),
        },
        Form {
            name: "settings: webhook URL",
            route: "/settings/webhook",
            path: "/settings/webhook".into(),
            fields: vec![
                c(),
                ("action", "save".into()),
                ("url", "http://127.0.0.1:9/second".into()),
            ],
            by: "boss@acme.example",
            check: ("/settings", "Open the settings"),
            says: "the webhook URL",
            written: format!(
                "(SELECT url FROM webhooks WHERE org_id = {org}) = 'http://127.0.0.1:9/second'"
            ),
        },
        Form {
            name: "settings: webhook removal",
            route: "/settings/webhook",
            path: "/settings/webhook".into(),
            fields: vec![c(), ("action", "remove".into())],
            by: "boss@acme.example",
            check: ("/settings", "Open the settings"),
            says: "the removal of the webhook",
            written: format!("NOT EXISTS (SELECT FROM webhooks WHERE org_id = {org})"),
        },
        Form {
            name: "settings: warning time",
            route: "/settings",
            path: "/settings".into(),
            fields: vec![
                c(),
                ("datacenter", "on".into()),
                ("expiry_warning_seconds", "123".into()),
            ],
            by: "boss@acme.example",
            check: ("/settings", "Open the settings"),
            says: "the datacenter switch",
            written: format!(
                "(SELECT expiry_warning_seconds FROM organizations WHERE id = {org}) = 123"
            ),
        },
        Form {
            name: "settings: customer cap and repairs segment",
            route: "/settings",
            path: "/settings".into(),
            fields: vec![
                c(),
                ("datacenter", "on".into()),
                ("customer_hold_limit", "7".into()),
                ("repairs_segment", "repairs".into()),
            ],
            by: "boss@acme.example",
            check: ("/settings", "Open the settings"),
            says: "the cap on one customer",
            written: format!(
                "(SELECT customer_hold_limit = 7 AND repairs_segment = 'repairs'
                    FROM organizations WHERE id = {org})
                 AND (SELECT count(*) FROM audit_log
                       WHERE action IN ('org.customer_hold_limit', 'org.repairs_segment')) = 2"
            ),
        },
        Form {
            name: "settings: headroom",
            route: "/settings/headroom",
            path: "/settings/headroom".into(),
            fields: vec![
                c(),
                ("site", "par1".into()),
                ("profile", "epyc".into()),
                ("segment", "enterprise".into()),
                ("machines", "2".into()),
            ],
            by: "boss@acme.example",
            check: ("/settings#headroom", "Open the settings"),
            says: "the headroom of the pool",
            written: format!(
                "(SELECT machines FROM headroom WHERE org_id = {org} AND site = 'par1'
                    AND profile = 'epyc' AND segment = 'enterprise') = 2
                 AND (SELECT count(*) FROM audit_log WHERE action = 'headroom.set') = 1"
            ),
        },
        Form {
            name: "settings: lead time",
            route: "/settings/lead-time",
            path: "/settings/lead-time".into(),
            fields: vec![c(), ("site", "par1".into()), ("days", "45".into())],
            by: "boss@acme.example",
            check: ("/settings#lead-times", "Open the settings"),
            says: "the lead time of the site",
            written: format!(
                "(SELECT lead_time_days FROM site_lead_times WHERE org_id = {org} AND site = 'par1') = 45
                 AND (SELECT count(*) FROM audit_log WHERE action = 'site.lead_time_set') = 1"
            ),
        },
        Form {
            name: "settings: substitutes",
            route: "/settings/substitutes",
            path: "/settings/substitutes".into(),
            fields: vec![
                c(),
                ("profile", "epyc".into()),
                ("substitutes", "epyc-big".into()),
                ("segments", "".into()),
            ],
            by: "boss@acme.example",
            check: ("/settings#substitutes", "Open the settings"),
            says: "the substitutes of the profile",
            written: format!(
                "(SELECT substitutes = ARRAY['epyc-big'] FROM substitutes WHERE org_id = {org}
                    AND profile = 'epyc')
                 AND (SELECT count(*) FROM audit_log WHERE action = 'substitutes.set') = 1"
            ),
        },
        Form {
            name: "users: add",
            route: "/users",
            path: "/users".into(),
            fields: vec![
                c(),
                ("email", "new@acme.example".into()),
                ("role", "viewer".into()),
                ("password", "a long enough password".into()),
            ],
            by: "boss@acme.example",
            check: ("/users", "Open the users page"),
            says: "the new user new@acme.example",
            written: "EXISTS (SELECT FROM users WHERE email = 'new@acme.example')".into(),
        },
        Form {
            name: "users: disable",
            route: "/users/{id}/disable",
            path: format!("/users/{gone}/disable"),
            fields: vec![c()],
            by: "boss@acme.example",
            check: ("/users", "Open the users page"),
            says: "the disabling of user gone@acme.example",
            written: format!("(SELECT disabled_at IS NOT NULL FROM users WHERE id = {gone})"),
        },
        Form {
            name: "tokens: create",
            route: "/tokens",
            path: "/tokens".into(),
            fields: vec![c(), ("name", "lost-token".into()), ("orders", "on".into())],
            by: "boss@acme.example",
            check: ("/tokens", "Open the tokens page"),
            says: "revoke it there",
            written:
                "EXISTS (SELECT FROM api_tokens WHERE name = 'lost-token' AND revoked_at IS NULL)"
                    .into(),
        },
        Form {
            name: "tokens: revoke",
            route: "/tokens/{id}/revoke",
            path: format!("/tokens/{old_token}/revoke"),
            fields: vec![c()],
            by: "boss@acme.example",
            check: ("/tokens", "Open the tokens page"),
            says: "the revocation of API token",
            written: format!(
                "(SELECT revoked_at IS NOT NULL FROM api_tokens WHERE id = {old_token})"
            ),
        },
        // After every form the datacenter module gates.
        Form {
            name: "settings: datacenter switch",
            route: "/settings",
            path: "/settings".into(),
            fields: vec![c()],
            by: "boss@acme.example",
            check: ("/settings", "Open the settings"),
            says: "the datacenter switch",
            written: format!(
                "NOT (SELECT datacenter_enabled FROM organizations WHERE id = {org})
                 AND (SELECT count(*) FROM audit_log
                       WHERE action = 'org.datacenter_enabled' AND detail = 'off') = 1"
            ),
        },
        // Last: it ends the session it is posted with.
        Form {
            name: "logout",
            route: "/logout",
            path: "/logout".into(),
            fields: vec![("csrf", leaving_csrf.clone())],
            by: "leaving@acme.example",
            check: ("/", "Open the overview"),
            says: "your logout",
            written: "NOT EXISTS (SELECT FROM sessions s JOIN users u ON u.id = s.user_id
                       WHERE u.email = 'leaving@acme.example' AND s.revoked_at IS NULL)"
                .into(),
        },
    ];

    // Every POST route of the dashboard has its row.
    let routes: BTreeSet<&str> = poolkeeper::dashboard::ROUTES
        .iter()
        .filter(|(_, methods)| methods.contains(&"post"))
        .map(|(path, _)| *path)
        .collect();
    let covered: BTreeSet<&str> = forms.iter().map(|f| f.route).collect();
    assert_eq!(
        routes, covered,
        "every dashboard form is killed mid-commit here: add a row"
    );

    while_commits_can_wait(&app, async {
        let waiting = waiting_server(&app).await;
        // The same sessions on the waiting server (a cookie is the host's,
        // whatever the port).
        let on_waiting = |c: &StaffClient| StaffClient {
            http: c.http.clone(),
            jar: c.jar.clone(),
            base: waiting.clone(),
        };
        for form in &forms {
            let name = form.name;
            // A session last seen over a minute ago is touched by the next
            // request's session check (session::touch_every), an
            // autocommit write that would wait for the standby before the
            // form's own commit, and be the one killed: on a slow run the
            // sessions made at the start are that old. Seen now, through
            // the ordinary pool, they are not touched on the waiting server.
            sqlx::query(
                "UPDATE sessions SET last_seen_at = clock_timestamp() WHERE revoked_at IS NULL",
            )
            .execute(&app.pool)
            .await
            .expect("sessions seen now");
            let request = {
                let fields = form.fields.clone();
                let path = form.path.clone();
                let client = match form.by {
                    "boss@acme.example" => on_waiting(&admin),
                    "leaving@acme.example" => on_waiting(&leaving),
                    _ => StaffClient::new(&waiting),
                };
                let login = (form.route == "/login").then_some(form.by);
                tokio::spawn(async move {
                    let resp = match login {
                        Some(email) => client.login(email, STAFF_PASSWORD).await,
                        None => client
                            .http
                            .post(client.url(&path))
                            .form(&fields)
                            .send()
                            .await
                            .expect("POST"),
                    };
                    let status = resp.status().as_u16();
                    let retry_after = resp.headers().contains_key("retry-after");
                    (status, retry_after, resp.text().await.unwrap_or_default())
                })
            };
            let statement = terminate_the_waiting_commit(&app, &request).await;
            let (status, retry_after, body) =
                tokio::time::timeout(Duration::from_secs(30), request)
                    .await
                    .expect("the form answers once its session is gone")
                    .expect("the request task");
            assert_eq!(
                statement, "COMMIT",
                "{name}: the session killed waited in its commit (if empty, the form \
                 answered {status} before any commit waited: {body})"
            );
            assert_eq!(status, 503, "{name}: {body}");
            assert!(retry_after, "{name}: Retry-After");
            assert!(
                body.contains("may or may not") && body.contains(form.says),
                "{name}: the page says what may have been written: {body}"
            );
            assert!(
                !body.contains("nothing was changed"),
                "{name}: never \"nothing was changed\": {body}"
            );
            let (href, words) = form.check;
            let href = href.replace("{id}", form.path.split('/').nth(2).unwrap_or(""));
            assert!(
                body.contains(&format!("<a href=\"{href}\">{words}</a>")),
                "{name}: a link to {href}: {body}"
            );
            let written: bool =
                sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT {}", form.written)))
                    .fetch_one(&app.pool)
                    .await
                    .unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(written, "{name}: the write is in the database");
        }
    })
    .await;
}
