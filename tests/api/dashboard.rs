//! The staff dashboard: pages parsed with scraper, every link
//! followed, forms driven as a browser would (cookies, CSRF), roles, tenant
//! isolation, the R12 gate, and agreement with the allocator's reasons.

mod capacity;

use std::collections::HashSet;

use poolkeeper::allocator::{self, OrderSpec};
use poolkeeper::domain::{Profile, Site, Vendor};
use poolkeeper::inventory::MachineFilter;
use scraper::{Html, Selector};

use crate::helpers::{
    Cancelled, Converted, Expired, FakeHold, FakeMachine, Held, HoldState, InService,
};
use crate::helpers::{
    STAFF_PASSWORD, StaffClient, TestApp, create_org, hidden_field, spawn_app, spawn_app_with,
};

fn sel(s: &str) -> Selector {
    Selector::parse(s).expect("selector")
}

fn text_of(html: &str, selector: &str) -> Vec<String> {
    let doc = Html::parse_document(html);
    doc.select(&sel(selector))
        .map(|e| {
            e.text()
                .collect::<String>()
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect()
}

/// Same-origin links of a page: a[href], link[href], script[src].
fn same_origin_links(base: &str, html: &str) -> Vec<String> {
    let doc = Html::parse_document(html);
    let mut out = Vec::new();
    for (s, attr) in [
        ("a[href]", "href"),
        ("link[href]", "href"),
        ("script[src]", "src"),
    ] {
        for e in doc.select(&sel(s)) {
            let Some(href) = e.value().attr(attr) else {
                continue;
            };
            let path = if let Some(rest) = href.strip_prefix(base) {
                rest.to_owned()
            } else if href.starts_with('/') && !href.starts_with("//") {
                href.to_owned()
            } else {
                continue;
            };
            out.push(path.split('#').next().unwrap_or("").to_owned());
        }
    }
    out
}

/// The page's own invariants (CSP without inline code, headers on tables),
/// then every same-origin link on it: none may answer 4xx or 5xx.
async fn check_page_and_links(c: &StaffClient, path: &str, seen: &mut HashSet<String>) -> String {
    let r = c.get(path).await;
    assert_eq!(r.status().as_u16(), 200, "GET {path}");
    let csp = r
        .headers()
        .get("content-security-policy")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    assert!(
        csp.contains("script-src 'self'") && !csp.contains("unsafe-inline"),
        "CSP of {path}: {csp}"
    );
    let body = r.text().await.expect("body");
    {
        let doc = Html::parse_document(&body);
        assert_eq!(
            doc.select(&sel("[style]")).count(),
            0,
            "no style attributes on {path}"
        );
        assert_eq!(
            doc.select(&sel("script:not([src])")).count(),
            0,
            "no inline script on {path}"
        );
        assert_eq!(
            doc.select(&sel("style")).count(),
            0,
            "no style element on {path}"
        );
        for table in doc.select(&sel("table")) {
            assert!(
                table.select(&sel("th[scope]")).count() > 0,
                "tables have <th scope> on {path}"
            );
        }
        // Every visible input has a label.
        for input in doc.select(&sel("input:not([type=hidden]), select, textarea")) {
            let id = input
                .value()
                .attr("id")
                .unwrap_or_else(|| panic!("an input without id on {path}"));
            assert!(
                doc.select(&sel(&format!("label[for=\"{id}\"]"))).count() == 1,
                "input {id} has a label on {path}"
            );
        }
    }
    for link in same_origin_links(&c.base, &body) {
        if link.is_empty() || !seen.insert(link.clone()) {
            continue;
        }
        let r = c.get(&link).await;
        let status = r.status().as_u16();
        assert!(status < 400, "link {link} on {path} answered {status}");
        if status == 303 || status == 302 {
            let to = r
                .headers()
                .get("location")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_owned();
            let status = c.get(&to).await.status().as_u16();
            assert!(
                status < 400,
                "link {link} on {path} redirected to {to}, which answered {status}"
            );
        }
    }
    body
}

/// A pool at par1 with every exclusion kind for the spec par1/epyc/dell, and
/// machines at two other sites.
struct Pool {
    held_id: i64,
    held_fence: i64,
}

async fn every_kind_pool(app: &TestApp) -> Pool {
    let org = app.org.id;
    FakeMachine::new()
        .tag("PK-001")
        .profile("epyc")
        .create(&app.pool, org)
        .await; // candidate
    FakeMachine::new()
        .tag("PK-002")
        .site("ams1")
        .profile("epyc")
        .create(&app.pool, org)
        .await; // wrong site
    FakeMachine::new()
        .tag("PK-003")
        .vendor("hpe")
        .profile("epyc")
        .create(&app.pool, org)
        .await; // wrong vendor
    FakeMachine::new()
        .tag("PK-004")
        .profile("xeon")
        .create(&app.pool, org)
        .await; // wrong profile
    FakeMachine::new()
        .tag("PK-005")
        .profile("epyc")
        .status("maintenance")
        .create(&app.pool, org)
        .await; // not ready
    FakeMachine::new()
        .tag("PK-006")
        .profile("epyc")
        .create(&app.pool, org)
        .await; // in service
    FakeMachine::new()
        .tag("PK-007")
        .profile("epyc")
        .create(&app.pool, org)
        .await; // held
    FakeMachine::new()
        .tag("PK-008")
        .site("fra1")
        .vendor("supermicro")
        .profile("epyc")
        .status("broken")
        .create(&app.pool, org)
        .await;
    FakeHold::on("PK-006")
        .order("ORD-SOLD")
        .state(InService)
        .service_ref("SRV-6")
        .create(&app.pool, org)
        .await;
    let (held_id, held_fence) = FakeHold::on("PK-007")
        .order("ORD-HELD")
        .create_with_fence(&app.pool, org)
        .await;
    Pool {
        held_id,
        held_fence,
    }
}

#[tokio::test]
async fn every_page_parses_shows_its_content_and_its_links_work() {
    let app = spawn_app().await;
    let pool = every_kind_pool(&app).await;
    // Another org's objects must never appear.
    FakeMachine::new()
        .tag("OTHER-1")
        .profile("epyc")
        .create(&app.pool, app.other.id)
        .await;
    FakeHold::on("OTHER-1")
        .order("ORD-OTHER")
        .create(&app.pool, app.other.id)
        .await;
    sqlx::query("INSERT INTO leases (key, holder, expires_at) VALUES ('sweep', 'web-2-abc', clock_timestamp() + interval '1 minute')")
        .execute(&app.pool)
        .await
        .expect("lease");
    sqlx::query("INSERT INTO sweep_runs (replica, lease_fence, finished_at, expired) VALUES ('web-2-abc', 1, clock_timestamp(), 3)")
        .execute(&app.pool)
        .await
        .expect("sweep run");
    sqlx::query("INSERT INTO lease_errors (key, replica, message) VALUES ('sweep', 'web-3', 'connection refused')")
        .execute(&app.pool)
        .await
        .expect("lease error");
    let c = app.staff("admin@acme.example", "admin").await;
    let mut seen = HashSet::new();

    let body = check_page_and_links(&c, "/", &mut seen).await;
    assert_eq!(text_of(&body, "section.site h2"), ["ams1", "fra1", "par1"]);
    // par1: 6 machines; sellable PK-001,003,004; held PK-007; sold PK-006;
    // not ready PK-005. By profile: epyc (5) and xeon (PK-004).
    let par1 = "section.site:nth-of-type(3)";
    assert_eq!(
        text_of(&body, &format!("{par1} tfoot td[data-k]")).join(" "),
        "3 1 1 1 6",
        "par1 counts"
    );
    assert_eq!(
        text_of(&body, &format!("{par1} tbody th")),
        ["epyc", "xeon"],
        "par1's profiles"
    );
    assert_eq!(
        text_of(&body, &format!("{par1} tbody tr[data-profile=epyc] td")).join(" "),
        "2 1 1 1 5 nothing kept 2",
        "then the headroom (none) and what an order without a segment may take"
    );
    assert_eq!(
        text_of(&body, &format!("{par1} tbody tr[data-profile=xeon] td")).join(" "),
        "1 0 0 0 1 nothing kept 1"
    );
    // Each number once: the bar carries no text labels, the table has them.
    assert_eq!(
        Html::parse_document(&body)
            .select(&sel("svg.bar text"))
            .count(),
        0
    );
    // The 24-hour chart: ORD-HELD was created this hour at par1, as was
    // ORD-SOLD (converted at once).
    let day = Html::parse_document(&body)
        .select(&sel(&format!("{par1} p.day")))
        .next()
        .and_then(|p| p.value().attr("data-day").map(str::to_owned))
        .expect("the day's totals");
    assert_eq!(day, "2 1 0 0", "created, converted, expired, cancelled");
    assert!(
        Html::parse_document(&body)
            .select(&sel(&format!("{par1} svg.hours rect.created")))
            .count()
            == 1
    );
    assert!(!body.contains("OTHER-1"));

    let body = check_page_and_links(&c, "/machines", &mut seen).await;
    assert_eq!(
        Html::parse_document(&body)
            .select(&sel("tr[data-asset-tag]"))
            .count(),
        8
    );
    assert!(
        !body.contains("OTHER-1"),
        "another org's machine is not listed"
    );
    let body = check_page_and_links(&c, "/machines?status=maintenance", &mut seen).await;
    assert_eq!(text_of(&body, "tr[data-asset-tag] th"), ["PK-005"]);
    let body = check_page_and_links(
        &c,
        "/machines?spec_site=par1&spec_profile=epyc&spec_vendor=dell",
        &mut seen,
    )
    .await;
    assert!(body.contains("Candidate"));

    // A filter naming a site and a profile is an order spec too.
    let body = check_page_and_links(&c, "/machines?site=par1&profile=epyc", &mut seen).await;
    assert_eq!(
        text_of(&body, "td.verdict[data-kind=held] .reason").len(),
        1,
        "PK-007 is held for this order"
    );
    let body = check_page_and_links(&c, "/machines/PK-006", &mut seen).await;
    assert!(body.contains("SRV-6") && body.contains("ORD-SOLD"));

    let body = check_page_and_links(&c, "/reservations", &mut seen).await;
    let rows = text_of(&body, "tr[data-reservation]");
    assert_eq!(rows.len(), 1, "one held reservation in this org: {rows:?}");
    assert!(rows[0].contains("ORD-HELD") && rows[0].contains("PK-007"));
    let remaining: i64 = Html::parse_document(&body)
        .select(&sel("[data-remaining]"))
        .next()
        .and_then(|e| e.value().attr("data-remaining").map(str::to_owned))
        .expect("a countdown")
        .parse()
        .expect("seconds");
    assert!((880..=900).contains(&remaining), "remaining {remaining}");
    assert!(body.contains(&format!(
        "/reservations/{}/cancel?fence={}",
        pool.held_id, pool.held_fence
    )));

    let body =
        check_page_and_links(&c, &format!("/reservations/{}", pool.held_id), &mut seen).await;
    assert!(
        text_of(&body, "#answer")[0].starts_with("Held until"),
        "the sentence"
    );
    assert!(
        text_of(&body, "table.timeline td")
            .iter()
            .any(|t| t == "created")
    );

    let body = check_page_and_links(
        &c,
        &format!(
            "/reservations/{}/cancel?fence={}",
            pool.held_id, pool.held_fence
        ),
        &mut seen,
    )
    .await;
    assert_eq!(
        hidden_field(&body, "fence").as_deref(),
        Some(pool.held_fence.to_string().as_str())
    );
    assert!(body.contains("returns the machine to stock"));
    check_page_and_links(
        &c,
        &format!("/reservations/{}/convert", pool.held_id),
        &mut seen,
    )
    .await;

    let body = check_page_and_links(&c, "/search?q=PK-00", &mut seen).await;
    assert_eq!(text_of(&body, "table th[scope=row]").len(), 8);
    let body =
        check_page_and_links(&c, "/why-not?site=par1&profile=epyc&vendor=dell", &mut seen).await;
    assert_eq!(text_of(&body, "#answer"), ["Would reserve PK-001."]);
    check_page_and_links(&c, "/why-not", &mut seen).await;

    let body = check_page_and_links(&c, "/jobs", &mut seen).await;
    assert!(
        body.contains("web-2-abc") && body.contains("connection refused") && body.contains("Live")
    );
    let body = check_page_and_links(&c, "/settings", &mut seen).await;
    assert!(body.contains("Deployment switch") && body.contains("checked"));
    assert!(seen.contains("/static/app.css") && seen.contains("/static/app.js"));
}

#[tokio::test]
async fn login_refuses_a_wrong_password_and_records_the_attempt() {
    let app = spawn_app().await;
    app.create_staff(app.org.id, "ana@acme.example", "support")
        .await;
    let c = StaffClient::new(&app.address);
    let r = c.login("ana@acme.example", "wrong password").await;
    assert_eq!(r.status().as_u16(), 401);
    let body = r.text().await.expect("body");
    assert!(body.contains("do not match"));
    assert!(c.session_cookie().is_none());
    assert_eq!(
        c.get("/").await.status().as_u16(),
        303,
        "still not logged in"
    );
    let r = c.login("nobody@acme.example", STAFF_PASSWORD).await;
    assert_eq!(
        r.status().as_u16(),
        401,
        "an unknown account is refused the same way"
    );
    assert_eq!(app.count("SELECT count(*) FROM sessions").await, 0);
    assert_eq!(
        app.count("SELECT count(*) FROM login_attempts WHERE NOT succeeded")
            .await,
        2
    );
    assert_eq!(
        app.count("SELECT count(*) FROM audit_log WHERE action = 'login_failed'")
            .await,
        2
    );
    // Never the password, anywhere in the audit trail.
    assert_eq!(
        app.count("SELECT count(*) FROM audit_log WHERE concat_ws(' ', actor, action, object, detail) LIKE '%wrong password%'")
            .await,
        0
    );
    // A login form without its double-submit token is refused.
    let r = c
        .post_form(
            "/login",
            &[("email", "ana@acme.example"), ("password", STAFF_PASSWORD)],
        )
        .await;
    assert_eq!(r.status().as_u16(), 403);
    let r = c.login("ana@acme.example", STAFF_PASSWORD).await;
    assert_eq!(r.status().as_u16(), 303);
    assert_eq!(
        app.count("SELECT count(*) FROM login_attempts WHERE succeeded")
            .await,
        1
    );
    assert_eq!(
        app.count("SELECT count(*) FROM audit_log WHERE action = 'login' AND org_id IS NOT NULL")
            .await,
        1
    );
}

#[tokio::test]
async fn repeated_failures_are_throttled() {
    let app = spawn_app().await;
    app.create_staff(app.org.id, "ana@acme.example", "support")
        .await;
    sqlx::query("INSERT INTO login_attempts (email, source_addr, succeeded) SELECT 'ana@acme.example', '192.0.2.1', false FROM generate_series(1, 10)")
        .execute(&app.pool)
        .await
        .expect("failures");
    let c = StaffClient::new(&app.address);
    let r = c.login("ana@acme.example", STAFF_PASSWORD).await;
    assert_eq!(r.status().as_u16(), 429, "even the right password waits");
    assert_eq!(app.count("SELECT count(*) FROM sessions").await, 0);

    // Per address the bound is higher: ana's refused attempt above and 48
    // failures for other accounts from this client's address still let bob
    // in; the 50th failure does not.
    app.create_staff(app.org.id, "bob@acme.example", "support")
        .await;
    sqlx::query(
        "INSERT INTO login_attempts (email, source_addr, succeeded)
         SELECT 'guess' || i || '@acme.example', '127.0.0.1', false FROM generate_series(1, 48) AS i",
    )
    .execute(&app.pool)
    .await
    .expect("failures");
    assert_eq!(
        c.login("bob@acme.example", STAFF_PASSWORD)
            .await
            .status()
            .as_u16(),
        303
    );
    sqlx::query("INSERT INTO login_attempts (email, source_addr, succeeded) VALUES ('guess@acme.example', '127.0.0.1', false)")
        .execute(&app.pool)
        .await
        .expect("failure");
    let fresh = StaffClient::new(&app.address);
    assert_eq!(
        fresh
            .login("bob@acme.example", STAFF_PASSWORD)
            .await
            .status()
            .as_u16(),
        429
    );
}

/// A client that sends `cookie` by hand: replays an old session cookie.
async fn with_cookie(app: &TestApp, cookie: &str, path: &str) -> u16 {
    app.http
        .get(app.url(path))
        .header("cookie", format!("pk_session={cookie}"))
        .send()
        .await
        .expect("GET")
        .status()
        .as_u16()
}

#[tokio::test]
async fn logout_revokes_the_session() {
    let app = spawn_app().await;
    let c = app.staff("ana@acme.example", "support").await;
    let cookie = c.session_cookie().expect("cookie");
    assert_eq!(with_cookie(&app, &cookie, "/").await, 200);
    let csrf = c.csrf().await;
    // Logging out needs the CSRF token too.
    assert_eq!(c.post_form("/logout", &[]).await.status().as_u16(), 403);
    let r = c.post_form("/logout", &[("csrf", &csrf)]).await;
    assert_eq!(r.status().as_u16(), 303);
    assert_eq!(r.headers()["location"], "/login?flash=logged_out");
    assert_eq!(c.get("/").await.status().as_u16(), 303);
    assert_eq!(
        with_cookie(&app, &cookie, "/").await,
        303,
        "the old cookie is dead"
    );
    assert_eq!(
        app.count("SELECT count(*) FROM sessions WHERE revoked_at IS NOT NULL")
            .await,
        1
    );
    assert_eq!(
        app.count("SELECT count(*) FROM audit_log WHERE action = 'logout'")
            .await,
        1
    );
}

#[tokio::test]
async fn the_session_id_changes_at_login() {
    let app = spawn_app().await;
    let c = app.staff("ana@acme.example", "support").await;
    let first = c.session_cookie().expect("first cookie");
    let r = c.login("ana@acme.example", STAFF_PASSWORD).await;
    assert_eq!(r.status().as_u16(), 303);
    let second = c.session_cookie().expect("second cookie");
    assert_ne!(first, second, "a new session id at login");
    assert_eq!(
        with_cookie(&app, &first, "/").await,
        303,
        "the session held before login is revoked"
    );
    assert_eq!(with_cookie(&app, &second, "/").await, 200);
    // The stored value is a hash, not the cookie.
    let stored: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM sessions WHERE token_hash = convert_to($1, 'UTF8')",
    )
    .bind(&second)
    .fetch_one(&app.pool)
    .await
    .expect("count");
    assert_eq!(stored, 0);
}

#[tokio::test]
async fn idle_and_old_sessions_end() {
    let app = spawn_app().await;
    let c = app.staff("ana@acme.example", "support").await;
    assert_eq!(c.get("/").await.status().as_u16(), 200);
    sqlx::query("UPDATE sessions SET last_seen_at = clock_timestamp() - interval '31 minutes'")
        .execute(&app.pool)
        .await
        .expect("idle");
    assert_eq!(c.get("/").await.status().as_u16(), 303, "idle timeout");
    let c = app.logged_in("ana@acme.example").await;
    sqlx::query("UPDATE sessions SET created_at = clock_timestamp() - interval '13 hours' WHERE revoked_at IS NULL")
        .execute(&app.pool)
        .await
        .expect("old");
    assert_eq!(c.get("/").await.status().as_u16(), 303, "absolute lifetime");
}

#[tokio::test]
async fn secure_cookies_use_the_host_prefix() {
    let app = spawn_app_with(|s| s.secure_cookies = true).await;
    app.create_staff(app.org.id, "ana@acme.example", "support")
        .await;
    let c = StaffClient::new(&app.address);
    let (_, body) = c.page("/login").await;
    let csrf = hidden_field(&body, "csrf").expect("csrf");
    // The test client speaks plain HTTP, so it would not send Secure cookies
    // back: read the Set-Cookie header itself.
    let r = app
        .http
        .post(app.url("/login"))
        .header("cookie", format!("__Host-pk_login={csrf}"))
        .form(&[
            ("email", "ana@acme.example"),
            ("password", STAFF_PASSWORD),
            ("csrf", &csrf),
        ])
        .send()
        .await
        .expect("login");
    assert_eq!(r.status().as_u16(), 303);
    let set: Vec<String> = r
        .headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok().map(str::to_owned))
        .collect();
    let session = set
        .iter()
        .find(|c| c.starts_with("__Host-pk_session="))
        .expect("session cookie");
    for attr in ["HttpOnly", "SameSite=Strict", "Secure", "Path=/"] {
        assert!(session.contains(attr), "{attr} in {session}");
    }
    assert!(
        !session.contains("Domain"),
        "__Host- cookies have no Domain"
    );
}

