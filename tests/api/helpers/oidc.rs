//! A real OpenID Connect provider on loopback for the single sign-on tests:
//! panva's oidc-provider under Node.js (tests/fixtures/sso/provider.mjs),
//! installed by scripts/test into target/oidc-provider. Never a stub: a
//! missing provider fails the test, naming scripts/test. Its accounts are a
//! JSON file the provider reads at every sign-in; its signing key is made
//! at every start (`restart` is a key rotation); and a browser-like
//! client walks its login form (`sign_in_at_provider`).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use super::{StaffClient, TestApp, spawn_app_with};

pub const CLIENT_ID: &str = "poolkeeper";
pub const CLIENT_SECRET: &str = "the-tests-client-secret-0123456789abcdef";

pub struct Provider {
    child: Option<Child>,
    pub issuer: String,
    port: u16,
    dir: PathBuf,
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The reason the provider cannot run here, if any.
fn missing() -> Option<String> {
    let installed = repo().join("target/oidc-provider/node_modules/oidc-provider/package.json");
    if !installed.is_file() {
        return Some(format!(
            "{} is missing: run scripts/test, which installs oidc-provider with npm",
            installed.display()
        ));
    }
    if Command::new("node").arg("--version").output().is_err() {
        return Some("node is not installed: run scripts/test, which installs nodejs".into());
    }
    None
}

impl Provider {
    /// Starts the provider with one client, `poolkeeper`, whose redirect URI
    /// is `app`'s callback, and the accounts `accounts` (`{id: {email,
    /// name, groups}}`; an account without `groups` has no such claim).
    pub fn start(app: &str, accounts: &Value) -> Provider {
        Provider::start_at(app, accounts, None)
    }

    /// As `start`, but reached at `front` (a proxy of the test in front of
    /// it, see `address`): its issuer, and the origin of its endpoints for
    /// requests that come with `front`'s Host.
    pub fn start_behind(app: &str, accounts: &Value, front: &str) -> Provider {
        Provider::start_at(app, accounts, Some(front))
    }

    fn start_at(app: &str, accounts: &Value, issuer: Option<&str>) -> Provider {
        // Fails the test, naming scripts/test, when it is missing.
        super::needs(
            "the OpenID Connect provider (oidc-provider under Node.js)",
            missing().is_none(),
            "apt-get install -y nodejs npm && npm install --prefix target/oidc-provider oidc-provider@8",
        );
        let dir = std::env::temp_dir().join(format!(
            "pk-oidc-{}-{}",
            std::process::id(),
            rand::random::<u64>()
        ));
        std::fs::create_dir_all(&dir).expect("provider dir");
        let secret = dir.join("client-secret");
        std::fs::write(&secret, format!("{CLIENT_SECRET}\n")).expect("secret file");
        let mut p = Provider {
            child: None,
            issuer: String::new(),
            port: 0,
            dir,
        };
        p.set_accounts(accounts);
        let mut config = json!({
            "port": 0,
            "accounts": p.dir.join("accounts.json"),
            "clients": [{
                "client_id": CLIENT_ID,
                "client_secret": CLIENT_SECRET,
                "redirect_uris": [format!("{app}/login/sso/callback")],
                "post_logout_redirect_uris": [format!("{app}/login?flash=logged_out")],
                "grant_types": ["authorization_code"],
                "response_types": ["code"],
                "token_endpoint_auth_method": "client_secret_basic",
            }],
        });
        if let Some(issuer) = issuer {
            config["issuer"] = json!(issuer);
        }
        std::fs::write(p.dir.join("config.json"), config.to_string()).expect("config");
        p.launch();
        p
    }

