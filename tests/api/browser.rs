//! A real browser against the dashboard: headless Chromium driven through
//! WebDriver (chromedriver), with a minimal W3C WebDriver client over
//! reqwest. Logs in, watches the countdown tick, cancels a reservation with
//! a reason, finds it through search and reads who cancelled it and why.
//! Screenshots of each page go to target/screenshots/.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::{Value, json};

use crate::helpers::{STAFF_PASSWORD, spawn_app};

const ELEMENT_KEY: &str = "element-6066-11e4-a52e-4f735466cecf";

fn find_program(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    for name in names {
        for dir in std::env::split_paths(&path).chain([
            PathBuf::from("/usr/bin"),
            PathBuf::from("/usr/lib/chromium"),
        ]) {
            let p = dir.join(name);
            if p.is_file() {
                return Some(p);
            }
        }
    }
    None
}

/// chromedriver on a free port, killed when dropped.
struct Driver {
    _child: tokio::process::Child,
    base: String,
    http: reqwest::Client,
    session: String,
    profile_dir: PathBuf,
}

impl Driver {
    async fn start() -> Driver {
        let chromedriver = find_program(&["chromedriver"]).unwrap_or_else(|| {
            panic!(
                "chromedriver is not installed: this test needs a real browser. \
                 Install it with `apt-get install -y chromium chromium-driver` (.ci/run does)."
            )
        });
        let chromium = find_program(&["chromium", "chromium-browser", "google-chrome"]).unwrap_or_else(|| {
            panic!("chromium is not installed: `apt-get install -y chromium chromium-driver` (.ci/run does).")
        });
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let child = tokio::process::Command::new(&chromedriver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", chromedriver.display()));
        let base = format!("http://127.0.0.1:{port}");
        let http = reqwest::Client::new();
        // Polling an external process's readiness, with a deadline.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ready = http.get(format!("{base}/status")).send().await.ok();
            let ready = match ready {
                Some(r) => r
                    .json::<Value>()
                    .await
                    .ok()
                    .is_some_and(|v| v["value"]["ready"] == true),
                None => false,
            };
            if ready {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "chromedriver did not become ready on port {port}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let profile_dir =
            std::env::temp_dir().join(format!("pk-chromium-{}", uuid::Uuid::new_v4().simple()));
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium.to_string_lossy(),
                "args": [
                    "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--no-first-run", "--disable-background-networking", "--disable-component-update",
                    "--disable-sync", "--window-size=1280,900",
                    format!("--user-data-dir={}", profile_dir.display()),
                ]
            }
        }}});
        let r: Value = http
            .post(format!("{base}/session"))
            .json(&caps)
            .send()
            .await
            .expect("new session")
            .json()
            .await
            .expect("session json");
        let session = r["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("WebDriver refused a session: {r}"))
            .to_owned();
        Driver {
            _child: child,
            base,
            http,
            session,
            profile_dir,
        }
    }

    async fn cmd(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let url = format!("{}/session/{}{}", self.base, self.session, path);
        let mut req = self.http.request(method, &url);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let r: Value = req
            .send()
            .await
            .expect("webdriver call")
            .json()
            .await
            .expect("webdriver json");
        if let Some(err) = r["value"]["error"].as_str() {
            panic!("WebDriver {path}: {err}: {}", r["value"]["message"]);
        }
        r["value"].clone()
    }

    async fn goto(&self, url: &str) {
        self.cmd(reqwest::Method::POST, "/url", Some(json!({"url": url})))
            .await;
    }

    async fn url(&self) -> String {
        self.cmd(reqwest::Method::GET, "/url", None)
            .await
            .as_str()
            .unwrap_or("")
            .to_owned()
    }

    async fn find(&self, css: &str) -> String {
        let v = self
            .cmd(
                reqwest::Method::POST,
                "/element",
                Some(json!({"using": "css selector", "value": css})),
            )
            .await;
        v[ELEMENT_KEY]
            .as_str()
            .unwrap_or_else(|| panic!("no element {css}"))
            .to_owned()
    }

    async fn text(&self, css: &str) -> String {
        let el = self.find(css).await;
        self.cmd(reqwest::Method::GET, &format!("/element/{el}/text"), None)
            .await
            .as_str()
            .unwrap_or("")
            .to_owned()
    }

    async fn attr(&self, css: &str, name: &str) -> String {
        let el = self.find(css).await;
        self.cmd(
            reqwest::Method::GET,
            &format!("/element/{el}/attribute/{name}"),
            None,
        )
        .await
        .as_str()
        .unwrap_or("")
        .to_owned()
    }

    async fn type_into(&self, css: &str, text: &str) {
        let el = self.find(css).await;
        self.cmd(
            reqwest::Method::POST,
            &format!("/element/{el}/value"),
            Some(json!({"text": text})),
        )
        .await;
    }

    async fn click(&self, css: &str) {
        let el = self.find(css).await;
        self.cmd(
            reqwest::Method::POST,
            &format!("/element/{el}/click"),
            Some(json!({})),
        )
        .await;
    }

    async fn resize(&self, width: u32, height: u32) {
        self.cmd(
            reqwest::Method::POST,
            "/window/rect",
            Some(json!({"width": width, "height": height})),
        )
        .await;
    }

    async fn screenshot(&self, dir: &Path, name: &str) {
        let b64 = self.cmd(reqwest::Method::GET, "/screenshot", None).await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(b64.as_str().unwrap_or(""))
            .expect("screenshot base64");
        std::fs::write(dir.join(name), png).expect("write screenshot");
    }

    /// Polls until `cond` holds for the URL, with a deadline.
    async fn wait_url(&self, what: &str, cond: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let url = self.url().await;
            if cond(&url) {
                return url;
            }
            assert!(Instant::now() < deadline, "waiting for {what}; at {url}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.profile_dir);
    }
}

