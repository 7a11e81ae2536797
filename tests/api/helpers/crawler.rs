//! The crawler of the dashboard's forms: every page reachable from the
//! overview as one signed-in client, every form on them submitted with
//! hostile values one field at a time, each answer recorded. Used by
//! `hostile_forms` (password sessions) and by the single sign-on component
//! test (sessions made by a real provider's sign-in), which must find the
//! same.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

use scraper::{ElementRef, Html, Selector};

use super::StaffClient;

fn sel(s: &str) -> Selector {
    Selector::parse(s).expect("selector")
}

/// Pages fetched per role, at most.
const MAX_PAGES: usize = 60;
/// URLs of one shape (`/machines/*`, `/reservations/*/cancel?fence`) fetched,
/// at most: the 360 machines of the demo have one page shape.
const PER_SHAPE: usize = 2;

/// The shape of a dashboard URL: the first segment, then `*` for every
/// segment that names an object (ids, tags), with the query's keys.
pub fn shape(url: &str) -> String {
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
pub struct Form {
    pub method: String,
    pub action: String,
    /// (name, value, hidden)
    pub fields: Vec<(String, String, bool)>,
    pub found_on: String,
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

pub fn forms_of(page: &str, html: &str) -> Vec<Form> {
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
pub fn hostile_values(order_ref: &str, asset_tag: &str) -> Vec<Vec<u8>> {
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

pub struct Crawl {
    pub requests: usize,
    /// (method action, status) -> count
    pub seen: BTreeMap<(String, u16), usize>,
    pub failures: Vec<String>,
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
pub async fn crawl(c: &StaffClient, crawl: &mut Crawl) -> Vec<Form> {
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
            if form_shapes.insert(key(&f)) {
                forms.push(f);
            }
        }
    }
    forms
}

/// A form's shape: its method, its action's shape, its fields' names.
pub fn key(f: &Form) -> String {
    let mut names: Vec<&str> = f.fields.iter().map(|(n, _, _)| n.as_str()).collect();
    names.sort_unstable();
    format!("{} {} {}", f.method, shape(&f.action), names.join(","))
}

/// Each form, each field but the CSRF token in turn set to each hostile
/// value, the others as the page gave them.
pub async fn submit_hostile(
    c: &StaffClient,
    forms: &[Form],
    values: &[Vec<u8>],
    crawl: &mut Crawl,
) {
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

impl Crawl {
    pub fn new() -> Crawl {
        Crawl {
            requests: 0,
            seen: BTreeMap::new(),
            failures: Vec::new(),
        }
    }
}

/// The forms each client found, by its label.
pub type FormsFound = BTreeMap<String, Vec<String>>;

/// The hostile values for the demo organization: its first hold's order
/// ref and asset tag give the search prefixes.
pub async fn demo_values(app: &super::TestApp) -> Vec<Vec<u8>> {
    let (order_ref, asset_tag): (String, String) = sqlx::query_as(
        "SELECT r.order_ref, m.asset_tag FROM reservations r JOIN machines m ON m.id = r.machine_id
          WHERE r.order_ref = 'DEMO-HOLD-0001'",
    )
    .fetch_one(&app.pool)
    .await
    .expect("a demo hold");
    hostile_values(&order_ref, &asset_tag)
}

/// Crawls as `c` (named `label`), submits every form found with every
/// hostile value, and checks that `c`'s session survived them all.
pub async fn as_client(
    c: &StaffClient,
    label: &str,
    values: &[Vec<u8>],
    log: &mut Crawl,
    found: &mut FormsFound,
) {
    let forms = crawl(c, log).await;
    found.insert(
        label.to_owned(),
        forms
            .iter()
            .map(|f| format!("{} {}", f.method, shape(&f.action)))
            .collect(),
    );
    submit_hostile(c, &forms, values, log).await;
    // Still logged in: the session survived every form.
    assert_eq!(c.page("/jobs").await.0, 200, "{label} still logged in");
}

/// The login page's forms, as a person who is not logged in yet.
pub async fn as_anonymous(base: &str, values: &[Vec<u8>], log: &mut Crawl) {
    let anonymous = StaffClient::new(base);
    let (_, page) = anonymous.page("/login").await;
    assert!(super::hidden_field(&page, "csrf").is_some());
    let login_forms = forms_of("/login", &page);
    submit_hostile(&anonymous, &login_forms, values, log).await;
}

/// No answer was a 5xx, and the crawl reached what it claims: every role's
/// filters and search, the actions of support, the admin's forms, each
/// with a valid token (the handlers answered, not the CSRF check).
pub fn assert_held(log: &Crawl, found: &FormsFound) {
    assert!(
        log.failures.is_empty(),
        "{} answers were 5xx:\n{}",
        log.failures.len(),
        log.failures.join("\n")
    );
    let reached = |what: &str| log.seen.keys().any(|(w, _)| w.starts_with(what));
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
            "the crawl never submitted {what}: {found:#?}"
        );
    }
    let forbidden = log
        .seen
        .iter()
        .filter(|((w, s), _)| w.starts_with("POST") && *s == 403)
        .map(|(_, n)| n)
        .sum::<usize>();
    let posts = log
        .seen
        .iter()
        .filter(|((w, _), _)| w.starts_with("POST"))
        .map(|(_, n)| n)
        .sum::<usize>();
    assert!(
        forbidden * 2 < posts,
        "most POSTs must pass the CSRF check: {forbidden} of {posts} were 403"
    );
}
