//! Configuration, from the environment (API.md). A `.env` file may add to it.

use std::net::SocketAddr;
use std::time::Duration;

/// Everything `serve` needs to know. Tests build one directly.
#[derive(Debug, Clone)]
pub struct Settings {
    /// `DATABASE_URL`; `None` means the embedded default.
    pub database_url: Option<String>,
    /// `POOLKEEPER_BIND`.
    pub bind: SocketAddr,
    /// `POOLKEEPER_METRICS_BIND`: when set, `/metrics` is served on this
    /// address only, and the main address answers it 404 (the pool's sites
    /// and profiles are not published to whoever reaches the API).
    pub metrics_bind: Option<SocketAddr>,
    /// `POOLKEEPER_DATACENTER_MODULE`: the deployment switch of R12.
    pub datacenter_module: bool,
    /// `POOLKEEPER_HOLD_SECONDS`: default reservation lifetime (R11).
    pub hold_seconds: u32,
    /// `POOLKEEPER_HOLD_MAX_SECONDS` (default 3600, 1 to 604800): R14's cap
    /// on a whole hold, from its creation to its deadline, that an extension
    /// may not pass.
    pub hold_max_seconds: u32,
    /// `POOLKEEPER_SWEEP_SECONDS`: sweep period.
    pub sweep_period: Duration,
    /// `POOLKEEPER_LEASE_SECONDS`: how long a sweep lease lasts without a
    /// heartbeat. Defaults to three sweep periods, at least 5 seconds.
    pub lease_duration: Duration,
    /// `POOLKEEPER_REPLICA`: unique per process.
    pub replica: String,
    /// `POOLKEEPER_SECURE_COOKIES`: served behind TLS, so cookies get
    /// `Secure` and the `__Host-` prefix.
    pub secure_cookies: bool,
    /// `POOLKEEPER_SESSION_IDLE_SECONDS` (default 1800).
    pub session_idle: Duration,
    /// `POOLKEEPER_SESSION_MAX_SECONDS` (default 12 h).
    pub session_max: Duration,
    /// `POOLKEEPER_DB_ACQUIRE_SECONDS` (default 2): how long a request waits
    /// for a pooled connection before it gets `503` with `Retry-After`
    /// instead of hanging.
    pub db_acquire_timeout: Duration,
    /// `POOLKEEPER_DB_POOLER` (`none`, `session` or `transaction`):
    /// `DATABASE_URL` points at a pooler (PgBouncer) in that mode. Then no
    /// startup `options` are sent (a pooler refuses them) and start-up checks
    /// that the session limits are set on the role instead.
    pub db_pooler: DbPooler,
    /// `POOLKEEPER_DB_STATEMENT_CACHE` (`on` or `off`, default on): off,
    /// nothing is prepared for later and every statement runs inside an
    /// explicit transaction (`db::Db`, pinned), for a transaction-mode
    /// pooler that passes prepared statements through (PgBouncer 1.18).
    pub db_statement_cache: bool,
    /// `POOLKEEPER_MIGRATION_DATABASE_URL`: a direct session (no pooler)
    /// as the owner role, for the migrations and their advisory lock.
    pub migration_database_url: Option<String>,
    /// `POOLKEEPER_SHUTDOWN_DRAIN_SECONDS` (default 5): after SIGTERM,
    /// `/readyz` answers 503 for this long while requests are still served,
    /// so that a load balancer stops sending new ones before the listener
    /// closes.
    pub shutdown_drain: Duration,
    /// `POOLKEEPER_REFUSAL_RETENTION_DAYS` (default 90, 1 to 3650): refusal
    /// rows older than this are purged by the sweep worker (issue 15).
    pub refusal_retention_days: u32,
    /// `POOLKEEPER_DB_MAX_CONNECTIONS` (default 20, 1 to 1000): the
    /// application pool's size (the sweep and the webhook worker have their
    /// own small pools).
    pub db_max_connections: u32,
    /// `POOLKEEPER_WEBHOOK_ALLOW_PRIVATE` (default off): let webhook URLs
    /// reach loopback, private, link-local and unspecified addresses. Off,
    /// a tenant admin cannot make the server call internal services.
    pub webhook_allow_private: bool,
    /// `POOLKEEPER_WEBHOOK_POLL_MS` (default 1000): how often the delivery
    /// worker looks for due deliveries.
    pub webhook_poll: Duration,
    /// `POOLKEEPER_WEBHOOK_BACKOFF_MS` (default 10000): the first retry's
    /// delay; each further retry doubles it (capped at an hour), with jitter.
    pub webhook_backoff_base: Duration,
    /// `POOLKEEPER_WEBHOOK_LEASE_SECONDS` (default 30): the delivery
    /// worker's lease (key `webhooks`).
    pub webhook_lease_duration: Duration,
    /// `POOLKEEPER_WEBHOOK_GIVE_UP_SECONDS` (default 86400): retries stop
    /// this long after the event.
    pub webhook_give_up: Duration,
}

