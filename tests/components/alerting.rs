//! The on-call kit: the series `/metrics` exports, the shipped rules
//! checked and unit-tested by promtool, and one alert proven end to end by
//! a real Prometheus scraping a real server (Debian's `prometheus` package;
//! missing, the tests fail: `helpers::needs`).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use poolkeeper::sweep;
use serde_json::Value;
use tokio::sync::watch;

use crate::helpers::FakeMachine;
use crate::helpers::replicas::free_port;
use crate::helpers::spawn_app;

const RULES: &str = include_str!("../../deploy/prometheus/poolkeeper.rules.yml");
const RULE_TESTS: &str = include_str!("../../deploy/prometheus/poolkeeper.rules.test.yml");
const CONFIG: &str = include_str!("../../deploy/prometheus/prometheus.yml");
const OPERATIONS: &str = include_str!("../../docs/operations.md");

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/prometheus")
}

fn tool(name: &str) -> Option<PathBuf> {
    [format!("/usr/bin/{name}"), format!("/usr/local/bin/{name}")]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
}

fn needs_prometheus(name: &str) -> PathBuf {
    crate::helpers::required(
        "prometheus",
        tool(name),
        "apt-get install -y --no-install-recommends prometheus",
    )
}

/// The alert names of the shipped rules.
fn alerts() -> Vec<String> {
    RULES
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .map(|s| s.trim().to_owned())
        .collect()
}

