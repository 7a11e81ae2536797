//! Single sign-on (docs/rules.md S1-S3) against a real OpenID Connect
//! provider started on loopback (tests/api/helpers/oidc.rs: oidc-provider
//! under Node.js, installed by scripts/test), through HTTP: sign-in and
//! roles, the refusals, key rotation, the provider down with a break-glass
//! admin, sign-out. The ID token refusals a real provider will not produce
//! on request (another audience, expired, a wrong nonce, `alg: none`, an
//! unknown key) go through a man in the middle of the test's own between
//! poolkeeper and the provider, which changes the provider's ID token
//! (`an_id_token_that_fails_any_check_is_refused_and_writes_nothing`); the
//! unit tests of `src/sso.rs` check `verify` alone; the browser's walk
//! through the redirects is `browser::single_sign_on_through_the_browser`.

use std::sync::Mutex;

use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use openidconnect::core::{CoreJwsSigningAlgorithm, CoreRsaPrivateSigningKey};
use openidconnect::{JsonWebKeyId, PrivateSigningKey};
use serde_json::{Value, json};

use crate::helpers::oidc::{self, Provider, app_with, callback_for, configure, finish, signed_in};
use crate::helpers::{FakeHold, FakeMachine, STAFF_PASSWORD, StaffClient, TestApp};
use crate::helpers::{crawler, matrix};

fn accounts() -> Value {
    json!({
        "ana": {"email": "ana@corp.example", "name": "Ana", "groups": ["everyone", "pk-support"]},
        "bo": {"email": "bo@corp.example", "name": "Bo", "groups": ["everyone"]},
        "cy": {"email": "cy@corp.example", "name": "Cy"},
        "di": {"email": "di@corp.example", "name": "Di", "groups": ["pk-admins"]},
    })
}

async fn setup() -> (TestApp, Provider) {
    let app = app_with(|_| {}).await;
    let provider = Provider::start(&app.address, &accounts());
    configure(&app, &provider, poolkeeper::sso::Passwords::On).await;
    (app, provider)
}

/// What a refusal must leave alone: users, sessions, audit rows.
async fn written(app: &TestApp) -> (i64, i64, i64) {
    (
        app.count("SELECT count(*) FROM users").await,
        app.count("SELECT count(*) FROM sessions").await,
        app.count("SELECT count(*) FROM audit_log").await,
    )
}

async fn role_of(app: &TestApp, email: &str) -> String {
    sqlx::query_scalar("SELECT role FROM users WHERE email = $1")
        .bind(email)
        .fetch_one(&app.pool)
        .await
        .expect("a user")
}

#[tokio::test]
async fn a_support_user_signs_in_through_the_provider_and_cancels_a_hold() {
    let (app, _provider) = setup().await;
    FakeMachine::new()
        .tag("PK-1")
        .create(&app.pool, app.org.id)
        .await;
    let hold = FakeHold::on("PK-1")
        .order("ORD-A")
        .create(&app.pool, app.org.id)
        .await;
    let c = signed_in(&app, "ana").await;
    let (status, body) = c.page("/").await;
    assert_eq!(status, 200);
    // The layout shows the provider's name beside the email.
    assert!(
        body.contains("Ana &lt;ana@corp.example&gt;"),
        "the name beside the email: {body}"
    );
    // S1: made at the first sign-in, with the provider's subject, audited.
    let (role, subject): (String, Option<String>) =
        sqlx::query_as("SELECT role, sso_subject FROM users WHERE email = 'ana@corp.example'")
            .fetch_one(&app.pool)
            .await
            .expect("the user");
    assert_eq!(
        (role.as_str(), subject.as_deref()),
        ("support", Some("ana"))
    );
    let audited: Vec<(String, String)> = sqlx::query_as(
        "SELECT action, detail FROM audit_log WHERE actor = 'ana@corp.example' ORDER BY id",
    )
    .fetch_all(&app.pool)
    .await
    .expect("audit");
    assert_eq!(audited.len(), 2, "{audited:?}");
    assert_eq!(audited[0].0, "user.add");
    assert_eq!(audited[1].0, "login");
    for (_, detail) in &audited {
        assert!(detail.contains("subject \"ana\""), "{detail}");
        assert!(detail.contains(&_provider.issuer), "{detail}");
    }
    // The password no one knows opens nothing.
    let other = StaffClient::new(&app.address);
    assert_eq!(
        other
            .login("ana@corp.example", STAFF_PASSWORD)
            .await
            .status()
            .as_u16(),
        401
    );
    // Support acts: cancels the hold.
    let (status, page) = c.page(&format!("/reservations/{hold}/cancel")).await;
    assert_eq!(status, 200, "{page}");
    let (action, mut fields) =
        oidc::form(&page[page.find("<main").expect("main")..]).expect("the cancel form");
    fields.push(("reason".into(), "customer changed plan".into()));
    let r = c
        .http
        .post(c.url(&action))
        .form(&fields)
        .send()
        .await
        .expect("POST");
    assert_eq!(r.status().as_u16(), 303);
    assert_eq!(app.state_of(hold).await, "cancelled");
    // Its audit entry names the provider's subject beside the email.
    let (actor, detail): (String, String) =
        sqlx::query_as("SELECT actor, detail FROM audit_log WHERE action = 'reservation.cancel'")
            .fetch_one(&app.pool)
            .await
            .expect("the cancellation's audit row");
    assert_eq!(actor, "ana@corp.example");
    assert!(detail.contains("customer changed plan"), "{detail}");
    assert!(detail.contains("subject \"ana\""), "{detail}");
    // The audit log keeps the name beside the email of what she did, and
    // shows it; not beside a failed password typed for her email, which
    // anyone may have typed.
    let names: Vec<(String, Option<String>)> = sqlx::query_as(
        "SELECT action, actor_name FROM audit_log WHERE actor = 'ana@corp.example' ORDER BY id",
    )
    .fetch_all(&app.pool)
    .await
    .expect("audit");
    let named = |name: Option<&str>| name.map(str::to_owned);
    assert_eq!(
        names,
        vec![
            ("user.add".to_owned(), named(Some("Ana"))),
            ("login".to_owned(), named(Some("Ana"))),
            ("login_failed".to_owned(), named(None)),
            ("reservation.cancel".to_owned(), named(Some("Ana"))),
        ]
    );
    let admin = app.staff("root@acme.example", "admin").await;
    let (status, audit) = admin.page("/audit").await;
    assert_eq!(status, 200);
    assert!(audit.contains("Ana &lt;ana@corp.example&gt;"), "{audit}");
    // A second sign-in finds the same user.
    signed_in(&app, "ana").await;
    assert_eq!(
        app.count("SELECT count(*) FROM users WHERE email = 'ana@corp.example'")
            .await,
        1
    );
    // Completed sign-ins do not count against their address's bound.
    assert_eq!(app.count("SELECT count(*) FROM sso_starts").await, 0);
}

