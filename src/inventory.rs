//! The pool: machines, their attributes and the datacenter team's status.

use crate::db::Db;
use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::domain::{AssetTag, MachineStatus, Profile, Site, Vendor};

#[derive(Debug, Clone, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct Machine {
    #[serde(skip)]
    pub id: i64,
    pub asset_tag: String,
    pub site: String,
    pub vendor: String,
    pub profile: String,
    #[schema(value_type = MachineStatus)]
    pub status: String,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// A machine as the datacenter team describes it.
#[derive(Debug, Clone)]
pub struct MachineSpec {
    pub site: Site,
    pub vendor: Vendor,
    pub profile: Profile,
    pub status: MachineStatus,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Upserted {
    Created,
    Updated,
}

const MACHINE_COLUMNS: &str =
    "id, asset_tag, site, vendor, profile, status, created_at, updated_at";

/// Creates or updates the machine `tag` of `org_id`. R15: a machine that
/// leaves `ready` under a hold heals it in this statement's transaction
/// (sql/healing.sql), recorded as done by `actor`.
pub async fn upsert(
    db: impl sqlx::PgExecutor<'_>,
    org_id: i64,
    tag: &AssetTag,
    spec: &MachineSpec,
    actor: &str,
) -> Result<(Machine, Upserted), sqlx::Error> {
    // xmax = 0 only on a freshly inserted row version: tells created from updated
    // in the same statement, without a race between a lookup and a write.
    let sql = format!(
        "INSERT INTO machines (org_id, asset_tag, site, vendor, profile, status)
         SELECT $1, $2, $3, $4, $5, $6 FROM (SELECT set_config('poolkeeper.actor', $7, true)) actor
         ON CONFLICT ON CONSTRAINT machines_asset_tag_unique_per_org DO UPDATE
            SET site = EXCLUDED.site, vendor = EXCLUDED.vendor, profile = EXCLUDED.profile,
                status = EXCLUDED.status, updated_at = clock_timestamp()
         RETURNING {MACHINE_COLUMNS}, (xmax = 0) AS inserted"
    );
    let row: MachineRow = sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(org_id)
        .bind(tag.as_str())
        .bind(spec.site.as_str())
        .bind(spec.vendor.as_str())
        .bind(spec.profile.as_str())
        .bind(spec.status.as_str())
        .bind(actor)
        .fetch_one(db)
        .await?;
    let how = if row.inserted {
        Upserted::Created
    } else {
        Upserted::Updated
    };
    Ok((row.machine, how))
}

#[derive(sqlx::FromRow)]
struct MachineRow {
    #[sqlx(flatten)]
    machine: Machine,
    inserted: bool,
}

/// Filters of the machines list; `None` matches everything.
#[derive(Debug, Clone, Default)]
pub struct MachineFilter {
    pub site: Option<Site>,
    pub vendor: Option<Vendor>,
    pub profile: Option<Profile>,
    pub status: Option<MachineStatus>,
    /// What the machine is doing in the pool (derived, never stored).
    pub state: Option<PoolState>,
}

/// What a machine is doing in the pool, as the overview counts it: a live
/// service link wins (sold), then a held reservation (held, overdue or
/// not: R11 expires it at the point of use), then the datacenter team's
/// status (sellable when ready, not ready otherwise). Derived from
/// reservations and service links, never stored (the schema's comment).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PoolState {
    Sellable,
    Held,
    Sold,
    NotReady,
}

impl PoolState {
    pub const ALL: [PoolState; 4] = [
        PoolState::Sellable,
        PoolState::Held,
        PoolState::Sold,
        PoolState::NotReady,
    ];

    /// The key in URLs, CSV and SQL.
    pub fn as_str(self) -> &'static str {
        match self {
            PoolState::Sellable => "sellable",
            PoolState::Held => "held",
            PoolState::Sold => "sold",
            PoolState::NotReady => "not_ready",
        }
    }

    /// In words, as the overview says it.
    pub fn label(self) -> &'static str {
        match self {
            PoolState::NotReady => "not ready",
            s => s.as_str(),
        }
    }

    pub fn parse(s: &str) -> Result<PoolState, crate::domain::ParseError> {
        Self::ALL
            .into_iter()
            .find(|st| st.as_str() == s)
            .ok_or_else(|| crate::domain::ParseError {
                what: "state",
                problem: "must be one of sellable, held, sold, not_ready".to_owned(),
            })
    }
}

