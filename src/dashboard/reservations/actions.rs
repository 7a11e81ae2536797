//! Cancel, convert and extend (R14) from the dashboard: a GET confirmation
//! page, then a POST form checked in the order session, CSRF, role, module
//! switch (R12) (the route's `gate::Access`), then its input; the action
//! and its audit row commit together. On a
//! reservation of an order of several (R13) they act on the whole order.

use crate::db::Db;
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;
use serde::Deserialize;

use super::super::error::{DashError, Written, commit};
use super::super::layout::Flash;
use super::super::session::{Staff, audit_on};
use super::super::view::{Chrome, fmt_remaining, fmt_time, page, see_other};
use super::detail::load;
use crate::domain::{ReservationState, ServiceRef};
use crate::holds::{self, HoldMachine, OrderLine};
use crate::reservations::{self, Named, OrderAction, TransitionError};
use crate::settings::Settings;

#[derive(Debug, Deserialize)]
pub struct FenceQuery {
    pub fence: Option<i64>,
}

#[derive(Template)]
#[template(path = "confirm.html")]
struct ConfirmPage {
    chrome: Chrome,
    action: &'static str,
    r: reservations::Reservation,
    m: HoldMachine,
    fence: i64,
    remaining_text: String,
    overdue: bool,
    /// R13: the order's machines when it has several (the action is on all
    /// of them); empty for an order of one.
    order: Vec<OrderLine>,
    /// The extension's choices, in minutes from now, within the cap.
    extend_choices: Vec<u32>,
    /// R14's cap, in words.
    cap_text: String,
}

/// The extension's choices offered on the page, in minutes from now (any
/// whole number of seconds up to the cap is accepted).
pub const EXTEND_CHOICES: [u32; 5] = [5, 10, 15, 30, 60];

async fn confirm(
    req: HttpRequest,
    staff: Staff,
    settings: web::Data<Settings>,
    pool: web::Data<Db>,
    id: i64,
    fence: Option<i64>,
    action: &'static str,
) -> Result<HttpResponse, DashError> {
    let (r, m) = load(&pool, &staff, id).await?;
    if !r.state.is_held() {
        return Err(not_held(id, r.state));
    }
    let order = holds::order_lines(&pool, staff.org_id, &r).await?;
    page(&ConfirmPage {
        order,
        extend_choices: EXTEND_CHOICES
            .into_iter()
            .filter(|m| m * 60 <= settings.hold_max_seconds)
            .collect(),
        cap_text: fmt_duration(settings.hold_max_seconds),
        chrome: Chrome::new(
            &req,
            &staff,
            if r.quantity > 1 {
                format!("Confirm: {action} order {}", r.order_ref)
            } else {
                format!("Confirm: {action} reservation {id}")
            },
            "reservations",
        ),
        action,
        // The fence the page that linked here showed: acting on it later
        // fails cleanly if the reservation changed in between.
        fence: fence.unwrap_or(r.fence),
        remaining_text: fmt_remaining(m.remaining),
        overdue: m.remaining <= 0,
        r,
        m,
    })
}

/// The three confirmation pages: one handler each for the route table,
/// the same page for its action.
macro_rules! confirm_page {
    ($($name:ident => $action:literal),+ $(,)?) => {$(
        pub(crate) async fn $name(
            req: HttpRequest,
            staff: Staff,
            settings: web::Data<Settings>,
            pool: web::Data<Db>,
            id: web::Path<i64>,
            q: web::Query<FenceQuery>,
        ) -> Result<HttpResponse, DashError> {
            confirm(req, staff, settings, pool, id.into_inner(), q.fence, $action).await
        }
    )+};
}

confirm_page! {
    confirm_cancel => "cancel",
    confirm_convert => "convert",
    confirm_extend => "extend",
}

/// Fields are strings with defaults: a missing or malformed one gets the
/// handler's own message, not the form parser's. The CSRF token is checked
/// before the handler (`gate::check`).
#[derive(Debug, Deserialize)]
pub struct ActionForm {
    #[serde(default)]
    pub fence: String,
    #[serde(default)]
    pub reason: String,
    #[serde(default)]
    pub service_ref: String,
    /// An extension's length, in minutes from now.
    #[serde(default)]
    pub minutes: String,
    /// For an order of several (R13): `fence_<id>` and, to convert,
    /// `service_ref_<id>` for each of its reservations.
    #[serde(flatten)]
    pub order: std::collections::HashMap<String, String>,
}

