//! Logging in and out: wrong passwords, throttling, the session cookie and
//! its lifetime, pages that need a session.

use crate::helpers::{
    STAFF_PASSWORD, StaffClient, TestApp, hidden_field, spawn_app, spawn_app_with,
};

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
    // Ten failures for ana from this client's address (failures from
    // elsewhere are tests/api/sso.rs's: they do not lock ana out here).
    sqlx::query("INSERT INTO login_attempts (email, source_addr, succeeded) SELECT 'ana@acme.example', '127.0.0.1', false FROM generate_series(1, 10)")
        .execute(&app.pool)
        .await
        .expect("failures");
    let c = StaffClient::new(&app.address);
    let r = c.login("ana@acme.example", STAFF_PASSWORD).await;
    assert_eq!(r.status().as_u16(), 429, "even the right password waits");
    assert_eq!(app.count("SELECT count(*) FROM sessions").await, 0);

    // Per address the bound is higher: ana's ten failures and her refused
    // attempt above, and 38 failures for other accounts from this client's
    // address, still let bob in; the 50th failure does not.
    app.create_staff(app.org.id, "bob@acme.example", "support")
        .await;
    sqlx::query(
        "INSERT INTO login_attempts (email, source_addr, succeeded)
         SELECT 'guess' || i || '@acme.example', '127.0.0.1', false FROM generate_series(1, 38) AS i",
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