#[tokio::test]
async fn no_mapped_group_is_a_403_that_says_what_was_seen_and_expected() {
    let (app, _provider) = setup().await;
    let before = written(&app).await;
    for (account, seen) in [
        ("bo", "claim held: \"everyone\""),
        ("cy", "carried no \"groups\" claim"),
    ] {
        let c = StaffClient::new(&app.address);
        let callback = callback_for(&app, &c, account).await;
        let (status, body) = finish(&c, &callback).await;
        let body = body.replace("&quot;", "\"").replace("&#34;", "\"");
        assert_eq!(status, 403, "{account}: {body}");
        assert!(body.contains(seen), "{account}: {body}");
        assert!(
            body.contains(r#"admin: "pk-admins", support: "pk-support", viewer: "pk-viewers""#),
            "what the organization expects: {body}"
        );
        assert!(c.session_cookie().is_none());
    }
    assert_eq!(written(&app).await, before, "nothing written");
    // Refused sign-ins still count against their address's bound.
    assert_eq!(app.count("SELECT count(*) FROM sso_starts").await, 2);
}

#[tokio::test]
async fn roles_are_recomputed_at_every_sign_in() {
    let (app, provider) = setup().await;
    let first = signed_in(&app, "di").await;
    assert_eq!(role_of(&app, "di@corp.example").await, "admin");
    assert_eq!(first.page("/settings").await.0, 200);
    // Moved from the admin group to the viewer group at the provider.
    let mut moved = accounts();
    moved["di"]["groups"] = json!(["pk-viewers"]);
    provider.set_accounts(&moved);
    // Renamed at the provider too: the name is recomputed with the role.
    moved["di"]["name"] = json!("Di Renamed");
    provider.set_accounts(&moved);
    let second = signed_in(&app, "di").await;
    assert_eq!(role_of(&app, "di@corp.example").await, "viewer");
    assert!(
        second
            .page("/")
            .await
            .1
            .contains("Di Renamed &lt;di@corp.example&gt;")
    );
    // No name claim: the email is the name, shown once.
    moved["di"]
        .as_object_mut()
        .expect("an account")
        .remove("name");
    moved["di"]["groups"] = json!(["pk-viewers"]);
    provider.set_accounts(&moved);
    let third = signed_in(&app, "di").await;
    let name: Option<String> =
        sqlx::query_scalar("SELECT display_name FROM users WHERE email = 'di@corp.example'")
            .fetch_one(&app.pool)
            .await
            .expect("the user");
    assert_eq!(name.as_deref(), Some("di@corp.example"));
    assert!(!third.page("/").await.1.contains("&lt;di@corp.example&gt;"));
    assert_eq!(second.page("/settings").await.0, 403);
    // The role is the user's: the earlier session is a viewer's too.
    assert_eq!(first.page("/settings").await.0, 403);
    let change: String =
        sqlx::query_scalar("SELECT detail FROM audit_log WHERE action = 'user.role_changed'")
            .fetch_one(&app.pool)
            .await
            .expect("the change is audited");
    assert!(change.starts_with("admin to viewer"), "{change}");
    // Removed from every mapped group: refused at the next sign-in.
    moved["di"]["groups"] = json!([]);
    provider.set_accounts(&moved);
    let c = StaffClient::new(&app.address);
    let callback = callback_for(&app, &c, "di").await;
    assert_eq!(finish(&c, &callback).await.0, 403);
}

#[tokio::test]
async fn a_tampered_state_a_foreign_browser_and_a_replayed_code_are_refused() {
    let (app, _provider) = setup().await;
    let c = StaffClient::new(&app.address);
    let callback = callback_for(&app, &c, "ana").await;
    let before = written(&app).await;
    // The state changed by one character.
    let state = reqwest::Url::parse(&callback)
        .expect("url")
        .query_pairs()
        .find(|(k, _)| k == "state")
        .map(|(_, v)| v.into_owned())
        .expect("a state");
    let mut tampered_state = state.clone();
    tampered_state.push('x');
    let tampered = callback.replace(
        &format!("state={state}"),
        &format!("state={tampered_state}"),
    );
    assert_ne!(tampered, callback);
    let (status, body) = finish(&c, &tampered).await;
    assert_eq!(status, 400, "{body}");
    // The right state from another browser (no binding cookie).
    let stranger = StaffClient::new(&app.address);
    assert_eq!(finish(&stranger, &callback).await.0, 400);
    assert_eq!(written(&app).await, before, "nothing written");
    // The genuine answer still works, once.
    assert_eq!(finish(&c, &callback).await.0, 200);
    let after = written(&app).await;
    let (status, body) = finish(&c, &callback).await;
    assert_eq!(status, 400, "the same callback again: {body}");
    assert!(body.contains("already used"), "{body}");
    assert_eq!(written(&app).await, after);
    // The used code under a fresh sign-in's own state: our state is good,
    // and the provider refuses the code (used, and another PKCE verifier).
    let fresh = callback_for(&app, &c, "ana").await;
    let code = |url: &str| {
        reqwest::Url::parse(url)
            .expect("url")
            .query_pairs()
            .find(|(k, _)| k == "code")
            .map(|(_, v)| v.into_owned())
            .expect("a code")
    };
    let replayed = fresh.replace(&code(&fresh), &code(&callback));
    assert_ne!(replayed, fresh);
    let (status, body) = finish(&c, &replayed).await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("refused"), "{body}");
    assert_eq!(written(&app).await, after, "nothing written");
}

