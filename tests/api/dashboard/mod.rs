//! The staff dashboard: pages parsed with scraper, every link
//! followed, forms driven as a browser would (cookies, CSRF), roles, tenant
//! isolation, the R12 gate, and agreement with the allocator's reasons.
//! One module per concern; the page helpers they share are here.

mod admin;
mod capacity;
mod errors;
mod machines;
mod overview;
mod reservations;
mod session;
mod substitutes;

use std::collections::HashSet;

use scraper::{Html, Selector};

use crate::helpers::{FakeHold, FakeMachine, InService};
use crate::helpers::{StaffClient, TestApp};

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
