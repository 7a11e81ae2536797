//! The test harness: one private PostgreSQL per test run (or `DATABASE_URL`
//! when set), a freshly migrated database per test (dropped when the test
//! ends), and `spawn_app()` that starts the server on port 0 against it, its
//! logs on stdout when `TEST_LOG` is set.
#![allow(dead_code)]

pub mod conformance;
pub mod crawler;
mod fake;
mod fixtures;
mod http;
pub mod matrix;
pub mod oidc;
pub mod receiver;
pub mod replicas;
pub use fake::*;
pub use fixtures::*;

use std::path::PathBuf;
use std::sync::{Arc, Once, OnceLock};
use std::time::{Duration, SystemTime};

use poolkeeper::db::Db;
use poolkeeper::domain::{Scope, Slug};
use poolkeeper::embedded_pg::{ClusterOptions, EmbeddedPostgres};
use poolkeeper::metrics::Metrics;
use poolkeeper::settings::Settings;
use poolkeeper::startup::{AppState, Application};
use sqlx::postgres::PgConnectOptions;
use sqlx::{Connection, PgConnection};

struct Cluster {
    /// Connects to the maintenance database, to create test databases.
    admin: PgConnectOptions,
    /// A database migrated once, copied for every test.
    template: String,
    /// Builds a URL for a database of this cluster (for child processes).
    url_base: UrlBase,
    _embedded: Option<EmbeddedPostgres>,
}

enum UrlBase {
    Embedded(String, String),
    External(String),
}

static CLUSTER: OnceLock<Result<Cluster, String>> = OnceLock::new();

fn cluster() -> &'static Cluster {
    let result = CLUSTER.get_or_init(|| {
        // Started on a plain thread with its own runtime: each #[tokio::test]
        // has a runtime of its own, which must not own the shared cluster.
        std::thread::spawn(|| {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            rt.block_on(start_cluster()).map_err(|e| format!("{e:#}"))
        })
        .join()
        .unwrap_or_else(|_| Err("starting the test cluster panicked".into()))
    });
    match result {
        Ok(c) => c,
        Err(e) => panic!("test database unavailable: {e}"),
    }
}

async fn start_cluster() -> anyhow::Result<Cluster> {
    // With autogroup every backend is a scheduling group of its own, and
    // under the concurrency tests' load a backend waited seconds for a CPU
    // (docs/production.md): say so once, in the run's own output (stderr
    // itself, which libtest does not capture), beside the lock timeouts it
    // causes.
    if std::fs::read_to_string("/proc/sys/kernel/sched_autogroup_enabled")
        .is_ok_and(|v| v.trim() != "0")
    {
        use std::io::Write as _;
        let _ = writeln!(
            std::io::stderr(),
            "tests: kernel.sched_autogroup_enabled is 1: PostgreSQL's backends may wait \
             seconds for a CPU and concurrency tests hit lock timeouts; scripts/test turns \
             it off for its run (docs/testing.md)"
        );
    }
    let template = format!("pk_template_{}", std::process::id());
    let (admin, url_base, embedded) =
        match std::env::var("DATABASE_URL").ok().filter(|s| !s.is_empty()) {
            Some(url) => {
                let admin = poolkeeper::db::parse_url(&url)?;
                let base = url
                    .split('?')
                    .next()
                    .unwrap_or(&url)
                    .rsplit_once('/')
                    .map(|(b, _)| b.to_owned())
                    .unwrap_or(url.clone());
                (admin, UrlBase::External(base), None)
            }
            None => {
                remove_stale_clusters();
                let dir = std::env::temp_dir().join(format!(
                    "poolkeeper-test-{}-{:x}",
                    std::process::id(),
                    rand_u32()
                ));
                poolkeeper::embedded_pg::prepare_private_dir(&dir)?;
                let opts = ClusterOptions {
                    data_dir: dir.join("pg"),
                    log_file: dir.join("postgres.log"),
                    throwaway: true,
                };
                let pg =
                    tokio::task::spawn_blocking(move || EmbeddedPostgres::start(&opts)).await??;
                let admin = pg.connect_options("postgres");
                let url = pg.url("DBNAME");
                let (a, b) = url
                    .split_once("DBNAME")
                    .map(|(a, b)| (a.to_owned(), b.to_owned()))
                    .unwrap_or_default();
                (admin, UrlBase::Embedded(a, b), Some(pg))
            }
        };
    let mut conn = PgConnection::connect_with(&admin).await?;
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {template}")))
        .execute(&mut conn)
        .await?;
    conn.close().await?;
    poolkeeper::db::migrate(&admin.clone().database(&template)).await?;
    Ok(Cluster {
        admin,
        template,
        url_base,
        _embedded: embedded,
    })
}