#[tokio::test]
async fn the_next_sign_in_works_after_the_provider_rotates_its_key() {
    let (app, mut provider) = setup().await;
    let kid = |issuer: String| async move {
        let jwks: Value = reqwest::get(format!("{issuer}/jwks"))
            .await
            .expect("jwks")
            .json()
            .await
            .expect("json");
        jwks["keys"][0]["kid"].as_str().expect("a kid").to_owned()
    };
    signed_in(&app, "ana").await;
    let before = kid(provider.issuer.clone()).await;
    provider.restart();
    let after = kid(provider.issuer.clone()).await;
    assert_ne!(before, after, "a new signing key");
    signed_in(&app, "ana").await;
}

#[tokio::test]
async fn provider_down_is_a_clear_page_and_the_break_glass_admin_signs_in() {
    let app = app_with(|_| {}).await;
    let mut provider = Provider::start(&app.address, &accounts());
    configure(&app, &provider, poolkeeper::sso::Passwords::Admins).await;
    app.create_staff(app.org.id, "root@acme.example", "admin")
        .await;
    app.create_staff(app.org.id, "sam@acme.example", "support")
        .await;
    provider.stop();
    let c = StaffClient::new(&app.address);
    let r = c.get("/login/sso?org=acme").await;
    assert_eq!(r.status().as_u16(), 503);
    let body = r.text().await.expect("body");
    assert!(body.contains("cannot be reached"), "{body}");
    assert!(body.contains("password"), "says what still works: {body}");
    // S2: the admin's password still works; support's does not.
    assert_eq!(
        c.login("root@acme.example", STAFF_PASSWORD)
            .await
            .status()
            .as_u16(),
        303
    );
    let s = StaffClient::new(&app.address);
    let r = s.login("sam@acme.example", STAFF_PASSWORD).await;
    assert_eq!(r.status().as_u16(), 403);
    assert!(
        r.text().await.expect("body").contains("admins only"),
        "says why"
    );
    assert!(s.session_cookie().is_none());
    // With passwords on for everyone, support's works again.
    configure(&app, &provider, poolkeeper::sso::Passwords::On).await;
    assert_eq!(
        s.login("sam@acme.example", STAFF_PASSWORD)
            .await
            .status()
            .as_u16(),
        303
    );
}

#[tokio::test]
async fn sign_out_ends_the_session_and_reaches_the_end_session_endpoint() {
    let (app, provider) = setup().await;
    let c = signed_in(&app, "ana").await;
    let csrf = c.csrf().await;
    let r = c.post_form("/logout", &[("csrf", &csrf)]).await;
    assert_eq!(r.status().as_u16(), 200);
    let body = r.text().await.expect("body");
    let doc = scraper::Html::parse_document(&body);
    let link = doc
        .select(&scraper::Selector::parse("main a").expect("selector"))
        .next()
        .and_then(|a| a.value().attr("href"))
        .expect("a link to the provider")
        .to_owned();
    assert!(
        link.starts_with(&format!("{}/session/end?", provider.issuer)),
        "{link}"
    );
    assert!(link.contains("client_id=poolkeeper"), "{link}");
    // Logged out here already.
    assert_eq!(c.get("/").await.status().as_u16(), 303);
    // The provider's end-session endpoint asks to confirm; confirming sends
    // the browser back to the login page.
    let r = c.http.get(&link).send().await.expect("end session");
    assert_eq!(r.status().as_u16(), 200);
    let page = r.text().await.expect("body");
    let (action, mut fields) = oidc::form(&page).expect("the provider's logout form");
    fields.push(("logout".into(), "yes".into()));
    let r = c
        .http
        .post(oidc::join(&link, &action))
        .form(&fields)
        .send()
        .await
        .expect("confirm");
    let back = r.headers()["location"]
        .to_str()
        .expect("location")
        .to_owned();
    assert_eq!(back, format!("{}/login?flash=logged_out", app.address));
    // A password user's logout stays here.
    let local = app.staff("root@acme.example", "admin").await;
    let csrf = local.csrf().await;
    let r = local.post_form("/logout", &[("csrf", &csrf)]).await;
    assert_eq!(r.status().as_u16(), 303);
}