/// Reads a confirmation page's form: its action and every field.
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

fn with(fields: &[(String, String)], extra: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut v = fields.to_vec();
    v.extend(extra.iter().map(|(k, x)| (k.to_string(), x.to_string())));
    v
}

async fn post(c: &StaffClient, action: &str, fields: &[(String, String)]) -> reqwest::Response {
    c.http
        .post(c.url(action))
        .form(fields)
        .send()
        .await
        .expect("POST")
}

#[tokio::test]
async fn cancel_and_convert_through_the_forms() {
    let app = spawn_app().await;
    FakeMachine::new()
        .tag("PK-1")
        .profile("epyc")
        .create(&app.pool, app.org.id)
        .await;
    FakeMachine::new()
        .tag("PK-2")
        .profile("epyc")
        .create(&app.pool, app.org.id)
        .await;
    let a = FakeHold::on("PK-1")
        .order("ORD-A")
        .create(&app.pool, app.org.id)
        .await;
    let b = FakeHold::on("PK-2")
        .order("ORD-B")
        .create(&app.pool, app.org.id)
        .await;
    let c = app.staff("ana@acme.example", "support").await;

    // Cancel: the list links to a confirmation page with the POST form.
    let (_, list) = c.page("/reservations").await;
    let confirm = Html::parse_document(&list)
        .select(&sel(&format!(
            "tr[data-reservation=\"{a}\"] a[href*=\"/cancel\"]"
        )))
        .next()
        .and_then(|e| e.value().attr("href").map(str::to_owned))
        .expect("a cancel link");
    let (status, page) = c.page(&confirm).await;
    assert_eq!(status, 200);
    let (action, fields) = form_of(&page);
    // A reason is required: refused, nothing written.
    let r = post(&c, &action, &with(&fields, &[("reason", "   ")])).await;
    assert_eq!(r.status().as_u16(), 400);
    assert!(
        r.text()
            .await
            .expect("body")
            .contains("A reason is required")
    );
    assert_eq!(app.state_of(a).await, "held");
    let r = post(
        &c,
        &action,
        &with(&fields, &[("reason", "customer changed plan")]),
    )
    .await;
    assert_eq!(r.status().as_u16(), 303);
    let to = r.headers()["location"]
        .to_str()
        .expect("location")
        .to_owned();
    assert_eq!(to, format!("/reservations/{a}?flash=cancelled"));
    let (_, body) = c.page(&to).await;
    assert_eq!(text_of(&body, ".flash"), ["The reservation was cancelled."]);
    let sentence = text_of(&body, "#answer").remove(0);
    assert!(
        sentence.starts_with("Cancelled by ana@acme.example at ")
            && sentence.ends_with(": customer changed plan"),
        "{sentence}"
    );
    assert_eq!(app.state_of(a).await, "cancelled");
    assert_eq!(
        app.count("SELECT count(*) FROM audit_log WHERE action = 'reservation.cancel'")
            .await,
        1
    );

    // Convert: an invalid service reference is refused, then a good one.
    let (_, page) = c.page(&format!("/reservations/{b}/convert")).await;
    let (action, fields) = form_of(&page);
    let r = post(&c, &action, &with(&fields, &[("service_ref", "SRV 9!")])).await;
    assert_eq!(r.status().as_u16(), 400);
    assert_eq!(app.state_of(b).await, "held");
    let r = post(&c, &action, &with(&fields, &[("service_ref", "SRV-9")])).await;
    assert_eq!(r.status().as_u16(), 303);
    let (_, body) = c.page(&format!("/reservations/{b}")).await;
    let sentence = text_of(&body, "#answer").remove(0);
    assert!(
        sentence.contains("into service SRV-9 by ana@acme.example"),
        "{sentence}"
    );
    assert_eq!(app.state_of(b).await, "converted");
    assert_eq!(
        app.count(
            "SELECT count(*) FROM service_links WHERE service_ref = 'SRV-9' AND ended_at IS NULL"
        )
        .await,
        1
    );

    // Both are gone from the live list.
    let (_, list) = c.page("/reservations").await;
    assert!(list.contains("No reservation is held right now."));
}

