//! No input a person can type makes a page fail. The demo's
//! search prefixes, a NUL in a token's name, the database's own refusal of
//! a value (the second net), and a crawler that finds every form reachable
//! from the overview as viewer, support and admin and submits each one with
//! hostile values, one field at a time.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use scraper::{ElementRef, Html, Selector};

use crate::helpers::{FakeHold, FakeMachine};
use crate::helpers::{StaffClient, TestApp, hidden_field, spawn_app};

fn sel(s: &str) -> Selector {
    Selector::parse(s).expect("selector")
}

/// A client of the demo organization, logged in with the demo's password.
async fn demo_client(app: &TestApp, email: &str) -> StaffClient {
    app.logged_in_with(email, poolkeeper::demo::PASSWORD).await
}

/// Every prefix of `s`, shortest first, and each in lower case too.
fn prefixes(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (i, _) in s.char_indices().skip(1).chain([(s.len(), ' ')]) {
        out.push(s[..i].to_owned());
        out.push(s[..i].to_lowercase());
    }
    out
}

#[tokio::test]
async fn every_prefix_of_a_demo_order_ref_and_asset_tag_is_a_search_not_a_500() {
    let app = spawn_app().await;
    poolkeeper::demo::load(&app.pool).await.expect("demo");
    let c = demo_client(&app, "support@demo.example").await;
    let refs: Vec<(i64, String)> = sqlx::query_as(
        "SELECT r.id, r.order_ref FROM reservations r JOIN organizations o ON o.id = r.org_id
          WHERE o.slug = 'demo' AND r.order_ref IN ('DEMO-HOLD-0001', 'DEMO-CANCEL-1', 'DEMO-CONVERT-1')",
    )
    .fetch_all(&app.pool)
    .await
    .expect("demo refs");
    assert_eq!(refs.len(), 3, "the demo's story: {refs:?}");
    let tag = "PK-00002";
    let mut targets: Vec<(String, String)> = refs
        .iter()
        .map(|(id, r)| (r.clone(), format!("/reservations/{id}")))
        .collect();
    targets.push((tag.to_owned(), format!("/machines/{tag}")));
    let mut searched = 0;
    for (full, page) in &targets {
        for p in prefixes(full) {
            let r = c
                .http
                .get(c.url("/search"))
                .query(&[("q", &p)])
                .send()
                .await
                .expect("search");
            let status = r.status().as_u16();
            let location = r
                .headers()
                .get("location")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            let body = r.text().await.unwrap_or_default();
            searched += 1;
            if &p == full {
                assert_eq!(status, 303, "{p}: one exact hit opens it: {body}");
                assert_eq!(location.as_deref(), Some(page.as_str()), "{p}");
            } else {
                assert!(
                    status == 200 || status == 303,
                    "searching {p:?} answered {status}: {body}"
                );
            }
            if status == 200 {
                // The prefix of a ref lists it among the hits (at most 50
                // of each kind, most recent first: only checked when the
                // list is not full).
                let doc = Html::parse_document(&body);
                let hits = doc.select(&sel("table th[scope=row]")).count();
                let listed = body.contains(full.as_str());
                assert!(
                    listed || hits >= 50,
                    "searching {p:?} did not list {full}: {hits} hits"
                );
            }
        }
    }
    assert!(searched > 60, "{searched} searches");
}

#[tokio::test]
async fn a_nul_in_a_token_name_is_a_400_naming_the_field_and_writes_nothing() {
    let app = spawn_app().await;
    let c = app.staff("root@acme.example", "admin").await;
    let csrf = c.csrf().await;
    let before = app.count("SELECT count(*) FROM api_tokens").await;
    for name in ["ci\0token", "\0", "bell\u{7}", "esc\u{1b}[31m"] {
        let r = c
            .post_form(
                "/tokens",
                &[("csrf", &csrf), ("name", name), ("orders", "on")],
            )
            .await;
        assert_eq!(r.status().as_u16(), 400, "{name:?}");
        let body = r.text().await.expect("body");
        assert!(body.contains("“name”"), "names the field: {body}");
        assert!(body.contains("/static/app.css"), "the dashboard's page");
    }
    assert_eq!(app.count("SELECT count(*) FROM api_tokens").await, before);
    // The same field with storable text still works.
    let r = c
        .post_form(
            "/tokens",
            &[("csrf", &csrf), ("name", "ci 😀 'token'"), ("orders", "on")],
        )
        .await;
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(
        app.count("SELECT count(*) FROM api_tokens").await,
        before + 1
    );
}