/// The one precedence of `PoolState`, as SQL over machine `m`, given SQL
/// for "has a live service link" and "has a held reservation".
fn pool_state_case(sold: &str, held: &str) -> String {
    format!(
        "CASE WHEN {sold} THEN 'sold' WHEN {held} THEN 'held' \
              WHEN m.status = 'ready' THEN 'sellable' ELSE 'not_ready' END"
    )
}

/// The joins that find machine `m`'s live service link (`live`) and held
/// reservation (`hold`): each on its partial unique index
/// (`service_links_one_live_per_machine`, `reservations_one_holder_per_machine`),
/// so at most one row each and the machine is never repeated.
pub const POOL_STATE_JOINS: &str =
    "LEFT JOIN service_links live ON live.machine_id = m.id AND live.ended_at IS NULL
           LEFT JOIN reservations hold ON hold.machine_id = m.id AND hold.state = 'held'";

/// `PoolState` of machine `m` over `POOL_STATE_JOINS`.
pub fn pool_state_sql() -> String {
    pool_state_case("live.machine_id IS NOT NULL", "hold.machine_id IS NOT NULL")
}

/// The same, for a query that cannot join (the allocator's `explain`, over
/// `machine_verdicts`): one probe of each partial unique index.
pub fn pool_state_probe_sql() -> String {
    pool_state_case(
        "EXISTS (SELECT 1 FROM service_links live WHERE live.machine_id = m.id AND live.ended_at IS NULL)",
        "EXISTS (SELECT 1 FROM reservations hold WHERE hold.machine_id = m.id AND hold.state = 'held')",
    )
}

/// A machine with what it is doing: the hold (reservation, order, seconds
/// left by the database clock, negative when overdue) or the service.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct PooledMachine {
    #[sqlx(flatten)]
    pub machine: Machine,
    pub pool_state: String,
    pub held_by: Option<i64>,
    pub held_for: Option<String>,
    pub remaining: Option<i64>,
    pub service_ref: Option<String>,
    pub sold_by: Option<i64>,
}

fn pooled_columns() -> String {
    format!(
        "m.id, m.asset_tag, m.site, m.vendor, m.profile, m.status, m.created_at, m.updated_at,
         {} AS pool_state,
         hold.id AS held_by, hold.order_ref AS held_for,
         floor(extract(epoch FROM hold.expires_at - clock_timestamp()))::bigint AS remaining,
         live.service_ref, live.reservation_id AS sold_by",
        pool_state_sql()
    )
}

/// The filter's WHERE over machine `m`, parameters `$2`-`$5`, every
/// filter optional in the statement: only for the plain counts the plan
/// test compares `count_by_state_sql` with, a spelling of the filter
/// independent of `filter_sql`'s (the shipped statements use `filter_sql`).
const FILTER_SQL: &str = "m.org_id = $1
            AND ($2::text IS NULL OR m.site = $2)
            AND ($3::text IS NULL OR m.vendor = $3)
            AND ($4::text IS NULL OR m.profile = $4)
            AND ($5::text IS NULL OR m.status = $5)";

/// The filter's WHERE over machine `m`: `$1` org, `$2`-`$5` site, vendor,
/// profile, status, each written by `optional_sql` for whether `filter`
/// sets it (one statement per combination, planned once).
pub fn filter_sql(filter: &MachineFilter) -> String {
    format!("m.org_id = $1 AND {}", filter_columns_sql(filter, 2))
}

/// The filter's columns alone (site, vendor, profile, status) as
/// `filter_sql` writes them, with parameters from `$first`: for statements
/// whose organization is bound elsewhere (the allocator's `explain`).
pub fn filter_columns_sql(filter: &MachineFilter, first: u8) -> String {
    format!(
        "{} AND {} AND {} AND {}",
        optional_sql(first, "m.site =", filter.site.is_some()),
        optional_sql(first + 1, "m.vendor =", filter.vendor.is_some()),
        optional_sql(first + 2, "m.profile =", filter.profile.is_some()),
        optional_sql(first + 3, "m.status =", filter.status.is_some()),
    )
}