#[tokio::test]
async fn missing_or_wrong_csrf_and_viewers_get_403() {
    let app = spawn_app().await;
    FakeMachine::new()
        .tag("PK-1")
        .profile("epyc")
        .create(&app.pool, app.org.id)
        .await;
    let (id, fence) = FakeHold::on("PK-1")
        .order("ORD-A")
        .create_with_fence(&app.pool, app.org.id)
        .await;
    let fence = fence.to_string();
    let c = app.staff("ana@acme.example", "support").await;
    let path = format!("/reservations/{id}/cancel");
    let r = c
        .post_form(&path, &[("fence", &fence), ("reason", "x")])
        .await;
    assert_eq!(r.status().as_u16(), 403, "missing CSRF");
    assert!(r.text().await.expect("body").contains("security token"));
    let r = c
        .post_form(
            &path,
            &[("csrf", "forged"), ("fence", &fence), ("reason", "x")],
        )
        .await;
    assert_eq!(r.status().as_u16(), 403, "wrong CSRF");
    // Another session's token is wrong for this one.
    let other = app.staff("bob@acme.example", "support").await;
    let others_token = other.csrf().await;
    let r = c
        .post_form(
            &path,
            &[("csrf", &others_token), ("fence", &fence), ("reason", "x")],
        )
        .await;
    assert_eq!(r.status().as_u16(), 403, "someone else's CSRF token");
    assert_eq!(app.state_of(id).await, "held");

    let viewer = app.staff("vic@acme.example", "viewer").await;
    let (_, list) = viewer.page("/reservations").await;
    assert!(list.contains("ORD-A"));
    assert!(
        !list.contains("/cancel") && !list.contains("/convert"),
        "viewers see no buttons"
    );
    let (_, detail) = viewer.page(&format!("/reservations/{id}")).await;
    assert!(!detail.contains("/cancel"));
    assert_eq!(
        viewer.get(&path).await.status().as_u16(),
        403,
        "no confirmation page either"
    );
    let csrf = viewer.csrf().await;
    let r = viewer
        .post_form(
            &path,
            &[("csrf", &csrf), ("fence", &fence), ("reason", "x")],
        )
        .await;
    assert_eq!(r.status().as_u16(), 403);
    let r = viewer
        .post_form(
            &format!("/reservations/{id}/convert"),
            &[("csrf", &csrf), ("fence", &fence), ("service_ref", "SRV-1")],
        )
        .await;
    assert_eq!(r.status().as_u16(), 403);
    assert_eq!(viewer.get("/settings").await.status().as_u16(), 403);
    assert_eq!(app.state_of(id).await, "held");
    assert_eq!(
        app.count("SELECT count(*) FROM reservation_events").await,
        1,
        "only 'created'"
    );
}

#[tokio::test]
async fn a_stale_form_gets_a_clear_message_not_a_500() {
    let app = spawn_app().await;
    FakeMachine::new()
        .tag("PK-1")
        .profile("epyc")
        .create(&app.pool, app.org.id)
        .await;
    FakeMachine::new()
        .tag("PK-2")
        .profile("epyc")
        .create(&app.pool, app.org.id)
        .await;
    let id = FakeHold::on("PK-1")
        .order("ORD-A")
        .create(&app.pool, app.org.id)
        .await;
    let c = app.staff("ana@acme.example", "support").await;
    let (_, page) = c.page(&format!("/reservations/{id}/cancel")).await;
    let (action, fields) = form_of(&page);

    // The fence changes under the open page.
    sqlx::query("UPDATE reservations SET fence = nextval('reservation_fence_seq') WHERE id = $1")
        .bind(id)
        .execute(&app.pool)
        .await
        .expect("new fence");
    let r = post(
        &c,
        &action,
        &with(&fields, &[("reason", "duplicate order")]),
    )
    .await;
    assert_eq!(r.status().as_u16(), 409);
    let body = r.text().await.expect("body");
    assert!(
        body.contains("changed since your page was loaded"),
        "{body}"
    );
    assert!(body.contains(&format!("href=\"/reservations/{id}\"")));
    assert_eq!(app.state_of(id).await, "held");

    // Already cancelled: the second click says so.
    let (_, page) = c.page(&format!("/reservations/{id}/cancel")).await;
    let (action, fields) = form_of(&page);
    let fields = with(&fields, &[("reason", "duplicate order")]);
    assert_eq!(post(&c, &action, &fields).await.status().as_u16(), 303);
    let r = post(&c, &action, &fields).await;
    assert_eq!(r.status().as_u16(), 409);
    assert!(r.text().await.expect("body").contains("already cancelled"));
    // The confirmation page of an ended reservation says so too.
    let r = c.get(&format!("/reservations/{id}/convert")).await;
    assert_eq!(r.status().as_u16(), 409);

    // Past its deadline: conversion is refused and the reservation expires.
    let late = FakeHold::on("PK-2")
        .order("ORD-B")
        .create(&app.pool, app.org.id)
        .await;
    let (_, page) = c.page(&format!("/reservations/{late}/convert")).await;
    let (action, fields) = form_of(&page);
    app.make_overdue(late).await;
    let r = post(&c, &action, &with(&fields, &[("service_ref", "SRV-9")])).await;
    assert_eq!(r.status().as_u16(), 409);
    assert!(
        r.text()
            .await
            .expect("body")
            .contains("had already expired")
    );
    assert_eq!(app.state_of(late).await, "expired");
    let (_, body) = c.page(&format!("/reservations/{late}")).await;
    let sentence = text_of(&body, "#answer").remove(0);
    assert!(
        sentence.starts_with("Timed out: conversion attempted at"),
        "{sentence}"
    );
}

#[tokio::test]
async fn another_organizations_objects_are_404() {
    let app = spawn_app().await;
    FakeMachine::new()
        .tag("OTHER-1")
        .profile("epyc")
        .create(&app.pool, app.other.id)
        .await;
    let (id, fence) = FakeHold::on("OTHER-1")
        .order("ORD-OTHER")
        .create_with_fence(&app.pool, app.other.id)
        .await;
    let c = app.staff("ana@acme.example", "admin").await;
    assert_eq!(
        c.get(&format!("/reservations/{id}"))
            .await
            .status()
            .as_u16(),
        404
    );
    assert_eq!(
        c.get(&format!("/reservations/{id}/cancel"))
            .await
            .status()
            .as_u16(),
        404
    );
    assert_eq!(c.get("/machines/OTHER-1").await.status().as_u16(), 404);
    let csrf = c.csrf().await;
    let r = c
        .post_form(
            &format!("/reservations/{id}/cancel"),
            &[
                ("csrf", &csrf),
                ("fence", &fence.to_string()),
                ("reason", "x"),
            ],
        )
        .await;
    assert_eq!(r.status().as_u16(), 404);
    assert_eq!(app.state_of(id).await, "held");
    let (status, body) = c.page("/search?q=ORD-OTHER").await;
    assert_eq!(status, 200);
    assert!(body.contains("Nothing found"));
    let (_, body) = c.page(&format!("/search?q={id}")).await;
    assert!(body.contains("Nothing found"));
    // A NUL reached PostgreSQL and was a 500 (found by the bad-input property).
    let (status, body) = c.page("/search?q=ORD%00X").await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("control character (NUL)"), "{body}");
    assert_eq!(
        c.get("/reservations/not-a-number").await.status().as_u16(),
        404
    );
}

#[tokio::test]
async fn search_redirects_on_one_exact_hit() {
    let app = spawn_app().await;
    FakeMachine::new()
        .tag("PK-1")
        .profile("epyc")
        .create(&app.pool, app.org.id)
        .await;
    FakeMachine::new()
        .tag("PK-10")
        .profile("epyc")
        .create(&app.pool, app.org.id)
        .await;
    let id = FakeHold::on("PK-1")
        .order("ORD-77")
        .create(&app.pool, app.org.id)
        .await;
    let c = app.staff("vic@acme.example", "viewer").await;
    let loc = |r: reqwest::Response| {
        assert_eq!(r.status().as_u16(), 303);
        r.headers()["location"]
            .to_str()
            .expect("location")
            .to_owned()
    };
    assert_eq!(
        loc(c.get("/search?q=ORD-77").await),
        format!("/reservations/{id}")
    );
    assert_eq!(
        loc(c.get(&format!("/search?q={id}")).await),
        format!("/reservations/{id}")
    );
    assert_eq!(loc(c.get("/search?q=PK-10").await), "/machines/PK-10");
    let (status, body) = c.page("/search?q=PK-1").await;
    assert_eq!(status, 303, "PK-1 is exact too: {body}");
    let (status, body) = c.page("/search?q=pk").await;
    assert_eq!(status, 200);
    assert_eq!(text_of(&body, "table th[scope=row]").len(), 2);
    let (_, body) = c.page("/search?q=%3Cscript%3E").await;
    assert!(!body.contains("<script>"), "escaped");
    assert!(text_of(&body, "main p").contains(&"Nothing found for “<script>”.".to_owned()));
}