/// The second net: whatever reaches PostgreSQL and is refused as a data
/// exception (SQLSTATE class 22) is a 400 at both boundaries, not a 500.
#[tokio::test]
async fn a_value_the_database_refuses_is_a_400_at_both_boundaries() {
    use actix_web::ResponseError;
    let app = spawn_app().await;
    for (sql, state) in [
        ("SELECT int4 '99999999999'", "22003"),
        ("SELECT 'abc'::bigint", "22P02"),
        ("SELECT convert_from('\\xff'::bytea, 'UTF8')", "22021"),
    ] {
        let e = sqlx::query(sql)
            .execute(&app.pool)
            .await
            .expect_err("a data exception");
        assert_eq!(
            poolkeeper::db::sqlstate(&e).as_deref(),
            Some(state),
            "{sql}"
        );
        let dash = poolkeeper::dashboard::DashError::from(
            sqlx::query(sql)
                .execute(&app.pool)
                .await
                .expect_err("again"),
        );
        assert_eq!(dash.status_code().as_u16(), 400, "{sql}: {dash:?}");
        let api = poolkeeper::error::ApiError::from(e);
        assert_eq!(api.status_code().as_u16(), 400, "{sql}: {api:?}");
        assert_eq!(api.code(), "invalid");
    }
    // Other database errors keep their answers.
    let e = sqlx::query("SELECT * FROM no_such_table")
        .execute(&app.pool)
        .await
        .expect_err("undefined table");
    let dash = poolkeeper::dashboard::DashError::from(e);
    assert_eq!(dash.status_code().as_u16(), 500);
}

/// A path segment is checked like a field (a NUL in an asset tag reached
/// PostgreSQL as well).
#[tokio::test]
async fn a_control_character_in_a_path_segment_is_a_400() {
    let app = spawn_app().await;
    let c = app.staff("dc@acme.example", "viewer").await;
    for path in ["/machines/PK%00X", "/machines/%1B"] {
        let (status, body) = c.page(path).await;
        assert_eq!(status, 400, "{path}: {body}");
        assert!(body.contains("control character"), "{body}");
    }
    assert_eq!(c.page("/machines/no-such").await.0, 404);
}

// ---------------------------------------------------------------------------
// The crawler
// ---------------------------------------------------------------------------

/// Pages fetched per role, at most.
const MAX_PAGES: usize = 60;
/// URLs of one shape (`/machines/*`, `/reservations/*/cancel?fence`) fetched,
/// at most: the 360 machines of the demo have one page shape.
const PER_SHAPE: usize = 2;

/// The shape of a dashboard URL: the first segment, then `*` for every
/// segment that names an object (ids, tags), with the query's keys.
fn shape(url: &str) -> String {
    let (path, query) = url.split_once('?').unwrap_or((url, ""));
    let mut segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    for (i, s) in segs.iter_mut().enumerate() {
        if i == 1 && !matches!(*s, "webhook" | "headroom") {
            *s = "*";
        }
    }
    let mut keys: Vec<&str> = query
        .split('&')
        .filter_map(|kv| kv.split('=').next())
        .filter(|k| !k.is_empty())
        .collect();
    keys.sort_unstable();
    keys.dedup();
    format!("/{}?{}", segs.join("/"), keys.join("&"))
}

/// A form as a browser would submit it untouched.
#[derive(Debug, Clone)]
struct Form {
    method: String,
    action: String,
    /// (name, value, hidden)
    fields: Vec<(String, String, bool)>,
    found_on: String,
}

/// A plausible value for an empty field a person must fill, so that the
/// other fields' hostile values reach the handler's own checks.
fn plausible(name: &str, kind: &str) -> Option<&'static str> {
    Some(match (name, kind) {
        ("reason", _) => "crawler: customer changed their mind",
        ("service_ref", _) => "SRV-CRAWL",
        ("name", _) => "crawler-token",
        (_, "email") => "crawler@demo.example",
        (_, "password") => "crawler password",
        _ => return None,
    })
}