#[tokio::test]
async fn unknown_organizations_and_missing_settings_are_refused_clearly() {
    let (app, _provider) = setup().await;
    let c = StaffClient::new(&app.address);
    for path in ["/login/sso?org=nobody", "/login/sso?org=other"] {
        let r = c.get(path).await;
        assert_eq!(r.status().as_u16(), 404, "{path}");
        assert!(r.text().await.expect("body").contains("no single sign-on"));
    }
    assert_eq!(c.get("/login/sso").await.status().as_u16(), 400);
    // A long authorization code (Entra ID's run past a kilobyte) passes the
    // input guard and meets the state check.
    let r = c
        .get(&format!(
            "/login/sso/callback?code={}&state=abc",
            "A".repeat(1500)
        ))
        .await;
    assert_eq!(r.status().as_u16(), 400);
    let body = r.text().await.expect("body");
    assert!(body.contains("does not match a sign-in"), "{body}");
    // The login page's form ends on our page, which moves on by itself
    // (the CSP's form-action governs a form's redirects).
    let r = c.get("/login/sso?org=acme&via=form").await;
    assert_eq!(r.status().as_u16(), 200);
    let body = r.text().await.expect("body");
    assert!(body.contains("http-equiv=\"refresh\""), "{body}");
    assert_eq!(app.count("SELECT count(*) FROM sso_pending").await, 1);
    // /settings shows it to admins, read-only, never the secret.
    let admin = app.staff("root@acme.example", "admin").await;
    let (status, page) = admin.page("/settings").await;
    assert_eq!(status, 200);
    assert!(page.contains(&_provider.issuer));
    assert!(page.contains("pk-support"));
    assert!(page.contains("/login/sso/callback"));
    assert!(!page.contains(oidc::CLIENT_SECRET));
}

#[tokio::test]
async fn the_secret_is_stored_nowhere_but_its_file() {
    let (app, provider) = setup().await;
    signed_in(&app, "ana").await;
    let dump: String = sqlx::query_scalar(
        "SELECT string_agg(t::text, ' ') FROM (
             SELECT row_to_json(s)::text AS t FROM org_sso s
             UNION ALL SELECT row_to_json(a)::text FROM audit_log a) x",
    )
    .fetch_one(&app.pool)
    .await
    .expect("dump");
    assert!(dump.contains(&provider.secret_file().to_string_lossy().into_owned()));
    assert!(!dump.contains(oidc::CLIENT_SECRET));
}

#[tokio::test]
async fn the_command_line_sets_shows_and_removes_single_sign_on() {
    let (app, provider) = setup().await;
    let secret = provider.secret_file().to_string_lossy().into_owned();
    let run = |args: &[&str]| {
        std::process::Command::new(crate::helpers::binary())
            .args(args)
            .env("DATABASE_URL", app.db.url())
            .env("POOLKEEPER_PUBLIC_URL", &app.address)
            .output()
            .expect("run poolkeeper")
    };
    let out = run(&[
        "org",
        "sso",
        "acme",
        "--issuer",
        &provider.issuer,
        "--client-id",
        oidc::CLIENT_ID,
        "--client-secret-file",
        &secret,
        "--claim",
        "roles",
        "--role",
        "admin=ops",
        "--role",
        "viewer=staff",
        "--role",
        "admin=cn=sre,ou=groups,dc=corp",
        "--passwords",
        "admins",
    ]);
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{said}");
    assert!(
        said.contains(&format!("{}/login/sso/callback", app.address)),
        "{said}"
    );
    assert!(!said.contains("warning"), "discovery worked: {said}");
    assert!(!said.contains(oidc::CLIENT_SECRET), "{said}");
    // Several values for one role, each taken whole (commas and all); the
    // single-value column keeps the first, for the previous release.
    let stored: (String, Vec<String>, Vec<String>, Option<String>, String) = sqlx::query_as(
        "SELECT claim, admin_values, support_values, admin_value, passwords FROM org_sso
          WHERE org_id = $1",
    )
    .bind(app.org.id)
    .fetch_one(&app.pool)
    .await
    .expect("stored");
    assert_eq!(
        stored,
        (
            "roles".into(),
            vec!["ops".into(), "cn=sre,ou=groups,dc=corp".into()],
            vec![],
            Some("ops".into()),
            "admins".into()
        )
    );
    assert!(
        said.contains(r#"admin: "ops" or "cn=sre,ou=groups,dc=corp", viewer: "staff""#),
        "{said}"
    );
    // Refused, and nothing changed: a plain http issuer, a value twice for
    // one role, one value for two roles, no role.
    for bad in [
        vec!["--issuer", "http://idp.example", "--role", "admin=x"],
        vec![
            "--issuer",
            provider.issuer.as_str(),
            "--role",
            "admin=x",
            "--role",
            "admin=x",
        ],
        vec![
            "--issuer",
            provider.issuer.as_str(),
            "--role",
            "admin=x",
            "--role",
            "viewer=x",
        ],
        vec!["--issuer", provider.issuer.as_str()],
    ] {
        let mut args = vec![
            "org",
            "sso",
            "acme",
            "--client-id",
            "c",
            "--client-secret-file",
            &secret,
        ];
        args.extend(bad.iter().copied());
        let out = run(&args);
        assert!(!out.status.success(), "{args:?}");
    }
    assert_eq!(
        app.count("SELECT count(*) FROM org_sso WHERE claim = 'roles'")
            .await,
        1
    );
    let out = run(&["org", "sso", "acme", "--off"]);
    assert!(out.status.success());
    assert_eq!(app.count("SELECT count(*) FROM org_sso").await, 0);
    assert_eq!(
        app.count(
            "SELECT count(*) FROM audit_log WHERE action IN ('org.sso_set', 'org.sso_removed')"
        )
        .await,
        // setup's own set, the command line's, its removal
        3
    );
    let help = run(&["org", "sso", "--help"]);
    let text = String::from_utf8_lossy(&help.stdout);
    for flag in [
        "--issuer",
        "--client-id",
        "--client-secret-file",
        "--claim",
        "--role",
        "--passwords",
        "--off",
    ] {
        assert!(text.contains(flag), "{flag} in {text}");
    }
}

/// Four first sign-ins of one person completed at once (every callback
/// fetched first, then all released together): one user, never a 5xx; a
/// sign-in that loses the race to create the user is refused and signing
/// in again works.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn first_sign_ins_at_once_make_one_user() {
    let (app, _provider) = setup().await;
    let mut ready = Vec::new();
    for _ in 0..4 {
        let c = StaffClient::new(&app.address);
        let callback = callback_for(&app, &c, "ana").await;
        ready.push((c, callback));
    }
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(ready.len()));
    let tasks: Vec<_> = ready
        .into_iter()
        .map(|(c, callback)| {
            let barrier = barrier.clone();
            tokio::spawn(async move {
                barrier.wait().await;
                finish(&c, &callback).await.0
            })
        })
        .collect();
    let mut statuses = Vec::new();
    for t in tasks {
        statuses.push(t.await.expect("task"));
    }
    assert!(
        statuses.iter().all(|s| *s == 200 || *s == 403),
        "{statuses:?}"
    );
    assert!(statuses.contains(&200), "{statuses:?}");
    assert_eq!(
        app.count("SELECT count(*) FROM users WHERE sso_subject = 'ana'")
            .await,
        1
    );
    assert_eq!(
        app.count("SELECT count(*) FROM audit_log WHERE action = 'user.add'")
            .await,
        1
    );
    signed_in(&app, "ana").await;
}

