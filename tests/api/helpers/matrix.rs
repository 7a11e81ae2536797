//! The dashboard's half of the access matrix: every route and method,
//! with the status for anonymous, viewer, support, admin of the
//! organization, admin of another organization. Used by
//! `guardrails::access_matrix_of_every_route_and_api_call` (password
//! sessions) and by the single sign-on component test, whose viewer,
//! support and admin signed in through a real provider and must get
//! exactly what a password session of their role gets.

use std::sync::atomic::{AtomicU32, Ordering};

use super::{FakeHold, FakeMachine, STAFF_PASSWORD, StaffClient, TestApp};

static SEQ: AtomicU32 = AtomicU32::new(1);

pub fn next() -> u32 {
    SEQ.fetch_add(1, Ordering::Relaxed)
}

/// Who asks, on the dashboard.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Who {
    Anonymous,
    Viewer,
    Support,
    Admin,
    /// An admin of the other organization: sees only its own objects.
    OtherOrg,
}

pub const WHO: [Who; 5] = [
    Who::Anonymous,
    Who::Viewer,
    Who::Support,
    Who::Admin,
    Who::OtherOrg,
];

/// Every dashboard route (the path as registered in `dashboard::ROUTES`) and
/// method, with the status for: anonymous, viewer, support, admin of the
/// organization, admin of another organization. Object paths name this
/// organization's objects, so the other organization's admin gets 404.
/// 303 for anonymous is always to /login. POST /login here is a crafted
/// POST without the login form's token (the form itself is tested apart).
/// Every GET cell is also asked with HEAD, which must answer the same
/// status and headers with no body.
#[rustfmt::skip]
pub const DASHBOARD: &[(&str, &str, [u16; 5])] = &[
    //                                             anon viewer support admin other
    ("/",                           "get",  [303, 200, 200, 200, 200]),
    ("/login",                      "get",  [200, 200, 200, 200, 200]),
    ("/login",                      "post", [403, 403, 403, 403, 403]),
    ("/login/sso",                  "get",  [400, 400, 400, 400, 400]),
    ("/login/sso/callback",         "get",  [400, 400, 400, 400, 400]),
    ("/logout",                     "post", [303, 303, 303, 303, 303]),
    ("/machines",                   "get",  [303, 200, 200, 200, 200]),
    ("/machines.csv",               "get",  [303, 200, 200, 200, 200]),
    ("/machines/{asset_tag}",       "get",  [303, 200, 200, 200, 404]),
    ("/reservations",               "get",  [303, 200, 200, 200, 200]),
    ("/reservations.csv",           "get",  [303, 200, 200, 200, 200]),
    ("/reservations/{id}",          "get",  [303, 200, 200, 200, 404]),
    ("/reservations/{id}/cancel",   "get",  [303, 403, 200, 200, 404]),
    ("/reservations/{id}/cancel",   "post", [303, 403, 303, 303, 404]),
    ("/reservations/{id}/convert",  "get",  [303, 403, 200, 200, 404]),
    ("/reservations/{id}/convert",  "post", [303, 403, 303, 303, 404]),
    ("/reservations/{id}/extend",   "get",  [303, 403, 200, 200, 404]),
    ("/reservations/{id}/extend",   "post", [303, 403, 303, 303, 404]),
    ("/search",                     "get",  [303, 200, 200, 200, 200]),
    ("/status-changes",             "get",  [303, 403, 200, 200, 409]),
    ("/status-changes",             "post", [303, 403, 200, 200, 409]),
    ("/why-not",                    "get",  [303, 200, 200, 200, 200]),
    ("/jobs",                       "get",  [303, 200, 200, 200, 200]),
    ("/demand",                     "get",  [303, 200, 200, 200, 200]),
    ("/demand.csv",                 "get",  [303, 200, 200, 200, 200]),
    ("/planning",                   "get",  [303, 200, 200, 200, 200]),
    ("/planning.csv",               "get",  [303, 200, 200, 200, 200]),
    ("/planning/pool",              "get",  [303, 400, 400, 400, 400]),
    ("/settings",                   "get",  [303, 403, 403, 200, 200]),
    ("/settings",                   "post", [303, 403, 403, 303, 303]),
    ("/settings/webhook",           "post", [303, 403, 403, 303, 303]),
    ("/settings/headroom",          "post", [303, 403, 403, 303, 303]),
    ("/settings/substitutes",       "post", [303, 403, 403, 303, 303]),
    ("/settings/lead-time",         "post", [303, 403, 403, 303, 303]),
    ("/audit",                      "get",  [303, 403, 403, 200, 200]),
    ("/users",                      "get",  [303, 403, 403, 200, 200]),
    ("/users",                      "post", [303, 403, 403, 303, 303]),
    ("/users/{id}/disable",         "post", [303, 403, 403, 303, 404]),
    ("/tokens",                     "get",  [303, 403, 403, 200, 200]),
    ("/tokens",                     "post", [303, 403, 403, 200, 200]),
    ("/tokens/{id}/revoke",         "post", [303, 403, 403, 303, 404]),
    ("/static/{path:.*}",           "get",  [200, 200, 200, 200, 200]),
];