fn not_held(id: i64, state: ReservationState) -> DashError {
    DashError::Stale {
        heading: format!("This reservation is already {state}"),
        message: format!(
            "Reservation {id} had already ended ({state}) before your request, so nothing was changed. \
             Its page shows what happened and who did it."
        ),
        link: Some((
            format!("/reservations/{id}"),
            format!("Open reservation {id}"),
        )),
    }
}

/// A stale page gets a page saying what happened, never a 500.
fn refused(id: i64, e: TransitionError) -> DashError {
    let link = Some((
        format!("/reservations/{id}"),
        format!("Open reservation {id}"),
    ));
    match e {
        TransitionError::NotFound => DashError::NotFound("reservation"),
        TransitionError::StaleFence => DashError::Stale {
            heading: "This reservation changed since your page was loaded".into(),
            message: format!(
                "The form carried an old fence for reservation {id}: someone or something changed it \
                 after you opened the page. Nothing was changed. Open it again to see its current state."
            ),
            link,
        },
        TransitionError::NotHeld { state } => not_held(id, state),
        // Only the API's replay answers it; a second submit here is refused.
        TransitionError::IdempotencyMismatch => DashError::Stale {
            heading: "This reservation has already ended".into(),
            message: format!(
                "Reservation {id} was already ended by another request. Nothing was changed."
            ),
            link,
        },
        TransitionError::Expired { expires_at } => DashError::Stale {
            heading: "This reservation had already expired".into(),
            message: format!(
                "Reservation {id} expired at {} before your request reached it; it is now marked expired \
                 and nothing else was changed.",
                fmt_time(&expires_at)
            ),
            link,
        },
        TransitionError::PartOfOrder {
            order_ref,
            quantity,
            ..
        } => DashError::Stale {
            heading: "This reservation is part of an order".into(),
            message: format!(
                "Reservation {id} is one of the {quantity} machines of order {order_ref}, which are \
                 cancelled, converted and extended together. Nothing was changed."
            ),
            link,
        },
        TransitionError::Mismatch { .. } => DashError::Stale {
            heading: "This order changed since your page was loaded".into(),
            message: format!(
                "The form did not name every reservation of the order of reservation {id}. \
                 Nothing was changed. Open it again to see the order as it is."
            ),
            link,
        },
        TransitionError::HoldCap {
            cap_seconds,
            latest,
        } => DashError::Stale {
            heading: "The hold cannot be extended that far".into(),
            message: format!(
                "A hold may last at most {} from its creation: reservation {id} can be held until {} \
                 at the latest. Nothing was changed.",
                fmt_duration(cap_seconds),
                fmt_time(&latest)
            ),
            link,
        },
        TransitionError::MachineNotReady { asset_tag, .. } => DashError::Stale {
            heading: "The machine is not ready".into(),
            message: format!(
                "Machine {asset_tag} under reservation {id} is no longer ready, so it cannot be sold. \
                 Nothing was changed."
            ),
            link,
        },
        TransitionError::Database(e) => e.into(),
    }
}

/// A number of seconds in words, for the extension's pages.
fn fmt_duration(seconds: u32) -> String {
    match seconds {
        s if s % 3600 == 0 => format!("{} h", s / 3600),
        s if s % 60 == 0 => format!("{} min", s / 60),
        s => format!("{s} s"),
    }
}

/// The form's fence. Session, CSRF, role and module switch (R12) were
/// checked before the handler (`gate::check`); nothing is written before
/// this passes too.
fn fence_of(form: &ActionForm) -> Result<i64, DashError> {
    form.fence.trim().parse::<i64>().map_err(|_| {
        DashError::bad_request("The form's fence is missing or not a number; reload the page.")
    })
}

/// A reservation's order when it has several machines (R13): what the form
/// names of each (its fence and, for a conversion, its service), read
/// against the order as it is now. `None` for an order of one.
async fn order_named(
    pool: &Db,
    staff: &Staff,
    id: i64,
    form: &ActionForm,
) -> Result<Option<(String, Vec<Named>)>, DashError> {
    let (r, _) = load(pool, staff, id).await?;
    if r.quantity <= 1 {
        return Ok(None);
    }
    let order = reservations::order_of(pool, staff.org_id, &r.order_ref).await?;
    let named = order
        .iter()
        .map(|o| {
            form.order
                .get(&format!("fence_{}", o.id))
                .and_then(|f| f.trim().parse::<i64>().ok())
                .map(|fence| Named { id: o.id, fence })
                .ok_or_else(|| {
                    DashError::bad_request(
                        "The form does not name every machine of the order; reload the page.",
                    )
                })
        })
        .collect::<Result<Vec<Named>, DashError>>()?;
    Ok(Some((r.order_ref, named)))
}