    fn launch(&mut self) {
        let mut config: Value =
            serde_json::from_slice(&std::fs::read(self.dir.join("config.json")).expect("config"))
                .expect("config json");
        config["port"] = json!(self.port);
        std::fs::write(self.dir.join("config.json"), config.to_string()).expect("config");
        let log = std::fs::File::create(self.dir.join("provider.log")).expect("log");
        let mut child = Command::new("node")
            .arg(repo().join("tests/fixtures/sso/provider.mjs"))
            .arg(self.dir.join("config.json"))
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("start node");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stdout);
            let mut line = String::new();
            let _ = reader.read_line(&mut line);
            let _ = tx.send(line);
            // Drained to the end: a closed pipe would kill the provider at
            // its next line.
            let _ = std::io::copy(&mut reader, &mut std::io::sink());
        });
        let line = rx.recv_timeout(Duration::from_secs(60)).unwrap_or_default();
        let started = serde_json::from_str::<Value>(&line)
            .ok()
            .and_then(|v| Some((v["issuer"].as_str()?.to_owned(), v["port"].as_u64()?)))
            .and_then(|(issuer, port)| Some((issuer, u16::try_from(port).ok()?)));
        let (issuer, port) = started.unwrap_or_else(|| {
            let _ = child.kill();
            panic!(
                "the provider did not start: {line:?}; its log: {}",
                std::fs::read_to_string(self.dir.join("provider.log")).unwrap_or_default()
            )
        });
        self.port = port;
        self.issuer = issuer;
        self.child = Some(child);
    }

    /// Where it listens: the issuer, unless it was started behind a proxy.
    pub fn address(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The file holding the client secret, for `org sso --client-secret-file`.
    pub fn secret_file(&self) -> PathBuf {
        self.dir.join("client-secret")
    }

    /// Replaces the accounts; the next sign-in reads them.
    pub fn set_accounts(&self, accounts: &Value) {
        let path = self.dir.join("accounts.json");
        let tmp = self.dir.join("accounts.json.tmp");
        std::fs::write(&tmp, accounts.to_string()).expect("accounts");
        std::fs::rename(&tmp, path).expect("accounts");
    }

    /// Stops the provider: it is down until `restart`.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops and starts it again on the same port, with a new signing key
    /// (and no memory of earlier sessions or codes).
    pub fn restart(&mut self) {
        self.stop();
        self.launch();
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for Provider {
    fn drop(&mut self) {
        self.stop();
        if std::thread::panicking() {
            eprintln!(
                "the provider's log: {}",
                std::fs::read_to_string(self.dir.join("provider.log")).unwrap_or_default()
            );
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `url` resolved against `base`.
pub fn join(base: &str, url: &str) -> String {
    reqwest::Url::parse(base)
        .and_then(|b| b.join(url))
        .map(|u| u.to_string())
        .unwrap_or_else(|_| url.to_owned())
}

/// The first form of `html`: its action and fields.
pub fn form(html: &str) -> Option<(String, Vec<(String, String)>)> {
    let doc = scraper::Html::parse_document(html);
    let form = doc
        .select(&scraper::Selector::parse("form").expect("selector"))
        .next()?;
    let action = form.value().attr("action").unwrap_or("").to_owned();
    let fields = form
        .select(&scraper::Selector::parse("input[name]").expect("selector"))
        .map(|i| {
            (
                i.value().attr("name").unwrap_or("").to_owned(),
                i.value().attr("value").unwrap_or("").to_owned(),
            )
        })
        .collect();
    Some((action, fields))
}

/// From the provider's authorization URL, as `account` (the dev login
/// form takes any password): follows the provider's redirects and forms
/// until one leads back to `app`, and returns that URL (the callback, with
/// its code and state) without requesting it.
pub async fn sign_in_at_provider(
    client: &StaffClient,
    app: &str,
    start: &str,
    account: &str,
) -> String {
    let mut url = start.to_owned();
    for _ in 0..12 {
        let r = client
            .http
            .get(&url)
            .send()
            .await
            .expect("GET at the provider");
        let status = r.status().as_u16();
        if let Some(location) = r.headers().get("location") {
            let next = join(&url, location.to_str().expect("location"));
            if next.starts_with(app) {
                return next;
            }
            url = next;
            continue;
        }
        let body = r.text().await.expect("body");
        let Some((action, mut fields)) = form(&body) else {
            panic!("the provider answered {status} with no form and no redirect: {body}");
        };
        for (name, value) in fields.iter_mut() {
            match name.as_str() {
                "login" => *value = account.to_owned(),
                "password" => *value = "any password".to_owned(),
                _ => {}
            }
        }
        let r = client
            .http
            .post(join(&url, &action))
            .form(&fields)
            .send()
            .await
            .expect("POST at the provider");
        let location = r
            .headers()
            .get("location")
            .unwrap_or_else(|| {
                panic!(
                    "the provider's form answered {} without a redirect",
                    r.status()
                )
            })
            .to_str()
            .expect("location")
            .to_owned();
        let next = join(&url, &location);
        if next.starts_with(app) {
            return next;
        }
        url = next;
    }
    panic!("the provider never sent the browser back to {app}");
}

/// The app on a port chosen first, so that its public URL (the redirect
/// URI the provider must know) can be set before it starts.
pub async fn app_with(adjust: impl FnOnce(&mut poolkeeper::settings::Settings)) -> TestApp {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    spawn_app_with(|s| {
        s.bind = format!("127.0.0.1:{port}").parse().expect("address");
        s.public_url = Some(format!("http://127.0.0.1:{port}"));
        adjust(s);
    })
    .await
}

/// The app with acme's single sign-on through `provider`.
pub async fn configure(app: &TestApp, provider: &Provider, passwords: poolkeeper::sso::Passwords) {
    configure_org(app, app.org.id, provider, passwords).await;
}

/// Organization `org_id`'s single sign-on through `provider`: the groups
/// pk-admins, pk-support and pk-viewers give admin, support and viewer.
pub async fn configure_org(
    app: &TestApp,
    org_id: i64,
    provider: &Provider,
    passwords: poolkeeper::sso::Passwords,
) {
    let secret = provider.secret_file().to_string_lossy().into_owned();
    poolkeeper::sso::set(
        &app.pool,
        org_id,
        &poolkeeper::sso::Setting {
            issuer: &provider.issuer,
            client_id: CLIENT_ID,
            client_secret_file: &secret,
            claim: "groups",
            admin_values: &["pk-admins"],
            support_values: &["pk-support"],
            viewer_values: &["pk-viewers"],
            passwords,
        },
        "test",
    )
    .await
    .expect("configure single sign-on");
}

/// Starts a sign-in at `/login/sso?org=acme`: the URL of the provider it
/// redirects to.
pub async fn start(c: &StaffClient) -> String {
    start_for(c, "acme").await
}

/// Starts a sign-in to the organization `slug`: the provider's URL.
pub async fn start_for(c: &StaffClient, slug: &str) -> String {
    let r = c.get(&format!("/login/sso?org={slug}")).await;
    assert_eq!(r.status().as_u16(), 303, "to the provider");
    let to = r.headers()["location"]
        .to_str()
        .expect("location")
        .to_owned();
    for part in [
        "code_challenge_method=S256",
        "code_challenge=",
        "state=",
        "nonce=",
        "scope=openid",
    ] {
        assert!(to.contains(part), "{part} in {to}");
    }
    to
}

/// The callback URL the provider sends `account` back with.
pub async fn callback_for(app: &TestApp, c: &StaffClient, account: &str) -> String {
    let to = start(c).await;
    sign_in_at_provider(c, &app.address, &to, account).await
}

/// Requests `callback` (a full URL of the app): status and body.
pub async fn finish(c: &StaffClient, callback: &str) -> (u16, String) {
    let r = c.http.get(callback).send().await.expect("callback");
    let status = r.status().as_u16();
    (status, r.text().await.expect("body"))
}

/// Signs `account` in to acme with a new client; asserts it worked.
pub async fn signed_in(app: &TestApp, account: &str) -> StaffClient {
    signed_in_to(app, "acme", account).await
}

/// Signs `account` in to the organization `slug` with a new client through
/// the provider (no password); asserts it worked.
pub async fn signed_in_to(app: &TestApp, slug: &str, account: &str) -> StaffClient {
    let c = StaffClient::new(&app.address);
    let to = start_for(&c, slug).await;
    let callback = sign_in_at_provider(&c, &app.address, &to, account).await;
    let (status, body) = finish(&c, &callback).await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains("http-equiv=\"refresh\""),
        "moves on to /: {body}"
    );
    assert!(c.session_cookie().is_some(), "a session");
    c
}