pub fn method(m: &str) -> reqwest::Method {
    m.to_ascii_uppercase().parse().expect("method")
}

/// The (path, method) pairs the OpenAPI document declares.
/// How the world's viewer, support and admin got their sessions.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum SignIn {
    /// The login form, with a password.
    Password,
    /// The organization's OpenID Connect provider (S1), whose accounts are
    /// `provider_accounts()`: no password of theirs is ever used.
    Provider,
}

/// The world every matrix cell acts on.
pub struct World {
    viewer: StaffClient,
    support: StaffClient,
    admin: StaffClient,
    other: StaffClient,
    pub sign_in: SignIn,
}

/// The provider's accounts for a world signed in through it, with the
/// groups that `oidc::configure` maps to viewer, support and admin.
pub fn provider_accounts() -> serde_json::Value {
    serde_json::json!({
        "vera": {"email": email_of(Who::Viewer), "name": "Vera Viewer", "groups": ["pk-viewers"]},
        "sam": {"email": email_of(Who::Support), "name": "Sam Support", "groups": ["pk-support"]},
        "ada": {"email": email_of(Who::Admin), "name": "Ada Admin", "groups": ["pk-admins"]},
    })
}

impl World {
    /// Password sessions for every role.
    pub async fn new(app: &TestApp) -> World {
        World::with(app, SignIn::Password).await
    }

    /// The organization's viewer, support and admin signed in through its
    /// provider (configured by the caller with `provider_accounts()`); the
    /// other organization's admin with a password.
    pub async fn through_provider(app: &TestApp) -> World {
        World::with(app, SignIn::Provider).await
    }

    async fn with(app: &TestApp, sign_in: SignIn) -> World {
        FakeMachine::new()
            .tag("PK-1")
            .profile("epyc")
            .create(&app.pool, app.org.id)
            .await;
        FakeMachine::new()
            .tag("OT-1")
            .profile("other-profile")
            .create(&app.pool, app.other.id)
            .await;
        // Second profiles, retired: what a declaration of substitutes names.
        FakeMachine::new()
            .tag("PK-BIG")
            .profile("epyc-big")
            .status("retired")
            .create(&app.pool, app.org.id)
            .await;
        FakeMachine::new()
            .tag("OT-BIG")
            .profile("other-big")
            .status("retired")
            .create(&app.pool, app.other.id)
            .await;
        app.create_staff(app.other.id, "root@other.example", "admin")
            .await;
        if sign_in == SignIn::Password {
            for who in [Who::Viewer, Who::Support, Who::Admin] {
                app.create_staff(app.org.id, email_of(who), role_of(who))
                    .await;
            }
        }
        World {
            viewer: session(app, sign_in, Who::Viewer).await,
            support: session(app, sign_in, Who::Support).await,
            admin: session(app, sign_in, Who::Admin).await,
            other: app.logged_in("root@other.example").await,
            sign_in,
        }
    }