/// `{lhs} $n` when the value is bound, `$n::text IS NULL` when it is not:
/// the parameters stay positional (every one is bound) while each
/// combination is a statement of its own, planned once. `($n IS NULL OR
/// {lhs} $n)` was planned again at every view (0.8 ms each at 50,000
/// machines, BENCHMARKS.md item 5): its custom plans, which fold the OR
/// away and use an index, always cost less than a generic plan that can
/// do neither.
pub fn optional_sql(n: u8, lhs: &str, set: bool) -> String {
    if set {
        format!("{lhs} ${n}::text")
    } else {
        format!("${n}::text IS NULL")
    }
}

/// `LIMIT n` written into a dashboard statement, for a limit the code
/// chooses (a page and one more, the CSV's maximum), never a user's: a
/// generic plan takes a `LIMIT $n` for a tenth of the rows, so PostgreSQL
/// kept planning such a statement again at every view (0.7 ms at 50,000
/// machines, BENCHMARKS.md item 5). An integer cannot carry SQL.
pub fn limit_sql(limit: i64) -> String {
    format!("LIMIT {}", limit.max(0))
}

/// `list_pooled`'s statement for `filter` (its state, and its columns as
/// `filter_sql`): `$1` org, `$2`-`$5` site, vendor, profile, status, `$6`
/// after (public for the plan test); the limit is written in
/// (`limit_sql`). The state is spelled out (what `pool_state_sql` = state
/// means), so that the planner estimates it: sellable and not ready walk the pool
/// in asset tag order and stop after a page; held and sold machines are
/// few among many, so the plan starts from the holds or the live services
/// (a `CASE ... = $n` made the planner scan and sort the whole pool: 55-60
/// ms against about 1 ms at 50,000 machines).
pub fn list_pooled_sql(filter: &MachineFilter, after: bool, limit: i64) -> String {
    let state = filter.state;
    let where_filter = filter_sql(filter);
    // Held and sold: from the organization's holds (or live services), each
    // machine probed by primary key (`OFFSET 0` keeps it a probe: joined,
    // the planner hashed the whole pool), then sorted; a page of a few
    // hundred holds costs those probes, not a walk of the pool.
    let probe = "CROSS JOIN LATERAL (SELECT * FROM machines m WHERE m.id = {key} OFFSET 0) m";
    let (from, condition) = match state {
        None => (format!("machines m {POOL_STATE_JOINS}"), "true"),
        Some(PoolState::Held) => (
            format!(
                "reservations hold {}
                 LEFT JOIN service_links live ON live.machine_id = m.id AND live.ended_at IS NULL",
                probe.replace("{key}", "hold.machine_id")
            ),
            "hold.state = 'held' AND hold.org_id = $1 AND live.machine_id IS NULL",
        ),
        Some(PoolState::Sold) => (
            format!(
                "service_links live {}
                 LEFT JOIN reservations hold ON hold.machine_id = m.id AND hold.state = 'held'",
                probe.replace("{key}", "live.machine_id")
            ),
            "live.ended_at IS NULL AND live.org_id = $1",
        ),
        Some(PoolState::Sellable) => (
            format!("machines m {POOL_STATE_JOINS}"),
            "live.machine_id IS NULL AND hold.machine_id IS NULL AND m.status = 'ready'",
        ),
        Some(PoolState::NotReady) => (
            format!("machines m {POOL_STATE_JOINS}"),
            "live.machine_id IS NULL AND hold.machine_id IS NULL AND m.status <> 'ready'",
        ),
    };
    format!(
        "SELECT {cols}
           FROM {from}
          WHERE {where_filter}
            AND {condition}
            AND {after}
          ORDER BY m.asset_tag
          {limit}",
        cols = pooled_columns(),
        after = optional_sql(6, "m.asset_tag >", after),
        limit = limit_sql(limit),
    )
}

