//! Held reservations as staff read them: the live list's pages in deadline
//! order (keyset on `(expires_at, id)`, on the sweep's partial index), its
//! count, and what a reservation's pages show beyond its row (its machine,
//! the time left by the database clock, its service, its order's members).

use chrono::{DateTime, Utc};

use crate::db::Db;
use crate::domain::{CustomerRef, ReservationState, Site};
use crate::reservations::Reservation;

/// A position in the deadline order: (expires_at, id), unique; encoded in
/// the page links as `<deadline in µs since the epoch>_<id>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cursor {
    pub expires_at: DateTime<Utc>,
    pub id: i64,
}

impl Cursor {
    pub fn encode(&self) -> String {
        format!("{}_{}", self.expires_at.timestamp_micros(), self.id)
    }

    pub fn parse(s: &str) -> Option<Cursor> {
        let (micros, id) = s.trim().split_once('_')?;
        Some(Cursor {
            expires_at: DateTime::from_timestamp_micros(micros.parse().ok()?)?,
            id: id.parse().ok()?,
        })
    }
}

/// Which held reservations: of a site, and/or whose deadline is within so
/// many minutes (overdue ones too).
#[derive(Debug, Clone, Default)]
pub struct LiveFilter {
    pub site: Option<Site>,
    pub within: Option<i32>,
    /// R19: one end customer's holds.
    pub customer: Option<CustomerRef>,
}

/// One held reservation of the live list: the reservation, and what the
/// list shows beside it.
#[derive(sqlx::FromRow)]
pub struct HeldLine {
    #[sqlx(flatten)]
    pub reservation: Reservation,
    /// Its machine as it is now.
    pub asset_tag: String,
    pub site: String,
    /// Seconds left by the database clock.
    pub remaining: i64,
    /// R15: the machine the hold last left, and when.
    pub replaced_tag: Option<String>,
    pub replaced_at: Option<DateTime<Utc>>,
}

/// Held reservations matching `f`, in deadline order from `cursor`
/// (backwards: before it, newest first), at most `limit`.
pub async fn held_page(
    pool: &Db,
    org_id: i64,
    f: &LiveFilter,
    cursor: Option<Cursor>,
    backwards: bool,
    limit: i64,
) -> Result<Vec<HeldLine>, sqlx::Error> {
    // The remaining seconds come from the database clock (clock_timestamp),
    // the same clock that judges expiry; the browser only counts down from
    // it, never reads its own wall clock. Keyset paging on (expires_at, id)
    // walks reservations_held_by_deadline_idx (the sweep's, on (expires_at,
    // id)) in order, forwards or backwards, and stops after a page: no
    // OFFSET, no per-row query. The page is chosen first, then each of its
    // rows' machine and last move are probed by key (OFFSET 0 keeps the
    // probe a probe): joined before the LIMIT, the planner hashed every
    // machine of the pool and sorted every hold (8-12 ms at 50,000
    // machines and a long history, against 0.5-1.2 ms). The redundant `expires_at >=`/`<=` lets the index bound the walk,
    // and `expires_at IS NOT NULL` (always true) matches the index's
    // predicate, which says so to keep the allocator's probes off it.
    let sql = held_page_sql(backwards);
    sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(org_id)
        .bind(f.site.as_ref().map(Site::as_str))
        .bind(f.within)
        .bind(cursor.map(|c| c.expires_at))
        .bind(cursor.map_or(0, |c| c.id))
        .bind(limit)
        .bind(f.customer.as_ref().map(CustomerRef::as_str))
        .fetch_all(pool)
        .await
}

/// `held_page`'s statement: `$1` org, `$2` site, `$3` within minutes,
/// `$4`, `$5` the cursor (deadline, id), `$6` the limit, `$7` the customer.
pub fn held_page_sql(backwards: bool) -> String {
    format!(
        "SELECT {p_columns}, m.asset_tag, m.site,
                floor(extract(epoch FROM p.expires_at - clock_timestamp()))::bigint AS remaining,
                x.replaced_tag, x.replaced_at
           FROM (SELECT {r_columns}
                   FROM reservations r
                  WHERE r.org_id = $1 AND r.state = 'held' AND r.expires_at IS NOT NULL
                    AND ($2::text IS NULL
                         OR (SELECT m.site FROM machines m WHERE m.id = r.machine_id) = $2::text)
                    AND ($3::int IS NULL OR r.expires_at <= clock_timestamp() + make_interval(mins => $3::int))
                    AND ($7::text IS NULL OR r.customer_ref = $7::text)
                    AND ($4::timestamptz IS NULL OR (r.expires_at {cmp}= $4 AND (r.expires_at, r.id) {cmp} ($4, $5)))
                  ORDER BY r.expires_at {dir}, r.id {dir}
                  LIMIT $6) p
          CROSS JOIN LATERAL (SELECT m.asset_tag, m.site FROM machines m WHERE m.id = p.machine_id OFFSET 0) m
           -- R15: the last move of this hold, by its events' index.
           LEFT JOIN LATERAL (
                SELECT old.asset_tag AS replaced_tag, e.at AS replaced_at
                  FROM reservation_events e JOIN machines old ON old.id = e.replaced_machine_id
                 WHERE e.reservation_id = p.id AND e.kind = 'machine_replaced'
                 ORDER BY e.id DESC LIMIT 1) x ON true
          ORDER BY p.expires_at {dir}, p.id {dir}",
        p_columns = crate::reservations::reservation_columns("p"),
        r_columns = crate::reservations::reservation_columns("r"),
        cmp = if backwards { "<" } else { ">" },
        dir = if backwards { "DESC" } else { "ASC" },
    )
}