    fn client(&self, who: Who) -> Option<&StaffClient> {
        match who {
            Who::Anonymous => None,
            Who::Viewer => Some(&self.viewer),
            Who::Support => Some(&self.support),
            Who::Admin => Some(&self.admin),
            Who::OtherOrg => Some(&self.other),
        }
    }

    /// Whether `who`'s sessions come from the provider.
    pub fn through_provider_for(&self, who: Who) -> bool {
        self.sign_in == SignIn::Provider && matches!(who, Who::Viewer | Who::Support | Who::Admin)
    }
}

/// A new session of `who`, made the world's way.
async fn session(app: &TestApp, sign_in: SignIn, who: Who) -> StaffClient {
    match (sign_in, who) {
        (SignIn::Provider, Who::Viewer | Who::Support | Who::Admin) => {
            let account = email_of(who).split('@').next().unwrap_or_default();
            super::oidc::signed_in(app, account).await
        }
        _ => app.logged_in(email_of(who)).await,
    }
}

fn role_of(who: Who) -> &'static str {
    match who {
        Who::Viewer => "viewer",
        Who::Support => "support",
        _ => "admin",
    }
}

pub fn email_of(who: Who) -> &'static str {
    match who {
        Who::Anonymous => "",
        Who::Viewer => "vera@acme.example",
        Who::Support => "sam@acme.example",
        Who::Admin => "ada@acme.example",
        Who::OtherOrg => "root@other.example",
    }
}

/// A fresh held reservation of the organization on a fresh machine.
pub async fn fresh_held(app: &TestApp) -> (i64, i64, String) {
    let n = next();
    let tag = format!("MX-{n}");
    FakeMachine::new()
        .tag(&tag)
        .profile("epyc")
        .create(&app.pool, app.org.id)
        .await;
    let order = format!("ORD-M{n}");
    let (id, fence) = FakeHold::on(&tag)
        .order(&order)
        .create_with_fence(&app.pool, app.org.id)
        .await;
    (id, fence, order)
}

