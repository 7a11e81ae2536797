//! OpenTelemetry traces: a real `poolkeeper serve` exports over OTLP/HTTP
//! (protobuf) to a receiver this test runs. A reserve sent with a W3C
//! `traceparent` yields spans of that trace: the request's span under the
//! caller's, the reserve's with its attributes, the statement's under it;
//! the trace id is in the request's log line and, while the statement
//! runs, in `pg_stat_activity`. `RUST_LOG=warn` quiets the logs, not the
//! spans. Unset, nothing is exported.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_web::{App, HttpResponse, HttpServer, web};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use serde_json::{Value, json};

use crate::helpers::FakeMachine;
use crate::helpers::replicas::Replica;
use crate::helpers::{create_org, migrated_db};

/// The caller's trace and span (the order service's), as in its header.
const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT: &str = "00f067aa0ba902b7";

/// An OTLP/HTTP receiver on a free port: every span it was sent, and how
/// many export requests came.
struct Receiver {
    port: u16,
    spans: Arc<Mutex<Vec<Span>>>,
    requests: Arc<Mutex<usize>>,
    handle: actix_web::dev::ServerHandle,
}

async fn receiver() -> Receiver {
    let spans: Arc<Mutex<Vec<Span>>> = Arc::default();
    let requests: Arc<Mutex<usize>> = Arc::default();
    let (s, r) = (spans.clone(), requests.clone());
    let server = HttpServer::new(move || {
        let (s, r) = (s.clone(), r.clone());
        App::new().route(
            "/v1/traces",
            web::post().to(move |body: web::Bytes| {
                let (s, r) = (s.clone(), r.clone());
                async move {
                    let Ok(export) = ExportTraceServiceRequest::decode(body) else {
                        return HttpResponse::BadRequest().finish();
                    };
                    *r.lock().expect("requests") += 1;
                    let mut spans = s.lock().expect("spans");
                    for rs in export.resource_spans {
                        for ss in rs.scope_spans {
                            spans.extend(ss.spans);
                        }
                    }
                    HttpResponse::Ok()
                        .content_type("application/x-protobuf")
                        .finish()
                }
            }),
        )
    })
    .workers(1)
    .disable_signals()
    .bind("127.0.0.1:0")
    .expect("bind the receiver");
    let port = server.addrs()[0].port();
    let server = server.run();
    let handle = server.handle();
    tokio::spawn(server);
    Receiver {
        port,
        spans,
        requests,
        handle,
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn attr(span: &Span, key: &str) -> Option<Value> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref()?.value.as_ref())
        .map(|v| match v {
            AnyValue::StringValue(s) => json!(s),
            AnyValue::IntValue(i) => json!(i),
            AnyValue::BoolValue(b) => json!(b),
            AnyValue::DoubleValue(d) => json!(d),
            other => json!(format!("{other:?}")),
        })
}