// The access matrix and the crawler of the dashboard's forms with users who
// signed in through the provider. They run here, not in the `api` binary:
// only a sign-in through a real provider (its code, its signed ID token,
// our callback) makes such a session, and the `api` binary has no provider;
// a session written into the database by the test would prove nothing
// about the sessions the callback makes.

/// Every dashboard route and method as the organization's viewer, support
/// and admin who signed in through the provider: the statuses of the
/// password sessions' matrix, but for the sign-out, which goes on to the
/// provider (S3).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_access_matrix_holds_for_users_signed_in_through_the_provider() {
    let app = app_with(|_| {}).await;
    let provider = Provider::start(&app.address, &matrix::provider_accounts());
    configure(&app, &provider, poolkeeper::sso::Passwords::On).await;
    let world = matrix::World::through_provider(&app).await;
    let emails = [
        matrix::email_of(matrix::Who::Viewer),
        matrix::email_of(matrix::Who::Support),
        matrix::email_of(matrix::Who::Admin),
    ];
    // The provider's users, made by their sign-in, never by a password.
    let made: Vec<(String, String)> = sqlx::query_as(
        "SELECT email, role FROM users WHERE email = ANY($1) AND sso_subject IS NOT NULL ORDER BY role",
    )
    .bind(&emails[..])
    .fetch_all(&app.pool)
    .await
    .expect("users");
    assert_eq!(
        made,
        vec![
            (emails[2].to_owned(), "admin".to_owned()),
            (emails[1].to_owned(), "support".to_owned()),
            (emails[0].to_owned(), "viewer".to_owned()),
        ]
    );
    let failures = matrix::dashboard_failures(&app, &world).await;
    assert!(
        failures.is_empty(),
        "matrix cells that differ:\n{}",
        failures.join("\n")
    );
    assert_eq!(
        app.count("SELECT count(*) FROM login_attempts WHERE email IN ('vera@acme.example', 'sam@acme.example', 'ada@acme.example')")
            .await,
        0,
        "no password of theirs was used"
    );
}

/// The crawler of the dashboard's forms as the demo organization's viewer,
/// support and admin signed in through the provider: a provider's session
/// finds exactly the forms a password session of its role finds, no
/// hostile value makes an answer a 5xx, and the session survives every
/// form.
#[tokio::test]
async fn every_form_survives_hostile_values_as_users_signed_in_through_the_provider() {
    let app = app_with(|_| {}).await;
    poolkeeper::demo::load(&app.pool).await.expect("demo");
    let demo: i64 = sqlx::query_scalar("SELECT id FROM organizations WHERE slug = $1")
        .bind(poolkeeper::demo::ORG)
        .fetch_one(&app.pool)
        .await
        .expect("the demo organization");
    let provider = Provider::start(
        &app.address,
        &json!({
            "viv": {"email": "viv@demo.example", "name": "Viv", "groups": ["pk-viewers"]},
            "sue": {"email": "sue@demo.example", "name": "Sue", "groups": ["pk-support"]},
            "abe": {"email": "abe@demo.example", "name": "Abe", "groups": ["everyone", "pk-admins"]},
        }),
    );
    oidc::configure_org(&app, demo, &provider, poolkeeper::sso::Passwords::On).await;
    let values = crawler::demo_values(&app).await;
    let mut log = crawler::Crawl::new();
    let mut found = crawler::FormsFound::new();
    // The admin last: its forms change the organization.
    for (role, email, account) in [
        ("viewer", "viewer@demo.example", "viv"),
        ("support", "support@demo.example", "sue"),
        ("admin", "admin@demo.example", "abe"),
    ] {
        let password = app.logged_in_with(email, poolkeeper::demo::PASSWORD).await;
        let through = oidc::signed_in_to(&app, poolkeeper::demo::ORG, account).await;
        // Both find their forms before any is submitted, which changes
        // the organization. The password session's hostile submissions
        // are `hostile_forms`'s.
        let by_password = crawler::crawl(&password, &mut log).await;
        let forms = crawler::crawl(&through, &mut log).await;
        let keys = |forms: &[crawler::Form]| -> std::collections::BTreeSet<String> {
            forms.iter().map(crawler::key).collect()
        };
        assert_eq!(
            keys(&forms),
            keys(&by_password),
            "{role}: the same forms through the provider as with a password"
        );
        found.insert(role.to_owned(), forms.iter().map(crawler::key).collect());
        crawler::submit_hostile(&through, &forms, &values, &mut log).await;
        assert_eq!(through.page("/jobs").await.0, 200, "{role} still signed in");
    }
    crawler::as_anonymous(&app.address, &values, &mut log).await;
    eprintln!("crawler: {} requests", log.requests);
    crawler::assert_held(&log, &found);
    let roles: Vec<(String, String)> = sqlx::query_as(
        "SELECT email, role FROM users WHERE sso_subject IS NOT NULL ORDER BY email",
    )
    .fetch_all(&app.pool)
    .await
    .expect("users");
    assert_eq!(
        roles,
        vec![
            ("abe@demo.example".to_owned(), "admin".to_owned()),
            ("sue@demo.example".to_owned(), "support".to_owned()),
            ("viv@demo.example".to_owned(), "viewer".to_owned()),
        ]
    );
}