/// `count_by_state`'s statement: `$1` org, `$2`-`$5` as `list_pooled_sql`.
/// The same precedence as `pool_state_sql`, counted from the small sides:
/// the filtered machines by status (ready or not) and in service (the
/// machine's copy of its live link, `machines.in_service`,
/// sql/services.sql) from the figures kept per pool (`pool_machines`,
/// sql/pool_figures.sql: site, vendor, profile and status are all in their
/// key, so every filter is a sum of a few rows per pool); then the
/// organization's holds on machines that are not in service, each machine
/// probed by its key (`machines_pool_probe_idx` covers the probe; `OFFSET
/// 0` keeps it a probe: joined, the planner hashed the whole pool).
/// Sellable is ready minus held and sold among the ready, not ready the
/// rest likewise. One statement, so one snapshot: the figures are written
/// in the transaction of every change of a machine. Counting the filtered
/// machines instead cost what they number (59 ms at 400,000); the plan test
/// compares this with the plain form.
pub fn count_by_state_sql(filter: &MachineFilter) -> String {
    let filter = filter_sql(filter);
    format!(
        "SELECT t.ready, t.other, h.ready, h.other, t.sold_ready, t.sold_other
           FROM (SELECT coalesce(sum(m.machines) FILTER (WHERE m.status = 'ready'), 0)::bigint AS ready,
                        coalesce(sum(m.machines) FILTER (WHERE m.status <> 'ready'), 0)::bigint AS other,
                        coalesce(sum(m.machines) FILTER (WHERE m.in_service AND m.status = 'ready'), 0)::bigint
                            AS sold_ready,
                        coalesce(sum(m.machines) FILTER (WHERE m.in_service AND m.status <> 'ready'), 0)::bigint
                            AS sold_other
                   FROM pool_machines m WHERE {filter}) t,
                (SELECT count(*) FILTER (WHERE m.status = 'ready') AS ready,
                        count(*) FILTER (WHERE m.status <> 'ready') AS other
                   FROM reservations hold,
                        LATERAL (SELECT m.status FROM machines m
                                  WHERE m.id = hold.machine_id AND {filter} AND NOT m.in_service
                                 OFFSET 0) m
                  WHERE hold.state = 'held' AND hold.org_id = $1) h"
    )
}

/// The plain form of the counts (every machine joined to its hold and its
/// service, grouped by `pool_state_sql`): the plan test checks that
/// `count_by_state_sql` agrees with it.
pub fn count_by_state_plain_sql() -> String {
    format!(
        "SELECT {state} AS st, count(*) FROM machines m {joins}
          WHERE {FILTER_SQL}
          GROUP BY 1",
        state = pool_state_sql(),
        joins = POOL_STATE_JOINS,
    )
}

/// Machines of `org_id` matching `filter`, with what each is doing, by
/// asset tag after `after`, at most `limit`: one statement. It walks
/// `machines_asset_tag_unique_per_org` in order and probes the two partial
/// unique indexes per machine until the page is full.
pub async fn list_pooled(
    pool: &Db,
    org_id: i64,
    filter: &MachineFilter,
    after: Option<&str>,
    limit: i64,
) -> Result<Vec<PooledMachine>, sqlx::Error> {
    let sql = list_pooled_sql(filter, after.is_some(), limit);
    sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(org_id)
        .bind(filter.site.as_ref().map(Site::as_str))
        .bind(filter.vendor.as_ref().map(Vendor::as_str))
        .bind(filter.profile.as_ref().map(Profile::as_str))
        .bind(filter.status.map(MachineStatus::as_str))
        .bind(after)
        .fetch_all(pool)
        .await
}

/// The same rows for machines `ids` of `org_id` (a page the allocator's
/// `explain` chose): one statement, by primary key.
pub async fn pooled_by_ids(
    pool: &Db,
    org_id: i64,
    ids: &[i64],
) -> Result<Vec<PooledMachine>, sqlx::Error> {
    let sql = format!(
        "SELECT {cols} FROM machines m {joins}
          WHERE m.org_id = $1 AND m.id = ANY($2)",
        cols = pooled_columns(),
        joins = POOL_STATE_JOINS,
    );
    sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(org_id)
        .bind(ids)
        .fetch_all(pool)
        .await
}