#[tokio::test]
async fn the_machines_page_and_the_allocator_agree_on_every_reason() {
    let app = spawn_app().await;
    every_kind_pool(&app).await;
    let c = app.staff("dc@acme.example", "viewer").await;
    let (status, body) = c
        .page("/machines?spec_site=par1&spec_profile=epyc&spec_vendor=dell")
        .await;
    assert_eq!(status, 200);
    let doc = Html::parse_document(&body);
    let mut rendered = std::collections::BTreeMap::new();
    for row in doc.select(&sel("tr[data-asset-tag]")) {
        let tag = row.value().attr("data-asset-tag").expect("tag").to_owned();
        let cell = row
            .select(&sel("td.verdict"))
            .next()
            .expect("a verdict cell");
        let kind = cell.value().attr("data-kind").expect("kind").to_owned();
        let reason = cell
            .select(&sel(".reason"))
            .next()
            .map(|r| r.text().collect::<String>());
        rendered.insert(tag, (kind, reason));
    }
    let spec = OrderSpec {
        site: Site::parse("par1").expect("site"),
        profile: Profile::parse("epyc").expect("profile"),
        vendor: Some(Vendor::parse("dell").expect("vendor")),
    };
    let verdicts = allocator::explain(
        &app.pool,
        app.org.id,
        &spec,
        &MachineFilter::default(),
        None,
        1000,
    )
    .await
    .expect("explain");
    assert_eq!(verdicts.len(), rendered.len());
    let mut kinds = HashSet::new();
    for v in &verdicts {
        let (kind, reason) = rendered
            .get(&v.machine.asset_tag)
            .expect("every machine is on the page");
        match &v.exclusion {
            None => {
                assert_eq!(kind, "candidate", "{}", v.machine.asset_tag);
                assert!(reason.is_none());
            }
            Some(e) => {
                assert_eq!(kind, e.key(), "{}", v.machine.asset_tag);
                assert_eq!(
                    reason.as_deref(),
                    Some(e.describe().as_str()),
                    "{}",
                    v.machine.asset_tag
                );
            }
        }
        kinds.insert(kind.clone());
    }
    for k in [
        "candidate",
        "wrong_site",
        "wrong_vendor",
        "wrong_profile",
        "not_ready",
        "in_service",
        "held",
    ] {
        assert!(kinds.contains(k), "the pool has a {k} machine: {kinds:?}");
    }
}

#[tokio::test]
async fn why_not_gives_the_three_answers() {
    let app = spawn_app().await;
    FakeMachine::new()
        .tag("PK-1")
        .profile("epyc")
        .create(&app.pool, app.org.id)
        .await;
    FakeMachine::new()
        .tag("PK-2")
        .profile("xeon")
        .status("broken")
        .create(&app.pool, app.org.id)
        .await;
    let c = app.staff("dc@acme.example", "viewer").await;
    let (_, body) = c.page("/why-not?site=par1&profile=epyc").await;
    assert_eq!(text_of(&body, "#answer"), ["Would reserve PK-1."]);

    // Someone else holds the row lock of the only candidate right now.
    let mut tx = app.pool.begin().await.expect("tx");
    sqlx::query("SELECT id FROM machines WHERE asset_tag = 'PK-1' FOR UPDATE")
        .execute(&mut *tx)
        .await
        .expect("lock");
    let (_, body) = c.page("/why-not?site=par1&profile=epyc").await;
    assert!(
        text_of(&body, "#answer")[0].starts_with("Contended: retry"),
        "{body}"
    );
    tx.rollback().await.expect("rollback");

    let (_, body) = c.page("/why-not?site=par1&profile=xeon").await;
    assert!(text_of(&body, "#answer")[0].starts_with("Unavailable: buy hardware"));
    assert!(body.contains("data-kind=\"not_ready\""));
    // Half a spec is a clear 400.
    assert_eq!(c.get("/why-not?site=par1").await.status().as_u16(), 400);
    assert_eq!(
        c.get("/why-not?site=par%201&profile=x")
            .await
            .status()
            .as_u16(),
        400
    );
}

#[tokio::test]
async fn the_module_switch_closes_pages_and_refuses_actions() {
    // R12, deployment half: the switch off.
    let app = spawn_app_with(|s| s.datacenter_module = false).await;
    FakeMachine::new()
        .tag("PK-1")
        .profile("epyc")
        .create(&app.pool, app.org.id)
        .await;
    let (id, fence) = FakeHold::on("PK-1")
        .order("ORD-A")
        .create_with_fence(&app.pool, app.org.id)
        .await;
    let c = app.staff("ana@acme.example", "admin").await;
    for path in [
        "/machines",
        "/machines/PK-1",
        "/why-not?site=par1&profile=epyc",
    ] {
        let (status, body) = c.page(path).await;
        assert_eq!(status, 403, "{path}");
        assert!(body.contains("The datacenter module is off"), "{path}");
    }
    let csrf = c.csrf().await;
    let r = c
        .post_form(
            &format!("/reservations/{id}/cancel"),
            &[
                ("csrf", &csrf),
                ("fence", &fence.to_string()),
                ("reason", "x"),
            ],
        )
        .await;
    assert_eq!(r.status().as_u16(), 403, "a crafted POST is refused too");
    assert_eq!(app.state_of(id).await, "held");
    let (_, body) = c.page("/settings").await;
    assert!(text_of(&body, "#deployment-switch")[0].contains("Off"));

    // Organization half: the admin turns it off in Settings (deployment on).
    let app = spawn_app().await;
    FakeMachine::new()
        .tag("PK-1")
        .profile("epyc")
        .create(&app.pool, app.org.id)
        .await;
    let (id, fence) = FakeHold::on("PK-1")
        .order("ORD-A")
        .create_with_fence(&app.pool, app.org.id)
        .await;
    let admin = app.staff("root@acme.example", "admin").await;
    let support = app.staff("ana@acme.example", "support").await;
    assert_eq!(support.get("/machines").await.status().as_u16(), 200);
    let csrf = admin.csrf().await;
    assert_eq!(
        admin
            .post_form("/settings", &[("datacenter", "on")])
            .await
            .status()
            .as_u16(),
        403,
        "no CSRF"
    );
    let support_csrf = support.csrf().await;
    assert_eq!(
        support
            .post_form("/settings", &[("csrf", &support_csrf)])
            .await
            .status()
            .as_u16(),
        403,
        "not admin"
    );
    let r = admin.post_form("/settings", &[("csrf", &csrf)]).await;
    assert_eq!(r.status().as_u16(), 303);
    assert_eq!(r.headers()["location"], "/settings?flash=settings_saved");
    assert_eq!(
        app.count("SELECT count(*) FROM organizations WHERE slug = 'acme' AND datacenter_enabled")
            .await,
        0
    );
    assert_eq!(app.count("SELECT count(*) FROM audit_log WHERE action = 'org.datacenter_enabled' AND detail = 'off'").await, 1);
    let (status, body) = support.page("/machines").await;
    assert_eq!(status, 403);
    assert!(body.contains("off for acme"));
    let r = support
        .post_form(
            &format!("/reservations/{id}/cancel"),
            &[
                ("csrf", &support_csrf),
                ("fence", &fence.to_string()),
                ("reason", "x"),
            ],
        )
        .await;
    assert_eq!(r.status().as_u16(), 403);
    assert_eq!(app.state_of(id).await, "held");
    // The other organization is untouched.
    assert_eq!(
        app.count("SELECT count(*) FROM organizations WHERE slug = 'other' AND datacenter_enabled")
            .await,
        1
    );
    assert_eq!(
        admin
            .post_form("/settings", &[("csrf", &csrf), ("datacenter", "on")])
            .await
            .status()
            .as_u16(),
        303
    );
    assert_eq!(support.get("/machines").await.status().as_u16(), 200);
}

#[tokio::test]
async fn static_assets_have_etags_and_answer_304() {
    let app = spawn_app().await;
    let r = app
        .http
        .get(app.url("/static/app.css"))
        .send()
        .await
        .expect("css");
    assert_eq!(r.status().as_u16(), 200);
    assert!(
        r.headers()["content-type"]
            .to_str()
            .expect("ct")
            .starts_with("text/css")
    );
    assert!(
        r.headers()["cache-control"]
            .to_str()
            .expect("cc")
            .contains("max-age")
    );
    let etag = r.headers()["etag"].to_str().expect("etag").to_owned();
    let r = app
        .http
        .get(app.url("/static/app.css"))
        .header("if-none-match", &etag)
        .send()
        .await
        .expect("css");
    assert_eq!(r.status().as_u16(), 304);
    assert_eq!(r.headers()["etag"].to_str().expect("etag"), etag);
    let r = app
        .http
        .get(app.url("/static/app.js"))
        .send()
        .await
        .expect("js");
    assert_eq!(r.status().as_u16(), 200);
    assert!(r.text().await.expect("js").contains("performance.now()"));
    assert_eq!(
        app.http
            .get(app.url("/static/nope.css"))
            .send()
            .await
            .expect("404")
            .status()
            .as_u16(),
        404
    );
    assert_eq!(
        app.http
            .get(app.url("/static/../Cargo.toml"))
            .send()
            .await
            .expect("404")
            .status()
            .as_u16(),
        404
    );
}

#[tokio::test]
async fn pages_need_a_session() {
    let app = spawn_app().await;
    for path in [
        "/",
        "/machines",
        "/reservations",
        "/reservations/1",
        "/search?q=x",
        "/why-not",
        "/jobs",
        "/settings",
    ] {
        let r = app.http.get(app.url(path)).send().await.expect("GET");
        assert_eq!(r.status().as_u16(), 303, "{path}");
        assert_eq!(r.headers()["location"], "/login", "{path}");
    }
    let r = app
        .http
        .post(app.url("/reservations/1/cancel"))
        .form(&[("reason", "x")])
        .send()
        .await
        .expect("POST");
    assert_eq!(r.status().as_u16(), 303);
}