/// S1: a role given by several values of the claim: any one of them gives
/// it, a user's highest wins.
#[tokio::test]
async fn any_of_a_roles_several_values_gives_it() {
    let app = app_with(|_| {}).await;
    let provider = Provider::start(
        &app.address,
        &json!({
            "eve": {"email": "eve@corp.example", "groups": ["sre"]},
            "fay": {"email": "fay@corp.example", "groups": ["contractors"]},
            "gus": {"email": "gus@corp.example", "groups": ["contractors", "pk-admins"]},
        }),
    );
    let secret = provider.secret_file().to_string_lossy().into_owned();
    poolkeeper::sso::set(
        &app.pool,
        app.org.id,
        &poolkeeper::sso::Setting {
            issuer: &provider.issuer,
            client_id: oidc::CLIENT_ID,
            client_secret_file: &secret,
            claim: "groups",
            admin_values: &["pk-admins", "sre"],
            support_values: &[],
            viewer_values: &["pk-viewers", "contractors"],
            passwords: poolkeeper::sso::Passwords::On,
        },
        "test",
    )
    .await
    .expect("configure");
    for (account, role) in [("eve", "admin"), ("fay", "viewer"), ("gus", "admin")] {
        signed_in(&app, account).await;
        assert_eq!(
            role_of(&app, &format!("{account}@corp.example")).await,
            role,
            "{account}"
        );
    }
}

// The ID token checks through HTTP. A real provider signs only good
// tokens, so a man in the middle of our own stands between poolkeeper and
// it: a proxy whose address is the provider's issuer (the provider is
// started with it), which relays every request, and changes only the ID
// token in the token endpoint's answers (one way per sign-in) and the key
// set, to which it adds a test key of its own. A token re-signed with that
// key and its claims unchanged signs in (the control below), so each
// refusal is the one claim or signature changed, not the relaying.

/// What the man in the middle does to the next ID token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tamper {
    /// The provider's token as it is.
    Untouched,
    /// Its claims re-signed with the published test key.
    Resigned,
    /// Re-signed with the published test key, with another nonce.
    WrongNonce,
    /// Re-signed with the published test key, expired an hour ago.
    Expired,
    /// Re-signed with the published test key, for another client.
    OtherAudience,
    /// Re-signed with the published test key, from another issuer.
    OtherIssuer,
    /// `alg: none` over the provider's claims, no signature.
    AlgNone,
    /// `alg: none` over the provider's claims, its signature kept.
    AlgNoneSignatureKept,
    /// Signed by a key the key set does not hold (its own key id).
    UnknownKey,
    /// Signed by a key the key set does not hold, under the provider's
    /// key id.
    ForgedUnderProvidersKeyId,
    /// The provider's token with its groups claim changed, its signature
    /// kept.
    ChangedClaim,
}

/// One ID token the man in the middle changed: the provider's and the one
/// poolkeeper received.
#[derive(Clone, Debug)]
struct Rewritten {
    tamper: Tamper,
    original: String,
    sent: String,
}

const MITM_KID: &str = "mitm-published-test-key";
const UNPUBLISHED_KID: &str = "never-published-key";

fn mitm_key() -> CoreRsaPrivateSigningKey {
    CoreRsaPrivateSigningKey::from_pem(
        include_str!("../fixtures/sso/known-key.pem"),
        Some(JsonWebKeyId::new(MITM_KID.to_owned())),
    )
    .expect("a test key fixture")
}

fn unpublished_key(kid: &str) -> CoreRsaPrivateSigningKey {
    CoreRsaPrivateSigningKey::from_pem(
        include_str!("../fixtures/sso/unknown-key.pem"),
        Some(JsonWebKeyId::new(kid.to_owned())),
    )
    .expect("a test key fixture")
}

fn b64(value: &Value) -> String {
    URL_SAFE_NO_PAD.encode(value.to_string())
}

fn unb64(part: &str) -> Value {
    serde_json::from_slice(&URL_SAFE_NO_PAD.decode(part).expect("base64url")).expect("JSON")
}

/// `claims` signed (RS256) by `key` under the key id `kid`.
fn signed_jwt(key: &CoreRsaPrivateSigningKey, kid: &str, claims: &Value) -> String {
    let message = format!(
        "{}.{}",
        b64(&json!({"alg": "RS256", "typ": "JWT", "kid": kid})),
        b64(claims)
    );
    let signature = key
        .sign(
            &CoreJwsSigningAlgorithm::RsaSsaPkcs1V15Sha256,
            message.as_bytes(),
        )
        .expect("sign");
    format!("{message}.{}", URL_SAFE_NO_PAD.encode(signature))
}

