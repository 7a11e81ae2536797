//! Least privilege: migrations as the owner role, the
//! server as a role that owns nothing and has only DML grants, created with
//! the SQL docs/production.md gives.

use std::time::{Duration, Instant};

use scraper::{Html, Selector};
use serde_json::{Value, json};
use sqlx::Connection;

use crate::helpers::FakeMachine;
use crate::helpers::replicas::Replica;
use crate::helpers::{
    STAFF_PASSWORD, StaffClient, TestDb, binary, create_org, empty_db, hidden_field,
};

/// The SQL of docs/production.md for the two roles, with the test's names; run by the
/// cluster's administrator (on a managed service: its admin role).
pub async fn create_roles(db: &TestDb, owner: &str, app: &str) {
    let mut admin = db.connection().await;
    for sql in [
        format!("CREATE ROLE {owner} LOGIN"),
        format!("CREATE ROLE {app} LOGIN"),
        format!("ALTER DATABASE {} OWNER TO {owner}", db.name),
    ] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(&mut admin)
            .await
            .expect("create roles");
    }
    let _ = admin.close().await;
    // As the owner: what the app role may do, on every table and sequence
    // the migrations create, now and later.
    let mut owner_conn = sqlx::PgConnection::connect_with(&db.options.clone().username(owner))
        .await
        .expect("connect as the owner");
    for sql in [
        format!("GRANT CONNECT ON DATABASE {} TO {app}", db.name),
        format!("GRANT USAGE ON SCHEMA public TO {app}"),
        format!(
            "ALTER DEFAULT PRIVILEGES FOR ROLE {owner} IN SCHEMA public \
             GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO {app}"
        ),
        format!(
            "ALTER DEFAULT PRIVILEGES FOR ROLE {owner} IN SCHEMA public \
             GRANT USAGE ON SEQUENCES TO {app}"
        ),
    ] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(&mut owner_conn)
            .await
            .expect("grants");
    }
    let _ = owner_conn.close().await;
}

/// `db.url()` for another role (the test cluster trusts its socket).
pub fn url_as(db: &TestDb, role: &str) -> String {
    db.url()
        .replacen("postgres://postgres@", &format!("postgres://{role}@"), 1)
}

fn sel(s: &str) -> Selector {
    Selector::parse(s).expect("selector")
}

