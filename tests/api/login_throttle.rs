//! Password throttling that cannot lock an account's owner out
//! (`dashboard::throttle`): failures count per account and source address
//! together, with a bound per source address, and the source address is
//! read from `Forwarded`/`X-Forwarded-For` only when the peer is one of
//! `POOLKEEPER_TRUSTED_PROXIES`. Other source addresses are real ones: the
//! clients bind to other loopback addresses (127.0.0.0/8 is this machine).

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

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

/// S1: the sign-ins started at `/login/sso` from one address that did not
/// complete are bounded (`throttle::MAX_SSO_STARTS_PER_ADDRESS`), exactly,
/// with every start of the round released at once; unknown organizations'
/// names count; the bound refuses before the provider is asked; another
/// address, and another client behind a trusted proxy, start freely.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn single_sign_on_starts_are_bounded_per_client_address() {
    use poolkeeper::dashboard::throttle::MAX_SSO_STARTS_PER_ADDRESS as MAX;
    let app = app_with(|s| {
        // Never reached: the provider's issuer is a closed port.
        s.public_url = Some("http://127.0.0.1:9".into());
        s.trusted_proxies = vec![poolkeeper::settings::Cidr::parse("127.0.0.4").expect("cidr")];
    })
    .await;
    let dir = std::env::temp_dir().join(format!("pk-sso-starts-{}", rand::random::<u64>()));
    std::fs::create_dir_all(&dir).expect("dir");
    let secret = dir.join("secret");
    std::fs::write(&secret, "s3cret\n").expect("secret");
    poolkeeper::sso::set(
        &app.pool,
        app.org.id,
        &poolkeeper::sso::Setting {
            issuer: "http://127.0.0.1:9",
            client_id: "poolkeeper",
            client_secret_file: &secret.to_string_lossy(),
            claim: "groups",
            admin_values: &["pk-admins"],
            support_values: &[],
            viewer_values: &[],
            passwords: poolkeeper::sso::Passwords::On,
        },
        "test",
    )
    .await
    .expect("configure");
    let attacker = Ipv4Addr::new(127, 0, 0, 2);
    // Ten more than the bound, released together, each on its own client.
    let n = MAX as usize + 10;
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(n));
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let c = client_from(&app, attacker);
            let barrier = barrier.clone();
            tokio::spawn(async move {
                barrier.wait().await;
                c.get(&format!("/login/sso?org=guess-{i}"))
                    .await
                    .status()
                    .as_u16()
            })
        })
        .collect();
    let statuses = tokio::time::timeout(Duration::from_secs(120), async {
        let mut statuses = Vec::new();
        for t in tasks {
            statuses.push(t.await.expect("task"));
        }
        statuses
    })
    .await
    .expect("every start answered within the bound");
    let count = |s: u16| statuses.iter().filter(|x| **x == s).count();
    assert_eq!((count(404), count(429)), (MAX as usize, 10), "{statuses:?}");
    let c = client_from(&app, attacker);
    let r = c.get("/login/sso?org=acme").await;
    assert_eq!(r.status().as_u16(), 429, "a real organization too");
    let body = r.text().await.expect("body");
    assert!(body.contains("/static/app.css"), "a page of the dashboard");
    assert!(body.contains("try again"), "{body}");
    assert_eq!(
        app.count("SELECT count(*) FROM sso_pending").await,
        0,
        "refused before anything else"
    );
    // Another address: the provider is asked (and is down: 503), counted.
    let other = client_from(&app, Ipv4Addr::new(127, 0, 0, 3));
    assert_eq!(
        other.get("/login/sso?org=acme").await.status().as_u16(),
        503
    );
    // Behind the trusted proxy, each client is its own address.
    let proxy = client_from(&app, Ipv4Addr::new(127, 0, 0, 4));
    for (client, want) in [("198.51.100.7", 404), ("203.0.113.5", 404)] {
        let r = proxy
            .http
            .get(proxy.url("/login/sso?org=nobody"))
            .header("x-forwarded-for", client)
            .send()
            .await
            .expect("GET");
        assert_eq!(r.status().as_u16(), want, "{client}");
    }
    let per_address: Vec<(String, i64)> =
        sqlx::query_as("SELECT source_addr, count(*) FROM sso_starts GROUP BY 1 ORDER BY 1")
            .fetch_all(&app.pool)
            .await
            .expect("starts");
    assert_eq!(
        per_address,
        vec![
            ("127.0.0.2".to_owned(), MAX),
            ("127.0.0.3".to_owned(), 1),
            ("198.51.100.7".to_owned(), 1),
            ("203.0.113.5".to_owned(), 1),
        ]
    );
    let _ = std::fs::remove_dir_all(&dir);
}
