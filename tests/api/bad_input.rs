//! Bad input everywhere (property-based): whatever the body, path or query,
//! the answer is a documented 2xx or a 4xx with a clear error, never a 5xx,
//! and nothing is written unless the answer says so.

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use serde_json::{Value, json};

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