#[tokio::test]
async fn the_detail_page_says_who_ended_it_and_how() {
    let app = spawn_app().await;
    FakeMachine::new()
        .tag("PK-1")
        .profile("epyc")
        .create(&app.pool, app.org.id)
        .await;
    FakeMachine::new()
        .tag("PK-2")
        .profile("epyc")
        .create(&app.pool, app.org.id)
        .await;
    let swept = FakeHold::on("PK-1")
        .order("ORD-S")
        .create(&app.pool, app.org.id)
        .await;
    // What the sweep writes, with its replica and lease fence.
    sqlx::query(
        "WITH r AS (UPDATE reservations SET state = 'expired', ended_at = clock_timestamp(), ended_by = 'sweep'
                     WHERE id = $1 RETURNING id)
         INSERT INTO reservation_events (reservation_id, kind, from_state, to_state, actor, replica, lease_fence)
         SELECT id, 'expired', 'held', 'expired', 'sweep', 'web-2', 17 FROM r",
    )
    .bind(swept)
    .execute(&app.pool)
    .await
    .expect("sweep it");
    let found = FakeHold::on("PK-2")
        .order("ORD-F")
        .hold_seconds(600)
        .create(&app.pool, app.org.id)
        .await;
    sqlx::query("UPDATE reservations SET state = 'expired', ended_at = clock_timestamp(), ended_by = 'allocator' WHERE id = $1")
        .bind(found)
        .execute(&app.pool)
        .await
        .expect("expire at point of use");
    let c = app.staff("ops@acme.example", "viewer").await;
    let (_, body) = c.page(&format!("/reservations/{swept}")).await;
    let sentence = text_of(&body, "#answer").remove(0);
    assert!(sentence.starts_with("Timed out: expired at "), "{sentence}");
    assert!(
        sentence.contains("after a 15-minute hold, marked by the sweep on replica web-2"),
        "{sentence}"
    );
    assert!(
        text_of(&body, "table.timeline td")
            .iter()
            .any(|t| t == "web-2 (lease fence 17)")
    );
    let (_, body) = c.page(&format!("/reservations/{found}")).await;
    let sentence = text_of(&body, "#answer").remove(0);
    assert!(
        sentence.contains("after a 10-minute hold; a new order for the machine found it overdue"),
        "{sentence}"
    );
    // The overview's 24-hour chart counts both as created and expired.
    let (_, body) = c.page("/").await;
    let day = Html::parse_document(&body)
        .select(&sel("section.site p.day"))
        .next()
        .and_then(|p| p.value().attr("data-day").map(str::to_owned))
        .expect("the day's totals");
    assert_eq!(day, "2 0 2 0");
}

/// Every row of the live list shows its hold's fence, in its own column
/// under the heading "Fence", the one its cancel, convert and extend links
/// name; a viewer, who has no actions, sees it too.
#[tokio::test]
async fn the_live_list_shows_each_holds_fence() {
    let app = spawn_app().await;
    let mut holds = Vec::new();
    for (tag, order) in [("PK-1", "ORD-A"), ("PK-2", "ORD-B"), ("PK-3", "ORD-C")] {
        FakeMachine::new()
            .tag(tag)
            .profile("epyc")
            .create(&app.pool, app.org.id)
            .await;
        holds.push(
            FakeHold::on(tag)
                .order(order)
                .create_with_fence(&app.pool, app.org.id)
                .await,
        );
    }
    // Fences differ from ids, so that a row showing its id passes for none.
    sqlx::query("UPDATE reservations SET fence = fence + 1000 * id")
        .execute(&app.pool)
        .await
        .expect("distinct fences");
    let fences: Vec<(i64, i64)> = sqlx::query_as("SELECT id, fence FROM reservations ORDER BY id")
        .fetch_all(&app.pool)
        .await
        .expect("fences");
    assert_eq!(fences.len(), holds.len());
    for (role, email) in [
        ("support", "sam@acme.example"),
        ("viewer", "vera@acme.example"),
    ] {
        let c = app.staff(email, role).await;
        let (status, body) = c.page("/reservations").await;
        assert_eq!(status, 200);
        let doc = Html::parse_document(&body);
        let heads: Vec<String> = doc
            .select(&sel("table.live thead th"))
            .map(|h| h.text().collect::<String>())
            .collect();
        let column = heads
            .iter()
            .position(|h| h == "Fence")
            .unwrap_or_else(|| panic!("{role}: no Fence column in {heads:?}"));
        let rows: Vec<_> = doc.select(&sel("table.live tbody tr")).collect();
        assert_eq!(rows.len(), fences.len(), "{role}");
        for row in rows {
            let id: i64 = row
                .value()
                .attr("data-reservation")
                .and_then(|v| v.parse().ok())
                .expect("a row names its reservation");
            let fence = fences
                .iter()
                .find(|(i, _)| *i == id)
                .map(|(_, f)| *f)
                .expect("a held reservation");
            let cells: Vec<String> = row
                .select(&sel("th, td"))
                .filter(|c| c.parent().map(|p| p.id()) == Some(row.id()))
                .map(|c| c.text().collect::<String>().trim().to_owned())
                .collect();
            assert_eq!(cells.len(), heads.len(), "{role}: #{id}: {cells:?}");
            assert_eq!(cells[column], fence.to_string(), "{role}: #{id}");
            let links: Vec<&str> = row
                .select(&sel("a.button"))
                .filter_map(|a| a.value().attr("href"))
                .collect();
            assert_eq!(links.len(), if role == "support" { 3 } else { 0 }, "{role}");
            for href in links {
                assert!(href.ends_with(&format!("?fence={fence}")), "{href}");
            }
        }
    }
}

#[tokio::test]
async fn overdue_reservations_are_marked_in_text() {
    let app = spawn_app().await;
    FakeMachine::new()
        .tag("PK-1")
        .profile("epyc")
        .create(&app.pool, app.org.id)
        .await;
    let id = FakeHold::on("PK-1")
        .order("ORD-A")
        .create(&app.pool, app.org.id)
        .await;
    app.make_overdue(id).await;
    let c = app.staff("ana@acme.example", "support").await;
    let (_, body) = c.page("/reservations").await;
    assert_eq!(
        text_of(&body, "tr[data-reservation] .badge.overdue"),
        ["Overdue"]
    );
    assert_eq!(
        Html::parse_document(&body)
            .select(&sel("[data-remaining]"))
            .count(),
        0
    );
    let (_, body) = c.page(&format!("/reservations/{id}")).await;
    assert!(text_of(&body, "#answer")[0].contains("overdue"));
}

#[tokio::test]
async fn the_machines_page_pages_through_50000_machines_quickly() {
    let app = spawn_app().await;
    crate::helpers::generated_machines(
        &app.pool,
        app.org.id,
        50_000,
        crate::helpers::Generated {
            tag: "'M-' || lpad(g::text, 6, '0')",
            site: "(ARRAY['par1','par2','ams1','fra1'])[1 + g % 4]",
            vendor: "(ARRAY['dell','hpe'])[1 + g % 2]",
            profile: "(ARRAY['epyc','xeon'])[1 + (g / 2) % 2]",
            status: "CASE WHEN g % 10 = 0 THEN 'maintenance' ELSE 'ready' END",
        },
    )
    .await;
    sqlx::query("ANALYZE machines")
        .execute(&app.pool)
        .await
        .expect("analyze");
    let c = app.staff("dc@acme.example", "viewer").await;
    let mut path = "/machines?site=fra1&status=ready".to_owned();
    let mut pages = 0;
    let mut last_first = String::new();
    while pages < 5 {
        let (status, body) = c.page(&path).await;
        assert_eq!(status, 200);
        let tags = text_of(&body, "tr[data-asset-tag] th");
        assert_eq!(tags.len(), 100);
        assert!(tags[0] > last_first, "keyset pages move forward");
        last_first = tags[0].clone();
        let next = Html::parse_document(&body)
            .select(&sel("a[rel=next]"))
            .next()
            .and_then(|a| a.value().attr("href").map(str::to_owned))
            .expect("a next link");
        path = next;
        pages += 1;
    }
    let (status, body) = c
        .page("/machines?spec_site=par1&spec_profile=epyc&after=M-025000")
        .await;
    assert_eq!(status, 200);
    assert_eq!(text_of(&body, "tr[data-asset-tag] th")[0], "M-025001");
    // An index, not a scan of 50,000 rows per page: the plans of the
    // statements these pages ran (a page and one more row) never read
    // machines whole. The page's counts and facets have their plan test in
    // machines_list.rs.
    let limit = poolkeeper::dashboard::machines::PAGE_SIZE + 1;
    let fra1_ready = MachineFilter {
        site: Some(Site::parse("fra1").expect("site")),
        status: Some(poolkeeper::domain::MachineStatus::parse("ready").expect("status")),
        ..MachineFilter::default()
    };
    for after in [None, Some(last_first.as_str())] {
        let sql = poolkeeper::inventory::list_pooled_sql(&fra1_ready, after.is_some(), limit);
        let plan = plan_of(&app, &sql, |q| {
            q.bind(app.org.id)
                .bind("fra1")
                .bind(None::<&str>)
                .bind(None::<&str>)
                .bind("ready")
                .bind(after)
        })
        .await;
        assert!(
            plan.contains("Index Scan") && !plan.contains("Seq Scan on machines"),
            "{after:?}:\n{plan}"
        );
    }
    let sql = allocator::explain_sql(&MachineFilter::default(), true, limit);
    let plan = plan_of(&app, &sql, |q| {
        q.bind(app.org.id)
            .bind("par1")
            .bind("epyc")
            .bind(None::<&str>)
            .bind(None::<&str>)
            .bind(None::<&str>)
            .bind(None::<&str>)
            .bind(None::<&str>)
            .bind(None::<&str>)
            .bind("M-025000")
    })
    .await;
    assert!(
        plan.contains("Index Scan") && !plan.contains("Seq Scan on machines"),
        "spec:\n{plan}"
    );
}

type Explain<'q> =
    sqlx::query::QueryScalar<'q, sqlx::Postgres, String, sqlx::postgres::PgArguments>;

/// The plan PostgreSQL chooses for `sql` with the values `bind` gives it.
async fn plan_of<'q>(
    app: &'q TestApp,
    sql: &str,
    bind: impl FnOnce(Explain<'q>) -> Explain<'q>,
) -> String {
    let explain = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("EXPLAIN (COSTS OFF) {sql}")));
    bind(explain)
        .fetch_all(&app.pool)
        .await
        .expect("explain")
        .join("\n")
}

#[tokio::test]
async fn a_database_that_cannot_answer_is_a_503_page() {
    let app = spawn_app().await;
    let c = app.staff("ana@acme.example", "support").await;
    assert_eq!(c.get("/").await.status().as_u16(), 200);
    // The app shares this pool: closed, every query fails as unavailable.
    app.pool.close().await;
    let r = c.get("/reservations").await;
    assert_eq!(r.status().as_u16(), 503);
    assert_eq!(r.headers()["retry-after"], "1");
    let body = r.text().await.expect("body");
    assert!(body.contains("Temporarily unavailable") && body.contains("/static/app.css"));
}

