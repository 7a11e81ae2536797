//! `/status-changes`: the datacenter team changes the status of one
//! machine or many (a rack into maintenance). GET without a change shows
//! the form; GET with one shows what it would do to the holds on those
//! machines now (R15: moved to which machine, or which order cancelled
//! whole), made and rolled back; POST makes it, in one transaction with its
//! audit row, and says what it did.

use crate::db::Db;
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;
use serde::Deserialize;

use super::error::{DashError, Written, commit};
use super::session::{Staff, audit_on};
use super::view::{Chrome, page};
use crate::domain::{AssetTag, MachineStatus};
use crate::healing::{self, Changed, HoldOutcome, Refused, StatusChange};

#[derive(Debug, Default, Deserialize)]
pub struct ChangeQuery {
    /// Asset tags, separated by spaces, commas or line breaks.
    #[serde(default)]
    pub tags: String,
    #[serde(default)]
    pub status: String,
}

/// Fields are strings with defaults: a missing or malformed one gets the
/// handler's own message, not the form parser's. The CSRF token is checked
/// before the handler (`gate::check`).
#[derive(Debug, Deserialize)]
pub struct ChangeForm {
    #[serde(default)]
    pub tags: String,
    #[serde(default)]
    pub status: String,
}

pub struct HoldLine {
    pub reservation_id: i64,
    pub order_ref: String,
    pub moved: bool,
    pub from: String,
    pub to: String,
    pub reason: String,
}

impl HoldLine {
    fn of(h: HoldOutcome) -> HoldLine {
        match h {
            HoldOutcome::Moved {
                reservation_id,
                order_ref,
                from,
                to,
            } => HoldLine {
                reservation_id,
                order_ref,
                moved: true,
                from,
                to,
                reason: String::new(),
            },
            HoldOutcome::Cancelled {
                reservation_id,
                order_ref,
                machine,
                reason,
            } => HoldLine {
                reservation_id,
                order_ref,
                moved: false,
                from: machine,
                to: String::new(),
                reason,
            },
        }
    }
}

pub struct MachineLine {
    pub asset_tag: String,
    pub site: String,
    pub status: String,
}

#[derive(Template)]
#[template(path = "status_change.html")]
struct ChangePage {
    chrome: Chrome,
    /// "form", "preview" or "done".
    stage: &'static str,
    tags: String,
    status: String,
    statuses: Vec<&'static str>,
    machines: Vec<MachineLine>,
    holds: Vec<HoldLine>,
    moved: usize,
    cancelled_orders: usize,
}

/// The tags as typed: split on spaces, commas and line breaks, each parsed
/// as an asset tag, repeats dropped, at most `healing::MAX_MACHINES`.
fn parse_tags(typed: &str) -> Result<Vec<AssetTag>, DashError> {
    let mut tags: Vec<AssetTag> = Vec::new();
    for word in typed
        .split(|c: char| c.is_whitespace() || c == ',')
        .filter(|w| !w.is_empty())
    {
        let tag = AssetTag::parse(word).map_err(|e| {
            DashError::bad_request(format!("{e} (in {word:?}); nothing was changed."))
        })?;
        if !tags.contains(&tag) {
            tags.push(tag);
        }
    }
    if tags.is_empty() {
        return Err(DashError::bad_request(
            "Name at least one machine by its asset tag; nothing was changed.",
        ));
    }
    if tags.len() > healing::MAX_MACHINES {
        return Err(DashError::bad_request(format!(
            "At most {} machines at once; nothing was changed.",
            healing::MAX_MACHINES
        )));
    }
    Ok(tags)
}

/// The tags as the pages and the audit row write them: one line.
fn joined(tags: &[AssetTag]) -> String {
    tags.iter()
        .map(AssetTag::as_str)
        .collect::<Vec<_>>()
        .join(" ")
}

fn parse_status(typed: &str) -> Result<MachineStatus, DashError> {
    MachineStatus::parse(typed.trim())
        .map_err(|e| DashError::bad_request(format!("{e}; nothing was changed.")))
}