fn rand_u32() -> u32 {
    rand::random()
}

/// Clusters left by earlier runs whose postmaster is gone (a run killed
/// before its cluster was stopped leaves a directory behind).
fn remove_stale_clusters() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let is_ours = entry
            .file_name()
            .to_str()
            .is_some_and(|n| n.starts_with("poolkeeper-test-"));
        let old = entry.metadata().and_then(|m| m.modified()).is_ok_and(|t| {
            SystemTime::now().duration_since(t).unwrap_or_default() > Duration::from_secs(120)
        });
        if !is_ours || !old {
            continue;
        }
        let pid = std::fs::read_to_string(path.join("pg/postmaster.pid"))
            .ok()
            .and_then(|s| s.lines().next().and_then(|l| l.trim().parse::<i32>().ok()));
        // SAFETY: signal 0 only checks that the process exists.
        let alive = pid.is_some_and(|p| unsafe { libc::kill(p, 0) } == 0);
        if !alive {
            let _ = std::fs::remove_dir_all(&path);
        }
    }
}

/// A database of the test cluster, owned by one test: dropped when the
/// last clone goes, at the test's end, passed or panicked.
#[derive(Clone)]
pub struct TestDb {
    pub name: String,
    pub options: PgConnectOptions,
    _dropped_with: Arc<DropOnExit>,
}

/// Drops its database: `WITH (FORCE)` ends the sessions the test left (its
/// pools, a server still running, a child process), on a plain thread with
/// its own runtime, as `cluster()` starts the cluster, because the test's
/// runtime may be the one unwinding. Bounded: a drop that does not finish
/// in time is left to its thread (the database stays), never holding up the
/// run.
struct DropOnExit {
    name: String,
}

const DROP_WITHIN: Duration = Duration::from_secs(10);

impl Drop for DropOnExit {
    fn drop(&mut self) {
        let Some(Ok(c)) = CLUSTER.get() else { return };
        let admin = c.admin.clone();
        let sql = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name);
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let result = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())
                .and_then(|rt| {
                    rt.block_on(async {
                        let drop = async {
                            let mut conn = PgConnection::connect_with(&admin).await?;
                            sqlx::query(sqlx::AssertSqlSafe(sql))
                                .execute(&mut conn)
                                .await?;
                            conn.close().await
                        };
                        match tokio::time::timeout(DROP_WITHIN, drop).await {
                            Ok(r) => r.map_err(|e| e.to_string()),
                            Err(_) => Err(format!("not done within {DROP_WITHIN:?}")),
                        }
                    })
                });
            let _ = done.send(result);
        });
        let outcome = finished
            .recv_timeout(DROP_WITHIN + Duration::from_secs(1))
            .unwrap_or_else(|_| Err("its thread did not answer".to_owned()));
        if let Err(e) = outcome {
            eprintln!("test database {} not dropped: {e}", self.name);
        }
    }
}

impl TestDb {
    /// A `DATABASE_URL` for child processes.
    pub fn url(&self) -> String {
        match &cluster().url_base {
            UrlBase::Embedded(a, b) => format!("{a}{}{b}", self.name),
            UrlBase::External(base) => format!("{base}/{}", self.name),
        }
    }