/// The audit row of a cancellation commits with it or not at all: with the
/// audit table gone, the cancellation fails as a whole and the reservation
/// is still held.
#[tokio::test]
async fn a_cancellation_and_its_audit_row_commit_together() {
    let app = spawn_app().await;
    FakeMachine::new()
        .tag("PK-1")
        .profile("epyc")
        .create(&app.pool, app.org.id)
        .await;
    let a = FakeHold::on("PK-1")
        .order("ORD-A")
        .create(&app.pool, app.org.id)
        .await;
    let c = app.staff("ana@acme.example", "support").await;
    let (status, page) = c.page(&format!("/reservations/{a}/cancel")).await;
    assert_eq!(status, 200);
    let (action, fields) = form_of(&page);

    sqlx::query("ALTER TABLE audit_log RENAME TO audit_log_gone")
        .execute(&app.pool)
        .await
        .expect("rename");
    let r = post(&c, &action, &with(&fields, &[("reason", "customer left")])).await;
    assert_eq!(r.status().as_u16(), 500);
    assert_eq!(
        app.state_of(a).await,
        "held",
        "no cancellation without its audit row"
    );

    sqlx::query("ALTER TABLE audit_log_gone RENAME TO audit_log")
        .execute(&app.pool)
        .await
        .expect("rename back");
    let r = post(&c, &action, &with(&fields, &[("reason", "customer left")])).await;
    assert_eq!(r.status().as_u16(), 303);
    assert_eq!(app.state_of(a).await, "cancelled");
    let audited: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM audit_log WHERE action = 'reservation.cancel' AND object = $1",
    )
    .bind(format!("reservation:{a}"))
    .fetch_one(&app.pool)
    .await
    .expect("count");
    assert_eq!(audited, 1);
}

/// (BENCHMARKS item 5 measures it) 1,000 held reservations come
/// 100 a page, soonest deadline first, in under 60 kB of HTML; the "next"
/// and "previous" links walk every row once and keep the filters.
#[tokio::test]
async fn a_thousand_holds_come_a_hundred_a_page_under_60_kb_with_filters_kept() {
    let app = spawn_app().await;
    let org = app.org.id;
    // Inserted in two statements (FakeHold writes one row per statement):
    // 1,000 machines (even ones at par1), and a hold on each: the first 300 with 4 to 6 minutes left, the rest 40
    // minutes or more, so the 15-minute filter keeps exactly 300 (150 at
    // par1) however slowly the test runs.
    crate::helpers::generated_machines(
        &app.pool,
        org,
        1000,
        crate::helpers::Generated {
            tag: "'PK-' || lpad(g::text, 5, '0')",
            site: "CASE WHEN g % 2 = 0 THEN 'par1' ELSE 'ams1' END",
            vendor: "'dell'",
            profile: "'epyc-9354-256g'",
            status: "'ready'",
        },
    )
    .await;
    sqlx::query(
        "INSERT INTO reservations (org_id, order_ref, machine_id, spec, machine_snapshot, reason,
                                   hold_seconds, expires_at)
         SELECT m.org_id, 'ORD-' || substr(m.asset_tag, 4), m.id, '{}'::jsonb, '{}'::jsonb,
                'PK matched site par1, vendor dell, profile epyc-9354-256g; a long frozen reason that must not be on the list',
                3600,
                clock_timestamp() + make_interval(secs => CASE WHEN n <= 300 THEN 240 + n * 0.4 ELSE 2400 + n END)
           FROM (SELECT m.*, row_number() OVER (ORDER BY m.id) AS n FROM machines m WHERE m.org_id = $1) m",
    )
    .bind(org)
    .execute(&app.pool)
    .await
    .expect("holds");
    let c = app.staff("ana@acme.example", "support").await;

    let row_ids = |body: &str| -> Vec<i64> {
        Html::parse_document(body)
            .select(&sel("tr[data-reservation]"))
            .map(|r| {
                r.value()
                    .attr("data-reservation")
                    .and_then(|v| v.parse().ok())
                    .expect("id")
            })
            .collect()
    };
    let remaining = |body: &str| -> Vec<i64> {
        Html::parse_document(body)
            .select(&sel("tr[data-reservation] [data-remaining]"))
            .map(|e| {
                e.value()
                    .attr("data-remaining")
                    .and_then(|v| v.parse().ok())
                    .expect("seconds")
            })
            .collect()
    };
    let link = |body: &str, rel: &str| -> Option<String> {
        Html::parse_document(body)
            .select(&sel(&format!("nav.pager a[rel={rel}]")))
            .next()
            .and_then(|a| a.value().attr("href").map(str::to_owned))
    };

    let (status, first) = c.page("/reservations").await;
    assert_eq!(status, 200);
    assert!(
        first.len() < 60_000,
        "first page is {} bytes (support, with buttons)",
        first.len()
    );
    eprintln!("/reservations with 1,000 held: {} bytes", first.len());
    assert_eq!(row_ids(&first).len(), 100);
    assert!(
        !first.contains("a long frozen reason"),
        "the reason is on the reservation's page"
    );
    let secs = remaining(&first);
    assert!(secs.windows(2).all(|w| w[0] <= w[1]), "soonest first");
    assert!(secs[0] <= 241, "{secs:?}");
    assert!(text_of(&first, "#live-count")[0].starts_with("1000 held"));
    assert!(link(&first, "prev").is_none());

    // Walk every page forwards: every hold once, in deadline order.
    let mut seen = Vec::new();
    let mut body = first.clone();
    let mut pages = 1;
    loop {
        seen.extend(row_ids(&body));
        match link(&body, "next") {
            Some(next) => {
                let (status, b) = c.page(&next.replace("&amp;", "&")).await;
                assert_eq!(status, 200, "{next}");
                body = b;
                pages += 1;
            }
            None => break,
        }
    }
    assert_eq!(pages, 10);
    let distinct: HashSet<i64> = seen.iter().copied().collect();
    assert_eq!((seen.len(), distinct.len()), (1000, 1000));
    // And back: the previous page of the second is the first.
    let (_, second) = c
        .page(&link(&first, "next").expect("next").replace("&amp;", "&"))
        .await;
    let (_, back) = c
        .page(&link(&second, "prev").expect("prev").replace("&amp;", "&"))
        .await;
    assert_eq!(row_ids(&back), row_ids(&first));

    // Filters: par1, deadline within 15 minutes: 150 holds, two pages.
    let (_, f1) = c.page("/reservations?site=par1&within=15").await;
    assert_eq!(row_ids(&f1).len(), 100);
    assert!(text_of(&f1, "#live-count")[0].starts_with("150 held at par1"));
    assert!(
        text_of(&f1, "table.live tbody td:nth-of-type(3)")
            .iter()
            .all(|s| s == "par1")
    );
    assert!(remaining(&f1).iter().all(|s| *s <= 900));
    let next = link(&f1, "next")
        .expect("a next page")
        .replace("&amp;", "&");
    assert!(
        next.contains("site=par1") && next.contains("within=15"),
        "{next}"
    );
    let (_, f2) = c.page(&next).await;
    assert_eq!(row_ids(&f2).len(), 50);
    assert!(link(&f2, "next").is_none());
    let prev = link(&f2, "prev").expect("prev").replace("&amp;", "&");
    assert!(
        prev.contains("site=par1") && prev.contains("within=15"),
        "{prev}"
    );
    // The form shows the filters in force.
    assert_eq!(
        Html::parse_document(&f2)
            .select(&sel("#l-within option[selected]"))
            .next()
            .and_then(|o| o.value().attr("value").map(str::to_owned))
            .as_deref(),
        Some("15")
    );
    // Bad filters are a clear 400.
    for bad in ["within=0", "within=abc", "after=nonsense", "site=par%201"] {
        assert_eq!(
            c.get(&format!("/reservations?{bad}"))
                .await
                .status()
                .as_u16(),
            400,
            "{bad}"
        );
    }
}

/// The frozen reason moved to the reservation's page; a
/// hold under two minutes says so in words; the list says when it was read.
#[tokio::test]
async fn the_live_list_is_compact_and_says_urgency_in_words() {
    let app = spawn_app().await;
    FakeMachine::new()
        .tag("PK-1")
        .profile("epyc")
        .create(&app.pool, app.org.id)
        .await;
    let (id, fence) = FakeHold::on("PK-1")
        .order("ORD-SOON")
        .hold_seconds(90)
        .create_with_fence(&app.pool, app.org.id)
        .await;
    let c = app.staff("viewer@acme.example", "viewer").await;
    let (_, body) = c.page("/reservations").await;
    assert_eq!(
        text_of(&body, &format!("tr[data-reservation=\"{id}\"] td")),
        [
            "ORD-SOON",
            "PK-1",
            "par1",
            &format!("{} Expires soon", text_of(&body, ".countdown")[0]),
            &fence.to_string(),
        ]
    );
    assert_eq!(
        text_of(&body, "thead th"),
        [
            "Reservation",
            "Order",
            "Machine",
            "Site",
            "Time left",
            "Fence"
        ]
    );
    assert!(text_of(&body, "#live-status")[0].contains("Last refreshed at"));
    let (_, detail) = c.page(&format!("/reservations/{id}")).await;
    assert!(detail.contains("Why this machine (frozen at creation)"));
}

/// The summary comes first, in words, with the API's
/// counts, and each group's link lists exactly that group.
#[tokio::test]
async fn why_not_summarises_by_reason_in_words_and_links_each_group() {
    let app = spawn_app().await;
    every_kind_pool(&app).await;
    let c = app.staff("dc@acme.example", "viewer").await;
    let spec = "/why-not?site=par1&profile=epyc&vendor=dell";
    let (status, body) = c.page(spec).await;
    assert_eq!(status, 200);
    assert_eq!(
        text_of(&body, "table.summary tbody tr"),
        [
            "candidate 1 candidate Show the 1 candidate",
            "at another site 2 wrong_site Show the 2 at another site",
            "other vendor 1 wrong_vendor Show the 1 other vendor",
            "other profile 1 wrong_profile Show the 1 other profile",
            "not ready 1 not_ready Show the 1 not ready",
            "in service 1 in_service Show the 1 in service",
            "held 1 held Show the 1 held",
        ]
    );
    assert_eq!(text_of(&body, "table.summary tfoot td")[0], "8");
    // Candidates first, then the rest of par1 only: no machine of ams1/fra1.
    assert_eq!(text_of(&body, "table.candidates tbody th"), ["PK-001"]);
    assert_eq!(
        text_of(&body, "table.rest tbody th"),
        ["PK-003", "PK-004", "PK-005", "PK-006", "PK-007"]
    );
    assert_eq!(
        text_of(&body, "table.rest td.verdict .badge"),
        [
            "Not a candidate: other vendor",
            "Not a candidate: other profile",
            "Not a candidate: not ready",
            "Not a candidate: in service",
            "Not a candidate: held",
        ]
    );
    assert!(!body.contains("wrong_site 2"), "no codes in sentences");
    // Each group's link lists exactly that group, other sites included.
    let doc = Html::parse_document(&body);
    for row in doc.select(&sel("table.summary tbody tr")) {
        let key = row.value().attr("data-reason").expect("key").to_owned();
        let href = row
            .select(&sel("a"))
            .next()
            .and_then(|a| a.value().attr("href"))
            .expect("a link")
            .to_owned();
        let (status, group) = c.page(&href).await;
        assert_eq!(status, 200, "{href}");
        let kinds: Vec<String> = Html::parse_document(&group)
            .select(&sel("table.rest td.verdict"))
            .map(|td| td.value().attr("data-kind").unwrap_or("").to_owned())
            .collect();
        let expected = if key == "wrong_site" { 2 } else { 1 };
        assert_eq!(kinds.len(), expected, "{key}: {kinds:?}");
        assert!(kinds.iter().all(|k| *k == key), "{key}: {kinds:?}");
    }
    assert_eq!(
        c.get(&format!("{spec}&reason=nonsense"))
            .await
            .status()
            .as_u16(),
        400
    );
}

