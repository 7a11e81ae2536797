//! Structured logs with tracing, and OpenTelemetry traces over OTLP.
//!
//! Logs: `RUST_LOG` filters them, and only them (the
//! exported spans have a filter of their own); `POOLKEEPER_LOG_FORMAT=json`
//! prints one JSON object per line. A request's log lines carry its
//! `trace_id` (tracing-actix-web's root span).
//!
//! Traces are off unless `OTEL_EXPORTER_OTLP_ENDPOINT` (or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set: then spans are exported
//! over OTLP/HTTP (protobuf), in batches from a thread of their own, to
//! `<endpoint>/v1/traces`, sampled as `OTEL_TRACES_SAMPLER` and
//! `OTEL_TRACES_SAMPLER_ARG` say (default: follow the caller's `traceparent`,
//! else sample every trace), named `OTEL_SERVICE_NAME`
//! (the defaults are in `settings::VARIABLES`). A `traceparent` header continues the caller's trace.

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::Layer as _;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// The OTLP variables this process honours (the standard ones), for the
/// configuration's one table (`settings::VARIABLES` lists them too).
pub const OTLP_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
pub const OTLP_TRACES_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT";
pub const SERVICE_NAME: &str = "OTEL_SERVICE_NAME";

/// Whether this process exports spans (set once by `init`).
static EXPORTING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// True when spans are exported: then a request's trace id is its span's.
pub fn exporting() -> bool {
    EXPORTING.load(std::sync::atomic::Ordering::Relaxed)
}

/// The request's root span. Exporting, tracing-actix-web's own: it
/// continues the caller's `traceparent` and records our `trace_id`.
/// Not exporting, no trace is made here, so no `trace_id` is invented (the
/// default would log one of zeros): the log line carries the caller's
/// trace id from its `traceparent`, when it sent one, as `trace_id`.
pub struct RootSpan;

impl tracing_actix_web::RootSpanBuilder for RootSpan {
    fn on_request_start(request: &actix_web::dev::ServiceRequest) -> tracing::Span {
        use actix_web::HttpMessage as _;
        use tracing_actix_web::DefaultRootSpanBuilder;
        if exporting() {
            return DefaultRootSpanBuilder::on_request_start(request);
        }
        let method = request.method().as_str();
        let route = request
            .match_pattern()
            .unwrap_or_else(|| "default".to_owned());
        let request_id = request
            .extensions()
            .get::<tracing_actix_web::RequestId>()
            .map(|id| id.to_string())
            .unwrap_or_default();
        let caller = request
            .headers()
            .get("traceparent")
            .and_then(|v| v.to_str().ok())
            .and_then(caller_trace_id);
        tracing::info_span!(
            "HTTP request",
            http.method = %method,
            http.route = %route,
            http.target = %request.uri().path(),
            http.status_code = tracing::field::Empty,
            otel.name = %format!("{method} {route}"),
            otel.kind = "server",
            otel.status_code = tracing::field::Empty,
            trace_id = caller.as_deref(),
            request_id = %request_id,
            exception.message = tracing::field::Empty,
            exception.details = tracing::field::Empty,
        )
    }

    fn on_request_end<B: actix_web::body::MessageBody>(
        span: tracing::Span,
        outcome: &Result<actix_web::dev::ServiceResponse<B>, actix_web::Error>,
    ) {
        tracing_actix_web::DefaultRootSpanBuilder::on_request_end(span, outcome);
    }
}

/// The trace id of a W3C `traceparent` (`00-<32 hex>-<16 hex>-<2 hex>`),
/// when it is one and not all zeros.
fn caller_trace_id(header: &str) -> Option<String> {
    let mut parts = header.trim().split('-');
    let (version, trace, span, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
    (hex(version, 2)
        && hex(trace, 32)
        && hex(span, 16)
        && hex(flags, 2)
        && trace.bytes().any(|b| b != b'0'))
    .then(|| trace.to_ascii_lowercase())
}

/// Keeps the exporter alive; dropping it flushes the spans not yet sent.
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// True when spans are exported.
    pub fn exporting(&self) -> bool {
        self.provider.is_some()
    }

    /// Sends what is buffered and stops the exporter (on shutdown).
    pub fn shutdown(&mut self) {
        if let Some(provider) = self.provider.take()
            && let Err(e) = provider.shutdown()
        {
            eprintln!("poolkeeper: flushing traces failed: {e}");
        }
    }
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Whether traces are to be exported, read from `lookup` (the environment).
pub fn otlp_enabled(lookup: impl Fn(&str) -> Option<String>) -> bool {
    [OTLP_ENDPOINT, OTLP_TRACES_ENDPOINT]
        .iter()
        .any(|v| lookup(v).is_some_and(|s| !s.trim().is_empty()))
}

fn tracer_provider() -> Result<SdkTracerProvider, opentelemetry_otlp::ExporterBuildError> {
    use opentelemetry_otlp::{Protocol, WithExportConfig};
    // The endpoint, timeout and headers come from the standard variables.
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .build()?;
    let name = std::env::var(SERVICE_NAME)
        .ok()
        .filter(|s| !s.trim().is_empty())
        .or_else(|| crate::settings::declared_default(SERVICE_NAME).map(str::to_owned))
        .unwrap_or_default();
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(
            opentelemetry_sdk::Resource::builder()
                .with_service_name(name)
                .build(),
        )
        .build())
}