/// The first POST form of `main`: its action and hidden fields.
fn form_of(html: &str) -> (String, Vec<(String, String)>) {
    let doc = Html::parse_document(html);
    let form = doc
        .select(&sel("main form[method=post]"))
        .next()
        .expect("a POST form");
    let action = form.value().attr("action").expect("action").to_owned();
    let fields = form
        .select(&sel("input[type=hidden]"))
        .map(|i| {
            (
                i.value().attr("name").unwrap_or("").to_owned(),
                i.value().attr("value").unwrap_or("").to_owned(),
            )
        })
        .collect();
    (action, fields)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_as_owner_then_serve_as_a_role_with_only_dml_grants() {
    let db = empty_db().await;
    let suffix = format!("{:08x}", rand::random::<u32>());
    let (owner, app) = (format!("pk_owner_{suffix}"), format!("pk_app_{suffix}"));
    create_roles(&db, &owner, &app).await;

    // The migrations, as the owner, with the migrate command.
    let out = tokio::process::Command::new(binary())
        .arg("migrate")
        .env("DATABASE_URL", url_as(&db, &owner))
        .env("RUST_LOG", "warn")
        .output()
        .await
        .expect("run migrate");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // What the app role is: no superuser, no CREATE, owns nothing.
    let admin = db.pool().await;
    let (superuser, create_db, owns, can_create): (bool, bool, i64, bool) = sqlx::query_as(
        "SELECT r.rolsuper, r.rolcreatedb,
                (SELECT count(*) FROM pg_class c WHERE c.relowner = r.oid),
                has_schema_privilege(r.rolname, 'public', 'CREATE')
           FROM pg_roles r WHERE r.rolname = $1",
    )
    .bind(&app)
    .fetch_one(&admin)
    .await
    .expect("role");
    assert_eq!(
        (superuser, create_db, owns, can_create),
        (false, false, 0, false)
    );

    // A lease expired two days ago: L5's purge at start-up runs as the app role.
    sqlx::query(
        "INSERT INTO leases (key, holder, fence, acquired_at, expires_at)
         VALUES ('old-job', 'gone', nextval('lease_fence_seq'),
                 clock_timestamp() - interval '2 days 1 minute', clock_timestamp() - interval '2 days')",
    )
    .execute(&admin)
    .await
    .expect("old lease");
    let org = create_org(&admin, "acme", true).await;
    poolkeeper::staff::create(
        &admin,
        org.id,
        &poolkeeper::domain::Email::parse("ana@acme.example").expect("email"),
        poolkeeper::domain::Role::parse("support").expect("role"),
        STAFF_PASSWORD,
    )
    .await
    .expect("staff");
    for i in 0..4 {
        FakeMachine::new()
            .tag(&format!("PK-{i}"))
            .profile("epyc")
            .create(&admin, org.id)
            .await;
    }

    let replica = Replica::start("least-privilege", &[("DATABASE_URL", url_as(&db, &app))]).await;
    let http = reqwest::Client::new();
    let ready = http
        .get(replica.url("/readyz"))
        .send()
        .await
        .expect("readyz");
    assert_eq!(ready.status().as_u16(), 200, "{}", replica.log());
    let purged: i64 = sqlx::query_scalar("SELECT count(*) FROM leases WHERE key = 'old-job'")
        .fetch_one(&admin)
        .await
        .expect("leases");
    assert_eq!(purged, 0, "the start-up purge ran as the app role");

    // The order flow through the API: reserve, convert, reserve, cancel.
    let reserve = |order: &'static str, hold: u32| {
        let (http, url, token) = (
            http.clone(),
            replica.url("/api/v1/reservations"),
            org.token.clone(),
        );
        async move {
            let r = http
                .post(url)
                .bearer_auth(token)
                .json(&json!({"order_ref": order, "site": "par1", "profile": "epyc", "hold_seconds": hold}))
                .send()
                .await
                .expect("reserve");
            assert_eq!(r.status().as_u16(), 201);
            r.json::<Value>().await.expect("json")
        }
    };
    let a = reserve("ORD-A", 600).await;
    let r = http
        .post(replica.url(&format!("/api/v1/reservations/{}/convert", a["id"])))
        .bearer_auth(&org.token)
        .json(&json!({"fence": a["fence"], "service_ref": "SRV-1"}))
        .send()
        .await
        .expect("convert");
    assert_eq!(
        r.status().as_u16(),
        200,
        "{}",
        r.text().await.unwrap_or_default()
    );
    let b = reserve("ORD-B", 600).await;
    let r = http
        .post(replica.url(&format!("/api/v1/reservations/{}/cancel", b["id"])))
        .bearer_auth(&org.token)
        .json(&json!({"fence": b["fence"], "reason": "changed plan"}))
        .send()
        .await
        .expect("cancel");
    assert_eq!(
        r.status().as_u16(),
        200,
        "{}",
        r.text().await.unwrap_or_default()
    );

    // Headroom (its pool's turn, its audit row) and capacity, as the app role.
    let r = http
        .put(replica.url("/api/v1/headroom"))
        .bearer_auth(&org.token)
        .json(&json!({"site": "par1", "profile": "epyc", "segment": "enterprise", "machines": 1}))
        .send()
        .await
        .expect("headroom");
    assert_eq!(
        r.status().as_u16(),
        200,
        "{}",
        r.text().await.unwrap_or_default()
    );
    let r = http
        .get(replica.url("/api/v1/capacity?site=par1&profile=epyc&quantity=1"))
        .bearer_auth(&org.token)
        .send()
        .await
        .expect("capacity");
    assert_eq!(r.status().as_u16(), 200);
    let capacity: Value = r.json().await.expect("json");
    assert_eq!(capacity["pools"][0]["reserved"], json!({"enterprise": 1}));

    // The sweep, as the app role: an overdue hold is expired by this replica.
    let c = reserve("ORD-C", 600).await;
    sqlx::query(
        "UPDATE reservations SET created_at = clock_timestamp() - interval '1 hour',
                expires_at = clock_timestamp() - interval '1 minute' WHERE id = $1",
    )
    .bind(c["id"].as_i64().expect("id"))
    .execute(&admin)
    .await
    .expect("overdue");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let state: String = sqlx::query_scalar("SELECT state FROM reservations WHERE id = $1")
            .bind(c["id"].as_i64().expect("id"))
            .fetch_one(&admin)
            .await
            .expect("state");
        if state == "expired" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the sweep never expired it:\n{}",
            replica.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let swept_by: Option<String> = sqlx::query_scalar(
        "SELECT replica FROM reservation_events WHERE reservation_id = $1 AND kind = 'expired'",
    )
    .bind(c["id"].as_i64().expect("id"))
    .fetch_one(&admin)
    .await
    .expect("event");
    assert_eq!(swept_by.as_deref(), Some("least-privilege"));

    // The dashboard's cancel and convert, as the app role.
    let d = reserve("ORD-D", 600).await;
    let e = reserve("ORD-E", 600).await;
    let staff = StaffClient::new(&replica.url(""));
    let (status, page) = staff.page("/login").await;
    assert_eq!(status, 200);
    let csrf = hidden_field(&page, "csrf").expect("csrf");
    let r = staff
        .post_form(
            "/login",
            &[
                ("email", "ana@acme.example"),
                ("password", STAFF_PASSWORD),
                ("csrf", &csrf),
            ],
        )
        .await;
    assert_eq!(r.status().as_u16(), 303, "login");
    for (id, path, field, value, state) in [
        (
            &d["id"],
            "cancel",
            "reason",
            "customer changed plan",
            "cancelled",
        ),
        (&e["id"], "convert", "service_ref", "SRV-2", "converted"),
    ] {
        let (status, page) = staff.page(&format!("/reservations/{id}/{path}")).await;
        assert_eq!(status, 200, "{page}");
        let (action, mut fields) = form_of(&page);
        fields.push((field.to_owned(), value.to_owned()));
        let r = staff
            .http
            .post(staff.url(&action))
            .form(&fields)
            .send()
            .await
            .expect("POST");
        assert_eq!(
            r.status().as_u16(),
            303,
            "{path}: {}",
            r.text().await.unwrap_or_default()
        );
        let now: String = sqlx::query_scalar("SELECT state FROM reservations WHERE id = $1")
            .bind(id.as_i64().expect("id"))
            .fetch_one(&admin)
            .await
            .expect("state");
        assert_eq!(now, state);
    }
    let audited: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM audit_log WHERE action IN ('reservation.cancel', 'reservation.convert')",
    )
    .fetch_one(&admin)
    .await
    .expect("audit");
    assert_eq!(audited, 2);

    // Prometheus, as the app role: the metrics token is read and the
    // database's numbers are read and shared (metrics_snapshot).
    let metrics = http
        .get(replica.url("/metrics"))
        .bearer_auth(&org.metrics_token)
        .send()
        .await
        .expect("metrics");
    assert_eq!(metrics.status().as_u16(), 200);
    let text = metrics.text().await.expect("metrics text");
    assert!(text.contains("poolkeeper_machines{"), "{text}");
    assert!(
        text.contains("poolkeeper_metrics_db_errors_total 0"),
        "{text}"
    );
    let errors: i64 = sqlx::query_scalar("SELECT count(*) FROM lease_errors")
        .fetch_one(&admin)
        .await
        .expect("lease errors");
    assert_eq!(errors, 0, "{}", replica.log());
    assert!(
        !replica.log().contains("permission denied"),
        "{}",
        replica.log()
    );
}

