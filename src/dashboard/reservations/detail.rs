//! `/reservations/{id}`: one reservation, its timeline with actors, the
//! one-sentence answer (cancelled by whom, timed out, converted, held until
//! when), and for an order of several its other machines.

use crate::db::Db;
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;

use super::super::error::DashError;
use super::super::outcome;
use super::super::session::Staff;
use super::super::view::{Chrome, fmt_opt_time, fmt_remaining, fmt_time, page};
use crate::domain::EventKind;
use crate::holds::{self, HoldMachine, OrderLine};
use crate::reservations;

pub struct EventView {
    pub at: String,
    pub kind: String,
    pub from_state: String,
    pub to_state: String,
    pub actor: String,
    pub detail: String,
    pub replica: String,
}

#[derive(Template)]
#[template(path = "reservation.html")]
struct ReservationPage {
    chrome: Chrome,
    r: reservations::Reservation,
    m: HoldMachine,
    sentence: String,
    created_at: String,
    expires_at: String,
    ended_at: String,
    remaining_text: String,
    held: bool,
    overdue: bool,
    can_act: bool,
    events: Vec<EventView>,
    order: Vec<OrderLine>,
    /// R15: the last time the hold moved to another machine (when, by whom,
    /// the event's words: from which machine and why).
    replaced: Option<(String, String, String)>,
}

/// The reservation and its machine; another organization's is absent.
pub(super) async fn load(
    pool: &Db,
    staff: &Staff,
    id: i64,
) -> Result<(reservations::Reservation, HoldMachine), DashError> {
    // Another organization's reservation is absent: 404, never 403.
    let r = reservations::get(pool, staff.org_id, id)
        .await?
        .ok_or(DashError::NotFound("reservation"))?;
    let m = holds::machine_of(pool, staff.org_id, id)
        .await?
        .ok_or(DashError::NotFound("reservation"))?;
    Ok((r, m))
}

pub(crate) async fn detail(
    req: HttpRequest,
    staff: Staff,
    pool: web::Data<Db>,
    id: web::Path<i64>,
) -> Result<HttpResponse, DashError> {
    let id = id.into_inner();
    let (r, m) = load(&pool, &staff, id).await?;
    let events = reservations::events(&pool, staff.org_id, id).await?;
    let sentence = outcome::sentence(&r, &events, m.service_ref.as_deref(), m.remaining);
    let order = holds::order_lines(&pool, staff.org_id, &r).await?;
    page(&ReservationPage {
        order,
        chrome: Chrome::new(&req, &staff, format!("Reservation {id}"), "reservations"),
        sentence,
        created_at: fmt_time(&r.created_at),
        expires_at: fmt_time(&r.expires_at),
        ended_at: fmt_opt_time(&r.ended_at),
        remaining_text: fmt_remaining(m.remaining),
        held: r.state.is_held(),
        overdue: r.state.is_held() && m.remaining <= 0,
        can_act: staff.can_act(),
        replaced: events
            .iter()
            .rev()
            .find(|e| e.kind == EventKind::MachineReplaced)
            .map(|e| {
                (
                    fmt_time(&e.at),
                    e.actor.clone(),
                    e.detail.clone().unwrap_or_default(),
                )
            }),
        events: events
            .into_iter()
            .map(|e| EventView {
                at: fmt_time(&e.at),
                kind: e.kind.to_string(),
                from_state: e.from_state.map(|s| s.to_string()).unwrap_or_default(),
                to_state: e.to_state.to_string(),
                actor: e.actor,
                detail: e.detail.unwrap_or_default(),
                replica: match (e.replica, e.lease_fence) {
                    (Some(rep), Some(f)) => format!("{rep} (lease fence {f})"),
                    (Some(rep), None) => rep,
                    _ => String::new(),
                },
            })
            .collect(),
        r,
        m,
    })
}