    /// A pool of 40 for the test's own work. It waits up to 30 s for a
    /// connection (not the server's 2 s): on a loaded 2-CPU machine opening
    /// one can take seconds, and a test of a rule must not fail on that.
    /// Tests of the 503 on an exhausted pool build their own.
    pub async fn pool(&self) -> Db {
        poolkeeper::db::connect_with_acquire_timeout(
            self.options.clone(),
            40,
            Duration::from_secs(30),
        )
        .await
        .expect("connect to the test database")
    }

    pub async fn connection(&self) -> PgConnection {
        PgConnection::connect_with(&self.options)
            .await
            .expect("connect to the test database")
    }
}

async fn create_db(template: Option<&str>) -> TestDb {
    let c = cluster();
    let name = format!("pk_test_{}", uuid::Uuid::new_v4().simple());
    let mut conn = PgConnection::connect_with(&c.admin)
        .await
        .expect("connect to the test cluster");
    let sql = match template {
        Some(t) => format!("CREATE DATABASE {name} TEMPLATE {t}"),
        None => format!("CREATE DATABASE {name}"),
    };
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .execute(&mut conn)
        .await
        .expect("create a test database");
    let _ = conn.close().await;
    TestDb {
        options: c.admin.clone().database(&name),
        _dropped_with: Arc::new(DropOnExit { name: name.clone() }),
        name,
    }
}

/// A fresh database with every migration applied.
pub async fn migrated_db() -> TestDb {
    create_db(Some(&cluster().template)).await
}

/// A fresh, empty database.
pub async fn empty_db() -> TestDb {
    create_db(None).await
}

pub fn test_settings() -> Settings {
    let mut s = Settings::defaults();
    s.bind = "127.0.0.1:0".parse().expect("static address");
    s.datacenter_module = true;
    s.replica = format!("test-{}", rand_u32());
    // Each capacity read reads: the tests read what a write just changed.
    s.capacity_cache = std::time::Duration::ZERO;
    s
}

/// An organization of the test app, with tokens of every scope combination.
pub struct TestOrg {
    pub id: i64,
    pub slug: String,
    /// Scopes orders and inventory.
    pub token: String,
    pub orders_token: String,
    pub inventory_token: String,
    /// Scope metrics alone (an operator's token: it reads every
    /// organization's series).
    pub metrics_token: String,
}

pub struct TestApp {
    pub address: String,
    pub port: u16,
    pub pool: Db,
    pub db: TestDb,
    pub settings: Settings,
    pub org: TestOrg,
    pub other: TestOrg,
    pub http: reqwest::Client,
    pub metrics: Metrics,
}

pub async fn spawn_app() -> TestApp {
    spawn_app_with(|_| {}).await
}

/// The in-process servers' logs: on stdout when `TEST_LOG` is set
/// (`TEST_LOG=1 cargo test --test api NAME -- --nocapture`, `RUST_LOG`
/// filtering as for `serve`), else formatted into a sink, so that every
/// log line's formatting still runs.
fn init_logs() {
    static LOGS: Once = Once::new();
    LOGS.call_once(|| {
        if std::env::var_os("TEST_LOG").is_some() {
            poolkeeper::telemetry::init_logs(std::io::stdout);
        } else {
            poolkeeper::telemetry::init_logs(std::io::sink);
        }
    });
}

/// Starts the application on port 0 against a fresh database, with two
/// organizations (both with the datacenter module on).
pub async fn spawn_app_with(adjust: impl FnOnce(&mut Settings)) -> TestApp {
    init_logs();
    let db = migrated_db().await;
    let pool = db.pool().await;
    let mut settings = test_settings();
    adjust(&mut settings);
    let org = create_org(&pool, "acme", true).await;
    let other = create_org(&pool, "other", true).await;
    let metrics = Metrics::new();
    let app = Application::build(AppState::new(
        settings.clone(),
        pool.clone(),
        metrics.clone(),
    ))
    .expect("build the app");
    let port = app.port();
    tokio::spawn(app.run_until_stopped());
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("http client");
    TestApp {
        address: format!("http://127.0.0.1:{port}"),
        port,
        pool,
        db,
        settings,
        org,
        other,
        http,
        metrics,
    }
}