/// The provider's ID token `original` changed as `tamper` says.
fn tampered(original: &str, tamper: Tamper) -> String {
    let parts: Vec<&str> = original.split('.').collect();
    assert_eq!(parts.len(), 3, "a signed JWT from the provider: {original}");
    let header = unb64(parts[0]);
    let mut claims = unb64(parts[1]);
    let now = chrono::Utc::now().timestamp();
    let none = b64(&json!({"alg": "none", "typ": "JWT"}));
    match tamper {
        Tamper::Untouched => original.to_owned(),
        Tamper::Resigned => signed_jwt(&mitm_key(), MITM_KID, &claims),
        Tamper::WrongNonce => {
            claims["nonce"] = json!("not-the-nonce-of-this-sign-in");
            signed_jwt(&mitm_key(), MITM_KID, &claims)
        }
        Tamper::Expired => {
            claims["iat"] = json!(now - 7200);
            claims["exp"] = json!(now - 3600);
            signed_jwt(&mitm_key(), MITM_KID, &claims)
        }
        Tamper::OtherAudience => {
            claims["aud"] = json!("another-app");
            if let Some(c) = claims.as_object_mut() {
                c.remove("azp");
            }
            signed_jwt(&mitm_key(), MITM_KID, &claims)
        }
        Tamper::OtherIssuer => {
            claims["iss"] = json!("https://idp.evil.example");
            signed_jwt(&mitm_key(), MITM_KID, &claims)
        }
        Tamper::AlgNone => format!("{none}.{}.", parts[1]),
        Tamper::AlgNoneSignatureKept => format!("{none}.{}.{}", parts[1], parts[2]),
        Tamper::UnknownKey => {
            signed_jwt(&unpublished_key(UNPUBLISHED_KID), UNPUBLISHED_KID, &claims)
        }
        Tamper::ForgedUnderProvidersKeyId => {
            let kid = header["kid"].as_str().expect("the provider's key id");
            signed_jwt(&unpublished_key(kid), kid, &claims)
        }
        Tamper::ChangedClaim => {
            claims["groups"] = json!(["pk-admins"]);
            format!("{}.{}.{}", parts[0], b64(&claims), parts[2])
        }
    }
}

/// The man in the middle: a relay on its own port in front of the
/// provider.
struct Mitm {
    state: web::Data<MitmState>,
}

struct MitmState {
    /// The provider's own address.
    upstream: Mutex<String>,
    client: reqwest::Client,
    tamper: Mutex<Tamper>,
    log: Mutex<Vec<Rewritten>>,
}

/// Headers of one hop only, and `accept-encoding`: the token endpoint's
/// answer must come back readable to be rewritten.
fn hop_by_hop(name: &str) -> bool {
    matches!(
        name.to_ascii_lowercase().as_str(),
        "connection"
            | "keep-alive"
            | "transfer-encoding"
            | "content-length"
            | "te"
            | "trailer"
            | "upgrade"
            | "proxy-connection"
            | "accept-encoding"
    )
}

impl Mitm {
    /// Listens on a free port, relaying nowhere yet: its URL is the
    /// provider's issuer, known before the provider starts.
    fn listen() -> (Mitm, std::net::TcpListener) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the relay");
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .build()
            .expect("a client");
        let state = web::Data::new(MitmState {
            upstream: Mutex::new(String::new()),
            client,
            tamper: Mutex::new(Tamper::Untouched),
            log: Mutex::new(Vec::new()),
        });
        (Mitm { state }, listener)
    }

    fn serve(&self, listener: std::net::TcpListener, upstream: String) {
        *self.state.upstream.lock().expect("upstream") = upstream;
        let state = self.state.clone();
        let server = HttpServer::new(move || {
            App::new()
                .app_data(state.clone())
                .app_data(web::PayloadConfig::new(1 << 20))
                .default_service(web::to(relay))
        })
        .workers(1)
        .disable_signals()
        .listen(listener)
        .expect("listen")
        .run();
        tokio::spawn(server);
    }

    fn set(&self, tamper: Tamper) {
        *self.state.tamper.lock().expect("tamper") = tamper;
    }

    fn rewritten(&self) -> Vec<Rewritten> {
        self.state.log.lock().expect("log").clone()
    }
}

/// Relays one request to the provider and its answer back, the Host kept
/// (the provider names its endpoints after it); the key set gains the test
/// key, the token endpoint's ID token is changed.
async fn relay(req: HttpRequest, body: web::Bytes, state: web::Data<MitmState>) -> HttpResponse {
    let upstream = state.upstream.lock().expect("upstream").clone();
    let path = req.uri().path_and_query().map_or("/", |p| p.as_str());
    let method = reqwest::Method::from_bytes(req.method().as_str().as_bytes()).expect("a method");
    let mut out = state.client.request(method, format!("{upstream}{path}"));
    for (name, value) in req.headers() {
        if !hop_by_hop(name.as_str()) {
            out = out.header(name.as_str(), value.as_bytes());
        }
    }
    let answer = out
        .body(body.to_vec())
        .send()
        .await
        .expect("the provider answers the relay");
    let status = answer.status().as_u16();
    let headers: Vec<(String, Vec<u8>)> = answer
        .headers()
        .iter()
        .filter(|(name, _)| !hop_by_hop(name.as_str()))
        .map(|(name, value)| (name.as_str().to_owned(), value.as_bytes().to_vec()))
        .collect();
    let mut bytes = answer.bytes().await.expect("the provider's body").to_vec();
    if req.path() == "/jwks" && status == 200 {
        let mut set: Value = serde_json::from_slice(&bytes).expect("a key set");
        let published = serde_json::to_value(mitm_key().as_verification_key()).expect("a JWK");
        set["keys"].as_array_mut().expect("keys").push(published);
        bytes = set.to_string().into_bytes();
    }
    if req.path() == "/token" && status == 200 {
        let mut tokens: Value = serde_json::from_slice(&bytes).expect("the token answer");
        let original = tokens["id_token"].as_str().expect("an ID token").to_owned();
        let tamper = *state.tamper.lock().expect("tamper");
        let sent = tampered(&original, tamper);
        tokens["id_token"] = json!(sent);
        state.log.lock().expect("log").push(Rewritten {
            tamper,
            original,
            sent,
        });
        bytes = tokens.to_string().into_bytes();
    }
    let mut response =
        HttpResponse::build(actix_web::http::StatusCode::from_u16(status).expect("a status"));
    for header in headers {
        response.append_header(header);
    }
    response.body(bytes)
}