fn forms_of(page: &str, html: &str) -> Vec<Form> {
    let doc = Html::parse_document(html);
    let mut out = Vec::new();
    for form in doc.select(&sel("form")) {
        let method = form
            .value()
            .attr("method")
            .unwrap_or("get")
            .to_ascii_lowercase();
        let action = match form.value().attr("action") {
            Some(a) if !a.is_empty() => a.to_owned(),
            _ => page.split('?').next().unwrap_or(page).to_owned(),
        };
        let mut fields = Vec::new();
        for el in form.select(&sel("input[name], select[name], textarea[name]")) {
            if let Some(f) = field_of(el) {
                fields.push(f);
            }
        }
        out.push(Form {
            method,
            action,
            fields,
            found_on: page.to_owned(),
        });
    }
    out
}

fn field_of(el: ElementRef) -> Option<(String, String, bool)> {
    let v = el.value();
    let name = v.attr("name")?.to_owned();
    match v.name() {
        "input" => {
            let kind = v.attr("type").unwrap_or("text").to_ascii_lowercase();
            match kind.as_str() {
                "submit" | "button" | "reset" | "image" | "file" => None,
                // Ticked, as a person filling the form in would: a token
                // needs a scope before its name is looked at.
                "checkbox" => Some((name, v.attr("value").unwrap_or("on").to_owned(), false)),
                "radio" => v
                    .attr("checked")
                    .map(|_| (name, v.attr("value").unwrap_or("on").to_owned(), false)),
                _ => {
                    let value = v.attr("value").unwrap_or("").to_owned();
                    let value = if value.is_empty() {
                        plausible(&name, &kind).unwrap_or("").to_owned()
                    } else {
                        value
                    };
                    Some((name, value, kind == "hidden"))
                }
            }
        }
        "select" => {
            let options: Vec<ElementRef> = el.select(&sel("option")).collect();
            let chosen = options
                .iter()
                .find(|o| o.value().attr("selected").is_some())
                .or(options.first())?;
            let value = chosen
                .value()
                .attr("value")
                .map(str::to_owned)
                .unwrap_or_else(|| chosen.text().collect());
            Some((name, value, false))
        }
        "textarea" => {
            let text: String = el.text().collect();
            let text = if text.is_empty() {
                plausible(&name, "textarea").unwrap_or("").to_owned()
            } else {
                text
            };
            Some((name, text, false))
        }
        _ => None,
    }
}

