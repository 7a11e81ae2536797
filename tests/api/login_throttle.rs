//! Password throttling that cannot lock an account's owner out
//! (`dashboard::throttle`): failures count per account and source address
//! together, with a bound per source address, and the source address is
//! read from `Forwarded`/`X-Forwarded-For` only when the peer is one of
//! `POOLKEEPER_TRUSTED_PROXIES`. Other source addresses are real ones: the
//! clients bind to other loopback addresses (127.0.0.0/8 is this machine).

use std::net::{IpAddr, Ipv4Addr};

use crate::helpers::{STAFF_PASSWORD, StaffClient, TestApp, hidden_field, spawn_app_with};

async fn app_with(adjust: impl FnOnce(&mut poolkeeper::settings::Settings)) -> TestApp {
    spawn_app_with(adjust).await
}

/// A client whose connections come from `addr` (any of 127.0.0.0/8 is this
/// machine): another source address without a proxy.
fn client_from(app: &TestApp, addr: Ipv4Addr) -> StaffClient {
    let mut c = StaffClient::new(&app.address);
    c.http = reqwest::Client::builder()
        .cookie_provider(c.jar.clone())
        .redirect(reqwest::redirect::Policy::none())
        .local_address(IpAddr::V4(addr))
        .build()
        .expect("client");
    c
}

/// A login through the form with extra headers (a proxy's).
async fn login_with(
    c: &StaffClient,
    email: &str,
    password: &str,
    header: Option<(&str, &str)>,
) -> u16 {
    let (status, body) = c.page("/login").await;
    assert_eq!(status, 200);
    let csrf = hidden_field(&body, "csrf").expect("login csrf");
    let mut req = c.http.post(c.url("/login")).form(&[
        ("email", email),
        ("password", password),
        ("csrf", &csrf),
    ]);
    if let Some((name, value)) = header {
        req = req.header(name, value);
    }
    req.send().await.expect("POST /login").status().as_u16()
}

#[tokio::test]
async fn fifty_wrong_passwords_from_one_address_leave_the_owner_able_to_sign_in_from_another() {
    let app = app_with(|_| {}).await;
    app.create_staff(app.org.id, "root@acme.example", "admin")
        .await;
    let attacker = client_from(&app, Ipv4Addr::new(127, 0, 0, 2));
    let mut statuses = vec![];
    for _ in 0..50 {
        statuses.push(login_with(&attacker, "root@acme.example", "guess", None).await);
    }
    assert!(statuses[..10].iter().all(|s| *s == 401), "{statuses:?}");
    assert!(statuses[10..].iter().all(|s| *s == 429), "{statuses:?}");
    // The attacker's address is throttled even with the right password...
    assert_eq!(
        login_with(&attacker, "root@acme.example", STAFF_PASSWORD, None).await,
        429
    );
    // ...and the owner, from their own address, signs in.
    let owner = client_from(&app, Ipv4Addr::new(127, 0, 0, 1));
    assert_eq!(
        login_with(&owner, "root@acme.example", STAFF_PASSWORD, None).await,
        303
    );
    let from: Vec<String> =
        sqlx::query_scalar("SELECT DISTINCT source_addr FROM login_attempts ORDER BY 1")
            .fetch_all(&app.pool)
            .await
            .expect("addresses");
    assert_eq!(from, ["127.0.0.1", "127.0.0.2"]);
}

#[tokio::test]
async fn through_a_trusted_proxy_the_limit_applies_to_each_client() {
    let app = app_with(|s| {
        s.trusted_proxies = vec![poolkeeper::settings::Cidr::parse("127.0.0.1").expect("cidr")];
    })
    .await;
    app.create_staff(app.org.id, "root@acme.example", "admin")
        .await;
    app.create_staff(app.org.id, "sam@acme.example", "support")
        .await;
    let proxy = client_from(&app, Ipv4Addr::new(127, 0, 0, 1));
    let attacker = Some(("x-forwarded-for", "198.51.100.7"));
    // One client sprays 50 failures over several accounts through the proxy.
    for i in 0..50 {
        let email = if i % 2 == 0 {
            "root@acme.example".to_owned()
        } else {
            format!("guess{i}@acme.example")
        };
        let s = login_with(&proxy, &email, "guess", attacker).await;
        assert!(s == 401 || s == 429, "{s}");
    }
    assert_eq!(
        login_with(&proxy, "sam@acme.example", STAFF_PASSWORD, attacker).await,
        429,
        "the client's own bound"
    );
    // Other clients behind the same proxy are not held by it.
    let ana = Some(("forwarded", "for=203.0.113.5;proto=https"));
    assert_eq!(
        login_with(&proxy, "root@acme.example", STAFF_PASSWORD, ana).await,
        303
    );
    let fresh = client_from(&app, Ipv4Addr::new(127, 0, 0, 1));
    assert_eq!(
        login_with(
            &fresh,
            "sam@acme.example",
            STAFF_PASSWORD,
            Some(("x-forwarded-for", "203.0.113.6"))
        )
        .await,
        303
    );
    // A peer that is not the proxy cannot choose its address by header.
    let direct = client_from(&app, Ipv4Addr::new(127, 0, 0, 3));
    login_with(
        &direct,
        "sam@acme.example",
        "guess",
        Some(("x-forwarded-for", "203.0.113.9")),
    )
    .await;
    let recorded: Vec<String> =
        sqlx::query_scalar("SELECT DISTINCT source_addr FROM login_attempts ORDER BY 1")
            .fetch_all(&app.pool)
            .await
            .expect("addresses");
    assert_eq!(
        recorded,
        ["127.0.0.3", "198.51.100.7", "203.0.113.5", "203.0.113.6"]
    );
}