/// `demo` tells every state with the real functions,
/// once; a second run writes nothing; a later run tops the live holds up.
#[tokio::test]
async fn the_demo_tells_every_state_once_and_tops_up_its_holds() {
    let app = spawn_app().await;
    let pool = &app.pool;
    let first = poolkeeper::demo::load(pool).await.expect("demo");
    let org: i64 = sqlx::query_scalar("SELECT id FROM organizations WHERE slug = 'demo'")
        .fetch_one(pool)
        .await
        .expect("demo org");
    let one = |sql: &'static str| async move {
        sqlx::query_scalar::<_, i64>(sql)
            .bind(org)
            .fetch_one(pool)
            .await
            .expect(sql)
    };
    let live =
        "SELECT count(*) FROM reservations WHERE org_id = $1 AND order_ref LIKE 'DEMO-HOLD-%'
                  AND state = 'held' AND expires_at > clock_timestamp()";
    assert_eq!(one(live).await, poolkeeper::demo::HOLDS as i64);
    // R13, R14: an order of three held together, one deadline, extended by
    // support with a reason (an event per machine).
    let trio_live =
        "SELECT count(*) FROM reservations WHERE org_id = $1 AND order_ref LIKE 'DEMO-TRIO-%'
                       AND quantity = 3 AND state = 'held' AND expires_at > clock_timestamp()";
    assert_eq!(one(trio_live).await, 3);
    assert_eq!(
        one("SELECT count(DISTINCT expires_at) FROM reservations WHERE org_id = $1 AND order_ref = 'DEMO-TRIO-1'")
            .await,
        1
    );
    assert_eq!(
        one("SELECT count(*) FROM reservation_events e JOIN reservations r ON r.id = e.reservation_id
              WHERE r.org_id = $1 AND e.kind = 'extended' AND e.actor = 'support@demo.example'")
        .await,
        3
    );
    assert_eq!(
        one(
            "SELECT count(*) FROM reservations WHERE org_id = $1 AND state = 'held'
              AND expires_at < clock_timestamp() + interval '2 minutes'"
        )
        .await,
        2,
        "two holds with under 2 minutes left"
    );
    assert_eq!(
        one("SELECT count(DISTINCT created_at) FROM reservations WHERE org_id = $1 AND order_ref LIKE 'DEMO-HOLD-%'").await,
        poolkeeper::demo::HOLDS as i64,
        "staggered"
    );
    assert_eq!(
        one("SELECT count(*) FROM reservations r JOIN reservation_events e ON e.reservation_id = r.id
              WHERE r.org_id = $1 AND r.state = 'expired' AND r.ended_by = 'sweep'
                AND e.kind = 'expired' AND e.replica LIKE 'demo-%' AND e.lease_fence IS NOT NULL").await,
        2,
        "expired by the sweep, under its lease"
    );
    assert_eq!(
        one(
            "SELECT count(*) FROM reservations a JOIN reservations b ON b.machine_id = a.machine_id
              WHERE a.org_id = $1 AND a.order_ref = 'DEMO-LATE-1' AND a.state = 'expired'
                AND a.ended_by = 'allocator' AND b.order_ref = 'DEMO-LATE-2' AND b.state = 'held'"
        )
        .await,
        1,
        "expired at the point of use by the next order for its machine"
    );
    assert_eq!(
        one(
            "SELECT count(*) FROM reservations WHERE org_id = $1 AND state = 'cancelled'
              AND ended_by = 'support@demo.example' AND end_reason <> ''"
        )
        .await,
        1
    );
    assert_eq!(
        one(
            "SELECT count(*) FROM reservations r JOIN service_links s ON s.reservation_id = r.id
              WHERE r.org_id = $1 AND r.state = 'converted' AND s.ended_at IS NULL"
        )
        .await,
        2,
        "a live service, and the GPU order's"
    );
    assert_eq!(
        one(
            "SELECT count(*) FROM reservations r JOIN service_links s ON s.reservation_id = r.id
              JOIN machines m ON m.id = s.machine_id
              WHERE r.org_id = $1 AND s.ended_at IS NOT NULL AND m.status = 'provisioning'
                AND r.order_ref = 'DEMO-ENDED-1'"
        )
        .await,
        1,
        "a service ended, its machine back to provisioning"
    );
    // R17-R19: a pool with headroom, a repairs segment, a customer cap.
    assert_eq!(
        one(
            "SELECT sum(machines)::bigint FROM headroom WHERE org_id = $1 AND site = 'par1'
              AND profile = 'gpu-h100-8x' AND segment = 'enterprise'"
        )
        .await,
        i64::from(poolkeeper::demo::HEADROOM_MACHINES)
    );
    assert_eq!(
        one(
            "SELECT count(*) FROM organizations WHERE id = $1 AND repairs_segment = 'repairs'
              AND customer_hold_limit = 2"
        )
        .await,
        1
    );
    // Through the real reserve path: an enterprise hold with its customer,
    // a customer at the cap, and one refusal of each code.
    assert_eq!(
        one(
            "SELECT count(*) FROM reservations WHERE org_id = $1 AND order_ref = 'DEMO-ENT-1'
              AND state = 'held' AND segment = 'enterprise' AND customer_ref = 'CUST-ORBIT'"
        )
        .await,
        1
    );
    assert_eq!(
        one(
            "SELECT count(*) FROM reservations WHERE org_id = $1 AND state = 'held'
              AND customer_ref = 'CUST-NOVA'"
        )
        .await,
        2,
        "the cap"
    );
    for reason in ["unavailable", "contended", "reserved", "customer_limit"] {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM reservation_refusals WHERE org_id = $1 AND reason = $2",
        )
        .bind(org)
        .bind(reason)
        .fetch_one(pool)
        .await
        .expect("refusals");
        assert_eq!(n, 1, "one {reason} refusal");
    }
    let rows = "SELECT (SELECT count(*) FROM reservations WHERE org_id = $1)
                     + (SELECT count(*) FROM reservation_events e JOIN reservations r ON r.id = e.reservation_id WHERE r.org_id = $1)
                     + (SELECT count(*) FROM service_links WHERE org_id = $1)
                     + (SELECT count(*) FROM machines WHERE org_id = $1)
                     + (SELECT count(*) FROM users WHERE org_id = $1)
                     + (SELECT count(*) FROM api_tokens WHERE org_id = $1)
                     + (SELECT count(*) FROM headroom WHERE org_id = $1)
                     + (SELECT count(*) FROM reservation_refusals WHERE org_id = $1)";
    let before = one(rows).await;
    let again = poolkeeper::demo::load(pool).await.expect("demo again");
    assert_eq!(again.reservations, first.reservations);
    assert!(again.token.is_none() && first.token.is_some());
    assert_eq!(one(rows).await, before, "a second run writes nothing");

    // Later, the holds have run out: a re-run tops them up, and the ended
    // chapters are not written twice.
    sqlx::query(
        "UPDATE reservations SET created_at = created_at - interval '1 hour',
                expires_at = expires_at - interval '1 hour'
          WHERE org_id = $1 AND state = 'held'",
    )
    .bind(org)
    .execute(pool)
    .await
    .expect("time passes");
    assert_eq!(one(live).await, 0);
    let ended = "SELECT count(*) FROM reservations WHERE org_id = $1
                   AND order_ref NOT LIKE 'DEMO-HOLD-%' AND order_ref NOT LIKE 'DEMO-TRIO-%'";
    let ended_before = one(ended).await;
    poolkeeper::demo::load(pool).await.expect("demo later");
    assert_eq!(one(live).await, poolkeeper::demo::HOLDS as i64);
    assert_eq!(one(ended).await, ended_before);
    // The order of three is topped up like the live holds: a new one.
    assert_eq!(one(trio_live).await, 3);
    assert_eq!(
        one("SELECT count(DISTINCT order_ref) FROM reservations WHERE org_id = $1 AND order_ref LIKE 'DEMO-TRIO-%'")
            .await,
        2
    );
    assert_eq!(
        one("SELECT count(*) FROM reservations WHERE org_id = $1 AND order_ref LIKE 'DEMO-HOLD-%'")
            .await,
        2 * poolkeeper::demo::HOLDS as i64
    );
}

/// The overview's 24-hour chart counts each reservation created in the
/// window and each one ended in it, by its end state, from one range of
/// `reservations_recent_activity_idx`: a reservation created
/// before the window and ended in it counts once (its end), one created and
/// ended in it twice, one wholly before it not at all, and another
/// organization's never.
#[tokio::test]
async fn the_overview_chart_counts_what_was_created_and_what_ended_in_the_last_24_hours() {
    let app = spawn_app().await;
    let org = app.org.id;
    let other = create_org(&app.pool, "chart-other", true).await.id;
    // (order, created this long ago, state, ended this long ago)
    let rows: [(&str, &str, HoldState, Option<&str>); 6] = [
        ("held-now", "2 hours", Held, None),
        ("cancelled-now", "3 hours", Cancelled, Some("1 hour")),
        ("converted-now", "2 hours", Converted, Some("90 minutes")),
        ("expired-late", "30 hours", Expired, Some("5 hours")),
        ("converted-old", "40 hours", Converted, Some("30 hours")),
        ("cancelled-old", "50 hours", Cancelled, Some("49 hours")),
    ];
    for (i, (order, created, state, ended)) in rows.iter().enumerate() {
        let tag = format!("CH-{i}");
        FakeMachine::new()
            .tag(&tag)
            .profile("epyc")
            .create(&app.pool, org)
            .await;
        let mut hold = FakeHold::on(&tag)
            .order(order)
            .state(*state)
            .bare()
            .reason("test")
            .created_ago(created);
        if let Some(ended) = ended {
            hold = hold.ended_ago(ended);
        }
        hold.create(&app.pool, org).await;
    }
    FakeMachine::new()
        .tag("CH-O")
        .profile("epyc")
        .create(&app.pool, other)
        .await;
    FakeHold::on("CH-O")
        .order("theirs")
        .state(Cancelled)
        .bare()
        .reason("test")
        .created_ago("1 hour")
        .ended_ago("10 minutes")
        .create(&app.pool, other)
        .await;

    app.create_staff(org, "chart@example.com", "viewer").await;
    let c = app.logged_in("chart@example.com").await;
    let (status, html) = c.page("/").await;
    assert_eq!(status, 200);
    assert!(
        html.contains(
            "par1, last 24 hours, per hour: 3 created, 1 converted, 1 expired, 1 cancelled in all"
        ),
        "{html}"
    );
}

