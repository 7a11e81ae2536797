//! Item 5: dashboard pages read by staff while orders are being allocated.
//! A viewer logs in through the login form (CSRF cookie and field, as a
//! browser does); readers fetch the pages, each time to the last byte, while
//! the 8-client HTTP allocation load runs against the same server.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use poolkeeper::domain::{Email, Role};
use tokio::sync::Barrier;

use crate::setup::Db;
use crate::stats::Latency;

pub const EMAIL: &str = "bench-viewer@example.com";
const PASSWORD: &str = "bench-viewer-password";

/// The pages measured: label and path.
pub fn pages(site: &str, profile: &str) -> Vec<(&'static str, String)> {
    vec![
        (
            "machines, filtered (site, status)",
            format!("/machines?site={site}&status=ready"),
        ),
        (
            "machines, filtered as an order spec (site, profile: a verdict per machine)",
            format!("/machines?site={site}&profile={profile}"),
        ),
        ("live reservations", "/reservations".to_owned()),
        (
            "the overview (every pool's counts, headroom and demand, the 24-hour chart)",
            "/".to_owned(),
        ),
    ]
}

pub async fn create_viewer(db: &Db, org_id: i64) -> anyhow::Result<()> {
    poolkeeper::staff::create(
        &db.setup,
        org_id,
        &Email::parse(EMAIL)?,
        Role::Viewer,
        PASSWORD,
    )
    .await?;
    Ok(())
}

/// A client with a logged-in session cookie.
pub async fn login(base: &str) -> anyhow::Result<reqwest::Client> {
    let http = reqwest::Client::builder()
        .cookie_store(true)
        .redirect(reqwest::redirect::Policy::none())
        .build()?;
    let form = http
        .get(format!("{base}/login"))
        .send()
        .await?
        .text()
        .await?;
    let marker = "name=\"csrf\" value=\"";
    let start = form
        .find(marker)
        .context("no csrf field on the login form")?
        + marker.len();
    let csrf = form[start..]
        .split('"')
        .next()
        .unwrap_or_default()
        .to_owned();
    let resp = http
        .post(format!("{base}/login"))
        .form(&[
            ("email", EMAIL),
            ("password", PASSWORD),
            ("csrf", csrf.as_str()),
        ])
        .send()
        .await?;
    if resp.status() != reqwest::StatusCode::SEE_OTHER {
        bail!("login answered {}", resp.status());
    }
    // The session works: the machines page answers 200.
    let check = http.get(format!("{base}/reservations")).send().await?;
    if check.status() != 200 {
        bail!("after login, /reservations answered {}", check.status());
    }
    Ok(http)
}

/// `readers` tasks fetching the pages in turn for `seconds`; per page, the
/// latency of every fetch (request sent to last byte read).
pub async fn read_run(
    http: &reqwest::Client,
    base: &str,
    pages: &[(&'static str, String)],
    readers: usize,
    seconds: f64,
) -> anyhow::Result<Vec<Latency>> {
    let barrier = Arc::new(Barrier::new(readers + 1));
    let mut tasks = Vec::new();
    for r in 0..readers {
        let (http, barrier) = (http.clone(), barrier.clone());
        let urls: Vec<String> = pages.iter().map(|(_, p)| format!("{base}{p}")).collect();
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let deadline = Instant::now() + Duration::from_secs_f64(seconds);
            let mut samples: Vec<Vec<Duration>> = vec![Vec::new(); urls.len()];
            let mut i = r;
            while Instant::now() < deadline {
                let which = i % urls.len();
                i += 1;
                let t = Instant::now();
                let resp = http.get(&urls[which]).send().await?;
                let status = resp.status();
                let body = resp.bytes().await?;
                samples[which].push(t.elapsed());
                if status != 200 {
                    bail!(
                        "{} answered {status}: {}",
                        urls[which],
                        String::from_utf8_lossy(&body)
                    );
                }
            }
            Ok::<_, anyhow::Error>(samples)
        }));
    }
    barrier.wait().await;
    let mut all: Vec<Vec<Duration>> = vec![Vec::new(); pages.len()];
    for t in tasks {
        for (i, s) in t.await??.into_iter().enumerate() {
            all[i].extend(s);
        }
    }
    Ok(all.iter_mut().map(|s| Latency::of(s)).collect())
}