/// What sits between poolkeeper and PostgreSQL (`POOLKEEPER_DB_POOLER`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DbPooler {
    /// A direct connection: the session limits travel as startup options.
    None,
    /// A pooler in session mode: a client keeps its server session.
    Session,
    /// A pooler in transaction mode: a session lasts one transaction.
    Transaction,
}

impl DbPooler {
    /// Behind any pooler: no startup options, limits from the role.
    pub fn pooled(self) -> bool {
        self != DbPooler::None
    }
}

#[derive(Debug, thiserror::Error)]
#[error("configuration: {name}={value:?} is not valid: {expected}")]
pub struct SettingsError {
    pub name: &'static str,
    pub value: String,
    pub expected: &'static str,
}

impl Settings {
    /// Defaults of API.md, for a replica named `replica`.
    pub fn defaults() -> Settings {
        Settings {
            database_url: None,
            bind: SocketAddr::from(([127, 0, 0, 1], 8080)),
            metrics_bind: None,
            datacenter_module: false,
            hold_seconds: 900,
            hold_max_seconds: 3600,
            sweep_period: Duration::from_secs(60),
            lease_duration: Duration::from_secs(180),
            replica: default_replica_name(),
            secure_cookies: false,
            session_idle: Duration::from_secs(30 * 60),
            session_max: Duration::from_secs(12 * 3600),
            db_acquire_timeout: Duration::from_secs(2),
            db_pooler: DbPooler::None,
            db_statement_cache: true,
            migration_database_url: None,
            shutdown_drain: Duration::from_secs(5),
            refusal_retention_days: 90,
            db_max_connections: 20,
            webhook_allow_private: false,
            webhook_poll: Duration::from_millis(1000),
            webhook_backoff_base: Duration::from_millis(10_000),
            webhook_lease_duration: Duration::from_secs(30),
            webhook_give_up: Duration::from_secs(86_400),
        }
    }

