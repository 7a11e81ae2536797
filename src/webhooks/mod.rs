//! Reservation events for the order service: each
//! organization may register one webhook URL; every event of its
//! reservations is put in the outbox (`webhook_deliveries`) by a trigger in
//! the transaction that wrote the event (see `sql/webhook_outbox.sql` for
//! why a trigger and why no cursor), and
//! the delivery worker here POSTs it, signed, at least once.
//!
//! The worker runs on every replica; the lease of key `webhooks` keeps it on
//! one (held by `lease::Holder`, as the sweep's, L1-L6). Every write made on
//! behalf of the lease carries its holder and fence and checks them in the
//! same statement, with the lease row taken FOR SHARE: a paused holder that
//! wakes after losing the lease may POST (a duplicate, allowed) but records
//! nothing. A holder killed mid-batch recorded nothing for what it was
//! sending, so the next holder sends it again: duplicates, never losses.
//!
//! Order and isolation: a delivery is due only when no earlier event of the
//! same reservation is pending, so one reservation's events arrive in order.
//! Different reservations and organizations go concurrently (bounded), with
//! at most `PER_ORG` in flight per organization, so a slow or failing
//! endpoint holds only its own organization's slots; the sweep has its own
//! lease, pool and task and never waits on this worker.

pub mod delivery;
pub mod outbox;
pub mod registration;
pub mod signatures;
pub mod urls;
pub mod worker;

pub use delivery::{
    BACKOFF_CAP, HEADER_ATTEMPT, HEADER_EVENT_ID, HEADER_SIGNATURE, HEADER_TIMESTAMP, backoff, post,
};
pub use outbox::{
    Attempt, Backlog, DUE_SQL, DeliveryError, Due, Failure, WEBHOOKS_KEY, backlog, drop_orphans,
    due, recent_failures, record_attempt,
};
pub use registration::{Saved, Webhook, get, remove_on, rotate_secret_on, set_on};
pub use signatures::{generate_secret, sign, signature_header};
pub use urls::{
    MAX_URL_LEN, REQUEST_TIMEOUT, UrlError, check_destination, check_ip, http_client, is_internal,
    parse_url,
};
pub use worker::{CONCURRENCY, PER_ORG, Step, WorkerConfig, run, run_once};