/// Percent-encodes raw bytes (hostile values need not be UTF-8).
fn enc(bytes: &[u8]) -> String {
    let mut out = String::new();
    for b in bytes {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(*b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn encode(fields: &[(String, Vec<u8>)]) -> String {
    fields
        .iter()
        .map(|(k, v)| format!("{}={}", enc(k.as_bytes()), enc(v)))
        .collect::<Vec<_>>()
        .join("&")
}

/// What a person (or a pasted spreadsheet, or an attacker) may type.
fn hostile_values(order_ref: &str, asset_tag: &str) -> Vec<Vec<u8>> {
    let mut v: Vec<Vec<u8>> = [
        "",
        " ",
        "\0",
        "a\0b",
        "\u{1}\u{7f}\u{1b}[31m",
        "line\r\nbreak",
        "\t",
        "\u{85}\u{9b}",
        "'; DROP TABLE machines; --",
        "\"><script>alert(1)</script>",
        "%",
        "_",
        "%_%\\",
        "😀🏳️‍🌈",
        "\u{202e}\u{feff}",
        "-1",
        "0",
        "99999999999999999999999",
        "-9223372036854775809",
        "1e309",
        "NaN",
        "http://127.0.0.1:5432/",
        "http://169.254.169.254/latest/meta-data/",
        "http://[::1]:8080/",
        "http://localhost:5432/",
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect();
    v.push("x".repeat(5000).into_bytes());
    v.push("é".repeat(2600).into_bytes());
    v.push(vec![0xff, 0xfe, b'a']);
    for p in [
        &order_ref[..4],
        &order_ref[..order_ref.len() - 2],
        &asset_tag[..3],
        &asset_tag[..asset_tag.len() - 1],
    ] {
        v.push(p.as_bytes().to_vec());
    }
    v
}

struct Crawl {
    requests: usize,
    /// (method action, status) -> count
    seen: BTreeMap<(String, u16), usize>,
    failures: Vec<String>,
}

impl Crawl {
    fn record(&mut self, what: &str, status: u16, detail: impl FnOnce() -> String) {
        self.requests += 1;
        *self.seen.entry((what.to_owned(), status)).or_default() += 1;
        if status >= 500 {
            self.failures
                .push(format!("{what} answered {status}: {}", detail()));
        }
    }
}

/// Pages reachable from the overview, breadth first, bounded; and the forms
/// on them, one of each shape.
async fn crawl(c: &StaffClient, crawl: &mut Crawl) -> Vec<Form> {
    let mut queue = VecDeque::from(["/".to_owned()]);
    let mut visited = HashSet::new();
    let mut per_shape: HashMap<String, usize> = HashMap::new();
    let mut forms: Vec<Form> = Vec::new();
    let mut form_shapes = HashSet::new();
    while let Some(url) = queue.pop_front() {
        if visited.len() >= MAX_PAGES || !visited.insert(url.clone()) {
            continue;
        }
        let r = c.get(&url).await;
        let status = r.status().as_u16();
        let body = r.text().await.unwrap_or_default();
        crawl.record(&format!("GET {}", shape(&url)), status, || url.clone());
        if status != 200 {
            continue;
        }
        let doc = Html::parse_document(&body);
        for a in doc.select(&sel("a[href]")) {
            let Some(href) = a.value().attr("href") else {
                continue;
            };
            let href = href.split('#').next().unwrap_or("");
            if !href.starts_with('/') || href.starts_with("//") || href.starts_with("/static/") {
                continue;
            }
            let n = per_shape.entry(shape(href)).or_default();
            if *n < PER_SHAPE && !visited.contains(href) {
                *n += 1;
                queue.push_back(href.to_owned());
            }
        }
        for f in forms_of(&url, &body) {
            let mut names: Vec<&str> = f.fields.iter().map(|(n, _, _)| n.as_str()).collect();
            names.sort_unstable();
            let key = format!("{} {} {}", f.method, shape(&f.action), names.join(","));
            if form_shapes.insert(key) {
                forms.push(f);
            }
        }
    }
    forms
}

/// Each form, each field but the CSRF token in turn set to each hostile
/// value, the others as the page gave them.
async fn submit_hostile(c: &StaffClient, forms: &[Form], values: &[Vec<u8>], crawl: &mut Crawl) {
    for form in forms {
        // Logging out would end the crawl; the other forms carry fields.
        if form.action == "/logout" {
            continue;
        }
        for (i, (name, _, _)) in form.fields.iter().enumerate() {
            if name == "csrf" {
                continue;
            }
            for value in values {
                let fields: Vec<(String, Vec<u8>)> = form
                    .fields
                    .iter()
                    .enumerate()
                    .map(|(j, (n, v, _))| {
                        let v = if i == j {
                            value.clone()
                        } else {
                            v.as_bytes().to_vec()
                        };
                        (n.clone(), v)
                    })
                    .collect();
                let body = encode(&fields);
                let req = if form.method == "post" {
                    c.http
                        .post(c.url(&form.action))
                        .header("content-type", "application/x-www-form-urlencoded")
                        .body(body)
                } else {
                    c.http.get(c.url(&format!("{}?{body}", form.action)))
                };
                let r = req.send().await.expect("request");
                let status = r.status().as_u16();
                let text = r.text().await.unwrap_or_default();
                let what = format!(
                    "{} {} [{name}]",
                    form.method.to_uppercase(),
                    shape(&form.action)
                );
                crawl.record(&what, status, || {
                    format!(
                        "value {:?} (form on {}): {}",
                        String::from_utf8_lossy(value),
                        form.found_on,
                        text.chars().take(300).collect::<String>()
                    )
                });
                if (400..500).contains(&status) {
                    assert!(
                        text.contains("/static/app.css"),
                        "{what}: a {status} is a page of the dashboard: {text}"
                    );
                }
            }
        }
    }
}

#[tokio::test]
async fn every_form_survives_hostile_values_as_every_role() {
    let started = Instant::now();
    let app = spawn_app().await;
    poolkeeper::demo::load(&app.pool).await.expect("demo");
    let (order_ref, asset_tag): (String, String) = sqlx::query_as(
        "SELECT r.order_ref, m.asset_tag FROM reservations r JOIN machines m ON m.id = r.machine_id
          WHERE r.order_ref = 'DEMO-HOLD-0001'",
    )
    .fetch_one(&app.pool)
    .await
    .expect("a demo hold");
    let values = hostile_values(&order_ref, &asset_tag);
    let mut crawl_log = Crawl {
        requests: 0,
        seen: BTreeMap::new(),
        failures: Vec::new(),
    };
    let mut form_count = BTreeMap::new();
    // The admin last: its forms change the organization (a new token, a
    // user), which must not change what the other roles see first.
    for email in [
        "viewer@demo.example",
        "support@demo.example",
        "admin@demo.example",
    ] {
        let c = demo_client(&app, email).await;
        let forms = crawl(&c, &mut crawl_log).await;
        form_count.insert(
            email,
            forms
                .iter()
                .map(|f| format!("{} {}", f.method, shape(&f.action)))
                .collect::<Vec<_>>(),
        );
        submit_hostile(&c, &forms, &values, &mut crawl_log).await;
        // Still logged in: the session survived every form.
        assert_eq!(c.page("/jobs").await.0, 200, "{email} still logged in");
    }
    // The login form, as a person who is not logged in yet.
    let anonymous = StaffClient::new(&app.address);
    let (_, page) = anonymous.page("/login").await;
    assert!(hidden_field(&page, "csrf").is_some());
    let login_forms = forms_of("/login", &page);
    submit_hostile(&anonymous, &login_forms, &values, &mut crawl_log).await;

    let r = app
        .http
        .get(app.url("/readyz"))
        .send()
        .await
        .expect("readyz");
    assert_eq!(r.status().as_u16(), 200, "the server still answers");
    eprintln!(
        "crawler: {} requests in {:?}; forms per role: {form_count:#?}",
        crawl_log.requests,
        started.elapsed()
    );
    assert!(
        crawl_log.failures.is_empty(),
        "{} answers were 5xx:\n{}",
        crawl_log.failures.len(),
        crawl_log.failures.join("\n")
    );
    // The crawl reached what it claims: every role's filters and search,
    // the actions of support, the admin's forms, each with a valid token
    // (the handlers answered, not the CSRF check).
    let reached = |what: &str| crawl_log.seen.keys().any(|(w, _)| w.starts_with(what));
    for what in [
        "GET /search? [q]",
        "GET /machines? [site]",
        "GET /reservations? [site]",
        "GET /why-not? [site]",
        "POST /reservations/*/cancel? [reason]",
        "POST /reservations/*/convert? [service_ref]",
        "POST /tokens? [name]",
        "POST /users? [email]",
        "POST /settings/webhook? [url]",
        "POST /settings/headroom? [site]",
        "POST /settings? [datacenter]",
        "POST /login? [email]",
    ] {
        assert!(
            reached(what),
            "the crawl never submitted {what}: {form_count:#?}"
        );
    }
    let forbidden = crawl_log
        .seen
        .iter()
        .filter(|((w, s), _)| w.starts_with("POST") && *s == 403)
        .map(|(_, n)| n)
        .sum::<usize>();
    let posts = crawl_log
        .seen
        .iter()
        .filter(|((w, _), _)| w.starts_with("POST"))
        .map(|(_, n)| n)
        .sum::<usize>();
    assert!(
        forbidden * 2 < posts,
        "most POSTs must pass the CSRF check: {forbidden} of {posts} were 403"
    );
    assert!(
        started.elapsed() < Duration::from_secs(120),
        "kept fast: {:?}",
        started.elapsed()
    );
}

/// A browser sends a textarea's lines as CRLF: a reason typed on two lines
/// cancels, and is stored with plain line breaks.
#[tokio::test]
async fn a_reason_typed_on_several_lines_cancels() {
    let app = spawn_app().await;
    FakeMachine::new()
        .tag("PK-1")
        .profile("epyc")
        .create(&app.pool, app.org.id)
        .await;
    let (id, fence) = FakeHold::on("PK-1")
        .order("ORD-1")
        .create_with_fence(&app.pool, app.org.id)
        .await;
    let c = app.staff("ana@acme.example", "support").await;
    let csrf = c.csrf().await;
    let r = c
        .post_form(
            &format!("/reservations/{id}/cancel"),
            &[
                ("csrf", &csrf),
                ("fence", &fence.to_string()),
                ("reason", "Customer left.\r\nNew order follows."),
            ],
        )
        .await;
    assert_eq!(r.status().as_u16(), 303);
    let reason: String = sqlx::query_scalar("SELECT end_reason FROM reservations WHERE id = $1")
        .bind(id)
        .fetch_one(&app.pool)
        .await
        .expect("reason");
    assert_eq!(reason, "Customer left.\nNew order follows.");
}
