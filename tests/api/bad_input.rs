//! Bad input everywhere (property-based): whatever the body, path or query,
//! the answer is a documented 2xx or a 4xx with a clear error, never a 5xx,
//! and nothing is written unless the answer says so.

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use serde_json::{Value, json};

use crate::helpers::{FakeHold, FakeMachine, InService};
use crate::helpers::{TestApp, spawn_app};

/// A runtime that outlives every proptest case, with the app inside it.
fn app_runtime() -> (tokio::runtime::Runtime, TestApp) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let app = rt.block_on(spawn_app());
    (rt, app)
}

/// Strings a client might send: valid labels, empty, huge, control
/// characters, unicode, SQL-ish.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[A-Za-z0-9._-]{1,64}",
        Just(String::new()),
        "[A-Za-z0-9]{65,300}",
        "\\PC{0,40}",
        "[\\x00-\\x1f]{1,5}",
        Just("'; DROP TABLE machines; --".to_owned()),
        Just("ready".to_owned()),
    ]
}

/// JSON values of every type.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        text().prop_map(Value::from),
    ];
    leaf.prop_recursive(2, 8, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            prop::collection::btree_map("[a-z_]{1,8}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A machine body whose fields are each either plausible or junk, and
/// sometimes missing or joined by an unknown field.
fn machine_body() -> impl Strategy<Value = Value> {
    let field = prop_oneof![
        6 => "[A-Za-z0-9._-]{1,64}".prop_map(Value::from),
        1 => text().prop_map(Value::from),
        1 => any_json(),
    ];
    let status = prop_oneof![
        3 => prop::sample::select(vec!["ready", "provisioning", "maintenance", "broken", "retired"]).prop_map(Value::from),
        1 => any_json(),
    ];
    (
        prop::option::weighted(0.9, field.clone()),
        prop::option::weighted(0.9, field.clone()),
        prop::option::weighted(0.9, field),
        prop::option::weighted(0.9, status),
        prop::option::weighted(0.1, any_json()),
    )
        .prop_map(|(site, vendor, profile, status, extra)| {
            let mut m = serde_json::Map::new();
            for (k, v) in [
                ("site", site),
                ("vendor", vendor),
                ("profile", profile),
                ("status", status),
                ("extra", extra),
            ] {
                if let Some(v) = v {
                    m.insert(k.to_owned(), v);
                }
            }
            Value::Object(m)
        })
}

fn is_label(v: &Value) -> bool {
    v.as_str()
        .is_some_and(|s| poolkeeper::domain::Site::parse(s).is_ok())
}

fn valid_machine(body: &Value) -> bool {
    let Some(o) = body.as_object() else {
        return false;
    };
    o.len() == 4
        && ["site", "vendor", "profile"]
            .iter()
            .all(|k| o.get(*k).is_some_and(is_label))
        && o.get("status")
            .and_then(Value::as_str)
            .is_some_and(|s| poolkeeper::domain::MachineStatus::parse(s).is_ok())
}

async fn machine_count(app: &TestApp) -> i64 {
    app.count("SELECT count(*) FROM machines").await
}

#[test]
fn machine_bodies_are_accepted_exactly_when_valid() {
    let (rt, app) = app_runtime();
    let mut runner = TestRunner::new(Config {
        cases: 96,
        ..Config::default()
    });
    let accepted = std::sync::atomic::AtomicUsize::new(0);
    runner
        .run(&machine_body(), |body| {
            rt.block_on(async {
                let before = machine_count(&app).await;
                let r = app
                    .http
                    .put(app.url("/api/v1/machines/PROP-1"))
                    .bearer_auth(&app.org.token)
                    .json(&body)
                    .send()
                    .await
                    .expect("request");
                let status = r.status().as_u16();
                let answer: Value = r.json().await.unwrap_or(Value::Null);
                if valid_machine(&body) {
                    prop_assert!(
                        status == 200 || status == 201,
                        "valid {body} got {status}: {answer}"
                    );
                    accepted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                } else {
                    prop_assert_eq!(status, 400, "invalid {} got {}: {}", body, status, answer);
                    prop_assert_eq!(&answer["error"], &json!("invalid"));
                    prop_assert_eq!(
                        machine_count(&app).await,
                        before,
                        "a refused body wrote nothing"
                    );
                }
                Ok(())
            })
        })
        .expect("property holds");
    // The generator must exercise both sides of the property.
    let accepted = accepted.into_inner();
    assert!(
        accepted > 0 && accepted < 96,
        "{accepted} of 96 bodies were valid"
    );
}

#[test]
fn raw_bytes_and_odd_paths_never_fail_the_server() {
    let (rt, app) = app_runtime();
    let mut runner = TestRunner::new(Config {
        cases: 96,
        ..Config::default()
    });
    let case = (prop::collection::vec(any::<u8>(), 0..200), "\\PC{0,70}");
    runner
        .run(&case, |(bytes, tag)| {
            rt.block_on(async {
                let before = machine_count(&app).await;
                let path: String = tag.bytes().map(|b| format!("%{b:02X}")).collect();
                let r = app
                    .http
                    .put(app.url(&format!("/api/v1/machines/{path}")))
                    .bearer_auth(&app.org.token)
                    .header("content-type", "application/json")
                    .body(bytes)
                    .send()
                    .await
                    .expect("request");
                let status = r.status().as_u16();
                prop_assert!((400..500).contains(&status), "got {}", status);
                prop_assert_eq!(machine_count(&app).await, before);
                Ok(())
            })
        })
        .expect("property holds");
}

#[test]
fn list_query_strings_are_200_or_400() {
    let (rt, app) = app_runtime();
    let mut runner = TestRunner::new(Config {
        cases: 96,
        ..Config::default()
    });
    let key = prop::sample::select(vec![
        "site", "vendor", "profile", "status", "after", "limit", "bogus",
    ]);
    let case = prop::collection::vec((key, "\\PC{0,30}"), 0..4);
    runner
        .run(&case, |pairs| {
            rt.block_on(async {
                let r = app
                    .http
                    .get(app.url("/api/v1/machines"))
                    .query(&pairs)
                    .bearer_auth(&app.org.token)
                    .send()
                    .await
                    .expect("request");
                let status = r.status().as_u16();
                prop_assert!(status == 200 || status == 400, "{:?} got {}", pairs, status);
                if status == 400 {
                    let v: Value = r.json().await.unwrap_or(Value::Null);
                    prop_assert_eq!(&v["error"], &json!("invalid"));
                }
                Ok(())
            })
        })
        .expect("property holds");
}

// ---------------------------------------------------------------------------
// The orders endpoints
// ---------------------------------------------------------------------------

/// A field that is usually a plausible label, sometimes junk of any type.
fn label_field(plausible: &'static str) -> impl Strategy<Value = Value> {
    prop_oneof![
        4 => Just(Value::from(plausible)),
        3 => "[A-Za-z0-9._-]{1,64}".prop_map(Value::from),
        2 => text().prop_map(Value::from),
        1 => "[A-Za-z0-9]{129,400}".prop_map(Value::from),
        1 => any_json(),
    ]
}

/// Whole numbers in and out of every range, and values of other types.
fn number_field(plausible: i64) -> impl Strategy<Value = Value> {
    prop_oneof![
        3 => Just(Value::from(plausible)),
        2 => (1i64..=86_400).prop_map(Value::from),
        2 => any::<i64>().prop_map(Value::from),
        1 => Just(json!(u64::MAX)),
        1 => Just(json!(0)),
        1 => Just(json!(86_401)),
        1 => Just(json!(1.5)),
        1 => Just(json!("5")),
        1 => any_json(),
    ]
}

/// An object of `fields` (each present with probability 0.9), sometimes
/// with an unknown field.
fn object(fields: Vec<(&'static str, BoxedStrategy<Value>)>) -> impl Strategy<Value = Value> {
    let parts: Vec<_> = fields
        .into_iter()
        .map(|(k, s)| prop::option::weighted(0.9, s).prop_map(move |v| (k, v)))
        .collect();
    (parts, prop::option::weighted(0.1, any_json())).prop_map(|(parts, extra)| {
        let mut m = serde_json::Map::new();
        for (k, v) in parts {
            if let Some(v) = v {
                m.insert(k.to_owned(), v);
            }
        }
        if let Some(extra) = extra {
            m.insert("extra".to_owned(), extra);
        }
        Value::Object(m)
    })
}

fn label_ok(v: Option<&Value>, max: usize) -> bool {
    v.and_then(Value::as_str).is_some_and(|s| {
        !s.is_empty()
            && s.len() <= max
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
    })
}

fn only_keys(o: &serde_json::Map<String, Value>, keys: &[&str]) -> bool {
    o.keys().all(|k| keys.contains(&k.as_str()))
}

fn valid_reserve(body: &Value) -> bool {
    let Some(o) = body.as_object() else {
        return false;
    };
    only_keys(
        o,
        &["order_ref", "site", "profile", "vendor", "hold_seconds"],
    ) && label_ok(o.get("order_ref"), 128)
        && label_ok(o.get("site"), 64)
        && label_ok(o.get("profile"), 64)
        && o.get("vendor")
            .is_none_or(|v| v.is_null() || label_ok(Some(v), 64))
        && o.get("hold_seconds").is_none_or(|v| {
            // R14: up to the deployment's cap on a hold (test settings: the default).
            let cap = i64::from(poolkeeper::settings::Settings::defaults().hold_max_seconds);
            v.is_null() || whole(v).is_some_and(|n| (1..=cap).contains(&n))
        })
}

/// A JSON number that is a whole int64, in any of its forms (227 or 227.0).
fn whole(v: &Value) -> Option<i64> {
    v.as_i64().or_else(|| {
        v.as_f64()
            .filter(|f| {
                f.fract() == 0.0
                    && (-9.223_372_036_854_776e18..9.223_372_036_854_776e18).contains(f)
            })
            .map(|f| f as i64)
    })
}

fn valid_convert(body: &Value) -> bool {
    let Some(o) = body.as_object() else {
        return false;
    };
    o.len() == 2
        && o.get("fence").is_some_and(|v| whole(v).is_some())
        && label_ok(o.get("service_ref"), 128)
}

fn valid_cancel(body: &Value) -> bool {
    let Some(o) = body.as_object() else {
        return false;
    };
    o.len() == 2
        && o.get("fence").is_some_and(|v| whole(v).is_some())
        && o.get("reason").and_then(Value::as_str).is_some_and(|r| {
            r.chars().count() <= 500 && poolkeeper::reservations::check_reason(r).is_ok()
        })
}

/// A path segment: the real id, other numbers, or anything at all.
fn id_segment(real: i64) -> impl Strategy<Value = String> {
    prop_oneof![
        4 => Just(real.to_string()),
        2 => any::<i64>().prop_map(|n| n.to_string()),
        1 => Just("99999999999999999999999".to_owned()),
        1 => Just("-1".to_owned()),
        1 => Just("1.0".to_owned()),
        2 => "\\PC{1,40}".prop_map(|s| s.bytes().map(|b| format!("%{b:02X}")).collect()),
        1 => "[\\x00-\\x1f]{1,3}".prop_map(|s| s.bytes().map(|b| format!("%{b:02X}")).collect()),
    ]
}

/// Rows of every table an order can write, as one comparable value.
async fn order_fingerprint(app: &TestApp) -> (i64, i64, i64, i64, i64) {
    sqlx::query_as(
        "SELECT (SELECT count(*) FROM reservations), (SELECT count(*) FROM reservations WHERE state = 'held'),
                (SELECT count(*) FROM reservation_events), (SELECT count(*) FROM service_links),
                (SELECT count(*) FROM service_links WHERE ended_at IS NULL)",
    )
    .fetch_one(&app.pool)
    .await
    .expect("fingerprint")
}

#[derive(Debug, Clone)]
enum OrderCall {
    Reserve(Value),
    Get(String),
    ByOrderRef(Vec<(String, String)>),
    Convert(String, Value),
    Cancel(String, Value),
    EndService(String),
    Events(String),
    Raw(&'static str, Vec<u8>),
}

fn order_call(held: i64, fence: i64, service: i64) -> impl Strategy<Value = OrderCall> {
    let reserve = object(vec![
        (
            "order_ref",
            prop_oneof![3 => "ORD-[0-9]{1,5}".prop_map(Value::from), 1 => label_field("ORD-1")]
                .boxed(),
        ),
        ("site", label_field("par1").boxed()),
        ("profile", label_field("epyc").boxed()),
        (
            "vendor",
            prop_oneof![label_field("dell"), Just(Value::Null)].boxed(),
        ),
        ("hold_seconds", number_field(900).boxed()),
    ]);
    let convert = object(vec![
        ("fence", number_field(fence).boxed()),
        ("service_ref", label_field("SRV-1").boxed()),
    ]);
    let cancel = object(vec![
        ("fence", number_field(fence).boxed()),
        (
            "reason",
            prop_oneof![3 => Just(Value::from("customer gave up")), 2 => text().prop_map(Value::from),
                        1 => "[a-z ]{501,600}".prop_map(Value::from), 1 => any_json()]
            .boxed(),
        ),
    ]);
    let query_key = prop::sample::select(vec!["order_ref", "bogus", "order_ref[]", ""]);
    let query = prop::collection::btree_map(
        query_key,
        prop_oneof!["ORD-[0-9]{1,3}", "\\PC{0,200}", "[\\x00-\\x1f]{1,3}"],
        0..3,
    )
    .prop_map(|m| {
        m.into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect::<Vec<_>>()
    });
    let raw_target = prop::sample::select(vec!["reserve", "convert", "cancel"]);
    prop_oneof![
        3 => reserve.prop_map(OrderCall::Reserve),
        1 => id_segment(held).prop_map(OrderCall::Get),
        1 => id_segment(held).prop_map(OrderCall::Events),
        1 => query.prop_map(OrderCall::ByOrderRef),
        2 => (id_segment(held), convert).prop_map(|(p, b)| OrderCall::Convert(p, b)),
        2 => (id_segment(held), cancel).prop_map(|(p, b)| OrderCall::Cancel(p, b)),
        1 => id_segment(service).prop_map(OrderCall::EndService),
        1 => (raw_target, prop::collection::vec(any::<u8>(), 0..300)).prop_map(|(t, b)| OrderCall::Raw(t, b)),
    ]
}

/// Every orders endpoint, with bodies, paths and queries of every kind:
/// a valid request gets one of its documented answers, anything else a
/// `400 invalid` that writes nothing; never a 5xx.
#[test]
fn orders_endpoints_refuse_bad_input_cleanly() {
    let (rt, app) = app_runtime();
    let (held, fence, service) = rt.block_on(async {
        for tag in ["OB-1", "OB-2", "OB-3", "OB-4"] {
            FakeMachine::new()
                .tag(tag)
                .profile("epyc")
                .create(&app.pool, app.org.id)
                .await;
        }
        let (held, fence) = FakeHold::on("OB-1")
            .order("ORD-HELD")
            .hold_seconds(3600)
            .create_with_fence(&app.pool, app.org.id)
            .await;
        let service = FakeHold::on("OB-2")
            .order("ORD-SOLD")
            .state(InService)
            .service_ref("SRV-0")
            .create(&app.pool, app.org.id)
            .await;
        (held, fence, service)
    });
    let mut runner = TestRunner::new(Config {
        cases: 160,
        ..Config::default()
    });
    let valid_seen = std::sync::atomic::AtomicUsize::new(0);
    runner
        .run(&order_call(held, fence, service), |call| {
            rt.block_on(async {
                let before = order_fingerprint(&app).await;
                let api = |p: &str| app.url(&format!("/api/v1{p}"));
                let is_id = |p: &str| poolkeeper::api::json::path_id(p).is_ok();
                let (req, valid, ok_statuses): (_, bool, &[u16]) = match &call {
                    OrderCall::Reserve(b) => (
                        app.http.post(api("/reservations")).json(b),
                        valid_reserve(b),
                        &[200, 201, 409],
                    ),
                    OrderCall::Get(p) => (
                        app.http.get(api(&format!("/reservations/{p}"))),
                        is_id(p),
                        &[200, 404],
                    ),
                    OrderCall::Events(p) => (
                        app.http.get(api(&format!("/reservations/{p}/events"))),
                        is_id(p),
                        &[200, 404],
                    ),
                    OrderCall::ByOrderRef(q) => {
                        let valid = q.len() == 1
                            && q[0].0 == "order_ref"
                            && label_ok(Some(&json!(q[0].1)), 128);
                        (
                            app.http.get(api("/reservations")).query(q),
                            valid,
                            &[200, 404],
                        )
                    }
                    OrderCall::Convert(p, b) => (
                        app.http
                            .post(api(&format!("/reservations/{p}/convert")))
                            .json(b),
                        is_id(p) && valid_convert(b),
                        &[200, 404, 409, 422],
                    ),
                    OrderCall::Cancel(p, b) => (
                        app.http
                            .post(api(&format!("/reservations/{p}/cancel")))
                            .json(b),
                        is_id(p) && valid_cancel(b),
                        &[200, 404, 409, 422],
                    ),
                    OrderCall::EndService(p) => (
                        app.http.post(api(&format!("/services/{p}/end"))),
                        is_id(p),
                        &[200, 404, 409],
                    ),
                    OrderCall::Raw(target, bytes) => {
                        let path = match *target {
                            "reserve" => "/reservations".to_owned(),
                            t => format!("/reservations/{held}/{t}"),
                        };
                        let valid =
                            serde_json::from_slice::<Value>(bytes).is_ok_and(|b| match *target {
                                "reserve" => valid_reserve(&b),
                                "convert" => valid_convert(&b),
                                _ => valid_cancel(&b),
                            });
                        (
                            app.http
                                .post(api(&path))
                                .header("content-type", "application/json")
                                .body(bytes.clone()),
                            valid,
                            // 422: a convert or cancel replayed under the
                            // same fence with another service_ref or reason.
                            &[200, 201, 404, 409, 422],
                        )
                    }
                };
                let r = req
                    .bearer_auth(&app.org.token)
                    .send()
                    .await
                    .expect("request");
                let status = r.status().as_u16();
                let answer: Value = r.json().await.unwrap_or(Value::Null);
                prop_assert!(status < 500, "{:?} got {}: {}", call, status, answer);
                if valid {
                    valid_seen.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    prop_assert!(
                        ok_statuses.contains(&status),
                        "valid {:?} got {}: {}",
                        call,
                        status,
                        answer
                    );
                } else {
                    // Paths that are not ids may also miss the route (404).
                    prop_assert!(
                        status == 400 || status == 404,
                        "invalid {:?} got {}: {}",
                        call,
                        status,
                        answer
                    );
                    prop_assert!(
                        answer["error"].is_string() && answer["message"].is_string(),
                        "a clear error: {}",
                        answer
                    );
                    prop_assert_eq!(
                        order_fingerprint(&app).await,
                        before,
                        "a refused request wrote nothing"
                    );
                }
                if (400..500).contains(&status) {
                    prop_assert!(
                        answer["error"].is_string(),
                        "a 4xx in the API's error shape: {}",
                        answer
                    );
                    prop_assert_eq!(order_fingerprint(&app).await, before, "a 4xx wrote nothing");
                }
                Ok(())
            })
        })
        .expect("property holds");
    let valid = valid_seen.into_inner();
    assert!(valid > 10 && valid < 150, "{valid} of 160 calls were valid");
}

// ---------------------------------------------------------------------------
// The dashboard's forms
// ---------------------------------------------------------------------------

/// Form values: plausible, empty, huge, control characters, any unicode.
fn form_value(plausible: String) -> impl Strategy<Value = Option<String>> {
    prop::option::weighted(
        0.9,
        prop_oneof![
            4 => Just(plausible),
            2 => text(),
            1 => "[a-z]{600,5000}",
            1 => any::<i64>().prop_map(|n| n.to_string()),
            1 => Just("99999999999999999999999".to_owned()),
        ],
    )
}

#[derive(Debug, Clone)]
enum FormCall {
    Cancel(String, Vec<(&'static str, Option<String>)>),
    Convert(String, Vec<(&'static str, Option<String>)>),
    Settings(Vec<(&'static str, Option<String>)>),
    Search(String),
    Login(Vec<(&'static str, Option<String>)>),
    Raw(&'static str, Vec<u8>),
}

/// `csrf` stands for the session's real token; the strategy decides
/// whether it is sent, replaced or left out.
fn form_call(held: i64, fence: i64) -> impl Strategy<Value = FormCall> {
    const CSRF: &str = "\u{1}csrf";
    let csrf = || form_value(CSRF.to_owned());
    let cancel = (
        id_segment(held),
        csrf(),
        form_value(fence.to_string()),
        form_value("customer gave up".into()),
    )
        .prop_map(|(p, c, f, r)| {
            FormCall::Cancel(p, vec![("csrf", c), ("fence", f), ("reason", r)])
        });
    let convert = (
        id_segment(held),
        csrf(),
        form_value(fence.to_string()),
        form_value("SRV-7".into()),
    )
        .prop_map(|(p, c, f, s)| {
            FormCall::Convert(p, vec![("csrf", c), ("fence", f), ("service_ref", s)])
        });
    let settings = (csrf(), form_value("on".into()))
        .prop_map(|(c, d)| FormCall::Settings(vec![("csrf", c), ("datacenter", d)]));
    let search = prop_oneof![
        text(),
        "[A-Za-z0-9-]{1000,3000}",
        Just("ORD-HELD".to_owned())
    ]
    .prop_map(FormCall::Search);
    let login = (
        csrf(),
        form_value("admin@acme.test".into()),
        form_value("wrong password".into()),
    )
        .prop_map(|(c, e, p)| FormCall::Login(vec![("csrf", c), ("email", e), ("password", p)]));
    let raw = (
        prop::sample::select(vec!["cancel", "convert", "settings", "login"]),
        prop::collection::vec(any::<u8>(), 0..300),
    )
        .prop_map(|(t, b)| FormCall::Raw(t, b));
    prop_oneof![3 => cancel, 3 => convert, 1 => settings, 1 => search, 1 => login, 2 => raw]
}

/// Everything a form can change, as one comparable value (login attempts
/// and the audit log record refusals on purpose and are left out).
async fn dashboard_fingerprint(app: &TestApp) -> ((i64, i64, i64, i64, i64), String, i64) {
    let orders = order_fingerprint(app).await;
    let (flags, sessions): (String, i64) = sqlx::query_as(
        "SELECT (SELECT string_agg(datacenter_enabled::text, ',' ORDER BY id) FROM organizations),
                (SELECT count(*) FROM sessions WHERE revoked_at IS NULL)",
    )
    .fetch_one(&app.pool)
    .await
    .expect("fingerprint");
    (orders, flags, sessions)
}

/// Every dashboard form, logged in as an admin with a valid CSRF token (so
/// that bodies reach validation), or with a missing or wrong one: never a
/// 5xx, and nothing written unless the answer is the success redirect.
#[test]
fn dashboard_forms_refuse_bad_input_cleanly() {
    let (rt, app) = app_runtime();
    let (held, fence, staff, anonymous, csrf) = rt.block_on(async {
        for tag in ["DB-1", "DB-2"] {
            FakeMachine::new()
                .tag(tag)
                .profile("epyc")
                .create(&app.pool, app.org.id)
                .await;
        }
        let (held, fence) = FakeHold::on("DB-1")
            .order("ORD-HELD")
            .hold_seconds(3600)
            .create_with_fence(&app.pool, app.org.id)
            .await;
        let staff = app.staff("admin@acme.test", "admin").await;
        let csrf = staff.csrf().await;
        let anonymous = crate::helpers::StaffClient::new(&app.address);
        (held, fence, staff, anonymous, csrf)
    });
    let mut runner = TestRunner::new(Config {
        cases: 128,
        ..Config::default()
    });
    let reached_success = std::sync::atomic::AtomicUsize::new(0);
    let seen = std::sync::Mutex::new(std::collections::BTreeMap::<(String, u16), u32>::new());
    runner
        .run(&form_call(held, fence), |call| {
            rt.block_on(async {
                let before = dashboard_fingerprint(&app).await;
                let form = |fields: &Vec<(&'static str, Option<String>)>,
                            token: &str|
                 -> Vec<(String, String)> {
                    fields
                        .iter()
                        .filter_map(|(k, v)| {
                            v.as_ref().map(|v| {
                                (
                                    (*k).to_owned(),
                                    if v == "\u{1}csrf" {
                                        token.to_owned()
                                    } else {
                                        v.clone()
                                    },
                                )
                            })
                        })
                        .collect()
                };
                let req = match &call {
                    FormCall::Cancel(p, f) => staff
                        .http
                        .post(staff.url(&format!("/reservations/{p}/cancel")))
                        .form(&form(f, &csrf)),
                    FormCall::Convert(p, f) => staff
                        .http
                        .post(staff.url(&format!("/reservations/{p}/convert")))
                        .form(&form(f, &csrf)),
                    FormCall::Settings(f) => staff
                        .http
                        .post(staff.url("/settings"))
                        .form(&form(f, &csrf)),
                    FormCall::Search(q) => staff.http.get(staff.url("/search")).query(&[("q", q)]),
                    FormCall::Login(f) => {
                        let (_, page) = anonymous.page("/login").await;
                        let token = crate::helpers::hidden_field(&page, "csrf").unwrap_or_default();
                        anonymous
                            .http
                            .post(anonymous.url("/login"))
                            .form(&form(f, &token))
                    }
                    FormCall::Raw(target, bytes) => {
                        let (client, path) = match *target {
                            "login" => (&anonymous, "/login".to_owned()),
                            "settings" => (&staff, "/settings".to_owned()),
                            t => (&staff, format!("/reservations/{held}/{t}")),
                        };
                        // A valid token first, so that the junk reaches the form's parser.
                        let mut body = match *target {
                            "login" => Vec::new(),
                            _ => format!("csrf={csrf}&").into_bytes(),
                        };
                        body.extend_from_slice(bytes);
                        client
                            .http
                            .post(client.url(&path))
                            .header("content-type", "application/x-www-form-urlencoded")
                            .body(body)
                    }
                };
                let r = req.send().await.expect("request");
                let status = r.status().as_u16();
                let body = r.text().await.unwrap_or_default();
                let kind = format!("{call:?}")
                    .split('(')
                    .next()
                    .unwrap_or_default()
                    .to_owned();
                *seen
                    .lock()
                    .expect("lock")
                    .entry((kind, status))
                    .or_default() += 1;
                prop_assert!(status < 500, "{:?} got {}: {}", call, status, body);
                prop_assert!(
                    [200, 303, 400, 401, 403, 404, 409, 413, 422, 429].contains(&status),
                    "{:?} got an unexpected {}: {}",
                    call,
                    status,
                    body
                );
                if status >= 400 {
                    prop_assert!(!body.trim().is_empty(), "a clear error page for {:?}", call);
                }
                if status == 303 && !matches!(call, FormCall::Search(_)) {
                    reached_success.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                } else {
                    prop_assert_eq!(
                        dashboard_fingerprint(&app).await,
                        before,
                        "{:?} ({}) wrote something",
                        call,
                        status
                    );
                }
                // Undo what a successful form did, so that later cases reach
                // validation again (module on, the reservation held).
                sqlx::query(
                    "WITH l AS (DELETE FROM service_links WHERE reservation_id = $1)
                     UPDATE reservations SET state = 'held', ended_at = NULL, ended_by = NULL, end_reason = NULL
                      WHERE id = $1",
                )
                .bind(held)
                .execute(&app.pool)
                .await
                .expect("reset the reservation");
                sqlx::query("UPDATE organizations SET datacenter_enabled = true")
                    .execute(&app.pool)
                    .await
                    .expect("reset the setting");
                Ok(())
            })
        })
        .expect("property holds");
    // Some forms must have got through validation to their success, and
    // some with a valid token must have been refused by validation itself.
    let seen = seen.into_inner().expect("lock");
    eprintln!("dashboard forms, (form, status): count = {seen:?}");
    assert!(
        reached_success.into_inner() > 0,
        "no form was ever valid: {seen:?}"
    );
    assert!(
        seen.keys()
            .any(|(k, s)| (k == "Cancel" || k == "Convert") && *s == 400),
        "no action form reached validation: {seen:?}"
    );
}

/// Found by the property above: a login with a huge email (past the btree
/// row limit of login_attempts' index) or a NUL in it: the dashboard's
/// input guard refuses both before the handler:
/// a 400 naming the field, no password checked, so nothing to count for
/// the throttle either (the answer tells nothing about the account).
#[tokio::test]
async fn a_login_with_a_huge_or_nul_email_is_refused_not_a_500() {
    let app = crate::helpers::spawn_app().await;
    for email in [
        "x".repeat(6000) + "@acme.test",
        "admin\0@acme.test".to_owned(),
    ] {
        let client = crate::helpers::StaffClient::new(&app.address);
        let r = client.login(&email, "wrong").await;
        assert_eq!(r.status().as_u16(), 400, "email of {} chars", email.len());
        let body = r.text().await.expect("body");
        assert!(body.contains("“email”"), "names the field: {body}");
    }
    assert_eq!(
        app.count("SELECT count(*) FROM login_attempts").await,
        0,
        "refused before any password was checked"
    );
}

/// A body is a JSON object: an array of the fields by position (which
/// serde would otherwise read into the request's struct) is `400 invalid`
/// on every write, and holds nothing.
#[tokio::test]
async fn a_json_array_in_place_of_the_object_is_invalid_and_writes_nothing() {
    let app = spawn_app().await;
    FakeMachine::new()
        .tag("ARR-M")
        .profile("epyc")
        .create(&app.pool, app.org.id)
        .await;
    let (held, fence) = FakeHold::on("ARR-M")
        .order("ARR-H")
        .create_with_fence(&app.pool, app.org.id)
        .await;
    let writes: Vec<(reqwest::Method, String, Value)> = vec![
        (
            reqwest::Method::POST,
            "/api/v1/reservations".into(),
            json!(["ARR-1", "par1", "epyc", null, null, null, null, null]),
        ),
        (
            reqwest::Method::POST,
            format!("/api/v1/reservations/{held}/cancel"),
            json!([fence, "by position"]),
        ),
        (
            reqwest::Method::PUT,
            "/api/v1/machines/ARR-2".into(),
            json!(["par1", "dell", "epyc", "ready"]),
        ),
        (
            reqwest::Method::PUT,
            "/api/v1/headroom".into(),
            json!(["par1", "epyc", "enterprise", 1]),
        ),
    ];
    let rows = async || {
        app.count(
            "SELECT (SELECT count(*) FROM reservations) + (SELECT count(*) FROM machines)
                  + (SELECT count(*) FROM headroom) + (SELECT count(*) FROM reservation_events)",
        )
        .await
    };
    let before = rows().await;
    for (method, path, body) in writes {
        let r = app
            .http
            .request(method.clone(), app.url(&path))
            .bearer_auth(&app.org.token)
            .json(&body)
            .send()
            .await
            .expect("request");
        let status = r.status();
        let answer: Value = r.json().await.expect("json");
        assert_eq!(status.as_u16(), 400, "{method} {path}: {answer}");
        assert_eq!(answer["error"], "invalid", "{method} {path}: {answer}");
    }
    assert_eq!(rows().await, before);
    assert_eq!(app.state_of(held).await, "held");
}