/// Ends a staff action's transaction through `error::commit` (F3): at the
/// commit a lost connection gets a page saying the change may or may not
/// have been made, offering the same action again (`action`: the path's
/// last segment), whose answer then tells. An expiry found at the point of
/// use commits with the refusal (R11), as `settle`.
async fn settle_action<T>(
    tx: sqlx::Transaction<'static, sqlx::Postgres>,
    outcome: Result<T, TransitionError>,
    id: i64,
    action: &str,
) -> Result<T, DashError> {
    let keep = async |tx: sqlx::Transaction<'static, sqlx::Postgres>| {
        let again = format!("/reservations/{id}/{action}");
        let noun = match action {
            "cancel" => "cancellation",
            "convert" => "conversion",
            "extend" => "extension",
            other => other,
        };
        commit(
            tx,
            Written::new(
                format!("the {noun} of reservation {id}"),
                "Open the reservation to see, or do the same again: if the change was made, the \
                 reservation says so and nothing is done twice.",
                (&again, "Do the same again"),
            ),
        )
        .await
    };
    match outcome {
        Ok(value) => {
            keep(tx).await?;
            Ok(value)
        }
        Err(e @ TransitionError::Expired { .. }) => {
            keep(tx).await?;
            Err(refused(id, e))
        }
        // Nothing to keep: dropping the transaction rolls it back (and a
        // connection that broke has nothing committed either).
        Err(e) => {
            drop(tx);
            Err(refused(id, e))
        }
    }
}

/// Audits and settles an order action; the audit row commits with it, and
/// only when the action changed something.
#[allow(clippy::too_many_arguments)]
async fn act_on_order(
    req: &HttpRequest,
    staff: &Staff,
    pool: &Db,
    id: i64,
    order_ref: &str,
    named: &[Named],
    what: OrderAction<'_>,
    audit: (crate::audit::AuditAction, &str),
) -> Result<(), DashError> {
    let mut tx = pool.begin().await?;
    let outcome = reservations::order_transition_changed_on(
        &mut tx,
        staff.org_id,
        Some(order_ref),
        named,
        &staff.email,
        what,
    )
    .await;
    if let Ok((_, true)) = outcome {
        let object = format!("order:{order_ref}");
        audit_on(&mut tx, req, staff, audit.0, &object, Some(audit.1)).await?;
    }
    let action = audit.0.as_str().trim_start_matches("order.");
    settle_action(tx, outcome, id, action).await?;
    Ok(())
}

pub(crate) async fn cancel(
    req: HttpRequest,
    staff: Staff,
    pool: web::Data<Db>,
    id: web::Path<i64>,
    form: web::Form<ActionForm>,
) -> Result<HttpResponse, DashError> {
    let id = id.into_inner();
    let fence = fence_of(&form)?;
    // A browser sends a textarea's line breaks as CRLF; the rule (shared
    // with the API) knows LF.
    let typed = form.reason.replace("\r\n", "\n");
    let reason = reservations::check_reason(&typed).map_err(|problem| {
        let mut sentence = problem.to_owned();
        sentence[..1].make_ascii_uppercase();
        DashError::bad_request(format!(
            "{sentence} to cancel a reservation; nothing was changed."
        ))
    })?;
    // R13: a reservation of an order of several cancels the whole order.
    if let Some((order_ref, named)) = order_named(&pool, &staff, id, &form).await? {
        act_on_order(
            &req,
            &staff,
            &pool,
            id,
            &order_ref,
            &named,
            OrderAction::Cancel { reason },
            (crate::audit::AuditAction::OrderCancel, reason),
        )
        .await?;
        return Ok(see_other(
            &Flash::Cancelled.after(&format!("/reservations/{id}")),
        ));
    }
    // The audit row commits with the cancellation, or not at all.
    let mut tx = pool.begin().await?;
    let outcome =
        reservations::cancel_on(&mut tx, staff.org_id, id, fence, &staff.email, reason).await;
    if outcome.is_ok() {
        let object = format!("reservation:{id}");
        audit_on(
            &mut tx,
            &req,
            &staff,
            crate::audit::AuditAction::ReservationCancel,
            &object,
            Some(reason),
        )
        .await?;
    }
    settle_action(tx, outcome, id, "cancel").await?;
    Ok(see_other(
        &Flash::Cancelled.after(&format!("/reservations/{id}")),
    ))
}