/// "14:59" or "1:02:03" to seconds.
fn seconds(text: &str) -> i64 {
    text.trim()
        .split(':')
        .map(|p| {
            p.trim()
                .parse::<i64>()
                .unwrap_or_else(|_| panic!("a countdown, got {text:?}"))
        })
        .fold(0, |acc, n| acc * 60 + n)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browser_watches_the_countdown_cancels_and_finds_who_did_it() {
    let app = spawn_app().await;
    app.insert_machine(app.org.id, "PK-001", "par1", "dell", "epyc", "ready")
        .await;
    app.insert_machine(app.org.id, "PK-002", "par1", "dell", "epyc", "ready")
        .await;
    app.insert_machine(app.org.id, "PK-003", "ams1", "hpe", "xeon", "maintenance")
        .await;
    let (id, _) = app.insert_held(app.org.id, "ORD-4242", "PK-001", 900).await;
    app.insert_held(app.org.id, "ORD-4243", "PK-002", 600).await;
    app.create_staff(app.org.id, "ana@acme.example", "support")
        .await;
    let shots = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/screenshots");
    std::fs::create_dir_all(&shots).expect("screenshots dir");

    let d = Driver::start().await;
    d.goto(&app.url("/login")).await;
    d.screenshot(&shots, "01-login.png").await;
    d.type_into("#email", "ana@acme.example").await;
    d.type_into("#password", STAFF_PASSWORD).await;
    d.click("main form button[type=submit]").await;
    d.wait_url("the overview after login", |u| !u.contains("/login"))
        .await;
    assert!(d.text("header .who").await.contains("ana@acme.example"));
    d.screenshot(&shots, "02-overview.png").await;

    d.goto(&app.url("/reservations")).await;
    let row = format!("tr[data-reservation=\"{id}\"]");
    let first = d.text(&format!("{row} .countdown")).await;
    // The countdown ticks in the browser: poll the DOM until it changes.
    let deadline = Instant::now() + Duration::from_secs(10);
    let second = loop {
        let now = d.text(&format!("{row} .countdown")).await;
        if now != first {
            break now;
        }
        assert!(
            Instant::now() < deadline,
            "the countdown never moved from {first}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(seconds(&second) < seconds(&first), "{first} then {second}");
    assert!(seconds(&first) <= 900 && seconds(&first) > 850, "{first}");
    d.screenshot(&shots, "03-reservations.png").await;

    d.click(&format!("{row} a[href*=\"/cancel\"]")).await;
    d.wait_url("the confirmation page", |u| {
        u.contains(&format!("/reservations/{id}/cancel"))
    })
    .await;
    d.type_into("#reason", "customer changed plan").await;
    d.screenshot(&shots, "04-confirm-cancel.png").await;
    d.click("main form button[type=submit]").await;
    d.wait_url("the reservation after cancelling", |u| {
        u.contains("flash=cancelled")
    })
    .await;
    assert_eq!(d.text(".flash").await, "The reservation was cancelled.");

    // Find it again through the search box, as ops would.
    d.goto(&app.url("/")).await;
    d.type_into("#nav-q", "ORD-4242").await;
    d.click("header form.search button").await;
    d.wait_url("the reservation found by search", |u| {
        u.ends_with(&format!("/reservations/{id}"))
    })
    .await;
    let answer = d.text("#answer").await;
    assert!(
        answer.starts_with("Cancelled by ana@acme.example at ")
            && answer.ends_with(": customer changed plan"),
        "{answer}"
    );
    assert_eq!(d.text("h1 .state").await, "cancelled");
    d.screenshot(&shots, "05-reservation-cancelled.png").await;

    // The other reservation still counts down; and a narrow window.
    d.goto(&app.url("/reservations")).await;
    assert!(
        d.attr("[data-remaining]", "data-remaining")
            .await
            .parse::<i64>()
            .is_ok()
    );
    d.resize(420, 900).await;
    d.screenshot(&shots, "06-reservations-narrow.png").await;
    d.goto(&app.url("/machines?spec_site=par1&spec_profile=epyc"))
        .await;
    d.resize(1280, 900).await;
    d.screenshot(&shots, "07-machines.png").await;
    assert_eq!(app.state_of(id).await, "cancelled");
    let _ = d.cmd(reqwest::Method::DELETE, "", None).await;
}
