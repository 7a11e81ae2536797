//! `/search?q=`: by order ref, asset tag or reservation id, over every state
//! and all time, and an end customer with live holds (a link to them). One
//! exact hit (and no customer) redirects to its page.

use crate::db::Db;
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;
use serde::Deserialize;

use super::error::DashError;
use super::session::Staff;
use super::view::{Chrome, fmt_time, page, see_other};
use crate::domain::ReservationState;

#[derive(Deserialize)]
pub struct SearchQuery {
    #[serde(default)]
    q: String,
}

#[derive(sqlx::FromRow)]
struct ResHit {
    id: i64,
    order_ref: String,
    state: ReservationState,
    asset_tag: String,
    created_at: chrono::DateTime<chrono::Utc>,
    exact: bool,
}

#[derive(sqlx::FromRow)]
struct MachineHit {
    asset_tag: String,
    site: String,
    status: String,
    exact: bool,
}

pub struct ResHitView {
    pub id: i64,
    pub order_ref: String,
    pub state: ReservationState,
    pub asset_tag: String,
    pub created_at: String,
}

#[derive(Template)]
#[template(path = "search.html")]
struct SearchPage {
    chrome: Chrome,
    q: String,
    /// R19: the text is an end customer with live holds: how many.
    customer: Option<i64>,
    reservations: Vec<ResHitView>,
    machines: Vec<(String, String, String)>,
}

const LIMIT: i64 = 50;

pub(crate) async fn search(
    req: HttpRequest,
    staff: Staff,
    pool: web::Data<Db>,
    q: web::Query<SearchQuery>,
) -> Result<HttpResponse, DashError> {
    // Length and control characters were checked by `input::guard`.
    let q = q.q.trim().to_owned();
    let mut reservations = Vec::new();
    let mut machines = Vec::new();
    let mut customer = None;
    if !q.is_empty() {
        // An end customer by its exact reference, on the index of live
        // holds by customer: support finds a customer's holds from here.
        if let Ok(c) = crate::domain::CustomerRef::parse(&q) {
            let (live, _) = crate::holds::customer_against_cap(&pool, staff.org_id, &c).await?;
            customer = (live > 0).then_some(live);
        }
        let id: Option<i64> = q.trim_start_matches('#').parse().ok();
        // Exact matches first (id, order ref), then order refs that start
        // with the text; every state, all time, this organization only.
        // `$3` is NULL when the text is not a number: `r.id = $3` would then
        // be NULL, not false, and so would `exact` (a search for "DEMO"
        // would answer 500); `IS NOT DISTINCT FROM` is false instead.
        reservations = sqlx::query_as::<_, ResHit>(
            "SELECT r.id, r.order_ref, r.state, m.asset_tag, r.created_at,
                    (r.id IS NOT DISTINCT FROM $3 OR r.order_ref = $2) AS exact
               FROM reservations r JOIN machines m ON m.id = r.machine_id
              WHERE r.org_id = $1
                AND (r.id = $3 OR r.order_ref = $2 OR starts_with(lower(r.order_ref), lower($2)))
              ORDER BY exact DESC, r.created_at DESC
              LIMIT $4",
        )
        .bind(staff.org_id)
        .bind(&q)
        .bind(id)
        .bind(LIMIT)
        .fetch_all(pool.get_ref())
        .await?;
        machines = sqlx::query_as::<_, MachineHit>(
            "SELECT asset_tag, site, status, asset_tag = $2 AS exact
               FROM machines
              WHERE org_id = $1 AND (asset_tag = $2 OR starts_with(lower(asset_tag), lower($2)))
              ORDER BY exact DESC, asset_tag
              LIMIT $3",
        )
        .bind(staff.org_id)
        .bind(&q)
        .bind(LIMIT)
        .fetch_all(pool.get_ref())
        .await?;
        let exact_res: Vec<&ResHit> = reservations.iter().filter(|r| r.exact).collect();
        let exact_machines: Vec<&MachineHit> = machines.iter().filter(|m| m.exact).collect();
        match (exact_res.as_slice(), exact_machines.as_slice()) {
            ([r], []) if customer.is_none() => {
                return Ok(see_other(&format!("/reservations/{}", r.id)));
            }
            ([], [m]) if customer.is_none() => {
                return Ok(see_other(&format!("/machines/{}", m.asset_tag)));
            }
            _ => {}
        }
    }
    page(&SearchPage {
        chrome: Chrome::new(&req, &staff, "Search", "search"),
        customer,
        q,
        reservations: reservations
            .into_iter()
            .map(|r| ResHitView {
                id: r.id,
                order_ref: r.order_ref,
                state: r.state,
                asset_tag: r.asset_tag,
                created_at: fmt_time(&r.created_at),
            })
            .collect(),
        machines: machines
            .into_iter()
            .map(|m| (m.asset_tag, m.site, m.status))
            .collect(),
    })
}