pub(crate) async fn convert(
    req: HttpRequest,
    staff: Staff,
    pool: web::Data<Db>,
    id: web::Path<i64>,
    form: web::Form<ActionForm>,
) -> Result<HttpResponse, DashError> {
    let id = id.into_inner();
    let fence = fence_of(&form)?;
    let bad_ref = |e: crate::domain::ParseError| {
        DashError::bad_request(format!(
            "The service reference is not valid: {e}. Nothing was changed."
        ))
    };
    // R13: a reservation of an order of several converts the whole order,
    // one service reference per machine.
    if let Some((order_ref, named)) = order_named(&pool, &staff, id, &form).await? {
        let refs = named
            .iter()
            .map(|n| {
                let text = form
                    .order
                    .get(&format!("service_ref_{}", n.id))
                    .map(|s| s.trim())
                    .unwrap_or_default();
                ServiceRef::parse(text).map_err(bad_ref)
            })
            .collect::<Result<Vec<ServiceRef>, DashError>>()?;
        let listed = refs
            .iter()
            .map(ServiceRef::as_str)
            .collect::<Vec<_>>()
            .join(", ");
        act_on_order(
            &req,
            &staff,
            &pool,
            id,
            &order_ref,
            &named,
            OrderAction::Convert {
                service_refs: &refs,
            },
            (crate::audit::AuditAction::OrderConvert, &listed),
        )
        .await?;
        return Ok(see_other(
            &Flash::Converted.after(&format!("/reservations/{id}")),
        ));
    }
    let service_ref = ServiceRef::parse(form.service_ref.trim()).map_err(bad_ref)?;
    let mut tx = pool.begin().await?;
    let outcome =
        reservations::convert_on(&mut tx, staff.org_id, id, fence, &staff.email, &service_ref)
            .await;
    if outcome.is_ok() {
        let object = format!("reservation:{id}");
        audit_on(
            &mut tx,
            &req,
            &staff,
            crate::audit::AuditAction::ReservationConvert,
            &object,
            Some(service_ref.as_str()),
        )
        .await?;
    }
    settle_action(tx, outcome, id, "convert").await?;
    Ok(see_other(
        &Flash::Converted.after(&format!("/reservations/{id}")),
    ))
}

/// R14: extend a hold (or its whole order) by the minutes chosen, from the
/// database's clock, with a reason; support and admin only; an audit row
/// commits with it.
pub(crate) async fn extend(
    req: HttpRequest,
    staff: Staff,
    settings: web::Data<Settings>,
    pool: web::Data<Db>,
    id: web::Path<i64>,
    form: web::Form<ActionForm>,
) -> Result<HttpResponse, DashError> {
    let id = id.into_inner();
    let fence = fence_of(&form)?;
    let seconds = crate::dashboard::input::whole_number::<u32>(form.minutes.trim())
        .filter(|m| (1..=1440).contains(m))
        .map(|m| m * 60)
        .ok_or_else(|| {
            DashError::bad_request(
                "Choose how many minutes to extend the hold by (1 to 1440); nothing was changed.",
            )
        })?;
    let reason = reservations::check_reason(&form.reason).map_err(|problem| {
        let mut sentence = problem.to_owned();
        sentence[..1].make_ascii_uppercase();
        DashError::bad_request(format!("{sentence} to extend a hold; nothing was changed."))
    })?;
    let what = OrderAction::Extend {
        seconds,
        until: None,
        cap_seconds: settings.hold_max_seconds,
        reason: Some(reason),
    };
    let detail = format!("{} min: {reason}", seconds / 60);
    match order_named(&pool, &staff, id, &form).await? {
        Some((order_ref, named)) => {
            act_on_order(
                &req,
                &staff,
                &pool,
                id,
                &order_ref,
                &named,
                what,
                (crate::audit::AuditAction::OrderExtend, &detail),
            )
            .await?
        }
        None => {
            let mut tx = pool.begin().await?;
            let outcome = reservations::order_transition_changed_on(
                &mut tx,
                staff.org_id,
                None,
                &[Named { id, fence }],
                &staff.email,
                what,
            )
            .await;
            // Only what changed is audited: an extension that asked for
            // no later deadline wrote nothing.
            if let Ok((_, true)) = outcome {
                let object = format!("reservation:{id}");
                audit_on(
                    &mut tx,
                    &req,
                    &staff,
                    crate::audit::AuditAction::ReservationExtend,
                    &object,
                    Some(&detail),
                )
                .await?;
            }
            settle_action(tx, outcome, id, "extend").await?;
        }
    }
    Ok(see_other(
        &Flash::Extended.after(&format!("/reservations/{id}")),
    ))
}