/// How many machines matching `filter` (its state aside) are in each
/// `PoolState`, in `PoolState::ALL`'s order.
pub async fn count_by_state(
    pool: &Db,
    org_id: i64,
    filter: &MachineFilter,
) -> Result<Vec<(PoolState, i64)>, sqlx::Error> {
    type Six = (i64, i64, i64, i64, i64, i64);
    let (ready, other, held_ready, held_other, sold_ready, sold_other): Six =
        sqlx::query_as(sqlx::AssertSqlSafe(count_by_state_sql(filter)))
            .bind(org_id)
            .bind(filter.site.as_ref().map(Site::as_str))
            .bind(filter.vendor.as_ref().map(Vendor::as_str))
            .bind(filter.profile.as_ref().map(Profile::as_str))
            .bind(filter.status.map(MachineStatus::as_str))
            .fetch_one(pool)
            .await?;
    Ok(vec![
        (PoolState::Sellable, ready - held_ready - sold_ready),
        (PoolState::Held, held_ready + held_other),
        (PoolState::Sold, sold_ready + sold_other),
        (PoolState::NotReady, other - held_other - sold_other),
    ])
}

/// The sites, vendors and profiles of an organization's inventory, for the
/// filters' selects.
#[derive(Debug, Clone, Default)]
pub struct Facets {
    pub sites: Vec<String>,
    pub vendors: Vec<String>,
    pub profiles: Vec<String>,
}

/// At most this many values of each: a select longer than that is no help.
pub const MAX_FACET_VALUES: i64 = 500;

/// `facets`' statement: `$1` org, `$2` the bound per list.
pub fn facets_sql() -> String {
    let skip = |col: &str| {
        format!(
            "ARRAY(WITH RECURSIVE v(val, n) AS (
                 (SELECT {col}, 1 FROM machines WHERE org_id = $1 ORDER BY {col} LIMIT 1)
                 UNION ALL
                 SELECT (SELECT {col} FROM machines WHERE org_id = $1 AND {col} > v.val ORDER BY {col} LIMIT 1), v.n + 1
                   FROM v WHERE v.val IS NOT NULL AND v.n < $2)
             SELECT val FROM v WHERE val IS NOT NULL)"
        )
    };
    format!(
        "SELECT {}, {}, {}",
        skip("site"),
        skip("vendor"),
        skip("profile")
    )
}

/// One statement, three skip scans: each step jumps to the next distinct
/// value on an index that leads with (org_id, column) (`machines_by_site_idx`,
/// `machines_by_vendor_idx`, `machines_by_profile_idx`), so the cost is the
/// number of distinct values, not of machines.
pub async fn facets(pool: &Db, org_id: i64) -> Result<Facets, sqlx::Error> {
    let sql = facets_sql();
    let (sites, vendors, profiles): (Vec<String>, Vec<String>, Vec<String>) =
        sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(org_id)
            .bind(MAX_FACET_VALUES)
            .fetch_one(pool)
            .await?;
    Ok(Facets {
        sites,
        vendors,
        profiles,
    })
}

/// Machines of `org_id` matching `filter`, by asset tag, at most `limit`
/// after the asset tag `after` (keyset pagination).
pub async fn list(
    pool: &Db,
    org_id: i64,
    filter: &MachineFilter,
    after: Option<&str>,
    limit: i64,
) -> Result<Vec<Machine>, sqlx::Error> {
    let sql = format!(
        "SELECT {MACHINE_COLUMNS} FROM machines m
          WHERE {filter}
            AND {state}
            AND {after}
          ORDER BY m.asset_tag
          LIMIT $8",
        // The API's limit is the caller's: bound, never written in (each
        // value would be a statement of its own in the connection's cache).
        filter = filter_sql(filter),
        state = optional_sql(
            6,
            &format!("{} =", pool_state_probe_sql()),
            filter.state.is_some()
        ),
        after = optional_sql(7, "m.asset_tag >", after.is_some()),
    );
    sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(org_id)
        .bind(filter.site.as_ref().map(Site::as_str))
        .bind(filter.vendor.as_ref().map(Vendor::as_str))
        .bind(filter.profile.as_ref().map(Profile::as_str))
        .bind(filter.status.map(MachineStatus::as_str))
        .bind(filter.state.map(PoolState::as_str))
        .bind(after)
        .bind(limit)
        .fetch_all(pool)
        .await
}

/// One machine of `org_id` by asset tag; another organization's is absent.
pub async fn by_tag(pool: &Db, org_id: i64, tag: &str) -> Result<Option<Machine>, sqlx::Error> {
    let sql =
        format!("SELECT {MACHINE_COLUMNS} FROM machines WHERE org_id = $1 AND asset_tag = $2");
    sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(org_id)
        .bind(tag)
        .fetch_optional(pool)
        .await
}