pub async fn create_org(pool: &Db, slug: &str, datacenter: bool) -> TestOrg {
    let org = poolkeeper::orgs::create(
        pool,
        &Slug::parse(slug).expect("valid slug"),
        slug,
        datacenter,
    )
    .await
    .expect("create org");
    let token = |name: &'static str, scopes: &'static [Scope]| async move {
        poolkeeper::tokens::create(pool, org.id, Some(name), scopes)
            .await
            .expect("create token")
            .1
    };
    TestOrg {
        id: org.id,
        slug: slug.to_owned(),
        token: token("checkout", &[Scope::Orders, Scope::Inventory]).await,
        orders_token: token("orders-only", &[Scope::Orders]).await,
        inventory_token: token("inventory-only", &[Scope::Inventory]).await,
        metrics_token: token("prometheus", &[Scope::Metrics]).await,
    }
}

impl TestApp {
    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.address, path)
    }

    /// The text of this server's `/metrics`, read with a `metrics` token.
    pub async fn metrics_text(&self) -> String {
        let r = self
            .http
            .get(self.url("/metrics"))
            .bearer_auth(&self.org.metrics_token)
            .send()
            .await
            .expect("GET /metrics");
        assert_eq!(
            r.status().as_u16(),
            200,
            "GET /metrics with a metrics token"
        );
        r.text().await.expect("the metrics text")
    }

    /// POST `body` to `path` with the organization's full token: the
    /// status and the JSON answer (`Null` when the answer is not JSON).
    pub async fn post_json(
        &self,
        path: &str,
        body: serde_json::Value,
    ) -> (reqwest::StatusCode, serde_json::Value) {
        let r = self
            .http
            .post(self.url(path))
            .bearer_auth(&self.org.token)
            .json(&body)
            .send()
            .await
            .expect("request");
        let status = r.status();
        (status, r.json().await.unwrap_or(serde_json::Value::Null))
    }

    /// PUT a machine with the full token of `org`.
    pub async fn put_machine(
        &self,
        token: &str,
        tag: &str,
        site: &str,
        vendor: &str,
        profile: &str,
        status: &str,
    ) -> reqwest::Response {
        self.http
            .put(self.url(&format!("/api/v1/machines/{tag}")))
            .bearer_auth(token)
            .json(&serde_json::json!({"site": site, "vendor": vendor, "profile": profile, "status": status}))
            .send()
            .await
            .expect("request")
    }

    pub async fn count(&self, sql: &'static str) -> i64 {
        sqlx::query_scalar(sql)
            .fetch_one(&self.pool)
            .await
            .expect("count query")
    }
}

/// How long a test polls for something that takes milliseconds when the
/// code is right (a session seen waiting on a lock, a terminated session
/// gone): long enough for a loaded shared machine, short enough that a
/// wait that never ends fails the test instead of hanging the run.
pub const POLL_BOUND: Duration = Duration::from_secs(30);

/// Polls `check` until it gives a value, yielding between tries; fails the
/// test naming `what` when it still has none after `within`. For what a
/// test cannot await directly, such as another session's lock wait.
pub async fn until<T, F, Fut>(what: &str, within: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Some(found) = check().await {
            return found;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "waited {within:?} for {what}, in vain"
        );
        tokio::task::yield_now().await;
    }
}

/// Waits for the session of the test's database that `condition` (a
/// `pg_stat_activity` predicate: waiting on a lock, say) names, and
/// terminates it, as a demoted leader's shutdown or a failover does.
pub async fn terminate_session_where(pool: &Db, condition: &str) {
    let sql = format!(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND {condition}"
    );
    let what = format!("a session where {condition}");
    let pid: i32 = until(&what, POLL_BOUND, || async {
        sqlx::query_scalar(sqlx::AssertSqlSafe(sql.clone()))
            .fetch_optional(pool)
            .await
            .expect("pg_stat_activity")
    })
    .await;
    let terminated: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .fetch_one(pool)
        .await
        .expect("terminate");
    assert!(terminated, "terminate {pid} ({condition})");
}

/// The compiled `poolkeeper` binary, for tests that run it as a process.
pub fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_poolkeeper"))
}