/// One dashboard cell: the concrete request for `who`, sent; its status and
/// Location header.
pub async fn dashboard_cell(
    app: &TestApp,
    world: &World,
    path: &str,
    m: &str,
    who: Who,
) -> (u16, String) {
    let n = next();
    let mut fields: Vec<(String, String)> = Vec::new();
    let mut concrete = path.to_owned();
    let fresh_session;
    let client: Option<&StaffClient> = if path == "/logout" && who != Who::Anonymous {
        // Logging out ends the session: use a fresh one of the same user.
        fresh_session = session(app, world.sign_in, who).await;
        Some(&fresh_session)
    } else {
        world.client(who)
    };
    match path {
        "/machines/{asset_tag}" => concrete = "/machines/PK-1".into(),
        "/static/{path:.*}" => concrete = "/static/app.css".into(),
        p if p.starts_with("/reservations/{id}") => {
            let (id, fence, _) = fresh_held(app).await;
            concrete = p.replace("{id}", &id.to_string());
            fields.push(("fence".into(), fence.to_string()));
            fields.push(("reason".into(), "matrix".into()));
            fields.push(("service_ref".into(), format!("SRV-{n}")));
            fields.push(("minutes".into(), "10".into()));
            if m == "get" {
                concrete = format!("{concrete}?fence={fence}");
            }
        }
        "/status-changes" => {
            // A machine of this organization: another's admin names a
            // machine it does not have (409, nothing written).
            let tag = format!("SC-{n}");
            FakeMachine::new()
                .tag(&tag)
                .profile("epyc")
                .create(&app.pool, app.org.id)
                .await;
            if m == "get" {
                concrete = format!("/status-changes?tags={tag}&status=maintenance");
            }
            fields.push(("tags".into(), tag));
            fields.push(("status".into(), "maintenance".into()));
        }
        "/settings" => fields.push(("datacenter".into(), "on".into())),
        "/settings/webhook" => fields.push(("action".into(), "remove".into())),
        "/settings/substitutes" => {
            // A profile of the poster's own organization (one with
            // machines), and a second one.
            let (profile, other) = if who == Who::OtherOrg {
                ("other-profile", "other-big")
            } else {
                ("epyc", "epyc-big")
            };
            fields.push(("profile".into(), profile.into()));
            fields.push(("substitutes".into(), other.into()));
        }
        "/settings/headroom" => {
            // A pool of the poster's own organization (one with machines).
            let profile = if who == Who::OtherOrg {
                "other-profile"
            } else {
                "epyc"
            };
            fields.push(("site".into(), "par1".into()));
            fields.push(("profile".into(), profile.into()));
            fields.push(("segment".into(), "enterprise".into()));
            fields.push(("machines".into(), "1".into()));
        }
        "/settings/lead-time" => {
            fields.push(("site".into(), "par1".into()));
            fields.push(("days".into(), "45".into()));
        }
        "/users" => {
            fields.push(("email".into(), format!("new{n}@example.com")));
            fields.push(("role".into(), "viewer".into()));
            fields.push(("password".into(), "a long password".into()));
        }
        "/users/{id}/disable" => {
            let email = format!("victim{n}@acme.example");
            app.create_staff(app.org.id, &email, "viewer").await;
            let id: i64 = sqlx::query_scalar("SELECT id FROM users WHERE email = $1")
                .bind(&email)
                .fetch_one(&app.pool)
                .await
                .expect("user id");
            concrete = format!("/users/{id}/disable");
        }
        "/tokens" => {
            fields.push(("name".into(), format!("matrix-{n}")));
            fields.push(("orders".into(), "on".into()));
        }
        "/tokens/{id}/revoke" => {
            let scopes = [poolkeeper::domain::Scope::Orders];
            poolkeeper::tokens::create(
                &app.pool,
                app.org.id,
                Some(&format!("doomed-{n}")),
                &scopes,
            )
            .await
            .expect("token");
            let id: i64 = sqlx::query_scalar("SELECT id FROM api_tokens WHERE name = $1")
                .bind(format!("doomed-{n}"))
                .fetch_one(&app.pool)
                .await
                .expect("token id");
            concrete = format!("/tokens/{id}/revoke");
        }
        "/login" => {
            fields.push(("email".into(), email_of(Who::Admin).into()));
            fields.push(("password".into(), STAFF_PASSWORD.into()));
        }
        _ => {}
    }
    let anonymous = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    let (http, csrf) = match client {
        Some(c) if path != "/login" => (c.http.clone(), c.csrf().await),
        Some(c) => (c.http.clone(), String::new()),
        None => (anonymous, String::new()),
    };
    let mut req = http.request(method(m), app.url(&concrete));
    if m == "post" {
        fields.push(("csrf".into(), csrf));
        req = req.form(&fields);
    }
    let r = req.send().await.expect("request");
    let location = r
        .headers()
        .get("location")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let status = r.status().as_u16();
    if m == "get" {
        let get = Answer::of(r).await;
        let url = app.url(&concrete);
        if let Err(e) = head_matches_get(|m| http.request(m, &url), get).await {
            return (0, format!("HEAD {concrete} as {who:?}: {e}"));
        }
    }
    (status, location)
}

/// Whether HEAD answers as `get`, the GET of the same request (`request`
/// builds it for a method). An answer is live: the sweep folds counts,
/// holds tick down, and an `as_of` instant is written with 3 or 6
/// fractional digits as its microseconds fall. So a differing pair is
/// asked again, up to three pairs: a HEAD that is not its GET's differs
/// every time.
pub async fn head_matches_get(
    request: impl Fn(reqwest::Method) -> reqwest::RequestBuilder,
    mut get: Answer,
) -> Result<(), String> {
    let mut attempt = 1;
    loop {
        let head = request(reqwest::Method::HEAD).send().await.expect("HEAD");
        match get.same_as_head(head).await {
            Ok(()) => return Ok(()),
            Err(e) if attempt == 3 => return Err(e),
            Err(_) => {
                let again = request(reqwest::Method::GET).send().await.expect("GET");
                get = Answer::of(again).await;
                attempt += 1;
            }
        }
    }
}