/// What is exported, whatever `RUST_LOG` says (it filters the logs only):
/// poolkeeper's spans and events and tracing-actix-web's request span, at
/// INFO and above; the sampler then decides which traces leave.
fn exported() -> tracing_subscriber::filter::Targets {
    tracing_subscriber::filter::Targets::new()
        .with_target("poolkeeper", tracing::Level::INFO)
        .with_target("tracing_actix_web", tracing::Level::INFO)
}

/// The log layer, written to `writer`: `RUST_LOG` filters it,
/// `POOLKEEPER_LOG_FORMAT=json` makes it JSON lines.
fn logs<S, W>(writer: W) -> impl tracing_subscriber::Layer<S>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        EnvFilter::new(crate::settings::declared_default("RUST_LOG").unwrap_or_default())
    });
    let json = std::env::var("POOLKEEPER_LOG_FORMAT").is_ok_and(|v| v.eq_ignore_ascii_case("json"));
    let fmt = tracing_subscriber::fmt::layer().with_writer(writer);
    let fmt = if json {
        fmt.json().boxed()
    } else {
        fmt.compact().boxed()
    };
    fmt.with_filter(filter)
}

/// Installs a global subscriber of the logs alone, written to `writer`, and
/// exports no traces: for servers run inside a test process, whose harness
/// chooses stdout or a sink. Does nothing when a subscriber is installed.
pub fn init_logs<W>(writer: W)
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let _ = tracing_subscriber::registry().with(logs(writer)).try_init();
}

/// Installs the global subscriber (logs on stderr, and the OpenTelemetry
/// layer when traces are exported), each layer with its own filter: a quiet
/// `RUST_LOG` (`warn` in production) must not silence the traces. Call
/// once, before the runtime starts: the exporter's HTTP client is a
/// blocking one, on the batch thread.
pub fn init() -> Telemetry {
    let provider = if otlp_enabled(|v| std::env::var(v).ok()) {
        match tracer_provider() {
            Ok(p) => Some(p),
            Err(e) => {
                eprintln!("poolkeeper: traces are off: the OTLP exporter could not be built: {e}");
                None
            }
        }
    } else {
        None
    };
    EXPORTING.store(provider.is_some(), std::sync::atomic::Ordering::Relaxed);
    let otel = provider.as_ref().map(|p| {
        opentelemetry::global::set_text_map_propagator(
            opentelemetry_sdk::propagation::TraceContextPropagator::new(),
        );
        opentelemetry::global::set_tracer_provider(p.clone());
        tracing_opentelemetry::layer()
            .with_tracer(p.tracer("poolkeeper"))
            .with_filter(exported())
    });
    // try_init: tests may initialise more than once.
    let _ = tracing_subscriber::registry()
        .with(logs(std::io::stderr))
        .with(otel)
        .try_init();
    Telemetry { provider }
}

/// The W3C `traceparent` of the current span when it is sampled: written
/// as a comment before a statement, so that the statement in
/// `pg_stat_activity` or the PostgreSQL log leads back to its trace.
/// `None` when the span is not sampled (then nothing of it is exported).
pub fn sampled_traceparent() -> Option<String> {
    use opentelemetry::trace::TraceContextExt;
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    let cx = tracing::Span::current().context();
    let span = cx.span();
    let sc = span.span_context();
    (sc.is_valid() && sc.is_sampled()).then(|| format!("00-{}-{}-01", sc.trace_id(), sc.span_id()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traces_are_off_unless_an_endpoint_is_set() {
        assert!(!otlp_enabled(|_| None));
        assert!(!otlp_enabled(|_| Some("  ".to_owned())));
        assert!(otlp_enabled(
            |v| (v == OTLP_ENDPOINT).then(|| "http://127.0.0.1:4318".to_owned())
        ));
        assert!(otlp_enabled(
            |v| (v == OTLP_TRACES_ENDPOINT).then(|| "http://127.0.0.1:4318/v1/traces".to_owned())
        ));
        // Without a subscriber layer, no span is sampled: no comment.
        assert_eq!(sampled_traceparent(), None);
    }

    #[test]
    fn only_a_well_formed_traceparent_gives_a_trace_id() {
        assert_eq!(
            caller_trace_id("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").as_deref(),
            Some("4bf92f3577b34da6a3ce929d0e0e4736")
        );
        for bad in [
            "",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "zz-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert_eq!(caller_trace_id(bad), None, "{bad}");
        }
    }
}