/// An organization made directly in SQL, with `machines` ready machines;
/// returns (org id, machine ids).
pub async fn seed_org_with_machines(
    pool: &Db,
    slug: &str,
    datacenter: bool,
    machines: i64,
) -> (i64, Vec<i64>) {
    let org: i64 =
        sqlx::query_scalar("INSERT INTO organizations (slug, name, datacenter_enabled) VALUES ($1, $1, $2) RETURNING id")
            .bind(slug)
            .bind(datacenter)
            .fetch_one(pool)
            .await
            .expect("insert organization");
    let ids = generated_machines(
        pool,
        org,
        machines,
        Generated {
            tag: "'m-' || g",
            site: "'par1'",
            vendor: "'dell'",
            profile: "'r650'",
            status: "'ready'",
        },
    )
    .await;
    (org, ids)
}

// ---- Dashboard helpers ----

/// The password every dashboard test user gets.
pub const STAFF_PASSWORD: &str = "correct horse battery";

/// A browser-like client: keeps cookies, does not follow redirects (tests
/// check the 303s themselves).
pub struct StaffClient {
    pub http: reqwest::Client,
    pub jar: std::sync::Arc<reqwest::cookie::Jar>,
    pub base: String,
}

impl StaffClient {
    pub fn new(base: &str) -> StaffClient {
        let jar = std::sync::Arc::new(reqwest::cookie::Jar::default());
        let http = reqwest::Client::builder()
            .cookie_provider(jar.clone())
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .expect("http client");
        StaffClient {
            http,
            jar,
            base: base.to_owned(),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    pub async fn get(&self, path: &str) -> reqwest::Response {
        self.http.get(self.url(path)).send().await.expect("GET")
    }

    /// GET a page: its status and body.
    pub async fn page(&self, path: &str) -> (u16, String) {
        let r = self.get(path).await;
        let status = r.status().as_u16();
        (status, r.text().await.expect("body"))
    }

    pub async fn post_form(&self, path: &str, form: &[(&str, &str)]) -> reqwest::Response {
        self.http
            .post(self.url(path))
            .form(form)
            .send()
            .await
            .expect("POST")
    }

    /// The value of the session cookie this client holds, if any.
    pub fn session_cookie(&self) -> Option<String> {
        use reqwest::cookie::CookieStore;
        let url: reqwest::Url = self.base.parse().expect("base url");
        let header = self.jar.cookies(&url)?;
        header
            .to_str()
            .ok()?
            .split(';')
            .map(str::trim)
            .find_map(|c| c.strip_prefix("pk_session=").map(str::to_owned))
            .filter(|v| !v.is_empty())
    }

    /// The CSRF token of this client's session, read from a page's logout form.
    pub async fn csrf(&self) -> String {
        let (status, body) = self.page("/jobs").await;
        assert_eq!(status, 200, "a logged-in page: {body}");
        hidden_field(&body, "csrf").expect("a csrf field in the layout")
    }

    /// Logs in through the form; returns the POST's response.
    pub async fn login(&self, email: &str, password: &str) -> reqwest::Response {
        let (status, body) = self.page("/login").await;
        assert_eq!(status, 200);
        let csrf = hidden_field(&body, "csrf").expect("login form csrf");
        self.post_form(
            "/login",
            &[("email", email), ("password", password), ("csrf", &csrf)],
        )
        .await
    }
}

/// The value of the first `<input name=NAME>` in `html`.
pub fn hidden_field(html: &str, name: &str) -> Option<String> {
    let doc = scraper::Html::parse_document(html);
    let sel = scraper::Selector::parse(&format!("input[name=\"{name}\"]")).expect("selector");
    doc.select(&sel)
        .next()
        .and_then(|e| e.value().attr("value"))
        .map(str::to_owned)
}

impl TestApp {
    /// Creates a staff user of `org_id` with STAFF_PASSWORD.
    pub async fn create_staff(&self, org_id: i64, email: &str, role: &str) {
        poolkeeper::staff::create(
            &self.pool,
            org_id,
            &poolkeeper::domain::Email::parse(email).expect("email"),
            poolkeeper::domain::Role::parse(role).expect("role"),
            STAFF_PASSWORD,
        )
        .await
        .expect("create staff user");
    }

    /// A staff user of `app.org` with `role`, logged in.
    pub async fn staff(&self, email: &str, role: &str) -> StaffClient {
        self.create_staff(self.org.id, email, role).await;
        self.logged_in(email).await
    }

    /// A client logged in as `email` with `password` (a user made through
    /// the users page).
    pub async fn logged_in_with(&self, email: &str, password: &str) -> StaffClient {
        let client = StaffClient::new(&self.address);
        let r = client.login(email, password).await;
        assert_eq!(r.status().as_u16(), 303, "login of {email} should succeed");
        client
    }

    pub async fn logged_in(&self, email: &str) -> StaffClient {
        let client = StaffClient::new(&self.address);
        let r = client.login(email, STAFF_PASSWORD).await;
        assert_eq!(r.status().as_u16(), 303, "login of {email} should succeed");
        assert!(client.session_cookie().is_some(), "a session cookie");
        client
    }

    /// Moves a held reservation's deadline into the past (database clock).
    pub async fn make_overdue(&self, id: i64) {
        sqlx::query(
            "UPDATE reservations SET created_at = clock_timestamp() - interval '1 hour',
                    expires_at = clock_timestamp() - interval '1 minute' WHERE id = $1",
        )
        .bind(id)
        .execute(&self.pool)
        .await
        .expect("make overdue");
    }

    pub async fn state_of(&self, id: i64) -> String {
        sqlx::query_scalar("SELECT state FROM reservations WHERE id = $1")
            .bind(id)
            .fetch_one(&self.pool)
            .await
            .expect("state")
    }
}

/// A test that uses `component` (PgBouncer, the browser, systemd-analyze,
/// Prometheus) never passes without it: a missing one fails the test,
/// naming the command that installs it (`scripts/test` installs every
/// one). Such tests are in the `components` binary, out of the default
/// `cargo test`; a run of it leaves some out with libtest's own filter
/// (`cargo test --test components -- --skip browser::`), which the summary
/// counts as filtered out, never as passed.
pub fn needs(component: &str, present: bool, install: &str) {
    assert!(
        present,
        "{component} is not installed: run `scripts/test` (it installs what is missing) or \
         `{install}`; to leave these tests out of a local run, `cargo test --test components -- --skip MODULE::` \
         (they are then counted as filtered out)"
    );
}

/// `needs` for a component that is found as a value (its path, say): the
/// value, or the test fails as `needs` says, so a caller has no early
/// `return` that would report a missing component as `ok`.
pub fn required<T>(component: &str, found: Option<T>, install: &str) -> T {
    needs(component, found.is_some(), install);
    found.expect("needs fails the test when the component is missing")
}

/// A missing component fails the test, naming how to install it.
#[test]
fn a_missing_component_fails_naming_its_install_command() {
    let failure = std::panic::catch_unwind(|| {
        needs(
            "no-such-component",
            false,
            "apt-get install -y no-such-package",
        )
    })
    .expect_err("a missing component fails");
    let msg = failure
        .downcast_ref::<String>()
        .cloned()
        .unwrap_or_default();
    assert!(msg.contains("scripts/test"), "{msg}");
    assert!(msg.contains("apt-get install -y no-such-package"), "{msg}");
    assert!(msg.contains("--skip"), "{msg}");
    needs("present-component", true, "unused");
}

/// `required` fails the same way, and gives what was found.
#[test]
fn a_required_component_is_given_or_the_test_fails() {
    let failure = std::panic::catch_unwind(|| {
        required::<PathBuf>(
            "no-such-component",
            None,
            "apt-get install -y no-such-package",
        )
    })
    .expect_err("a missing component fails");
    let msg = failure
        .downcast_ref::<String>()
        .cloned()
        .unwrap_or_default();
    assert!(msg.contains("scripts/test"), "{msg}");
    assert!(msg.contains("apt-get install -y no-such-package"), "{msg}");
    assert_eq!(required("present-component", Some(7), "unused"), 7);
}