#[test]
fn promtool_checks_the_rules_and_their_unit_tests_pass() {
    let promtool = needs_prometheus("promtool");
    for args in [
        ["check", "rules", "poolkeeper.rules.yml"],
        ["test", "rules", "poolkeeper.rules.test.yml"],
    ] {
        let out = std::process::Command::new(&promtool)
            .args(args)
            .current_dir(dir())
            .output()
            .expect("run promtool");
        assert!(
            out.status.success(),
            "promtool {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn every_alert_has_unit_tests_both_ways_and_a_runbook() {
    let names = alerts();
    assert!(names.len() >= 9, "{names:?}");
    for name in &names {
        let tests: Vec<&str> = RULE_TESTS
            .split("alertname: ")
            .skip(1)
            .filter(|t| t.starts_with(&format!("{name}\n")))
            .collect();
        assert!(
            tests.iter().any(|t| t.contains("exp_labels")),
            "{name}: no unit test where it fires"
        );
        assert!(
            tests.iter().any(|t| t.contains("exp_alerts: []")),
            "{name}: no unit test where it stays silent"
        );
        assert!(
            OPERATIONS.contains(&format!("### {name}\n")),
            "{name}: no runbook heading in docs/operations.md"
        );
        assert!(
            RULES.contains(&format!("docs/operations.md#{}", name.to_lowercase())),
            "{name}: no runbook_url"
        );
    }
}

/// The series names a text exposition declares (`# TYPE name kind`).
fn exported(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn metrics_export_the_kit_with_route_templates_and_pool_numbers() {
    let app = spawn_app().await;
    FakeMachine::new()
        .tag("a1")
        .site("fra1")
        .profile("m5")
        .create(&app.pool, app.org.id)
        .await;
    FakeMachine::new()
        .tag("a2")
        .site("fra1")
        .profile("m5")
        .status("broken")
        .create(&app.pool, app.org.id)
        .await;
    // A raw path with an id: the label must be its template.
    let r = app
        .http
        .get(format!("{}/api/v1/reservations/987654", app.address))
        .bearer_auth(&app.org.token)
        .send()
        .await
        .expect("request");
    assert_eq!(r.status().as_u16(), 404);
    let text = app.metrics_text().await;
    let names = exported(&text);
    for series in SERIES {
        assert!(
            ON_FIRST_EVENT.contains(series) || names.iter().any(|n| n == series),
            "{series} not exported"
        );
        assert!(
            OPERATIONS.contains(&format!("`{series}`")),
            "{series} not listed in docs/operations.md"
        );
    }
    assert!(
        text.contains(
            "poolkeeper_http_request_duration_seconds_count{method=\"GET\",route=\"/api/v1/reservations/{id}\",status=\"4xx\"} 1"
        ),
        "{text}"
    );
    assert!(!text.contains("987654"), "a raw path leaked into a label");
    assert!(
        text.contains(
            "poolkeeper_machines{org=\"acme\",profile=\"m5\",site=\"fra1\",state=\"sellable\"} 1"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "poolkeeper_machines{org=\"acme\",profile=\"m5\",site=\"fra1\",state=\"not_ready\"} 1"
        ),
        "{text}"
    );
    assert!(
        text.contains("poolkeeper_pool_available{org=\"acme\",profile=\"m5\",site=\"fra1\"} 1"),
        "{text}"
    );
    // R21: no history yet, so no demand: no run-out, never "0 days".
    assert!(
        text.contains("poolkeeper_pool_days_left{org=\"acme\",profile=\"m5\",site=\"fra1\"} inf"),
        "{text}"
    );
    assert!(
        text.contains(
            "poolkeeper_pool_lead_time_days{org=\"acme\",profile=\"m5\",site=\"fra1\"} 30"
        ),
        "{text}"
    );
    assert!(
        text.contains("poolkeeper_sweep_last_success_age_seconds inf"),
        "{text}"
    );
    assert!(
        text.contains("poolkeeper_lease_holders{key=\"sweep\"} 0"),
        "{text}"
    );
    assert!(
        text.contains("poolkeeper_db_pool_connections{state=\"max\"}"),
        "{text}"
    );
    assert!(text.contains("poolkeeper_build_info{git_commit="), "{text}");
}

/// Series with labels known only when something happens (a label set
/// appears with its first event).
const ON_FIRST_EVENT: &[&str] = &[
    "poolkeeper_db_errors_total",
    "poolkeeper_reserve_outcomes_total",
    "poolkeeper_reservations_refused_total",
    "poolkeeper_reservations_expired_total",
    "poolkeeper_orders_served_total",
    // A label set per headroom kept (R18): none in a fresh inventory.
    "poolkeeper_pool_headroom",
];

/// Every series the server exports (documented in docs/operations.md).
pub const SERIES: &[&str] = &[
    "poolkeeper_build_info",
    "poolkeeper_http_request_duration_seconds",
    "poolkeeper_http_requests_in_flight",
    "poolkeeper_http_unavailable_total",
    "poolkeeper_db_errors_total",
    "poolkeeper_db_read_only_seen_total",
    "poolkeeper_db_acquire_seconds",
    "poolkeeper_db_pool_connections",
    "poolkeeper_machines",
    "poolkeeper_pool_headroom",
    "poolkeeper_pool_available",
    "poolkeeper_pool_days_left",
    "poolkeeper_pool_lead_time_days",
    "poolkeeper_holds_expiring_soon",
    "poolkeeper_holds_overdue",
    "poolkeeper_webhook_deliveries_pending",
    "poolkeeper_webhook_oldest_pending_age_seconds",
    "poolkeeper_webhook_deliveries_total",
    "poolkeeper_webhook_attempt_duration_seconds",
    "poolkeeper_sweep_last_success_age_seconds",
    "poolkeeper_sweep_period_seconds",
    "poolkeeper_lease_holders",
    "poolkeeper_metrics_db_errors_total",
    "poolkeeper_metrics_db_reads_total",
    "poolkeeper_reserve_outcomes_total",
    "poolkeeper_reservations_refused_total",
    "poolkeeper_reservations_expired_total",
    "poolkeeper_orders_served_total",
    "poolkeeper_sweeps_total",
    "poolkeeper_sweep_errors_total",
    "poolkeeper_last_sweep_timestamp_seconds",
    "poolkeeper_lease_acquired_total",
    "poolkeeper_lease_lost_total",
    "poolkeeper_lease_errors_total",
    "process_cpu_seconds_total",
    "process_resident_memory_bytes",
    "process_open_fds",
    "process_start_time_seconds",
];

/// The shipped rules with every `for:` shortened to 3 s, so that an alert
/// goes pending, then firing, within the test; the expressions are the
/// shipped ones, unchanged.
fn rules_with_short_for() -> String {
    RULES
        .lines()
        .map(|l| match l.trim_start().strip_prefix("for: ") {
            Some(_) => format!("{}for: 3s", &l[..l.len() - l.trim_start().len()]),
            None => l.to_owned(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The shipped scrape configuration, run against the test's server: its
/// rules, its token file and its address in place of the shipped ones;
/// 5 s scrapes with a 5 s timeout (a loaded machine's scrape is not
/// dropped) and rules evaluated every second. Everything else, the
/// `authorization` block included, is the shipped text.
fn test_config(work: &Path, port: u16) -> String {
    let replaced = [
        (
            "  scrape_interval: 15s",
            "  scrape_interval: 5s\n  scrape_timeout: 5s".to_owned(),
        ),
        (
            "  evaluation_interval: 15s",
            "  evaluation_interval: 1s".to_owned(),
        ),
        (
            "  - poolkeeper.rules.yml",
            format!("  - {}", work.join("rules.yml").display()),
        ),
        (
            "credentials_file: /etc/prometheus/poolkeeper.token",
            format!("credentials_file: {}", work.join("token").display()),
        ),
        ("'127.0.0.1:8080'", format!("'127.0.0.1:{port}'")),
    ];
    let mut config = CONFIG.to_owned();
    for (shipped, ours) in replaced {
        assert!(
            config.contains(shipped),
            "the shipped prometheus.yml has no {shipped:?}"
        );
        config = config.replace(shipped, &ours);
    }
    config
}

#[test]
fn the_shipped_scrape_configuration_is_valid_and_sends_a_token() {
    let promtool = needs_prometheus("promtool");
    assert!(
        CONFIG.contains("authorization:\n      type: Bearer\n      credentials_file: "),
        "{CONFIG}"
    );
    let work =
        std::env::temp_dir().join(format!("poolkeeper-promcfg-{:08x}", rand::random::<u32>()));
    std::fs::create_dir_all(&work).expect("dir");
    std::fs::write(work.join("rules.yml"), RULES).expect("rules");
    std::fs::write(work.join("token"), "pk_example").expect("token");
    std::fs::write(work.join("prometheus.yml"), test_config(&work, 8080)).expect("config");
    let out = std::process::Command::new(&promtool)
        .args(["check", "config"])
        .arg(work.join("prometheus.yml"))
        .output()
        .expect("run promtool");
    let _ = std::fs::remove_dir_all(&work);
    assert!(
        out.status.success(),
        "promtool check config: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The state of `alert` in Prometheus (`None`: inactive).
async fn alert_state(http: &reqwest::Client, prom: &str, alert: &str) -> Option<String> {
    let body: Value = http
        .get(format!("{prom}/api/v1/alerts"))
        .send()
        .await
        .ok()?
        .json()
        .await
        .ok()?;
    body["data"]["alerts"]
        .as_array()?
        .iter()
        .find(|a| a["labels"]["alertname"] == alert)
        .and_then(|a| a["state"].as_str().map(str::to_owned))
}

async fn query(http: &reqwest::Client, prom: &str, q: &str) -> Option<f64> {
    let body: Value = http
        .get(format!("{prom}/api/v1/query"))
        .query(&[("query", q)])
        .send()
        .await
        .ok()?
        .json()
        .await
        .ok()?;
    body["data"]["result"].as_array()?.first()?["value"][1]
        .as_str()?
        .parse()
        .ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_prometheus_fires_and_resolves_no_lease_holder() {
    let prometheus = needs_prometheus("prometheus");
    let app = spawn_app().await;
    let mut settings = app.settings.clone();
    settings.sweep_period = Duration::from_secs(1);
    settings.lease_duration = Duration::from_secs(3);
    let start_sweep = |settings: &poolkeeper::settings::Settings| {
        let (stop, stopped) = watch::channel(false);
        let (pool, settings, metrics) = (app.pool.clone(), settings.clone(), app.metrics.clone());
        let task =
            tokio::spawn(async move { sweep::run(&pool, &settings, metrics, stopped).await });
        (stop, task)
    };
    let (stop, task) = start_sweep(&settings);

    let work = std::env::temp_dir().join(format!("poolkeeper-prom-{:08x}", rand::random::<u32>()));
    std::fs::create_dir_all(work.join("data")).expect("dir");
    std::fs::write(work.join("rules.yml"), rules_with_short_for()).expect("rules");
    std::fs::write(work.join("token"), &app.org.metrics_token).expect("token");
    std::fs::write(work.join("prometheus.yml"), test_config(&work, app.port)).expect("config");
    let prom_port = free_port();
    let mut child = tokio::process::Command::new(prometheus)
        .arg(format!(
            "--config.file={}",
            work.join("prometheus.yml").display()
        ))
        .arg(format!(
            "--storage.tsdb.path={}",
            work.join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{prom_port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start prometheus");
    let prom = format!("http://127.0.0.1:{prom_port}");
    let http = reqwest::Client::new();

    // Held: Prometheus sees the holder, and the alert stays inactive.
    app.wait_for(
        "Prometheus to see the lease held",
        Duration::from_secs(60),
        || {
            let http = http.clone();
            let prom = prom.clone();
            async move {
                query(&http, &prom, "max(poolkeeper_lease_holders{key=\"sweep\"})").await
                    == Some(1.0)
            }
        },
    )
    .await;
    assert_eq!(
        alert_state(&http, &prom, "PoolkeeperNoLeaseHolder").await,
        None
    );

    // The holder stops and releases the lease: pending, then firing.
    let _ = stop.send(true);
    task.await.expect("sweep worker");
    let seen_pending = std::cell::Cell::new(false);
    app.wait_for("the alert to fire", Duration::from_secs(60), || {
        let http = http.clone();
        let prom = prom.clone();
        let seen = &seen_pending;
        async move {
            match alert_state(&http, &prom, "PoolkeeperNoLeaseHolder")
                .await
                .as_deref()
            {
                Some("pending") => {
                    seen.set(true);
                    false
                }
                Some("firing") => true,
                _ => false,
            }
        }
    })
    .await;
    assert!(
        seen_pending.get(),
        "the alert went firing without being pending first"
    );

    // A holder again: the alert resolves.
    let (stop, task) = start_sweep(&settings);
    app.wait_for("the alert to resolve", Duration::from_secs(60), || {
        let http = http.clone();
        let prom = prom.clone();
        async move {
            alert_state(&http, &prom, "PoolkeeperNoLeaseHolder")
                .await
                .is_none()
        }
    })
    .await;
    let _ = stop.send(true);
    task.await.expect("sweep worker");
    let _ = child.kill().await;
    let _ = std::fs::remove_dir_all(&work);
}

const DASHBOARD: &str = include_str!("../../deploy/grafana/poolkeeper.json");

/// Every PromQL expression of the dashboard.
fn dashboard_exprs() -> Vec<String> {
    let dash: Value = serde_json::from_str(DASHBOARD).expect("the dashboard is JSON");
    let mut exprs = Vec::new();
    for panel in dash["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().into_iter().flatten() {
            exprs.push(target["expr"].as_str().expect("an expr").to_owned());
        }
    }
    exprs
}

/// The metric names an expression mentions (ours and the process's).
fn names_in(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let bytes: Vec<char> = expr.chars().collect();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        if c == '"' {
            // Skip a label value.
            i += 1;
            while i < bytes.len() && bytes[i] != '"' {
                i += 1;
            }
            i += 1;
            continue;
        }
        if c.is_ascii_alphabetic() || c == '_' {
            let start = i;
            while i < bytes.len()
                && (bytes[i].is_ascii_alphanumeric() || bytes[i] == '_' || bytes[i] == ':')
            {
                i += 1;
            }
            let word: String = bytes[start..i].iter().collect();
            if word.starts_with("poolkeeper") || word.starts_with("process_") {
                names.push(word);
            }
            continue;
        }
        i += 1;
    }
    names
}

#[tokio::test]
async fn every_dashboard_expression_names_exported_or_recorded_series() {
    let app = spawn_app().await;
    // One request first, so that the request histogram has a label set.
    app.http
        .get(format!("{}/healthz", app.address))
        .send()
        .await
        .expect("healthz");
    let text = app.metrics_text().await;
    let mut known: Vec<String> = exported(&text);
    known.extend(SERIES.iter().map(|s| s.to_string()));
    let histograms: Vec<String> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter(|l| l.ends_with(" histogram"))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect();
    for h in &histograms {
        for suffix in ["_bucket", "_count", "_sum"] {
            known.push(format!("{h}{suffix}"));
        }
    }
    let recorded: Vec<String> = RULES
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- record: "))
        .map(|s| s.trim().to_owned())
        .collect();
    let exprs = dashboard_exprs();
    assert!(exprs.len() >= 20, "{exprs:?}");
    let mut uses_recorded = 0;
    for expr in &exprs {
        let names = names_in(expr);
        assert!(!names.is_empty(), "{expr}: names no series");
        for name in names {
            if recorded.contains(&name) {
                uses_recorded += 1;
            } else {
                assert!(
                    known.contains(&name),
                    "{expr}: {name} is neither exported nor recorded"
                );
            }
        }
    }
    assert!(
        uses_recorded >= 10,
        "the dashboard should be built on the recording rules"
    );
    // The rules' expressions name real series too.
    for line in RULES.lines() {
        for name in names_in(line) {
            let t = line.trim_start();
            let prose = [
                "#",
                "- record:",
                "- alert:",
                "- name:",
                "summary:",
                "runbook_url:",
            ]
            .iter()
            .any(|p| t.starts_with(p));
            if !prose {
                assert!(
                    recorded.contains(&name) || known.contains(&name),
                    "rules: {name} is neither exported nor recorded"
                );
            }
        }
    }

    // Every expression is valid PromQL: promtool checks them as rules.
    let promtool = needs_prometheus("promtool");
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, expr) in exprs.iter().enumerate() {
        rules.push_str(&format!(
            "      - record: dashboard:expr{i}\n        expr: {}\n",
            serde_json::to_string(expr).expect("quoted")
        ));
    }
    let file =
        std::env::temp_dir().join(format!("poolkeeper-dash-{:08x}.yml", rand::random::<u32>()));
    std::fs::write(&file, rules).expect("write");
    let out = std::process::Command::new(promtool)
        .args(["check", "rules"])
        .arg(&file)
        .output()
        .expect("promtool");
    let _ = std::fs::remove_file(&file);
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