/// A database with an organization and two ready machines; its URL and
/// the organization's token.
async fn world() -> (crate::helpers::TestDb, String, poolkeeper::db::Db) {
    let db = migrated_db().await;
    let pool = db.pool().await;
    let org = create_org(&pool, "traced", true).await;
    for tag in ["TR-1", "TR-2"] {
        FakeMachine::new()
            .tag(tag)
            .profile("epyc")
            .create(&pool, org.id)
            .await;
    }
    (db, org.token, pool)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reserve_with_a_traceparent_is_traced_into_postgresql() {
    let (db, token, pool) = world().await;
    let rx = receiver().await;
    let mut serve = Replica::start(
        "traced",
        &[
            ("DATABASE_URL", db.url()),
            (
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                format!("http://127.0.0.1:{}", rx.port),
            ),
            ("OTEL_SERVICE_NAME", "poolkeeper-test".to_owned()),
            ("RUST_LOG", "info".to_owned()),
        ],
    )
    .await;

    // The reserve waits on a lock the test holds, so that its statement
    // can be seen in pg_stat_activity with the trace in a comment.
    let mut blocker = db.connection().await;
    sqlx::query("BEGIN")
        .execute(&mut blocker)
        .await
        .expect("begin");
    sqlx::query("LOCK TABLE reservations IN EXCLUSIVE MODE")
        .execute(&mut blocker)
        .await
        .expect("lock");
    let request = {
        let (url, token) = (serve.url("/api/v1/reservations"), token.clone());
        tokio::spawn(async move {
            reqwest::Client::new()
                .post(url)
                .bearer_auth(token)
                .header("traceparent", format!("00-{TRACE}-{PARENT}-01"))
                .json(&json!({"order_ref": "ORD-TRACED", "site": "par1", "profile": "epyc"}))
                .send()
                .await
                .expect("reserve")
                .status()
                .as_u16()
        })
    };
    let waiting: String = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let found: Option<String> = sqlx::query_scalar(
                "SELECT query FROM pg_stat_activity
                  WHERE wait_event_type = 'Lock' AND query LIKE '%traceparent=%'",
            )
            .fetch_optional(&pool)
            .await
            .expect("pg_stat_activity");
            if let Some(q) = found {
                break q;
            }
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the reserve's statement waits on the lock");
    sqlx::query("ROLLBACK")
        .execute(&mut blocker)
        .await
        .expect("release");
    assert_eq!(request.await.expect("request task"), 201);
    assert!(
        waiting.starts_with(&format!("/* traceparent='00-{TRACE}-")),
        "{waiting}"
    );
    let statement_span = waiting
        .split('-')
        .nth(2)
        .expect("the span id in the comment")
        .to_owned();

    // An orderly stop flushes what is buffered.
    serve.signal(libc::SIGTERM);
    let (status, log) = serve.exit(Duration::from_secs(30)).await;
    assert!(status.success(), "{status}\n{log}");
    assert!(
        log.contains(TRACE),
        "the request's log line names its trace:\n{log}"
    );

    let spans = rx.spans.lock().expect("spans").clone();
    let ours: Vec<&Span> = spans.iter().filter(|s| hex(&s.trace_id) == TRACE).collect();
    let by_name = |name: &str| {
        ours.iter()
            .copied()
            .find(|s| s.name == name)
            .unwrap_or_else(|| {
                panic!(
                    "no span {name}: {:#?}",
                    ours.iter().map(|s| &s.name).collect::<Vec<_>>()
                )
            })
    };
    // The request's span continues the caller's.
    let root = ours
        .iter()
        .copied()
        .find(|s| hex(&s.parent_span_id) == PARENT)
        .unwrap_or_else(|| panic!("no span under the caller's: {ours:#?}"));
    let reserve = by_name("reserve");
    assert_eq!(hex(&reserve.parent_span_id), hex(&root.span_id));
    assert_eq!(attr(reserve, "order_ref"), Some(json!("ORD-TRACED")));
    assert_eq!(attr(reserve, "quantity"), Some(json!(1)));
    assert_eq!(attr(reserve, "outcome"), Some(json!("created")));
    assert!(
        attr(reserve, "candidates").is_some_and(|c| c.as_i64().is_some_and(|n| n >= 1)),
        "{reserve:#?}"
    );
    // The statement is the reserve's child, and its id is the comment's.
    let statement = by_name("db.statement");
    assert_eq!(hex(&statement.parent_span_id), hex(&reserve.span_id));
    assert_eq!(hex(&statement.span_id), statement_span);
    assert_eq!(attr(statement, "db.system"), Some(json!("postgresql")));
    rx.handle.stop(false).await;
}

/// Quiet logs do not silence traces: `RUST_LOG` filters what is logged,
/// the sampler decides what is exported.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn spans_are_exported_whatever_rust_log_says() {
    let (db, token, _pool) = world().await;
    let rx = receiver().await;
    let mut serve = Replica::start(
        "quiet",
        &[
            ("DATABASE_URL", db.url()),
            (
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                format!("http://127.0.0.1:{}", rx.port),
            ),
            ("RUST_LOG", "warn".to_owned()),
        ],
    )
    .await;
    let status = reqwest::Client::new()
        .post(serve.url("/api/v1/reservations"))
        .bearer_auth(&token)
        .header("traceparent", format!("00-{TRACE}-{PARENT}-01"))
        .json(&json!({"order_ref": "ORD-QUIET", "site": "par1", "profile": "epyc"}))
        .send()
        .await
        .expect("reserve")
        .status();
    assert_eq!(status.as_u16(), 201);
    serve.signal(libc::SIGTERM);
    let (status, log) = serve.exit(Duration::from_secs(30)).await;
    assert!(status.success(), "{status}\n{log}");
    // The logs are as quiet as asked: no access line.
    assert!(!log.contains("answered"), "{log}");

    let spans = rx.spans.lock().expect("spans").clone();
    let ours: Vec<&Span> = spans.iter().filter(|s| hex(&s.trace_id) == TRACE).collect();
    let names = || ours.iter().map(|s| &s.name).collect::<Vec<_>>();
    let root = ours
        .iter()
        .copied()
        .find(|s| hex(&s.parent_span_id) == PARENT)
        .unwrap_or_else(|| panic!("no request span under the caller's: {:?}", names()));
    let reserve = ours
        .iter()
        .copied()
        .find(|s| s.name == "reserve")
        .unwrap_or_else(|| panic!("no reserve span: {:?}", names()));
    assert_eq!(hex(&reserve.parent_span_id), hex(&root.span_id));
    assert_eq!(attr(reserve, "outcome"), Some(json!("created")));
    let statement = ours
        .iter()
        .copied()
        .find(|s| s.name == "db.statement")
        .unwrap_or_else(|| panic!("no db.statement span: {:?}", names()));
    assert_eq!(hex(&statement.parent_span_id), hex(&reserve.span_id));
    rx.handle.stop(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_an_endpoint_nothing_is_exported() {
    let (db, token, _pool) = world().await;
    let rx = receiver().await;
    // The receiver listens, but nothing tells the server about it.
    let mut serve = Replica::start(
        "untraced",
        &[("DATABASE_URL", db.url()), ("RUST_LOG", "info".to_owned())],
    )
    .await;
    let status = reqwest::Client::new()
        .post(serve.url("/api/v1/reservations"))
        .bearer_auth(&token)
        .header("traceparent", format!("00-{TRACE}-{PARENT}-01"))
        .json(&json!({"order_ref": "ORD-UNTRACED", "site": "par1", "profile": "epyc"}))
        .send()
        .await
        .expect("reserve")
        .status();
    assert_eq!(status.as_u16(), 201);
    serve.signal(libc::SIGTERM);
    let (status, log) = serve.exit(Duration::from_secs(30)).await;
    assert!(status.success(), "{status}\n{log}");
    assert_eq!(*rx.requests.lock().expect("requests"), 0);
    assert!(!log.contains("OTLP"), "{log}");
    // No trace id made up (the default would log one of zeros); the
    // caller's, from its traceparent, is in the request's line.
    assert!(!log.contains("00000000000000000000000000000000"), "{log}");
    assert!(log.contains(TRACE), "{log}");
    rx.handle.stop(false).await;
}
