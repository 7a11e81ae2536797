//! Item 14 (R17): `GET /api/v1/capacity` of one pool (a site and profile),
//! read by `page_readers` clients in a loop beside item 1's reserve+cancel
//! load at 8 clients, on item 5's organization (50,000 machines). Each run
//! is the load alone, then the load with the readers, so that the
//! reserve rate with readers is read against the rate without them.

use std::time::{Duration, Instant};

use anyhow::bail;
use tokio::sync::Barrier;

use crate::cpu::Meter;
use crate::setup::{self, Config, Org, PROFILE};
use crate::stats::Latency;
use crate::throughput::{self, Run};

#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct Result {
    pub machines: i64,
    pub readers: usize,
    /// Each run's length, to turn reads into reads per second.
    pub seconds: f64,
    pub reads: Vec<Latency>,
    pub alone: Vec<Run>,
    pub beside: Vec<Run>,
}

async fn read(
    http: &reqwest::Client,
    url: &str,
    token: &str,
    readers: usize,
    seconds: f64,
) -> anyhow::Result<Latency> {
    let barrier = std::sync::Arc::new(Barrier::new(readers + 1));
    let mut tasks = Vec::new();
    for _ in 0..readers {
        let (http, barrier, url, token) = (
            http.clone(),
            barrier.clone(),
            url.to_owned(),
            token.to_owned(),
        );
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let deadline = Instant::now() + Duration::from_secs_f64(seconds);
            let mut samples = Vec::new();
            while Instant::now() < deadline {
                let t = Instant::now();
                let resp = http.get(&url).bearer_auth(&token).send().await?;
                let status = resp.status();
                let body = resp.bytes().await?;
                samples.push(t.elapsed());
                if status != 200 {
                    bail!(
                        "{url} answered {status}: {}",
                        String::from_utf8_lossy(&body)
                    );
                }
            }
            Ok::<_, anyhow::Error>(samples)
        }));
    }
    barrier.wait().await;
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await??);
    }
    Ok(Latency::of(&mut all))
}

pub async fn run(
    cfg: &Config,
    meter: &Meter,
    base: &str,
    org: &Org,
    machines: i64,
) -> anyhow::Result<Result> {
    let http = reqwest::Client::new();
    let url = format!(
        "{base}/api/v1/capacity?site={}&profile={PROFILE}",
        setup::site(2)
    );
    // Warm-up: connections and plans.
    read(&http, &url, &org.token, cfg.page_readers, 1.0).await?;
    let mut out = Result {
        machines,
        readers: cfg.page_readers,
        seconds: cfg.run_seconds,
        reads: Vec::new(),
        alone: Vec::new(),
        beside: Vec::new(),
    };
    for r in 0..cfg.runs {
        let alone = throughput::http_run(
            meter,
            base,
            &org.token,
            cfg.sites,
            8,
            cfg.run_seconds,
            &format!("c-alone-{r}"),
        )
        .await?;
        let tag = format!("c-beside-{r}");
        let load =
            throughput::http_run(meter, base, &org.token, cfg.sites, 8, cfg.run_seconds, &tag);
        let reads = read(&http, &url, &org.token, cfg.page_readers, cfg.run_seconds);
        let (load, reads) = tokio::join!(load, reads);
        let (load, reads) = (load?, reads?);
        eprintln!(
            "  capacity run {r}: p50 {:.2} p99 {:.2} ms; load {:.0}/s beside, {:.0}/s alone",
            reads.p50_ms, reads.p99_ms, load.cycles_per_s, alone.cycles_per_s
        );
        out.reads.push(reads);
        out.alone.push(alone);
        out.beside.push(load);
    }
    Ok(out)
}
