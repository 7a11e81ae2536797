//! Configuration, from the environment (docs/configuration.md). A `.env` file may add to it.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

/// Everything `serve` needs to know. Tests build one directly. Each
/// field's default is declared once, in `VARIABLES`.
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
    /// `POOLKEEPER_HOLD_MAX_SECONDS` (1 to 604800): R14's cap
    /// on a whole hold, from its creation to its deadline, that an extension
    /// may not pass.
    pub hold_max_seconds: u32,
    /// `POOLKEEPER_SWEEP_SECONDS`: sweep period.
    pub sweep_period: Duration,
    /// `POOLKEEPER_LEASE_SECONDS`: how long a sweep lease lasts without a
    /// heartbeat.
    pub lease_duration: Duration,
    /// `POOLKEEPER_REPLICA`: unique per process.
    pub replica: String,
    /// `POOLKEEPER_SECURE_COOKIES`: served behind TLS, so cookies get
    /// `Secure` and the `__Host-` prefix.
    pub secure_cookies: bool,
    /// `POOLKEEPER_PUBLIC_URL`: the dashboard's address as browsers reach
    /// it, without a trailing slash (single sign-on's redirect URI is
    /// `<public URL>/login/sso/callback`).
    pub public_url: Option<String>,
    /// `POOLKEEPER_TRUSTED_PROXIES`: the reverse proxies whose
    /// `Forwarded`/`X-Forwarded-For` name the client (throttling, audit).
    pub trusted_proxies: Vec<Cidr>,
    /// `POOLKEEPER_SESSION_IDLE_SECONDS`.
    pub session_idle: Duration,
    /// `POOLKEEPER_SESSION_MAX_SECONDS`.
    pub session_max: Duration,
    /// `POOLKEEPER_DB_ACQUIRE_SECONDS`: how long a request waits
    /// for a pooled connection before it gets `503` with `Retry-After`
    /// instead of hanging.
    pub db_acquire_timeout: Duration,
    /// `POOLKEEPER_DB_POOLER` (`none`, `session` or `transaction`):
    /// `DATABASE_URL` points at a pooler (PgBouncer) in that mode. Then no
    /// startup `options` are sent (a pooler refuses them) and start-up checks
    /// that the session limits are set on the role instead.
    pub db_pooler: DbPooler,
    /// `POOLKEEPER_DB_STATEMENT_CACHE` (`on` or `off`): off,
    /// nothing is prepared for later and every statement runs inside an
    /// explicit transaction (`db::Db`, pinned), for a transaction-mode
    /// pooler that passes prepared statements through (PgBouncer 1.18).
    pub db_statement_cache: bool,
    /// `POOLKEEPER_MIGRATION_DATABASE_URL`: a direct session (no pooler)
    /// as the owner role, for the migrations and their advisory lock.
    pub migration_database_url: Option<String>,
    /// `POOLKEEPER_SHUTDOWN_DRAIN_SECONDS`: after SIGTERM,
    /// `/readyz` answers 503 for this long while requests are still served,
    /// so that a load balancer stops sending new ones before the listener
    /// closes.
    pub shutdown_drain: Duration,
    /// `POOLKEEPER_REFUSAL_RETENTION_DAYS` (1 to 3650): refusal
    /// rows older than this are purged by the sweep worker.
    pub refusal_retention_days: u32,
    /// `POOLKEEPER_DB_MAX_CONNECTIONS` (1 to 1000): the
    /// application pool's size (the sweep and the webhook worker have their
    /// own small pools).
    pub db_max_connections: u32,
    /// `POOLKEEPER_WEBHOOK_ALLOW_PRIVATE`: let webhook URLs
    /// reach loopback, private, link-local and unspecified addresses. Off,
    /// a tenant admin cannot make the server call internal services.
    pub webhook_allow_private: bool,
    /// `POOLKEEPER_WEBHOOK_POLL_MS`: how often the delivery
    /// worker looks for due deliveries.
    pub webhook_poll: Duration,
    /// `POOLKEEPER_CAPACITY_CACHE_MS` (0: none): how long one
    /// process answers `GET /api/v1/capacity` of the same question from the
    /// snapshot it last read (R17).
    pub capacity_cache: Duration,
    /// `POOLKEEPER_WEBHOOK_BACKOFF_MS`: the first retry's
    /// delay; each further retry doubles it (capped at an hour), with jitter.
    pub webhook_backoff_base: Duration,
    /// `POOLKEEPER_WEBHOOK_LEASE_SECONDS`: the delivery
    /// worker's lease (key `webhooks`).
    pub webhook_lease_duration: Duration,
    /// `POOLKEEPER_WEBHOOK_GIVE_UP_SECONDS`: retries stop
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
    /// The defaults: every variable's declared default (`VARIABLES`,
    /// `WhenUnset::Value`) read as if it were set, over `before_defaults`.
    pub fn defaults() -> Settings {
        let mut s = Settings::before_defaults();
        for var in VARIABLES {
            if let WhenUnset::Value(value) = var.when_unset {
                // A constant of VARIABLES; `tests::every_declared_default_parses`
                // reads each one.
                (var.apply)(&mut s, var.name, value.to_owned())
                    .expect("settings::VARIABLES declares a default that parses");
            }
        }
        s
    }

    /// The settings before the declared defaults are read: the fields whose
    /// default is described rather than a value (`WhenUnset::Described`)
    /// hold it here; every other field is overwritten by `defaults`.
    fn before_defaults() -> Settings {
        Settings {
            database_url: None,
            bind: SocketAddr::from(([127, 0, 0, 1], 0)),
            metrics_bind: None,
            datacenter_module: false,
            hold_seconds: 0,
            hold_max_seconds: 0,
            sweep_period: Duration::ZERO,
            // Set with the sweep period (`POOLKEEPER_SWEEP_SECONDS`).
            lease_duration: Duration::ZERO,
            replica: default_replica_name(),
            secure_cookies: false,
            public_url: None,
            trusted_proxies: Vec::new(),
            session_idle: Duration::ZERO,
            session_max: Duration::ZERO,
            db_acquire_timeout: Duration::ZERO,
            db_pooler: DbPooler::None,
            db_statement_cache: false,
            migration_database_url: None,
            shutdown_drain: Duration::ZERO,
            refusal_retention_days: 0,
            db_max_connections: 0,
            webhook_allow_private: false,
            webhook_poll: Duration::ZERO,
            capacity_cache: Duration::ZERO,
            webhook_backoff_base: Duration::ZERO,
            webhook_lease_duration: Duration::ZERO,
            webhook_give_up: Duration::ZERO,
        }
    }

    pub fn from_env() -> Result<Settings, SettingsError> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Reads settings through `lookup`, so that tests need not touch the
    /// process environment: each of `VARIABLES`, in order, then the checks
    /// that span several.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Settings, SettingsError> {
        let mut s = Settings::defaults();
        for var in VARIABLES {
            if let Some(value) = lookup(var.name).filter(|v| !v.trim().is_empty()) {
                (var.apply)(&mut s, var.name, value)?;
            }
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

/// One variable of the configuration, declared once: `from_lookup` reads
/// it, `poolkeeper --help` lists it (`help_text`), and a test compares the
/// list with docs/configuration.md.
pub struct Variable {
    pub name: &'static str,
    /// What holds when the variable is unset: the one place its default
    /// is written.
    pub when_unset: WhenUnset,
    pub help: &'static str,
    /// Parses a set value into the settings (`name` for its error).
    apply: fn(&mut Settings, &'static str, String) -> Result<(), SettingsError>,
}

/// A variable's default.
#[derive(Debug, Clone, Copy)]
pub enum WhenUnset {
    /// This value, read as if it were set (`Settings::defaults`).
    Value(&'static str),
    /// No value: what holds instead, in words (the settings' field holds
    /// it from `Settings::before_defaults`, or the logger reads the variable).
    Described(&'static str),
}

impl Variable {
    /// The default, as docs/configuration.md and `--help` write it.
    pub fn default_text(&self) -> &'static str {
        match self.when_unset {
            WhenUnset::Value(text) | WhenUnset::Described(text) => text,
        }
    }
}

/// Read before the settings, by the logger and the trace exporter
/// (`telemetry`, the OpenTelemetry SDK): listed for the
/// documentation and `--help`; nothing to parse here.
fn read_by_the_logger(_: &mut Settings, _: &'static str, _: String) -> Result<(), SettingsError> {
    Ok(())
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// Every variable, in the order they are read and documented.
pub const VARIABLES: &[Variable] = &[
    Variable {
        name: "DATABASE_URL",
        when_unset: WhenUnset::Described("unset"),
        help: "PostgreSQL URL; unset, a private PostgreSQL under ./.poolkeeper/pg",
        apply: |s, _, v| {
            s.database_url = Some(v);
            Ok(())
        },
    },
    Variable {
        name: "POOLKEEPER_BIND",
        when_unset: WhenUnset::Value("127.0.0.1:8080"),
        help: "address to listen on",
        apply: |s, name, v| {
            s.bind = parse_addr(name, &v, "an address and port such as 127.0.0.1:8080")?;
            Ok(())
        },
    },
    Variable {
        name: "POOLKEEPER_METRICS_BIND",
        when_unset: WhenUnset::Described("unset"),
        help: "serve /metrics only on this address",
        apply: |s, name, v| {
            s.metrics_bind = Some(parse_addr(
                name,
                &v,
                "an address and port such as 127.0.0.1:9090",
            )?);
            Ok(())
        },
    },
    Variable {
        name: "POOLKEEPER_DATACENTER_MODULE",
        when_unset: WhenUnset::Value("off"),
        help: "the datacenter module's deployment switch (on/off)",
        apply: |s, name, v| {
            s.datacenter_module = parse_switch(name, &v)?;
            Ok(())
        },
    },
    Variable {
        name: "POOLKEEPER_HOLD_SECONDS",
        when_unset: WhenUnset::Value("900"),
        help: "default reservation lifetime (1-86400, at most the cap)",
        apply: |s, name, v| {
            s.hold_seconds = parse_seconds(name, &v, 1, 86_400)? as u32;
            Ok(())
        },
    },
    Variable {
        name: "POOLKEEPER_HOLD_MAX_SECONDS",
        when_unset: WhenUnset::Value("3600"),
        help: "the cap on a whole hold, from its creation (1-604800)",
        apply: |s, name, v| {
            s.hold_max_seconds = parse_seconds(name, &v, 1, 604_800)? as u32;
            Ok(())
        },
    },
    Variable {
        name: "POOLKEEPER_SWEEP_SECONDS",
        when_unset: WhenUnset::Value("60"),
        help: "sweep period (1-86400)",
        apply: |s, name, v| {
            s.sweep_period = secs(parse_seconds(name, &v, 1, 86_400)?);
            // The lease's default follows the period (read after this).
            s.lease_duration = (s.sweep_period * 3).max(secs(5));
            Ok(())
        },
    },
    Variable {
        name: "POOLKEEPER_LEASE_SECONDS",
        when_unset: WhenUnset::Described("3 × sweep period, at least 5"),
        help: "how long the sweep lease lasts without a heartbeat (1-86400)",
        apply: |s, name, v| {
            s.lease_duration = secs(parse_seconds(name, &v, 1, 86_400)?);
            Ok(())
        },
    },
    Variable {
        name: "POOLKEEPER_REPLICA",
        when_unset: WhenUnset::Described("hostname + random suffix"),
        help: "this replica's name in lease rows and logs; unique per process",
        apply: |s, _, v| {
            s.replica = v;
            Ok(())
        },
    },
    Variable {
        name: "POOLKEEPER_SECURE_COOKIES",
        when_unset: WhenUnset::Value("off"),
        help: "served behind TLS: Secure cookies with the __Host- prefix (on/off)",
        apply: |s, name, v| {
            s.secure_cookies = parse_switch(name, &v)?;
            Ok(())
        },
    },
    Variable {
        name: "POOLKEEPER_PUBLIC_URL",
        when_unset: WhenUnset::Described("unset"),
        help: "the dashboard's URL as browsers reach it (single sign-on's redirect URI is <URL>/login/sso/callback)",
        apply: |s, name, v| {
            let trimmed = v.trim().trim_end_matches('/').to_owned();
            let ok = url::Url::parse(&trimmed).is_ok_and(|u| {
                matches!(u.scheme(), "http" | "https")
                    && u.host().is_some()
                    && u.query().is_none()
                    && u.fragment().is_none()
            });
            if !ok {
                return Err(SettingsError {
                    name,
                    value: v,
                    expected: "an http or https URL such as https://pool.example.com",
                });
            }
            s.public_url = Some(trimmed);
            Ok(())
        },
    },
    Variable {
        name: "POOLKEEPER_TRUSTED_PROXIES",
        when_unset: WhenUnset::Described("none"),
        help: "reverse proxies (addresses or CIDR ranges, comma-separated) whose Forwarded/X-Forwarded-For name the client",
        apply: |s, name, v| {
            s.trusted_proxies = v
                .split(',')
                .map(str::trim)
                .filter(|p| !p.is_empty())
                .map(Cidr::parse)
                .collect::<Option<Vec<_>>>()
                .ok_or(SettingsError {
                    name,
                    value: v.clone(),
                    expected: "addresses or CIDR ranges separated by commas, such as 10.0.0.5,192.168.1.0/24",
                })?;
            Ok(())
        },
    },
    Variable {
        name: "POOLKEEPER_SESSION_IDLE_SECONDS",
        when_unset: WhenUnset::Value("1800"),
        help: "staff session idle timeout (1-86400)",
        apply: |s, name, v| {
            s.session_idle = secs(parse_seconds(name, &v, 1, 86_400)?);
            Ok(())
        },
    },
    Variable {
        name: "POOLKEEPER_SESSION_MAX_SECONDS",
        when_unset: WhenUnset::Value("43200"),
        help: "staff session absolute lifetime (1-604800)",
        apply: |s, name, v| {
            s.session_max = secs(parse_seconds(name, &v, 1, 7 * 86_400)?);
            Ok(())
        },
    },
    Variable {
        name: "POOLKEEPER_DB_MAX_CONNECTIONS",
        when_unset: WhenUnset::Value("20"),
        help: "the application pool's size (1-1000)",
        apply: |s, name, v| {
            s.db_max_connections = parse_number(name, &v, 1, 1000)? as u32;
            Ok(())
        },
    },
    Variable {
        name: "POOLKEEPER_DB_ACQUIRE_SECONDS",
        when_unset: WhenUnset::Value("2"),
        help: "how long a request waits for a connection before 503 (1-60)",
        apply: |s, name, v| {
            s.db_acquire_timeout = secs(parse_seconds(name, &v, 1, 60)?);
            Ok(())
        },
    },
    Variable {
        name: "POOLKEEPER_DB_POOLER",
        when_unset: WhenUnset::Value("none"),
        help: "none, session or transaction: what is between poolkeeper and PostgreSQL",
        apply: |s, name, v| {
            s.db_pooler = match v.trim().to_ascii_lowercase().as_str() {
                "transaction" => DbPooler::Transaction,
                "session" => DbPooler::Session,
                "none" | "off" => DbPooler::None,
                _ => {
                    return Err(SettingsError {
                        name,
                        value: v,
                        expected: "none, session or transaction",
                    });
                }
            };
            Ok(())
        },
    },
    Variable {
        name: "POOLKEEPER_DB_STATEMENT_CACHE",
        when_unset: WhenUnset::Value("on"),
        help: "off behind a transaction pooler that passes prepared statements through",
        apply: |s, name, v| {
            s.db_statement_cache = parse_switch(name, &v)?;
            Ok(())
        },
    },
    Variable {
        name: "POOLKEEPER_MIGRATION_DATABASE_URL",
        when_unset: WhenUnset::Described("unset (DATABASE_URL)"),
        help: "a direct URL as the owner role, for migrations and definitions",
        apply: |s, _, v| {
            s.migration_database_url = Some(v);
            Ok(())
        },
    },
    Variable {
        name: "POOLKEEPER_SHUTDOWN_DRAIN_SECONDS",
        when_unset: WhenUnset::Value("5"),
        help: "after SIGTERM, /readyz answers 503 this long before the listener closes (0-300)",
        apply: |s, name, v| {
            s.shutdown_drain = secs(parse_seconds(name, &v, 0, 300)?);
            Ok(())
        },
    },
    Variable {
        name: "POOLKEEPER_REFUSAL_RETENTION_DAYS",
        when_unset: WhenUnset::Value("90"),
        help: "how long refused reserves are kept (1-3650 days)",
        apply: |s, name, v| {
            s.refusal_retention_days = v
                .trim()
                .parse::<u32>()
                .ok()
                .filter(|n| (1..=3650).contains(n))
                .ok_or(SettingsError {
                    name,
                    value: v.clone(),
                    expected: "a whole number of days from 1 to 3650",
                })?;
            Ok(())
        },
    },
    Variable {
        name: "POOLKEEPER_WEBHOOK_ALLOW_PRIVATE",
        when_unset: WhenUnset::Value("off"),
        help: "let webhook URLs reach loopback and private addresses (on/off)",
        apply: |s, name, v| {
            s.webhook_allow_private = parse_switch(name, &v)?;
            Ok(())
        },
    },
    Variable {
        name: "POOLKEEPER_WEBHOOK_POLL_MS",
        when_unset: WhenUnset::Value("1000"),
        help: "how often the delivery worker looks for due deliveries (10-60000)",
        apply: |s, name, v| {
            s.webhook_poll = Duration::from_millis(parse_number(name, &v, 10, 60_000)?);
            Ok(())
        },
    },
    Variable {
        name: "POOLKEEPER_CAPACITY_CACHE_MS",
        when_unset: WhenUnset::Value("1000"),
        help: "how long a capacity answer is served from the snapshot last read, per process (0-60000; 0: every request reads)",
        apply: |s, name, v| {
            s.capacity_cache = Duration::from_millis(parse_number(name, &v, 0, 60_000)?);
            Ok(())
        },
    },
    Variable {
        name: "POOLKEEPER_WEBHOOK_BACKOFF_MS",
        when_unset: WhenUnset::Value("10000"),
        help: "delay before a failed delivery's first retry (1-3600000)",
        apply: |s, name, v| {
            s.webhook_backoff_base = Duration::from_millis(parse_number(name, &v, 1, 3_600_000)?);
            Ok(())
        },
    },
    Variable {
        name: "POOLKEEPER_WEBHOOK_LEASE_SECONDS",
        when_unset: WhenUnset::Value("30"),
        help: "the delivery worker's lease (1-3600)",
        apply: |s, name, v| {
            s.webhook_lease_duration = secs(parse_seconds(name, &v, 1, 3_600)?);
            Ok(())
        },
    },
    Variable {
        name: "POOLKEEPER_WEBHOOK_GIVE_UP_SECONDS",
        when_unset: WhenUnset::Value("86400"),
        help: "retries of a delivery stop this long after its event (1-604800)",
        apply: |s, name, v| {
            s.webhook_give_up = secs(parse_seconds(name, &v, 1, 7 * 86_400)?);
            Ok(())
        },
    },
    Variable {
        name: "RUST_LOG",
        when_unset: WhenUnset::Value("info,sqlx=warn,actix_server=warn"),
        help: "log filter (the logs only, never the exported spans)",
        apply: read_by_the_logger,
    },
    Variable {
        name: "POOLKEEPER_LOG_FORMAT",
        when_unset: WhenUnset::Value("text"),
        help: "json for one JSON object per log line",
        apply: read_by_the_logger,
    },
    Variable {
        name: "OTEL_EXPORTER_OTLP_ENDPOINT",
        when_unset: WhenUnset::Described("unset"),
        help: "OTLP/HTTP collector (spans to <endpoint>/v1/traces); unset, no trace is exported",
        apply: read_by_the_logger,
    },
    Variable {
        name: "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        when_unset: WhenUnset::Described("unset"),
        help: "the full URL for spans, instead of the endpoint above",
        apply: read_by_the_logger,
    },
    Variable {
        name: "OTEL_SERVICE_NAME",
        when_unset: WhenUnset::Value("poolkeeper"),
        help: "service.name of the exported spans",
        apply: read_by_the_logger,
    },
    Variable {
        name: "OTEL_TRACES_SAMPLER",
        when_unset: WhenUnset::Described("parentbased_always_on"),
        help: "sampler, e.g. parentbased_traceidratio",
        apply: read_by_the_logger,
    },
    Variable {
        name: "OTEL_TRACES_SAMPLER_ARG",
        when_unset: WhenUnset::Described("unset"),
        help: "the sampler's ratio, e.g. 0.01",
        apply: read_by_the_logger,
    },
];

/// An address range of `POOLKEEPER_TRUSTED_PROXIES`: an address alone is
/// a range of one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl Cidr {
    pub fn parse(text: &str) -> Option<Cidr> {
        let (addr, prefix) = match text.split_once('/') {
            Some((a, p)) => (a.parse::<IpAddr>().ok()?, Some(p.parse::<u8>().ok()?)),
            None => (text.parse::<IpAddr>().ok()?, None),
        };
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = prefix.unwrap_or(max);
        (prefix <= max).then_some(Cidr { addr, prefix })
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        // An IPv4 peer may arrive as an IPv4-mapped IPv6 address.
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
            v4 => v4,
        };
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

/// The declared default value of variable `name` (`WhenUnset::Value`), for
/// the code that reads it outside `Settings` (the logger).
pub fn declared_default(name: &str) -> Option<&'static str> {
    VARIABLES
        .iter()
        .find(|v| v.name == name)
        .and_then(|v| match v.when_unset {
            WhenUnset::Value(value) => Some(value),
            WhenUnset::Described(_) => None,
        })
}

/// The variables for `--help`: one line each, with the default.
pub fn help_text() -> String {
    let mut out = String::from("Configuration (environment; a .env file may add to it):\n");
    for v in VARIABLES {
        out.push_str(&format!(
            "  {:<36} {} [default: {}]\n",
            v.name,
            v.help,
            v.default_text()
        ));
    }
    out
}

fn parse_addr(
    name: &'static str,
    value: &str,
    expected: &'static str,
) -> Result<SocketAddr, SettingsError> {
    value.trim().parse().map_err(|_| SettingsError {
        name,
        value: value.to_owned(),
        expected,
    })
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
    fn trusted_proxies_are_addresses_or_ranges() {
        let s = Settings::from_lookup(|n| {
            (n == "POOLKEEPER_TRUSTED_PROXIES").then(|| "10.0.0.5, 192.168.1.0/24,::1".to_owned())
        })
        .expect("parses");
        let has = |ip: &str| {
            s.trusted_proxies
                .iter()
                .any(|c| c.contains(ip.parse().expect("ip")))
        };
        assert!(has("10.0.0.5") && !has("10.0.0.6"));
        assert!(has("192.168.1.200") && !has("192.168.2.1"));
        assert!(has("::1") && has("::ffff:192.168.1.7"));
        assert!(
            Cidr::parse("0.0.0.0/0").is_some_and(|c| c.contains("8.8.8.8".parse().expect("ip")))
        );
        for bad in ["10.0.0.0/33", "example.com", "10.0.0.1/x"] {
            assert!(
                Settings::from_lookup(
                    |n| (n == "POOLKEEPER_TRUSTED_PROXIES").then(|| bad.to_owned())
                )
                .is_err(),
                "{bad}"
            );
        }
        let url = Settings::from_lookup(|n| {
            (n == "POOLKEEPER_PUBLIC_URL").then(|| "https://pool.example.com/".to_owned())
        })
        .expect("parses");
        assert_eq!(url.public_url.as_deref(), Some("https://pool.example.com"));
        assert!(
            Settings::from_lookup(
                |n| (n == "POOLKEEPER_PUBLIC_URL").then(|| "pool.example.com".to_owned())
            )
            .is_err()
        );
    }

    #[test]
    fn every_declared_default_parses_and_is_the_default() {
        let defaults = Settings::defaults();
        for var in VARIABLES {
            if let WhenUnset::Value(value) = var.when_unset {
                let mut s = defaults.clone();
                (var.apply)(&mut s, var.name, value.to_owned())
                    .unwrap_or_else(|e| panic!("{}'s declared default: {e}", var.name));
                assert_eq!(format!("{s:?}"), format!("{defaults:?}"), "{}", var.name);
            }
        }
        let unset = Settings::from_lookup(|_| None).expect("defaults parse");
        assert_eq!(unset.lease_duration, (unset.sweep_period * 3).max(secs(5)));
        assert!(unset.database_url.is_none() && unset.migration_database_url.is_none());
        assert!(unset.metrics_bind.is_none());
        assert_eq!(
            declared_default("POOLKEEPER_HOLD_SECONDS"),
            Some(unset.hold_seconds.to_string().as_str())
        );
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