    pub fn from_env() -> Result<Settings, SettingsError> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Reads settings through `lookup`, so that tests need not touch the
    /// process environment.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Settings, SettingsError> {
        let mut s = Settings::defaults();
        let get = |name: &str| lookup(name).filter(|v| !v.trim().is_empty());
        s.database_url = get("DATABASE_URL");
        if let Some(v) = get("POOLKEEPER_BIND") {
            s.bind = v.parse().map_err(|_| SettingsError {
                name: "POOLKEEPER_BIND",
                value: v.clone(),
                expected: "an address and port such as 127.0.0.1:8080",
            })?;
        }
        if let Some(v) = get("POOLKEEPER_METRICS_BIND") {
            s.metrics_bind = Some(v.parse().map_err(|_| SettingsError {
                name: "POOLKEEPER_METRICS_BIND",
                value: v.clone(),
                expected: "an address and port such as 127.0.0.1:9090",
            })?);
        }
        if let Some(v) = get("POOLKEEPER_DATACENTER_MODULE") {
            s.datacenter_module = parse_switch("POOLKEEPER_DATACENTER_MODULE", &v)?;
        }
        if let Some(v) = get("POOLKEEPER_SECURE_COOKIES") {
            s.secure_cookies = parse_switch("POOLKEEPER_SECURE_COOKIES", &v)?;
        }
        if let Some(v) = get("POOLKEEPER_HOLD_SECONDS") {
            s.hold_seconds = parse_seconds("POOLKEEPER_HOLD_SECONDS", &v, 1, 86_400)? as u32;
        }
        if let Some(v) = get("POOLKEEPER_HOLD_MAX_SECONDS") {
            s.hold_max_seconds =
                parse_seconds("POOLKEEPER_HOLD_MAX_SECONDS", &v, 1, 604_800)? as u32;
        }
        if let Some(v) = get("POOLKEEPER_SWEEP_SECONDS") {
            s.sweep_period =
                Duration::from_secs(parse_seconds("POOLKEEPER_SWEEP_SECONDS", &v, 1, 86_400)?);
        }
        s.lease_duration = (s.sweep_period * 3).max(Duration::from_secs(5));
        if let Some(v) = get("POOLKEEPER_LEASE_SECONDS") {
            s.lease_duration =
                Duration::from_secs(parse_seconds("POOLKEEPER_LEASE_SECONDS", &v, 1, 86_400)?);
        }
        if let Some(v) = get("POOLKEEPER_SESSION_IDLE_SECONDS") {
            s.session_idle = Duration::from_secs(parse_seconds(
                "POOLKEEPER_SESSION_IDLE_SECONDS",
                &v,
                1,
                86_400,
            )?);
        }
        if let Some(v) = get("POOLKEEPER_SESSION_MAX_SECONDS") {
            s.session_max = Duration::from_secs(parse_seconds(
                "POOLKEEPER_SESSION_MAX_SECONDS",
                &v,
                1,
                7 * 86_400,
            )?);
        }
        if let Some(v) = get("POOLKEEPER_DB_ACQUIRE_SECONDS") {
            s.db_acquire_timeout =
                Duration::from_secs(parse_seconds("POOLKEEPER_DB_ACQUIRE_SECONDS", &v, 1, 60)?);
        }
        if let Some(v) = get("POOLKEEPER_DB_POOLER") {
            s.db_pooler = match v.trim().to_ascii_lowercase().as_str() {
                "transaction" => DbPooler::Transaction,
                "session" => DbPooler::Session,
                "none" | "off" => DbPooler::None,
                _ => {
                    return Err(SettingsError {
                        name: "POOLKEEPER_DB_POOLER",
                        value: v.clone(),
                        expected: "none, session or transaction",
                    });
                }
            };
        }
        if let Some(v) = get("POOLKEEPER_DB_STATEMENT_CACHE") {
            s.db_statement_cache = parse_switch("POOLKEEPER_DB_STATEMENT_CACHE", &v)?;
        }
        s.migration_database_url = get("POOLKEEPER_MIGRATION_DATABASE_URL");
        if let Some(v) = get("POOLKEEPER_SHUTDOWN_DRAIN_SECONDS") {
            s.shutdown_drain = Duration::from_secs(parse_seconds(
                "POOLKEEPER_SHUTDOWN_DRAIN_SECONDS",
                &v,
                0,
                300,
            )?);
        }
        if let Some(v) = get("POOLKEEPER_REFUSAL_RETENTION_DAYS") {
            s.refusal_retention_days = v
                .trim()
                .parse::<u32>()
                .ok()
                .filter(|n| (1..=3650).contains(n))
                .ok_or(SettingsError {
                    name: "POOLKEEPER_REFUSAL_RETENTION_DAYS",
                    value: v.clone(),
                    expected: "a whole number of days from 1 to 3650",
                })?;
        }
        if let Some(v) = get("POOLKEEPER_WEBHOOK_ALLOW_PRIVATE") {
            s.webhook_allow_private = parse_switch("POOLKEEPER_WEBHOOK_ALLOW_PRIVATE", &v)?;
        }
        if let Some(v) = get("POOLKEEPER_WEBHOOK_POLL_MS") {
            s.webhook_poll =
                Duration::from_millis(parse_number("POOLKEEPER_WEBHOOK_POLL_MS", &v, 10, 60_000)?);
        }
        if let Some(v) = get("POOLKEEPER_WEBHOOK_BACKOFF_MS") {
            s.webhook_backoff_base = Duration::from_millis(parse_number(
                "POOLKEEPER_WEBHOOK_BACKOFF_MS",
                &v,
                1,
                3_600_000,
            )?);
        }
        if let Some(v) = get("POOLKEEPER_WEBHOOK_LEASE_SECONDS") {
            s.webhook_lease_duration = Duration::from_secs(parse_seconds(
                "POOLKEEPER_WEBHOOK_LEASE_SECONDS",
                &v,
                1,
                3_600,
            )?);
        }
        if let Some(v) = get("POOLKEEPER_WEBHOOK_GIVE_UP_SECONDS") {
            s.webhook_give_up = Duration::from_secs(parse_seconds(
                "POOLKEEPER_WEBHOOK_GIVE_UP_SECONDS",
                &v,
                1,
                7 * 86_400,
            )?);
        }
        if let Some(v) = get("POOLKEEPER_DB_MAX_CONNECTIONS") {
            s.db_max_connections =
                parse_number("POOLKEEPER_DB_MAX_CONNECTIONS", &v, 1, 1000)? as u32;
        }
        if let Some(v) = get("POOLKEEPER_REPLICA") {
            s.replica = v;
        }
        // R14: the cap is on every hold, the default one included.
        if s.hold_seconds > s.hold_max_seconds {
            return Err(SettingsError {
                name: "POOLKEEPER_HOLD_SECONDS",
                value: format!(
                    "{} (above POOLKEEPER_HOLD_MAX_SECONDS={})",
                    s.hold_seconds, s.hold_max_seconds
                ),
                expected: "at most POOLKEEPER_HOLD_MAX_SECONDS, the cap on every hold",
            });
        }
        Ok(s)
    }
}