/// How many held reservations `f` selects, and the database's clock when
/// it counted. The count walks the same partial index; a site is checked
/// per held row by the machine's primary key (a join let the planner hash
/// every machine of the pool: 5 ms at 50,000 machines against 1 ms).
pub async fn count_held(
    pool: &Db,
    org_id: i64,
    f: &LiveFilter,
) -> Result<(i64, DateTime<Utc>), sqlx::Error> {
    sqlx::query_as(
        "SELECT count(*), clock_timestamp()
           FROM reservations r
          WHERE r.org_id = $1 AND r.state = 'held' AND r.expires_at IS NOT NULL
            AND ($2::text IS NULL OR (SELECT m.site FROM machines m WHERE m.id = r.machine_id) = $2::text)
            AND ($3::int IS NULL OR r.expires_at <= clock_timestamp() + make_interval(mins => $3::int))
            AND ($4::text IS NULL OR r.customer_ref = $4::text)",
    )
    .bind(org_id)
    .bind(f.site.as_ref().map(Site::as_str))
    .bind(f.within)
    .bind(f.customer.as_ref().map(CustomerRef::as_str))
    .fetch_one(pool)
    .await
}

/// What a reservation's pages show beyond its row: its machine as it is
/// now, the seconds left by the database clock, its service if converted.
#[derive(sqlx::FromRow)]
pub struct HoldMachine {
    pub asset_tag: String,
    pub site: String,
    pub vendor: String,
    pub profile: String,
    pub remaining: i64,
    pub service_ref: Option<String>,
}

pub async fn machine_of(
    pool: &Db,
    org_id: i64,
    id: i64,
) -> Result<Option<HoldMachine>, sqlx::Error> {
    sqlx::query_as(
        "SELECT m.asset_tag, m.site, m.vendor, m.profile,
                floor(extract(epoch FROM r.expires_at - clock_timestamp()))::bigint AS remaining,
                s.service_ref
           FROM reservations r
           JOIN machines m ON m.id = r.machine_id
           LEFT JOIN service_links s ON s.reservation_id = r.id
          WHERE r.id = $1 AND r.org_id = $2",
    )
    .bind(id)
    .bind(org_id)
    .fetch_optional(pool)
    .await
}

/// One machine of a reservation's order (R13), for the detail and
/// confirmation pages.
#[derive(sqlx::FromRow)]
pub struct OrderLine {
    pub id: i64,
    pub fence: i64,
    pub slot: i16,
    pub state: ReservationState,
    pub asset_tag: String,
    pub site: String,
}

/// Every reservation of the order of `r` (itself included), in slot order.
pub async fn order_lines(
    pool: &Db,
    org_id: i64,
    r: &Reservation,
) -> Result<Vec<OrderLine>, sqlx::Error> {
    if r.quantity <= 1 {
        return Ok(Vec::new());
    }
    sqlx::query_as(
        "SELECT r.id, r.fence, r.slot, r.state, m.asset_tag, m.site
           FROM reservations r JOIN machines m ON m.id = r.machine_id
          WHERE r.org_id = $1 AND r.order_ref = $2
          ORDER BY r.slot",
    )
    .bind(org_id)
    .bind(&r.order_ref)
    .fetch_all(pool)
    .await
}

/// R19 as support reads it: the live holds of one end customer (a hold
/// past its deadline no longer counts, as for the cap) and the
/// organization's cap on them (0: none), on the customer's index.
pub async fn customer_against_cap(
    pool: &Db,
    org_id: i64,
    customer: &CustomerRef,
) -> Result<(i64, i32), sqlx::Error> {
    sqlx::query_as(
        "SELECT (SELECT count(*) FROM reservations r
                  WHERE r.org_id = $1 AND r.state = 'held' AND r.customer_ref = $2
                    AND r.expires_at > clock_timestamp()),
                (SELECT o.customer_hold_limit FROM organizations o WHERE o.id = $1)",
    )
    .bind(org_id)
    .bind(customer.as_str())
    .fetch_one(pool)
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_survives_its_link() {
        let c = Cursor {
            expires_at: DateTime::from_timestamp_micros(1_796_000_000_123_456).expect("time"),
            id: 42,
        };
        assert_eq!(Cursor::parse(&c.encode()), Some(c));
        assert_eq!(Cursor::parse("12_x"), None);
        assert_eq!(Cursor::parse("nonsense"), None);
    }
}