/// The SQL definitions are the owner's: when they are pending, a replica
/// serving as the app role applies them over
/// `POOLKEEPER_MIGRATION_DATABASE_URL` (the owner), never as itself, and
/// the functions stay owned by the owner; the app role only reads
/// `sql_definitions`.
#[tokio::test]
async fn pending_definitions_are_applied_as_the_owner_not_the_app_role() {
    let db = empty_db().await;
    let suffix = format!("{:08x}", rand::random::<u32>());
    let (owner, app) = (format!("pk_owner_{suffix}"), format!("pk_app_{suffix}"));
    create_roles(&db, &owner, &app).await;
    let out = tokio::process::Command::new(binary())
        .arg("migrate")
        .env("DATABASE_URL", url_as(&db, &owner))
        .env("RUST_LOG", "warn")
        .output()
        .await
        .expect("run migrate");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Pending: as if the installed set were older than the binary's.
    let admin = db.pool().await;
    sqlx::query("DELETE FROM sql_definitions")
        .execute(&admin)
        .await
        .expect("forget the installed set");

    let replica = Replica::start(
        "definitions-as-owner",
        &[
            ("DATABASE_URL", url_as(&db, &app)),
            ("POOLKEEPER_MIGRATION_DATABASE_URL", url_as(&db, &owner)),
        ],
    )
    .await;
    let ready = reqwest::get(replica.url("/readyz")).await.expect("readyz");
    assert_eq!(ready.status().as_u16(), 200, "{}", replica.log());
    let files: i64 = sqlx::query_scalar("SELECT count(*) FROM sql_definitions")
        .fetch_one(&admin)
        .await
        .expect("sql_definitions");
    assert_eq!(files as usize, poolkeeper::db::definitions::FILES.len());
    let owners: Vec<String> = sqlx::query_scalar(
        "SELECT DISTINCT pg_get_userbyid(proowner)::text FROM pg_proc
          WHERE pronamespace = 'public'::regnamespace",
    )
    .fetch_all(&admin)
    .await
    .expect("owners");
    assert_eq!(owners, vec![owner.clone()]);
    admin.close().await;
}