fn unknown(tags: &[String]) -> DashError {
    DashError::Stale {
        heading: "Unknown machines".into(),
        message: format!(
            "No machine {} in your organization, so nothing was changed.",
            tags.join(", ")
        ),
        link: Some(("/machines".into(), "Open the machines list".into())),
    }
}

fn render(
    req: &HttpRequest,
    staff: &Staff,
    stage: &'static str,
    tags: String,
    status: String,
    changed: Option<Changed>,
) -> Result<HttpResponse, DashError> {
    let (machines, holds) = changed.map_or((Vec::new(), Vec::new()), |c| {
        (
            c.machines
                .into_iter()
                .map(|m| MachineLine {
                    asset_tag: m.asset_tag,
                    site: m.site,
                    status: m.status,
                })
                .collect(),
            c.holds.into_iter().map(HoldLine::of).collect::<Vec<_>>(),
        )
    });
    let moved = holds.iter().filter(|h| h.moved).count();
    let mut orders: Vec<&str> = holds
        .iter()
        .filter(|h| !h.moved)
        .map(|h| h.order_ref.as_str())
        .collect();
    orders.dedup();
    let cancelled_orders = orders.len();
    page(&ChangePage {
        chrome: Chrome::new(req, staff, "Change machine status", "machines"),
        stage,
        tags,
        status,
        statuses: MachineStatus::ALL.iter().map(|s| s.as_str()).collect(),
        machines,
        holds,
        moved,
        cancelled_orders,
    })
}

pub(crate) async fn show(
    req: HttpRequest,
    staff: Staff,
    pool: web::Data<Db>,
    q: web::Query<ChangeQuery>,
) -> Result<HttpResponse, DashError> {
    let q = q.into_inner();
    if q.tags.trim().is_empty() && q.status.trim().is_empty() {
        return render(
            &req,
            &staff,
            "form",
            String::new(),
            "maintenance".into(),
            None,
        );
    }
    let tags = parse_tags(&q.tags)?;
    let status = parse_status(&q.status)?;
    let change = StatusChange {
        org_id: staff.org_id,
        tags: &tags,
        status,
        actor: &staff.email,
    };
    let changed = match healing::preview(&pool, &change).await? {
        Ok(c) => c,
        Err(Refused::Unknown(t)) => return Err(unknown(&t)),
    };
    let typed = joined(&tags);
    render(
        &req,
        &staff,
        "preview",
        typed,
        status.as_str().into(),
        Some(changed),
    )
}

pub(crate) async fn apply(
    req: HttpRequest,
    staff: Staff,
    pool: web::Data<Db>,
    form: web::Form<ChangeForm>,
) -> Result<HttpResponse, DashError> {
    let tags = parse_tags(&form.tags)?;
    let status = parse_status(&form.status)?;
    let change = StatusChange {
        org_id: staff.org_id,
        tags: &tags,
        status,
        actor: &staff.email,
    };
    let mut tx = pool.begin().await?;
    let changed = match healing::change_status(&mut tx, &change).await? {
        Ok(c) => c,
        Err(Refused::Unknown(t)) => return Err(unknown(&t)),
    };
    let typed = joined(&tags);
    let mut detail = format!("status {} for {typed}", status.as_str());
    for h in &changed.holds {
        detail.push_str("; ");
        detail.push_str(&healing::describe(h));
    }
    let object = if tags.len() == 1 {
        format!("machine:{typed}")
    } else {
        format!("machines:{}", tags.len())
    };
    audit_on(
        &mut tx,
        &req,
        &staff,
        crate::audit::AuditAction::MachineStatus,
        &object,
        Some(&detail),
    )
    .await?;
    let again = format!(
        "/status-changes?tags={}&status={}",
        typed.replace(' ', "+"),
        status.as_str()
    );
    commit(
        tx,
        Written::new(
            format!("the status change of {typed} to {}", status.as_str()),
            "Open the machines to see their status now, or review the change again: a machine \
             already in that status is not changed twice.",
            (&again, "Review the change again"),
        ),
    )
    .await?;
    render(
        &req,
        &staff,
        "done",
        typed,
        status.as_str().into(),
        Some(changed),
    )
}