/// Every row of the tables a sign-in writes, but the sign-ins under way
/// (which a callback consumes), as text to compare.
async fn every_row(app: &TestApp) -> Vec<(&'static str, String)> {
    let mut rows = Vec::new();
    for table in [
        "users",
        "sessions",
        "audit_log",
        "login_attempts",
        "org_sso",
        "sso_starts",
    ] {
        // The table names are the constants above.
        let dump: String = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT count(*)::text || ' ' || coalesce(string_agg(row_to_json(t)::text, ' ' \
             ORDER BY row_to_json(t)::text), '') FROM {table} t"
        )))
        .fetch_one(&app.pool)
        .await
        .expect("a dump");
        rows.push((table, dump));
    }
    rows
}

/// S1: through the real provider's code flow, an ID token with a wrong
/// nonce, expired, for another audience or from another issuer, unsigned (`alg: none`), signed by
/// a key the provider does not publish, or with a claim changed under the
/// provider's signature is refused: a 403 that says why, no session, and
/// nothing written but the consumed sign-in under way.
#[tokio::test]
async fn an_id_token_that_fails_any_check_is_refused_and_writes_nothing() {
    let app = app_with(|_| {}).await;
    let (mitm, listener) = Mitm::listen();
    let front = format!(
        "http://127.0.0.1:{}",
        listener.local_addr().expect("address").port()
    );
    let provider = Provider::start_behind(&app.address, &accounts(), &front);
    mitm.serve(listener, provider.address());
    assert_eq!(provider.issuer, front);
    configure(&app, &provider, poolkeeper::sso::Passwords::On).await;
    // Discovery, through the relay, sends the code exchange and the key set
    // through it too.
    let discovery: Value = reqwest::get(format!("{front}/.well-known/openid-configuration"))
        .await
        .expect("discovery")
        .json()
        .await
        .expect("JSON");
    assert_eq!(discovery["issuer"], json!(front));
    assert_eq!(discovery["token_endpoint"], json!(format!("{front}/token")));
    assert_eq!(discovery["jwks_uri"], json!(format!("{front}/jwks")));
    // The controls: the provider's token relayed as it is, and its claims
    // re-signed with the published test key, both sign in.
    for tamper in [Tamper::Untouched, Tamper::Resigned] {
        mitm.set(tamper);
        signed_in(&app, "ana").await;
        let last = mitm.rewritten().pop().expect("relayed");
        assert_eq!(last.tamper, tamper);
        assert_eq!(last.sent == last.original, tamper == Tamper::Untouched);
    }
    // Each refusal as di (the admins' group, never signed in) or bo (in no
    // mapped group, claiming the admins' group under the provider's
    // signature), and what the page says.
    let cases = [
        (Tamper::WrongNonce, "di", "Invalid nonce"),
        (Tamper::Expired, "di", "Expired"),
        (Tamper::OtherAudience, "di", "Invalid audiences"),
        (Tamper::OtherIssuer, "di", "Invalid issuer"),
        (Tamper::AlgNone, "di", "No signature found"),
        (Tamper::AlgNoneSignatureKept, "di", "No signature found"),
        (Tamper::UnknownKey, "di", "No matching key"),
        (Tamper::ForgedUnderProvidersKeyId, "di", "bad signature"),
        (Tamper::ChangedClaim, "bo", "bad signature"),
    ];
    for (tamper, account, why) in cases {
        mitm.set(tamper);
        let c = StaffClient::new(&app.address);
        let callback = callback_for(&app, &c, account).await;
        let before = every_row(&app).await;
        assert_eq!(app.count("SELECT count(*) FROM sso_pending").await, 1);
        let relayed = mitm.rewritten().len();
        let (status, body) = finish(&c, &callback).await;
        assert_eq!(status, 403, "{tamper:?}: {body}");
        assert!(
            body.contains("The sign-in was refused"),
            "{tamper:?}: {body}"
        );
        assert!(body.contains(why), "{tamper:?}: {why:?} in {body}");
        // The token poolkeeper refused is the one changed here.
        let log = mitm.rewritten();
        assert_eq!(log.len(), relayed + 1, "{tamper:?}: one code exchange");
        let last = log.last().expect("relayed");
        assert_eq!(last.tamper, tamper);
        assert_ne!(last.sent, last.original, "{tamper:?}");
        // No session: no cookie, and the dashboard sends it to log in.
        assert!(c.session_cookie().is_none(), "{tamper:?}");
        let r = c.get("/").await;
        assert_eq!(r.status().as_u16(), 303, "{tamper:?}");
        // Nothing written; the sign-in under way is consumed, so its answer
        // cannot be tried again.
        assert_eq!(every_row(&app).await, before, "{tamper:?}: nothing written");
        assert_eq!(app.count("SELECT count(*) FROM sso_pending").await, 0);
        assert_eq!(finish(&c, &callback).await.0, 400, "{tamper:?}: used");
    }
    assert_eq!(
        app.count(
            "SELECT count(*) FROM users WHERE email IN ('di@corp.example', 'bo@corp.example')"
        )
        .await,
        0
    );
    // The same accounts sign in once their tokens are left alone: what
    // refused them was the change. bo is in no mapped group: 403 for that.
    mitm.set(Tamper::Untouched);
    signed_in(&app, "di").await;
    let c = StaffClient::new(&app.address);
    let callback = callback_for(&app, &c, "bo").await;
    let (status, body) = finish(&c, &callback).await;
    assert_eq!(status, 403);
    assert!(body.contains("everyone"), "the claim seen: {body}");
}
