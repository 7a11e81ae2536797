//! A real browser against the dashboard: headless Chromium driven through
//! WebDriver (chromedriver), with a minimal W3C WebDriver client over
//! reqwest. Logs in, watches the countdown tick, cancels a reservation with
//! a reason, finds it through search and reads who cancelled it and why;
//! then tours every page over the demo's story as support, viewer and admin,
//! checking what a person sees, running axe-core (npm package, installed
//! into target/axe-core by scripts/test) on each page, checking its layout
//! (nothing scrolls sideways at 1280 px, the page does not at 375 px, no
//! table cell breaks a word), and taking screenshots at 1400 and 375 px
//! wide into target/screenshots/.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::{Value, json};

use crate::helpers::{FakeHold, FakeMachine};
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

/// chromedriver, Chromium and axe-core present, or the test fails naming
/// the install (`helpers::needs`).
fn require_browser() {
    let present = find_program(&["chromedriver"]).is_some()
        && find_program(&["chromium", "chromium-browser", "google-chrome"]).is_some()
        && axe_path().is_file();
    crate::helpers::needs(
        "browser",
        present,
        "apt-get install -y chromium chromium-driver nodejs npm && \
         npm install --prefix target/axe-core axe-core@4",
    )
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
                 Install it with `apt-get install -y chromium chromium-driver` (scripts/test does)."
            )
        });
        let chromium = find_program(&["chromium", "chromium-browser", "google-chrome"]).unwrap_or_else(|| {
            panic!("chromium is not installed: `apt-get install -y chromium chromium-driver` (scripts/test does).")
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
                    "--disable-sync", "--window-size=1400,1000",
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

    /// Runs `script` (a function body) in the page; returns its value.
    async fn execute(&self, script: &str) -> Value {
        self.cmd(
            reqwest::Method::POST,
            "/execute/sync",
            Some(json!({"script": script, "args": []})),
        )
        .await
    }

    /// Runs an asynchronous `script`: it calls `arguments[0]` with its value.
    async fn execute_async(&self, script: &str) -> Value {
        self.cmd(
            reqwest::Method::POST,
            "/execute/async",
            Some(json!({"script": script, "args": []})),
        )
        .await
    }

    /// Every element's text for a selector (empty when none).
    async fn texts(&self, css: &str) -> Vec<String> {
        let script = format!(
            "return Array.from(document.querySelectorAll({})).map(e => (e.innerText ?? e.textContent ?? '').trim());",
            json!(css)
        );
        self.execute(&script)
            .await
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|v| v.as_str().unwrap_or("").to_owned())
                    .collect()
            })
            .unwrap_or_default()
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

/// axe.min.js of the npm package `axe-core`, installed by scripts/test with
/// `npm install --prefix target/axe-core axe-core@4`.
fn axe_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("target/axe-core/node_modules/axe-core/axe.min.js")
}

fn axe_source() -> String {
    let path = axe_path();
    std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}. Install axe-core with `npm install --prefix target/axe-core axe-core@4` (scripts/test does).",
            path.display()
        )
    })
}