fn parse_switch(name: &'static str, value: &str) -> Result<bool, SettingsError> {
    match value.trim().to_ascii_lowercase().as_str() {
        "on" | "true" | "1" | "yes" => Ok(true),
        "off" | "false" | "0" | "no" => Ok(false),
        _ => Err(SettingsError {
            name,
            value: value.to_owned(),
            expected: "on or off",
        }),
    }
}

fn parse_seconds(
    name: &'static str,
    value: &str,
    min: u64,
    max: u64,
) -> Result<u64, SettingsError> {
    value
        .trim()
        .parse::<u64>()
        .ok()
        .filter(|n| (min..=max).contains(n))
        .ok_or(SettingsError {
            name,
            value: value.to_owned(),
            expected: "a whole number of seconds in range",
        })
}

fn parse_number(name: &'static str, value: &str, min: u64, max: u64) -> Result<u64, SettingsError> {
    value
        .trim()
        .parse::<u64>()
        .ok()
        .filter(|n| (min..=max).contains(n))
        .ok_or(SettingsError {
            name,
            value: value.to_owned(),
            expected: "a whole number in range",
        })
}

/// The hostname plus a random suffix: two processes on one host must never
/// believe they are the same lease holder.
pub fn default_replica_name() -> String {
    let host = hostname().unwrap_or_else(|| "poolkeeper".to_owned());
    let suffix: u32 = rand::random();
    format!("{host}-{suffix:08x}")
}