/// A GET's answer, to compare the HEAD of the same URL with.
pub struct Answer {
    status: u16,
    headers: reqwest::header::HeaderMap,
    body_len: usize,
    /// A body that changes with every request (no length to compare).
    pub snapshot: bool,
}

impl Answer {
    pub async fn of(r: reqwest::Response) -> Answer {
        Answer {
            status: r.status().as_u16(),
            headers: r.headers().clone(),
            body_len: r.bytes().await.expect("body").len(),
            snapshot: false,
        }
    }

    /// HEAD answers with the GET's status and headers
    /// (the Content-Length of the GET's body included) and no body. Only
    /// the date and the values of fresh cookies may differ.
    pub async fn same_as_head(&self, head: reqwest::Response) -> Result<(), String> {
        let status = head.status().as_u16();
        let headers = head.headers().clone();
        let body = head.bytes().await.expect("HEAD body");
        if status != self.status {
            return Err(format!("status {status}, GET {}", self.status));
        }
        if !body.is_empty() {
            return Err(format!("a body of {} bytes", body.len()));
        }
        let comparable = |h: &reqwest::header::HeaderMap| -> Vec<(String, String)> {
            let mut v: Vec<(String, String)> = h
                .iter()
                .filter(|(k, _)| k.as_str() != "date")
                .filter(|(k, _)| !(self.snapshot && k.as_str() == "content-length"))
                .map(|(k, v)| {
                    let v = v.to_str().unwrap_or_default();
                    let v = if k.as_str() == "set-cookie" {
                        v.split('=').next().unwrap_or_default()
                    } else {
                        v
                    };
                    (k.as_str().to_owned(), v.to_owned())
                })
                .collect();
            v.sort();
            v
        };
        if comparable(&headers) != comparable(&self.headers) {
            return Err(format!(
                "headers {:?}, GET {:?}",
                comparable(&headers),
                comparable(&self.headers)
            ));
        }
        let length = headers
            .get("content-length")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<usize>().ok());
        if length != Some(self.body_len) && !self.snapshot {
            return Err(format!(
                "content-length {length:?}, GET body {} bytes",
                self.body_len
            ));
        }
        Ok(())
    }
}

/// Every dashboard cell of `DASHBOARD` asked as each of `WHO` in `world`:
/// the cells that differ from the table, described. S3 is the one
/// difference a provider's session makes: its sign-out answers 200, the
/// page that sends the browser on to the provider's end-session endpoint,
/// where a password session's is a 303 to /login.
pub async fn dashboard_failures(app: &TestApp, world: &World) -> Vec<String> {
    let mut failures = Vec::new();
    for (path, m, expected) in DASHBOARD {
        for (who, want) in WHO.iter().zip(expected) {
            let want = if *path == "/logout" && world.through_provider_for(*who) {
                200
            } else {
                *want
            };
            let (got, location) = dashboard_cell(app, world, path, m, *who).await;
            if got == 0 {
                // The GET was as expected or not; its HEAD was not the same.
                failures.push(location);
            } else if got != want {
                failures.push(format!("{m} {path} as {who:?}: {got}, expected {want}"));
            } else if got == 303 && *who == Who::Anonymous && location != "/login" {
                failures.push(format!(
                    "{m} {path} as {who:?}: 303 to {location}, expected /login"
                ));
            } else if got == 303 && *who != Who::Anonymous && location == "/login" {
                failures.push(format!("{m} {path} as {who:?}: sent to log in again"));
            }
        }
    }
    failures
}
