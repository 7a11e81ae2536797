//! `/jobs`: the sweep's lease (L1), its last runs and recent lease errors
//! (L6), so that a job that stopped running is visible; and the webhook
//! delivery worker's lease, its backlog and the last failed deliveries.

use crate::db::Db;
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;
use chrono::{DateTime, Utc};

use super::error::DashError;
use super::session::Staff;
use super::view::{Chrome, fmt_opt_time, fmt_time, page};

#[derive(sqlx::FromRow)]
struct LeaseRow {
    holder: String,
    fence: i64,
    acquired_at: DateTime<Utc>,
    expires_at: DateTime<Utc>,
    live: bool,
}

pub struct LeaseView {
    pub holder: String,
    pub fence: i64,
    pub acquired_at: String,
    pub expires_at: String,
    pub live: bool,
}

#[derive(sqlx::FromRow)]
struct RunRow {
    replica: String,
    lease_fence: i64,
    started_at: DateTime<Utc>,
    finished_at: Option<DateTime<Utc>>,
    expired: i32,
}

pub struct RunView {
    pub replica: String,
    pub lease_fence: i64,
    pub started_at: String,
    pub finished_at: String,
    pub expired: i32,
}

#[derive(sqlx::FromRow)]
struct ErrRow {
    key: String,
    replica: String,
    at: DateTime<Utc>,
    message: String,
}

#[derive(Template)]
#[template(path = "jobs.html")]
struct JobsPage {
    chrome: Chrome,
    webhooks_lease: Option<LeaseView>,
    backlog: super::org_settings::BacklogView,
    failures: Vec<super::org_settings::FailureView>,
    lease: Option<LeaseView>,
    runs: Vec<RunView>,
    errors: Vec<(String, String, String, String)>,
}

pub(crate) async fn jobs(
    req: HttpRequest,
    staff: Staff,
    pool: web::Data<Db>,
) -> Result<HttpResponse, DashError> {
    let lease: Option<LeaseRow> = sqlx::query_as(
        "SELECT holder, fence, acquired_at, expires_at, expires_at > clock_timestamp() AS live
           FROM leases WHERE key = 'sweep'",
    )
    .fetch_optional(pool.get_ref())
    .await?;
    let webhooks_lease: Option<LeaseRow> = sqlx::query_as(
        "SELECT holder, fence, acquired_at, expires_at, expires_at > clock_timestamp() AS live
           FROM leases WHERE key = $1",
    )
    .bind(crate::webhooks::WEBHOOKS_KEY)
    .fetch_optional(pool.get_ref())
    .await?;
    // The backlog is the worker's, all organizations together (counts
    // only, as the sweep's runs); failures name URLs, so only this staff
    // member's organization's are listed.
    let b = crate::webhooks::backlog(pool.get_ref(), None).await?;
    let failures = crate::webhooks::recent_failures(pool.get_ref(), Some(staff.org_id), 20).await?;
    let runs: Vec<RunRow> = sqlx::query_as(
        "SELECT replica, lease_fence, started_at, finished_at, expired
           FROM sweep_runs ORDER BY started_at DESC LIMIT 20",
    )
    .fetch_all(pool.get_ref())
    .await?;
    let errors: Vec<ErrRow> = sqlx::query_as(
        "SELECT key, replica, at, message FROM lease_errors ORDER BY at DESC LIMIT 20",
    )
    .fetch_all(pool.get_ref())
    .await?;
    page(&JobsPage {
        chrome: Chrome::new(&req, &staff, "Jobs", "jobs"),
        webhooks_lease: webhooks_lease.map(lease_view),
        backlog: super::org_settings::BacklogView {
            pending: b.pending,
            due: b.due,
            oldest_pending: fmt_opt_time(&b.oldest_pending),
            delivered_24h: b.delivered_24h,
            failed_24h: b.failed_24h,
        },
        failures: failures
            .into_iter()
            .map(super::org_settings::failure_view)
            .collect(),
        lease: lease.map(|l| LeaseView {
            holder: l.holder,
            fence: l.fence,
            acquired_at: fmt_time(&l.acquired_at),
            expires_at: fmt_time(&l.expires_at),
            live: l.live,
        }),
        runs: runs
            .into_iter()
            .map(|r| RunView {
                replica: r.replica,
                lease_fence: r.lease_fence,
                started_at: fmt_time(&r.started_at),
                finished_at: fmt_opt_time(&r.finished_at),
                expired: r.expired,
            })
            .collect(),
        errors: errors
            .into_iter()
            .map(|e| (fmt_time(&e.at), e.key, e.replica, e.message))
            .collect(),
    })
}

fn lease_view(l: LeaseRow) -> LeaseView {
    LeaseView {
        holder: l.holder,
        fence: l.fence,
        acquired_at: fmt_time(&l.acquired_at),
        expires_at: fmt_time(&l.expires_at),
        live: l.live,
    }
}
