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

/// `lower(column)` starts with `lower($2)`, written as the range of the
/// `text_pattern_ops` index on `(org_id, lower(column))` that holds it
/// (byte order: every string with the prefix lies between the prefix and
/// the prefix followed by the last code point), then checked exactly.
/// `starts_with` alone is no index condition, and `LIKE $2 || '%'` is one
/// only in a plan made for the value, never in the generic plan a prepared
/// statement settles on. The callers order by `lower(column) USING ~<~`,
/// the index's own order, so that a short prefix stops after a page
/// instead of sorting every match in the collation's order.
fn prefix_range(column: &str) -> String {
    format!(
        "lower({column}) ~>=~ lower($2) AND lower({column}) ~<~ (lower($2) || U&'\\+10FFFF')
         AND starts_with(lower({column}), lower($2))"
    )
}

/// The search's reservations: `$1` org, `$2` the text, `$3` the text as an
/// id (NULL when it is not a number), `$4` the limit. Exact matches first
/// (id, order ref), then the first `$4` order refs that start with the
/// text whatever the case, by order ref on
/// `reservations_order_ref_prefix_idx` (a short prefix never sorts the
/// history), newest first; every state, all time, this organization only.
/// `r.id = $3` is NULL, not false, when `$3` is NULL, so the prefix side
/// says `IS DISTINCT FROM`. Public for the plan test.
pub fn reservations_sql() -> String {
    format!(
        "SELECT h.id, h.order_ref, h.state, m.asset_tag, h.created_at, h.exact
           FROM (SELECT r.id, r.order_ref, r.state, r.machine_id, r.created_at, true AS exact
                   FROM reservations r
                  WHERE r.org_id = $1 AND (r.id = $3 OR r.order_ref = $2)
                 UNION ALL
                 (SELECT r.id, r.order_ref, r.state, r.machine_id, r.created_at, false
                    FROM reservations r
                   WHERE r.org_id = $1 AND {range}
                     AND r.order_ref <> $2 AND r.id IS DISTINCT FROM $3
                   ORDER BY lower(r.order_ref) USING ~<~
                   LIMIT $4)) h
           JOIN machines m ON m.id = h.machine_id
          ORDER BY h.exact DESC, h.created_at DESC
          LIMIT $4",
        range = prefix_range("r.order_ref"),
    )
}

/// The search's machines: `$1` org, `$2` the text, `$3` the limit. The
/// exact tag, then the first `$3` tags that start with the text whatever
/// the case, on `machines_asset_tag_prefix_idx`. Public for the plan test.
pub fn machines_sql() -> String {
    format!(
        "SELECT h.asset_tag, h.site, h.status, h.exact
           FROM (SELECT m.asset_tag, m.site, m.status, true AS exact
                   FROM machines m WHERE m.org_id = $1 AND m.asset_tag = $2
                 UNION ALL
                 (SELECT m.asset_tag, m.site, m.status, false
                    FROM machines m
                   WHERE m.org_id = $1 AND {range} AND m.asset_tag <> $2
                   ORDER BY lower(m.asset_tag) USING ~<~
                   LIMIT $3)) h
          ORDER BY h.exact DESC, h.asset_tag
          LIMIT $3",
        range = prefix_range("m.asset_tag"),
    )
}

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
        reservations = sqlx::query_as::<_, ResHit>(sqlx::AssertSqlSafe(reservations_sql()))
            .bind(staff.org_id)
            .bind(&q)
            .bind(id)
            .bind(LIMIT)
            .fetch_all(pool.get_ref())
            .await?;
        machines = sqlx::query_as::<_, MachineHit>(sqlx::AssertSqlSafe(machines_sql()))
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