fn hostname() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname NUL-terminates
    // on success when the name fits.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return None;
    }
    let end = buf.iter().position(|&b| b == 0)?;
    let name = String::from_utf8_lossy(&buf[..end]).trim().to_owned();
    (!name.is_empty()).then_some(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_api_md() {
        let s = Settings::from_lookup(|_| None).expect("defaults parse");
        assert_eq!(s.bind.to_string(), "127.0.0.1:8080");
        assert!(!s.datacenter_module);
        assert_eq!(s.hold_seconds, 900);
        assert_eq!(s.hold_max_seconds, 3600);
        assert_eq!(s.sweep_period, Duration::from_secs(60));
        assert!(s.database_url.is_none());
        assert_eq!(s.db_acquire_timeout, Duration::from_secs(2));
    }

    #[test]
    fn the_hold_cap_is_configurable_and_bounded() {
        let s =
            Settings::from_lookup(|n| (n == "POOLKEEPER_HOLD_MAX_SECONDS").then(|| "7200".into()))
                .expect("7200 is in range");
        assert_eq!(s.hold_max_seconds, 7200);
        let err =
            Settings::from_lookup(|n| (n == "POOLKEEPER_HOLD_MAX_SECONDS").then(|| "0".into()))
                .expect_err("a cap of 0 refuses every extension");
        assert_eq!(err.name, "POOLKEEPER_HOLD_MAX_SECONDS");
    }

    #[test]
    fn a_default_hold_above_the_cap_is_refused() {
        let err = Settings::from_lookup(|n| match n {
            "POOLKEEPER_HOLD_SECONDS" => Some("7200".into()),
            "POOLKEEPER_HOLD_MAX_SECONDS" => Some("3600".into()),
            _ => None,
        })
        .expect_err("a default hold longer than the cap");
        assert_eq!(err.name, "POOLKEEPER_HOLD_SECONDS");
        assert!(err.to_string().contains("3600"), "{err}");
        let ok = Settings::from_lookup(|n| match n {
            "POOLKEEPER_HOLD_SECONDS" => Some("3600".into()),
            "POOLKEEPER_HOLD_MAX_SECONDS" => Some("3600".into()),
            _ => None,
        })
        .expect("a default hold at the cap");
        assert_eq!(ok.hold_seconds, 3600);
    }

    #[test]
    fn acquire_timeout_is_configurable_and_bounded() {
        let s =
            Settings::from_lookup(|n| (n == "POOLKEEPER_DB_ACQUIRE_SECONDS").then(|| "7".into()))
                .expect("7 is in range");
        assert_eq!(s.db_acquire_timeout, Duration::from_secs(7));
        let err =
            Settings::from_lookup(|n| (n == "POOLKEEPER_DB_ACQUIRE_SECONDS").then(|| "0".into()))
                .expect_err("0 would fail every request");
        assert_eq!(err.name, "POOLKEEPER_DB_ACQUIRE_SECONDS");
    }

    #[test]
    fn deployment_settings_parse_and_refuse_bad_values() {
        let s = Settings::from_lookup(|n| match n {
            "POOLKEEPER_DB_POOLER" => Some("transaction".into()),
            "POOLKEEPER_MIGRATION_DATABASE_URL" => Some("postgres://owner@db/pk".into()),
            "POOLKEEPER_SHUTDOWN_DRAIN_SECONDS" => Some("0".into()),
            "POOLKEEPER_DB_STATEMENT_CACHE" => Some("off".into()),
            _ => None,
        })
        .expect("valid");
        assert_eq!(s.db_pooler, DbPooler::Transaction);
        assert!(!s.db_statement_cache);
        assert_eq!(
            s.migration_database_url.as_deref(),
            Some("postgres://owner@db/pk")
        );
        assert_eq!(s.shutdown_drain, Duration::ZERO);
        let d = Settings::from_lookup(|_| None).expect("defaults");
        assert_eq!(d.db_pooler, DbPooler::None);
        assert!(d.db_statement_cache);
        let err = Settings::from_lookup(|n| {
            (n == "POOLKEEPER_DB_STATEMENT_CACHE").then(|| "sometimes".into())
        })
        .expect_err("on or off");
        assert_eq!(err.name, "POOLKEEPER_DB_STATEMENT_CACHE");
        assert_eq!(d.shutdown_drain, Duration::from_secs(5));
        let err =
            Settings::from_lookup(|n| (n == "POOLKEEPER_DB_POOLER").then(|| "statement".into()))
                .expect_err("statement mode cannot run transactions");
        assert_eq!(err.name, "POOLKEEPER_DB_POOLER");
        let err = Settings::from_lookup(|n| {
            (n == "POOLKEEPER_SHUTDOWN_DRAIN_SECONDS").then(|| "301".into())
        })
        .expect_err("out of range");
        assert_eq!(err.name, "POOLKEEPER_SHUTDOWN_DRAIN_SECONDS");
    }

    #[test]
    fn webhook_settings_parse_and_are_bounded() {
        let s = Settings::from_lookup(|_| None).expect("defaults parse");
        assert!(!s.webhook_allow_private);
        assert_eq!(s.webhook_give_up, Duration::from_secs(86_400));
        let env = |n: &str| match n {
            "POOLKEEPER_WEBHOOK_ALLOW_PRIVATE" => Some("on".into()),
            "POOLKEEPER_WEBHOOK_POLL_MS" => Some("20".into()),
            "POOLKEEPER_WEBHOOK_BACKOFF_MS" => Some("50".into()),
            "POOLKEEPER_WEBHOOK_LEASE_SECONDS" => Some("2".into()),
            _ => None,
        };
        let s = Settings::from_lookup(env).expect("valid");
        assert!(s.webhook_allow_private);
        assert_eq!(s.webhook_poll, Duration::from_millis(20));
        assert_eq!(s.webhook_backoff_base, Duration::from_millis(50));
        assert_eq!(s.webhook_lease_duration, Duration::from_secs(2));
        let err =
            Settings::from_lookup(|n| (n == "POOLKEEPER_WEBHOOK_POLL_MS").then(|| "0".into()))
                .expect_err("0 would spin");
        assert_eq!(err.name, "POOLKEEPER_WEBHOOK_POLL_MS");
    }

    #[test]
    fn replica_names_are_unique_per_process_instance() {
        assert_ne!(default_replica_name(), default_replica_name());
    }

    #[test]
    fn bad_values_are_named_in_the_error() {
        let err = Settings::from_lookup(|n| (n == "POOLKEEPER_HOLD_SECONDS").then(|| "0".into()))
            .expect_err("0 is out of range");
        assert_eq!(err.name, "POOLKEEPER_HOLD_SECONDS");
        let err = Settings::from_lookup(|n| {
            (n == "POOLKEEPER_DATACENTER_MODULE").then(|| "maybe".into())
        })
        .expect_err("maybe is not a switch");
        assert!(err.to_string().contains("on or off"));
    }

    #[test]
    fn refusal_retention_defaults_to_90_days_and_is_bounded() {
        let s = Settings::from_lookup(|_| None).expect("defaults parse");
        assert_eq!(s.refusal_retention_days, 90);
        let s = Settings::from_lookup(|n| {
            (n == "POOLKEEPER_REFUSAL_RETENTION_DAYS").then(|| "7".into())
        })
        .expect("7 is in range");
        assert_eq!(s.refusal_retention_days, 7);
        for bad in ["0", "3651", "-1", "ninety"] {
            let err = Settings::from_lookup(|n| {
                (n == "POOLKEEPER_REFUSAL_RETENTION_DAYS").then(|| bad.into())
            })
            .expect_err("out of range or not a number");
            assert_eq!(err.name, "POOLKEEPER_REFUSAL_RETENTION_DAYS", "{bad}");
        }
    }
}
