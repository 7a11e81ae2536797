//! The pool: machines, their attributes and the datacenter team's status.

use crate::db::Db;
use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::domain::{AssetTag, MachineStatus, Profile, Site, Vendor};

#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct Machine {
    #[serde(skip)]
    pub id: i64,
    pub asset_tag: String,
    pub site: String,
    pub vendor: String,
    pub profile: String,
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

/// Creates or updates the machine `tag` of `org_id`.
pub async fn upsert(
    pool: &Db,
    org_id: i64,
    tag: &AssetTag,
    spec: &MachineSpec,
) -> Result<(Machine, Upserted), sqlx::Error> {
    // xmax = 0 only on a freshly inserted row version: tells created from updated
    // in the same statement, without a race between a lookup and a write.
    let sql = format!(
        "INSERT INTO machines (org_id, asset_tag, site, vendor, profile, status)
         VALUES ($1, $2, $3, $4, $5, $6)
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
        .fetch_one(pool)
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
        "SELECT {MACHINE_COLUMNS} FROM machines
          WHERE org_id = $1
            AND ($2::text IS NULL OR site = $2)
            AND ($3::text IS NULL OR vendor = $3)
            AND ($4::text IS NULL OR profile = $4)
            AND ($5::text IS NULL OR status = $5)
            AND ($6::text IS NULL OR asset_tag > $6)
          ORDER BY asset_tag
          LIMIT $7"
    );
    sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(org_id)
        .bind(filter.site.as_ref().map(Site::as_str))
        .bind(filter.vendor.as_ref().map(Vendor::as_str))
        .bind(filter.profile.as_ref().map(Profile::as_str))
        .bind(filter.status.map(MachineStatus::as_str))
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