/// Injects axe-core into the page and runs it; the violations of impact
/// serious or critical, one line each (rule, impact, help, elements).
async fn axe_violations(d: &Driver, axe: &str) -> Vec<String> {
    d.execute(&format!("{axe}\nreturn typeof window.axe;"))
        .await;
    let r = d
        .execute_async(
            "const done = arguments[arguments.length - 1];
             window.axe.run(document, {resultTypes: ['violations']})
               .then(r => done(r.violations
                   .filter(v => v.impact === 'serious' || v.impact === 'critical')
                   .map(v => v.id + ' (' + v.impact + '): ' + v.help + ' at ' +
                        v.nodes.slice(0, 5).map(n => n.target.join(' ')).join(', '))))
               .catch(e => done(['axe failed: ' + e]));",
        )
        .await;
    r.as_array()
        .map(|a| {
            a.iter()
                .map(|v| v.as_str().unwrap_or("").to_owned())
                .collect()
        })
        .unwrap_or_else(|| vec![format!("axe answered {r}")])
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
    require_browser();
    let app = spawn_app().await;
    FakeMachine::new()
        .tag("PK-001")
        .profile("epyc")
        .create(&app.pool, app.org.id)
        .await;
    FakeMachine::new()
        .tag("PK-002")
        .profile("epyc")
        .create(&app.pool, app.org.id)
        .await;
    FakeMachine::new()
        .tag("PK-003")
        .site("ams1")
        .vendor("hpe")
        .profile("xeon")
        .status("maintenance")
        .create(&app.pool, app.org.id)
        .await;
    let id = FakeHold::on("PK-001")
        .order("ORD-4242")
        .create(&app.pool, app.org.id)
        .await;
    FakeHold::on("PK-002")
        .order("ORD-4243")
        .hold_seconds(600)
        .create(&app.pool, app.org.id)
        .await;
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

    // The list refreshes itself (a fetch of the same page every 30 s): a
    // hold made after the page was loaded appears without a reload, and
    // the page says when it last read the list.
    d.goto(&app.url("/reservations")).await;
    let loaded_at = d.text("#live .refreshed-at").await;
    FakeMachine::new()
        .tag("PK-004")
        .profile("epyc")
        .create(&app.pool, app.org.id)
        .await;
    let late = FakeHold::on("PK-004")
        .order("ORD-LATER")
        .create(&app.pool, app.org.id)
        .await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while d
        .texts(&format!("tr[data-reservation=\"{late}\"]"))
        .await
        .is_empty()
    {
        assert!(
            Instant::now() < deadline,
            "the list never refreshed to show ORD-LATER"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_ne!(d.text("#live .refreshed-at").await, loaded_at);
    assert_eq!(
        d.url().await,
        app.url("/reservations"),
        "no reload, no redirect"
    );
    let _ = d.cmd(reqwest::Method::DELETE, "", None).await;
}

/// What the layout of the page in the window breaks, one line each: the
/// page wider than the window; with `boxes`, any element that scrolls
/// sideways in its own box (a `.table-wrap`); and any word of a table cell
/// rendered on more than one line (a Range over each word has one line
/// box, or the word was broken). Hidden elements (`.visually-hidden`, a
/// box under 2 px) are not looked at.
async fn layout_problems(d: &Driver, boxes: bool) -> Vec<String> {
    let script = format!(
        "const boxes = {boxes};
         const problems = [];
         const name = el => el.tagName.toLowerCase() + (el.id ? '#' + el.id : '') +
             (typeof el.className === 'string' && el.className ? '.' + el.className.trim().split(/\\s+/).join('.') : '');
         const hidden = el => el.closest('.visually-hidden') !== null || el.getBoundingClientRect().width < 2;
         const root = document.documentElement;
         if (root.scrollWidth > window.innerWidth) {{
             problems.push('the page scrolls sideways (' + root.scrollWidth + ' px wide in ' + window.innerWidth + ')');
         }}
         if (boxes) {{
             for (const el of document.querySelectorAll('body *')) {{
                 if (['INPUT', 'TEXTAREA', 'SELECT'].includes(el.tagName) || hidden(el)) continue;
                 const x = getComputedStyle(el).overflowX;
                 if ((x === 'auto' || x === 'scroll') && el.scrollWidth > el.clientWidth + 1) {{
                     problems.push(name(el) + ' scrolls sideways (' + el.scrollWidth + ' px wide in ' + el.clientWidth + ')');
                 }}
             }}
         }}
         for (const cell of document.querySelectorAll('td, th')) {{
             if (hidden(cell)) continue;
             const walk = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
             for (let n = walk.nextNode(); n; n = walk.nextNode()) {{
                 for (const m of n.data.matchAll(/\\S+/g)) {{
                     const r = document.createRange();
                     r.setStart(n, m.index);
                     r.setEnd(n, m.index + m[0].length);
                     const lines = new Set(Array.from(r.getClientRects())
                         .filter(b => b.width > 0).map(b => Math.round(b.top)));
                     if (lines.size > 1) {{
                         problems.push('a ' + name(cell) + ' breaks ' + JSON.stringify(m[0]) + ' over ' + lines.size + ' lines');
                     }}
                 }}
             }}
         }}
         return problems;"
    );
    d.execute(&script)
        .await
        .as_array()
        .map(|a| {
            a.iter()
                .map(|v| v.as_str().unwrap_or("").to_owned())
                .collect()
        })
        .unwrap_or_else(|| vec!["the layout check answered nothing".into()])
}

/// What one page must pass: axe-core at full width (no serious or critical
/// violation); at 1280 px nothing scrolls sideways, neither the page nor a
/// table in its box; at 375 px the page does not (a table too wide for a
/// phone scrolls in its own box, by design: its cells never break a word);
/// at both widths no table cell breaks a word; and a screenshot at 1400
/// and 375 px for a reviewer.
async fn check_page(d: &Driver, shots: &Path, name: &str, axe: &str, problems: &mut Vec<String>) {
    d.resize(1400, 1000).await;
    d.screenshot(shots, &format!("{name}.png")).await;
    for v in axe_violations(d, axe).await {
        problems.push(format!("{name}: {v}"));
    }
    d.resize(1280, 1000).await;
    let inner = d.execute("return window.innerWidth;").await;
    assert_eq!(
        inner.as_i64(),
        Some(1280),
        "{name}: the window is 1280 px wide"
    );
    for p in layout_problems(d, true).await {
        problems.push(format!("{name}: at 1280 px {p}"));
    }
    d.resize(375, 900).await;
    for p in layout_problems(d, false).await {
        if !p.starts_with("the page scrolls sideways") {
            problems.push(format!("{name}: at 375 px {p}"));
        }
    }
    let widths = d
        .execute("return [document.documentElement.scrollWidth, window.innerWidth];")
        .await;
    let (scroll, inner) = (
        widths[0].as_i64().unwrap_or(0),
        widths[1].as_i64().unwrap_or(0),
    );
    if inner <= 400 && scroll > inner + 1 {
        problems.push(format!(
            "{name}: at 375 px the page scrolls sideways ({scroll} px wide in {inner})"
        ));
    }
    d.screenshot(shots, &format!("{name}-375.png")).await;
    d.resize(1400, 1000).await;
}

async fn log_in(d: &Driver, app: &crate::helpers::TestApp, email: &str) {
    d.goto(&app.url("/login")).await;
    d.type_into("#email", email).await;
    d.type_into("#password", poolkeeper::demo::PASSWORD).await;
    d.click("main form button[type=submit]").await;
    d.wait_url("the overview after login", |u| !u.contains("/login"))
        .await;
}

async fn log_out(d: &Driver) {
    d.click("header .who button").await;
    d.wait_url("the login page", |u| u.contains("/login")).await;
}

async fn id_of(app: &crate::helpers::TestApp, order_ref: &str) -> i64 {
    sqlx::query_scalar("SELECT id FROM reservations WHERE order_ref = $1")
        .bind(order_ref)
        .fetch_one(&app.pool)
        .await
        .expect(order_ref)
}

/// The demo's story seen in the browser, each
/// page checked by axe-core and at 375 px, with screenshots.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tour_of_the_demo_every_page_accessible_and_readable_at_375_px() {
    require_browser();
    let app = spawn_app().await;
    poolkeeper::demo::load(&app.pool).await.expect("demo");
    let axe = axe_source();
    let shots = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/screenshots");
    std::fs::create_dir_all(&shots).expect("screenshots dir");
    // The README's pictures, under target/ so that a test run leaves the
    // checkout as it found it; `scripts/screenshots` copies them to docs/img.
    let readme_img = shots.join("readme");
    std::fs::create_dir_all(&readme_img).expect("screenshots dir for the README");
    let mut problems = Vec::new();
    let d = Driver::start().await;
    d.cmd(
        reqwest::Method::POST,
        "/timeouts",
        Some(json!({"script": 60_000})),
    )
    .await;

    // The check can fail: an unlabelled field added to the page is reported.
    d.goto(&app.url("/login")).await;
    d.execute("document.querySelector('main').appendChild(document.createElement('input'));")
        .await;
    let seeded = axe_violations(&d, &axe).await;
    assert!(
        seeded.iter().any(|v| v.starts_with("label (critical)")),
        "axe must see an unlabelled input: {seeded:?}"
    );
    d.goto(&app.url("/login")).await;
    check_page(&d, &shots, "10-login", &axe, &mut problems).await;
    log_in(&d, &app, "support@demo.example").await;

    // Overview: per site a table by profile and the last 24 hours.
    assert_eq!(
        d.texts("section.site h2").await,
        ["ams1", "fra1", "par1", "par2"]
    );
    let profiles = d
        .texts("section.site:first-of-type table.profiles tbody th")
        .await;
    assert_eq!(
        profiles.len(),
        5,
        "three, ams1's GPU and the planning story's: {profiles:?}"
    );
    assert!(
        d.text("section.site:first-of-type h3")
            .await
            .contains("Last 24 hours")
    );
    assert!(
        !d.texts("svg.hours rect").await.is_empty(),
        "the story drew bars"
    );
    // R18: the GPU pool at par1 keeps 2 for enterprise; its third machine
    // is sold, so an order without a segment has none left.
    let gpu = "section.site tr[data-profile=\"gpu-h100-8x\"]";
    let kept = d.texts(&format!("{gpu} td[data-k=kept]")).await;
    assert_eq!(kept, ["nothing kept", "2 for enterprise"], "ams1, par1");
    let available = d.texts(&format!("{gpu} td[data-k=available]")).await;
    assert_eq!(available, ["1", "0"], "ams1, par1");
    check_page(&d, &shots, "11-overview", &axe, &mut problems).await;
    // The README's pictures come from this tour, so that they show the
    // pages as they are (refreshed by `scripts/screenshots`).
    d.screenshot(&readme_img, "overview.png").await;

    // The live list: compact rows, the short holds flagged in words, buttons
    // for support.
    d.goto(&app.url("/reservations")).await;
    let rows = d.texts("tr[data-reservation]").await;
    assert!(rows.len() >= poolkeeper::demo::HOLDS, "{rows:?}");
    assert!(
        rows.iter().any(|r| r.contains("Expires soon")),
        "a hold under 2 minutes says so in words: {rows:?}"
    );
    assert_eq!(
        d.texts("table.live thead th").await,
        [
            "Reservation",
            "Order",
            "Machine",
            "Site",
            "Time left",
            "Fence",
            "Actions"
        ]
    );
    assert_eq!(
        d.texts("tr[data-reservation] a.button").await.len(),
        3 * rows.len(),
        "cancel, convert and extend on every row"
    );
    assert!(
        rows.iter()
            .filter(|r| r.contains("DEMO-TRIO-") && r.contains(" of 3)"))
            .count()
            == 3,
        "the order of three, each machine with its place in the order: {rows:?}"
    );
    assert!(d.text("#live-status").await.contains("Last refreshed at"));
    check_page(&d, &shots, "12-reservations", &axe, &mut problems).await;
    d.screenshot(&readme_img, "reservations.png").await;
    d.goto(&app.url("/reservations?within=2")).await;
    assert_eq!(d.texts("tr[data-reservation]").await.len(), 2);
    assert_eq!(
        d.attr("#l-within option[selected]", "value").await,
        "2",
        "the filter in force is shown"
    );

    // Ops' question on each ended reservation: who, and why.
    let stories = [
        (
            "DEMO-CANCEL-1",
            "13-cancelled",
            "Cancelled by support@demo.example at ",
        ),
        (
            "DEMO-SWEPT-1",
            "14-expired-by-sweep",
            "Timed out: expired at ",
        ),
        (
            "DEMO-LATE-1",
            "15-expired-at-point-of-use",
            "Timed out: expired at ",
        ),
        ("DEMO-CONVERT-1", "16-converted", "Converted at "),
    ];
    for (order, shot, start) in stories {
        d.goto(&app.url(&format!("/reservations/{}", id_of(&app, order).await)))
            .await;
        let answer = d.text("#answer").await;
        assert!(answer.starts_with(start), "{order}: {answer}");
        check_page(&d, &shots, shot, &axe, &mut problems).await;
    }
    d.goto(&app.url(&format!(
        "/reservations/{}",
        id_of(&app, "DEMO-SWEPT-1").await
    )))
    .await;
    assert!(
        d.text("#answer")
            .await
            .contains("marked by the sweep on replica demo-")
    );
    d.goto(&app.url(&format!(
        "/reservations/{}",
        id_of(&app, "DEMO-LATE-1").await
    )))
    .await;
    assert!(
        d.text("#answer")
            .await
            .contains("a new order for the machine found it overdue")
    );
    let ended_tag: String = sqlx::query_scalar(
        "SELECT m.asset_tag FROM reservations r JOIN machines m ON m.id = r.machine_id WHERE r.order_ref = 'DEMO-ENDED-1'",
    )
    .fetch_one(&app.pool)
    .await
    .expect("ended machine");
    d.goto(&app.url(&format!("/machines/{ended_tag}"))).await;
    let page = d.text("main").await;
    assert!(
        page.contains("SRV-DEMO-2") && page.contains("provisioning"),
        "{page}"
    );
    check_page(&d, &shots, "17-machine-service-ended", &axe, &mut problems).await;

    // A held one, and the cancel confirmation with its labelled reason.
    let held = id_of(&app, "DEMO-HOLD-0008").await;
    d.goto(&app.url(&format!("/reservations/{held}"))).await;
    assert!(d.text("#answer").await.starts_with("Held until"));
    assert_eq!(
        d.texts("main p.actions a.button").await,
        ["Cancel…", "Convert…", "Extend…"]
    );
    check_page(&d, &shots, "18-held", &axe, &mut problems).await;
    d.click("main p.actions a[href*=\"/cancel\"]").await;
    d.wait_url("the confirmation", |u| u.contains("/cancel"))
        .await;
    check_page(&d, &shots, "19-confirm-cancel", &axe, &mut problems).await;

    // R13, R14: the order of three, extended by support with a reason; its
    // page links the order's other machines; the extend confirmation.
    let trio: Vec<i64> = sqlx::query_scalar(
        "SELECT id FROM reservations WHERE order_ref = 'DEMO-TRIO-1' ORDER BY slot",
    )
    .fetch_all(&app.pool)
    .await
    .expect("the demo's order of three");
    assert_eq!(trio.len(), 3);
    d.goto(&app.url(&format!("/reservations/{}", trio[0])))
        .await;
    let facts = d.text("dl.facts").await;
    assert!(facts.contains("machine 1 of 3, held together"), "{facts}");
    assert_eq!(d.texts("dl.facts ul.order-lines li").await.len(), 3);
    let timeline = d.text("table.timeline").await;
    assert!(
        timeline.contains("extended") && timeline.contains(poolkeeper::demo::EXTEND_REASON),
        "{timeline}"
    );
    assert_eq!(
        d.texts("main p.actions a.button").await,
        [
            "Cancel the order…",
            "Convert the order…",
            "Extend the order…"
        ]
    );
    check_page(&d, &shots, "19b-order-of-three", &axe, &mut problems).await;
    d.click("main p.actions a[href*=\"/extend\"]").await;
    d.wait_url("the extension", |u| u.contains("/extend")).await;
    assert!(d.text("h1").await.starts_with("Extend order DEMO-TRIO-1"));
    check_page(&d, &shots, "19c-confirm-extend", &axe, &mut problems).await;

    // R15: a rack went into maintenance. DEMO-HEALED-1's hold moved to an
    // equivalent machine (flagged, and listed on the machine it left);
    // DEMO-RACK-1 had no equivalent and was cancelled whole, in words.
    let healed = id_of(&app, "DEMO-HEALED-1").await;
    d.goto(&app.url(&format!("/reservations/{healed}"))).await;
    let replaced = d.text("#replaced").await;
    assert!(
        replaced.contains("admin@demo.example") && replaced.contains("maintenance; moved to "),
        "{replaced}"
    );
    check_page(&d, &shots, "19d-healed-hold", &axe, &mut problems).await;
    let left: String = sqlx::query_scalar(
        "SELECT m.asset_tag FROM reservation_events e JOIN machines m ON m.id = e.replaced_machine_id
          WHERE e.reservation_id = $1",
    )
    .bind(healed)
    .fetch_one(&app.pool)
    .await
    .expect("the machine the hold left");
    d.goto(&app.url(&format!("/machines/{left}"))).await;
    assert!(d.text("#moved-away").await.contains("Holds moved"));
    check_page(
        &d,
        &shots,
        "19e-machine-hold-moved-away",
        &axe,
        &mut problems,
    )
    .await;
    let rack = id_of(&app, "DEMO-RACK-1").await;
    d.goto(&app.url(&format!("/reservations/{rack}"))).await;
    let page = d.text("main").await;
    assert!(
        page.contains("maintenance; no equivalent machine in "),
        "{page}"
    );
    // The status form's preview for a machine under a live hold.
    let under: String = sqlx::query_scalar(
        "SELECT m.asset_tag FROM reservations r JOIN machines m ON m.id = r.machine_id
          WHERE r.order_ref = 'DEMO-HOLD-0008'",
    )
    .fetch_one(&app.pool)
    .await
    .expect("a held machine");
    d.goto(&app.url(&format!("/machines/{under}"))).await;
    d.click("#status-form button").await;
    d.wait_url("the preview", |u| u.contains("/status-changes?"))
        .await;
    let summary = d.text("#hold-summary").await;
    assert!(summary.starts_with("1 hold will move"), "{summary}");
    check_page(&d, &shots, "19f-status-change-preview", &axe, &mut problems).await;

    // Reasons in words on machines and why-not.
    d.goto(&app.url("/machines?spec_site=par1&spec_profile=epyc-9354-256g"))
        .await;
    let verdicts = d.texts("td.verdict .badge").await;
    assert!(
        verdicts
            .iter()
            .any(|v| v == "Not a candidate: at another site"),
        "{verdicts:?}"
    );
    assert!(verdicts.iter().all(|v| !v.contains('_')), "{verdicts:?}");
    check_page(&d, &shots, "20-machines-for-an-order", &axe, &mut problems).await;
    d.goto(&app.url("/why-not?site=par1&profile=epyc-9354-256g"))
        .await;
    let summary = d.texts("table.summary tbody th").await;
    assert_eq!(
        summary,
        [
            "candidate",
            "at another site",
            "other vendor",
            "other profile",
            "not ready",
            "in service",
            "held"
        ]
    );
    assert!(d.text("#answer").await.starts_with("Would reserve "));
    check_page(&d, &shots, "21-why-not", &axe, &mut problems).await;
    d.click("table.summary tr[data-reason=wrong_site] a").await;
    d.wait_url("the group", |u| u.contains("reason=wrong_site"))
        .await;
    assert!(d.text("#machines").await.contains("at another site"));
    check_page(&d, &shots, "22-why-not-other-sites", &axe, &mut problems).await;
    d.goto(&app.url("/why-not?site=par1&profile=epyc-9354-256g&quantity=3"))
        .await;
    let three = d.text("#answer").await;
    assert!(
        three.starts_with("Would reserve ") && three.matches(", ").count() == 2,
        "three machines named: {three}"
    );
    check_page(&d, &shots, "22b-why-not-three", &axe, &mut problems).await;

    // R18 on why-not and the machines check: the GPU pool's two sellable
    // machines are kept for enterprise, for an order of no segment; an
    // enterprise order may take them.
    d.goto(&app.url("/why-not?site=par1&profile=gpu-h100-8x"))
        .await;
    assert!(
        d.text("#answer")
            .await
            .starts_with("Reserved: kept for enterprise."),
        "{}",
        d.text("#answer").await
    );
    let kept = d.texts("table.candidates td.verdict .badge").await;
    assert!(
        !kept.is_empty()
            && kept
                .iter()
                .all(|v| v == "Not a candidate: kept for enterprise"),
        "{kept:?}"
    );
    check_page(&d, &shots, "22c-why-not-kept-for", &axe, &mut problems).await;
    d.goto(&app.url("/why-not?site=par1&profile=gpu-h100-8x&segment=enterprise"))
        .await;
    assert!(d.text("#answer").await.starts_with("Would reserve "));
    d.goto(&app.url("/machines?profile=gpu-h100-8x&spec_site=par1&spec_profile=gpu-h100-8x"))
        .await;
    let verdicts = d.texts("td.verdict .badge").await;
    assert!(
        verdicts
            .iter()
            .any(|v| v == "Not a candidate: kept for enterprise"),
        "{verdicts:?}"
    );
    check_page(&d, &shots, "22d-machines-kept-for", &axe, &mut problems).await;

    // Lost demand: the demo's refused orders, each code in its own column,
    // and the overview's chart in its own colours.
    d.goto(&app.url("/demand")).await;
    // Two unavailable: a GPU where there is none, and the order that asked
    // for the exact hardware a substitute could have served (R20), whose
    // twin was served by it.
    for (k, expected) in [
        ("unavailable_7d", 2),
        ("reserved_7d", 1),
        ("customer_limit_7d", 1),
        ("contended_7d", 1),
        ("substituted_7d", 1),
    ] {
        // Besides the planning story's pools (R21), refused for days.
        let total: i64 = d
            .texts(&format!(
                "table.demand tr:not([data-profile=\"epyc-9754-768g\"]):not([data-profile=\"xeon-6430-768g\"]) td[data-k={k}]"
            ))
            .await
            .iter()
            .filter_map(|t| t.parse::<i64>().ok())
            .sum();
        assert_eq!(total, expected, "{k} in the demo");
    }
    check_page(&d, &shots, "22e-lost-demand", &axe, &mut problems).await;
    d.goto(&app.url("/")).await;
    // Two unavailable bars: the GPU's pool and the exact order's (R20).
    for (class, bars) in [
        ("spark-unavailable", 2),
        ("spark-reserved", 1),
        ("spark-customer_limit", 1),
    ] {
        assert_eq!(
            d.texts(&format!(
                "tr:not([data-profile=\"epyc-9754-768g\"]) svg.spark rect.{class}"
            ))
            .await
            .len(),
            bars,
            "{class} drawn"
        );
    }

    // R21: the planning page ranks the pools by days left (the sold-out
    // fra1 pool and the profile served only by substitutes first), flags
    // them in words, and a pool's page draws its 90 days with a table.
    d.goto(&app.url("/planning")).await;
    let first = d.texts("table.planning tbody tr th").await;
    assert_eq!(first.first().map(String::as_str), Some("fra1"), "{first:?}");
    let flags = d.texts("table.planning td[data-k=order_by] strong").await;
    assert!(
        flags.len() >= 3 && flags.iter().all(|f| f == "Flagged"),
        "{flags:?}"
    );
    check_page(&d, &shots, "23-planning", &axe, &mut problems).await;
    d.screenshot(&readme_img, "planning.png").await;
    d.goto(&app.url("/planning/pool?site=par1&profile=epyc-9754-768g"))
        .await;
    assert_eq!(d.text("dd[data-k=available]").await, "6");
    assert!(
        d.texts("table.plan-days tbody tr").await.len() >= 90,
        "a row per day of history"
    );
    assert!(
        !d.texts("svg.plan line.proj").await.is_empty(),
        "the projection"
    );
    check_page(&d, &shots, "23b-planning-pool", &axe, &mut problems).await;

    // A hold with its customer and segment: in the live list and on its page.
    let enterprise = id_of(&app, "DEMO-ENT-1").await;
    d.goto(&app.url("/reservations")).await;
    assert_eq!(
        d.text(&format!("tr[data-reservation=\"{enterprise}\"] .customer"))
            .await,
        "for CUST-ORBIT (enterprise)"
    );
    d.goto(&app.url(&format!("/reservations/{enterprise}")))
        .await;
    assert_eq!(d.text("#customer").await, "CUST-ORBIT");
    assert_eq!(d.text("#segment").await, "enterprise");
    check_page(&d, &shots, "22f-hold-with-customer", &axe, &mut problems).await;

    // R20: the order a declared substitute served, in the live list and on
    // its page; the overview marks its pool.
    let upgraded = id_of(&app, "DEMO-UP-1").await;
    d.goto(&app.url("/reservations")).await;
    assert_eq!(
        d.text(&format!("tr[data-reservation=\"{upgraded}\"] .substituted"))
            .await,
        "served by epyc-9124-256g, asked epyc-9124-128g"
    );
    d.goto(&app.url(&format!("/reservations/{upgraded}"))).await;
    assert!(
        d.text("#substituted")
            .await
            .starts_with("served by epyc-9124-256g, asked epyc-9124-128g")
    );
    check_page(
        &d,
        &shots,
        "22g-served-by-a-substitute",
        &axe,
        &mut problems,
    )
    .await;
    d.goto(&app.url("/")).await;
    assert_eq!(
        d.texts("table.demand tr[data-profile=\"epyc-9124-128g\"] .badge.substituted")
            .await,
        ["served by substitutes: 1"]
    );

    for (path, shot) in [
        ("/machines", "23-machines"),
        ("/search?q=DEMO", "24-search"),
        ("/jobs", "25-jobs"),
    ] {
        d.goto(&app.url(path)).await;
        check_page(&d, &shots, shot, &axe, &mut problems).await;
    }
    log_out(&d).await;

    // A viewer sees the same answers and no buttons.
    log_in(&d, &app, "viewer@demo.example").await;
    d.goto(&app.url("/reservations")).await;
    assert!(d.texts("tr[data-reservation]").await.len() >= poolkeeper::demo::HOLDS);
    assert!(
        d.texts("a.button").await.is_empty(),
        "no buttons for a viewer"
    );
    assert_eq!(
        d.texts("table.live thead th").await.len(),
        6,
        "no actions column"
    );
    d.goto(&app.url(&format!("/reservations/{held}"))).await;
    assert!(d.texts("a.button").await.is_empty());
    check_page(&d, &shots, "26-held-as-viewer", &axe, &mut problems).await;
    log_out(&d).await;

    // The admin's pages.
    log_in(&d, &app, "admin@demo.example").await;
    d.goto(&app.url("/settings#substitutes")).await;
    assert_eq!(
        d.texts("#substitutes-list tr[data-profile=\"epyc-9124-128g\"] td")
            .await
            .first()
            .map(String::as_str),
        Some("epyc-9124-256g")
    );
    for (path, shot) in [
        ("/settings", "27-settings"),
        ("/users", "28-users"),
        ("/tokens", "29-tokens"),
        ("/audit", "30-audit"),
    ] {
        d.goto(&app.url(path)).await;
        assert!(!d.text("h1").await.is_empty(), "{path}");
        check_page(&d, &shots, shot, &axe, &mut problems).await;
    }
    let _ = d.cmd(reqwest::Method::DELETE, "", None).await;
    assert!(
        problems.is_empty(),
        "accessibility problems ({}):\n{}",
        problems.len(),
        problems.join("\n")
    );
}

/// S1 and S3 in a real browser against a real provider (oidc-provider):
/// the login page's single sign-on form, the provider's login page, back
/// to the overview signed in (the `SameSite=Strict` session cookie after
/// the provider's cross-site redirect), then sign-out through the
/// provider's end-session page, after which the provider asks for the
/// login again. The pages of ours on the way are checked by axe-core.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_sign_on_through_the_browser_and_out_through_the_provider() {
    require_browser();
    let app = crate::helpers::oidc::app_with(|_| {}).await;
    let provider = crate::helpers::oidc::Provider::start(
        &app.address,
        &json!({"ana": {"email": "ana@corp.example", "name": "Ana", "groups": ["pk-support"]}}),
    );
    crate::helpers::oidc::configure(&app, &provider, poolkeeper::sso::Passwords::On).await;
    let axe = axe_source();
    let shots = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/screenshots");
    std::fs::create_dir_all(&shots).expect("screenshots dir");
    let mut problems = Vec::new();
    let d = Driver::start().await;
    let at_provider = |u: &str| u.starts_with(&provider.issuer);

    d.goto(&app.url("/login")).await;
    check_page(&d, &shots, "login-sso", &axe, &mut problems).await;
    d.type_into("#sso-org", "acme").await;
    d.click("form[action='/login/sso'] button").await;
    d.wait_url("the provider's login page", at_provider).await;
    d.type_into("input[name=login]", "ana").await;
    d.type_into("input[name=password]", "any password").await;
    d.click("button[type=submit]").await;
    let overview = format!("{}/", app.address);
    d.wait_url("the overview, signed in", |u| u == overview)
        .await;
    let who = d.text("header .who").await;
    assert!(
        who.contains("ana@corp.example") && who.contains("support"),
        "{who}"
    );

    // Sign-out: our session ends, then the provider's end-session page.
    d.click("header .who button").await;
    d.wait_url("the provider's end-session page", |u| {
        u.starts_with(&format!("{}/session/end", provider.issuer))
    })
    .await;
    assert_eq!(
        app.count("SELECT count(*) FROM sessions WHERE revoked_at IS NULL")
            .await,
        0
    );
    d.click("button[value=yes]").await;
    let back = d
        .wait_url("back on the login page", |u| u.contains("/login"))
        .await;
    assert!(back.starts_with(&app.address), "{back}");
    assert_eq!(d.texts(".flash").await, ["You are logged out."]);
    // Signed out at the provider too: a new sign-in asks for the login.
    d.type_into("#sso-org", "acme").await;
    d.click("form[action='/login/sso'] button").await;
    d.wait_url("the provider's login page again", at_provider)
        .await;
    d.find("input[name=login]").await;
    assert!(problems.is_empty(), "{problems:#?}");
}