/// R13 and R14 on the dashboard: a reservation of an order of three shows
/// the order's other machines (live list and its page); support extends it
/// with a reason (the whole order, one deadline, an `extended` event per
/// machine and one audit row); a viewer sees no Extend button and gets 403;
/// a reason is required; converting from one reservation's page converts
/// the whole order, one service reference per machine.
#[tokio::test]
async fn orders_of_several_and_extensions_on_the_dashboard() {
    use poolkeeper::allocator::{Quantity, ReserveOutcome};
    let app = spawn_app().await;
    for i in 0..3 {
        FakeMachine::new()
            .tag(&format!("PK-{i}"))
            .profile("epyc")
            .create(&app.pool, app.org.id)
            .await;
    }
    let req = poolkeeper::allocator::ReserveRequest {
        quantity: Quantity::new(3).expect("three"),
        ..crate::helpers::request_for("ORD-TRIO", "epyc", None)
    };
    let order = match allocator::reserve(&app.pool, app.org.id, &req)
        .await
        .expect("reserve")
    {
        ReserveOutcome::Created {
            reservation,
            others,
            ..
        } => std::iter::once(reservation)
            .chain(others)
            .collect::<Vec<_>>(),
        other => panic!("expected an order of three, got {other:?}"),
    };
    let first = &order[0];
    let support = app.staff("ana@acme.example", "support").await;
    let viewer = app.staff("vic@acme.example", "viewer").await;

    let (status, live) = support.page("/reservations").await;
    assert_eq!(status, 200);
    assert!(
        live.contains("(1 of 3)") && live.contains("/search?q=ORD-TRIO"),
        "{live}"
    );
    assert!(live.contains(&format!(
        "/reservations/{}/extend?fence={}",
        first.id, first.fence
    )));
    let (_, page) = support
        .page(&format!("/reservations/{}", order[1].id))
        .await;
    assert!(page.contains("machine 2 of 3"), "{page}");
    for r in [&order[0], &order[2]] {
        assert!(
            page.contains(&format!("href=\"/reservations/{}\"", r.id)),
            "links its order"
        );
    }
    let (_, viewer_page) = viewer.page(&format!("/reservations/{}", first.id)).await;
    assert!(
        !viewer_page.contains("/extend?fence="),
        "no Extend button for a viewer"
    );
    let (status, _) = viewer
        .page(&format!(
            "/reservations/{}/extend?fence={}",
            first.id, first.fence
        ))
        .await;
    assert_eq!(status, 403);

    // The confirmation page names the whole order and carries each fence.
    let confirm = format!("/reservations/{}/extend?fence={}", first.id, first.fence);
    let (status, body) = support.page(&confirm).await;
    assert_eq!(status, 200);
    assert!(body.contains("Extend order ORD-TRIO?"), "{body}");
    let mut form: Vec<(String, String)> = vec![
        ("fence".into(), first.fence.to_string()),
        ("minutes".into(), "30".into()),
        ("reason".into(), " ".into()),
    ];
    for r in &order {
        let f = hidden_field(&body, &format!("fence_{}", r.id)).expect("a fence per machine");
        assert_eq!(f, r.fence.to_string());
        form.push((format!("fence_{}", r.id), f));
    }
    let post = |form: Vec<(String, String)>, path: String| {
        let support = &support;
        async move {
            let csrf = support.csrf().await;
            let mut fields = form;
            fields.push(("csrf".into(), csrf));
            support
                .http
                .post(support.url(&path))
                .form(&fields)
                .send()
                .await
                .expect("post")
        }
    };
    let extend_path = format!("/reservations/{}/extend", first.id);
    let r = post(form.clone(), extend_path.clone()).await;
    assert_eq!(r.status().as_u16(), 400, "a reason is required");
    form[2].1 = "3-D Secure challenge".into();
    let r = post(form.clone(), extend_path).await;
    assert_eq!(r.status().as_u16(), 303);
    let (deadlines, events, audits): (i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(DISTINCT expires_at) FROM reservations WHERE order_ref = 'ORD-TRIO'
                   AND expires_at > clock_timestamp() + interval '29 minutes'),
                (SELECT count(*) FROM reservation_events e JOIN reservations r ON r.id = e.reservation_id
                  WHERE r.order_ref = 'ORD-TRIO' AND e.kind = 'extended' AND e.actor = 'ana@acme.example'
                    AND e.detail LIKE '%: 3-D Secure challenge'),
                (SELECT count(*) FROM audit_log WHERE action = 'order.extend' AND object = 'order:ORD-TRIO')",
    )
    .fetch_one(&app.pool)
    .await
    .expect("after the extension");
    assert_eq!((deadlines, events, audits), (1, 3, 1));
    let (_, timeline) = support
        .page(&format!("/reservations/{}", order[2].id))
        .await;
    let timeline = text_of(&timeline, "table.timeline").join(" ");
    assert!(
        timeline.contains("extended") && timeline.contains("3-D Secure challenge"),
        "{timeline}"
    );

    // Convert the whole order from one reservation's page.
    let (_, body) = support
        .page(&format!(
            "/reservations/{}/convert?fence={}",
            first.id, first.fence
        ))
        .await;
    let mut form: Vec<(String, String)> = vec![("fence".into(), first.fence.to_string())];
    for (i, r) in order.iter().enumerate() {
        assert!(body.contains(&format!("name=\"service_ref_{}\"", r.id)));
        form.push((format!("fence_{}", r.id), r.fence.to_string()));
        form.push((format!("service_ref_{}", r.id), format!("SRV-T{i}")));
    }
    let r = post(form, format!("/reservations/{}/convert", first.id)).await;
    assert_eq!(r.status().as_u16(), 303);
    let converted: Vec<(String, String)> = sqlx::query_as(
        "SELECT r.state, s.service_ref FROM reservations r JOIN service_links s ON s.reservation_id = r.id
          WHERE r.order_ref = 'ORD-TRIO' ORDER BY r.slot",
    )
    .fetch_all(&app.pool)
    .await
    .expect("converted");
    assert_eq!(
        converted,
        (0..3)
            .map(|i| ("converted".to_owned(), format!("SRV-T{i}")))
            .collect::<Vec<_>>()
    );
}

/// F3 on the dashboard: a staff cancellation whose session is terminated
/// while its COMMIT waits (here on an advisory lock a deferred trigger
/// takes at commit time; in production, on the synchronous standby) gets
/// a page, not a 500: `503`, saying the change may or may not have been
/// made, with a link to do the same again; done again, it is done once.
/// A statement that breaks before the commit says nothing was changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_staff_action_killed_mid_commit_gets_a_page_offering_it_again() {
    let app = spawn_app().await;
    FakeMachine::new()
        .tag("MC-1")
        .profile("epyc")
        .create(&app.pool, app.org.id)
        .await;
    let a = FakeHold::on("MC-1")
        .order("ORD-MC-1")
        .create(&app.pool, app.org.id)
        .await;
    let c = app.staff("ana@acme.example", "support").await;
    let (status, page) = c.page(&format!("/reservations/{a}/cancel")).await;
    assert_eq!(status, 200);
    let (action, fields) = form_of(&page);
    let fields = with(&fields, &[("reason", "customer left")]);
    // At commit, the audit row's deferred trigger waits for lock 4242.
    sqlx::raw_sql(
        "CREATE FUNCTION test_wait_at_commit() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN PERFORM pg_advisory_xact_lock(4242); RETURN NULL; END $$;
         CREATE CONSTRAINT TRIGGER test_wait_at_commit AFTER INSERT ON audit_log
         DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION test_wait_at_commit();",
    )
    .execute(&app.pool)
    .await
    .expect("the trigger");
    let mut blocker = app.db.connection().await;
    sqlx::query("SELECT pg_advisory_lock(4242)")
        .execute(&mut blocker)
        .await
        .expect("lock");
    let request = {
        let http = c.http.clone();
        let url = c.url(&action);
        let fields = fields.clone();
        tokio::spawn(async move {
            http.post(url)
                .form(&fields)
                .send()
                .await
                .expect("an answer")
        })
    };
    crate::helpers::terminate_session_where(
        &app.pool,
        "wait_event_type = 'Lock' AND wait_event = 'advisory' AND application_name = 'poolkeeper'",
    )
    .await;
    let resp = request.await.expect("the request task");
    assert_eq!(resp.status().as_u16(), 503);
    assert!(resp.headers().contains_key("retry-after"));
    let body = resp.text().await.expect("page");
    assert!(body.contains("may or may not have been made"), "{body}");
    assert!(
        body.contains(&format!("href=\"/reservations/{a}/cancel\"")),
        "the same action, offered again: {body}"
    );
    sqlx::query("SELECT pg_advisory_unlock(4242)")
        .execute(&mut blocker)
        .await
        .expect("unlock");
    sqlx::raw_sql("DROP TRIGGER test_wait_at_commit ON audit_log")
        .execute(&app.pool)
        .await
        .expect("drop the trigger");
    // Terminated before its commit finished: not made. Done again, it is.
    assert_eq!(app.state_of(a).await, "held");
    let (status, page) = c.page(&format!("/reservations/{a}/cancel")).await;
    assert_eq!(status, 200);
    let (action, again) = form_of(&page);
    let r = post(&c, &action, &with(&again, &[("reason", "customer left")])).await;
    assert_eq!(r.status().as_u16(), 303);
    assert_eq!(app.state_of(a).await, "cancelled");
    let audited: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM audit_log WHERE action = 'reservation.cancel' AND object = $1",
    )
    .bind(format!("reservation:{a}"))
    .fetch_one(&app.pool)
    .await
    .expect("count");
    assert_eq!(audited, 1);

    // Done again after it took effect: the page says it ended, no 500.
    let r = post(&c, &action, &with(&again, &[("reason", "customer left")])).await;
    assert_eq!(r.status().as_u16(), 409);
}

/// An audit row only for what changed: a staff extension shorter than the
/// time left changes nothing and is not audited; a longer one is, once.
#[tokio::test]
async fn an_extension_that_changed_nothing_writes_no_audit_row() {
    let app = spawn_app().await;
    FakeMachine::new()
        .tag("AX-1")
        .profile("epyc")
        .create(&app.pool, app.org.id)
        .await;
    let (a, fence) = FakeHold::on("AX-1")
        .order("ORD-AX-1")
        .create_with_fence(&app.pool, app.org.id)
        .await;
    let c = app.staff("ana@acme.example", "support").await;
    let audited = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM audit_log WHERE action = 'reservation.extend' AND object = $1",
        )
        .bind(format!("reservation:{a}"))
        .fetch_one(&app.pool)
        .await
        .expect("count")
    };
    for (minutes, expected) in [("1", 0), ("30", 1)] {
        let (status, page) = c
            .page(&format!("/reservations/{a}/extend?fence={fence}"))
            .await;
        assert_eq!(status, 200);
        let (action, fields) = form_of(&page);
        let r = post(
            &c,
            &action,
            &with(
                &fields,
                &[("minutes", minutes), ("reason", "payment pending")],
            ),
        )
        .await;
        assert_eq!(r.status().as_u16(), 303, "{minutes} min");
        assert_eq!(audited().await, expected, "{minutes} min");
    }
}
