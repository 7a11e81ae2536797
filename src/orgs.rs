//! Organizations (tenants) and their half of the R12 switch.

use crate::db::Db;
use sqlx::PgExecutor;

use crate::domain::{Segment, Slug};

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Organization {
    pub id: i64,
    pub slug: String,
    pub name: String,
    pub datacenter_enabled: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum OrgError {
    #[error("organization {0:?} already exists")]
    Exists(String),
    #[error("no organization {0:?}")]
    Unknown(String),
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

pub async fn create(
    pool: &Db,
    slug: &Slug,
    name: &str,
    datacenter_enabled: bool,
) -> Result<Organization, OrgError> {
    sqlx::query_as(
        "INSERT INTO organizations (slug, name, datacenter_enabled) VALUES ($1, $2, $3)
         RETURNING id, slug, name, datacenter_enabled",
    )
    .bind(slug.as_str())
    .bind(name)
    .bind(datacenter_enabled)
    .fetch_one(pool)
    .await
    .map_err(|e| match crate::db::violated_unique(&e) {
        Some("organizations_slug_unique") => OrgError::Exists(slug.as_str().to_owned()),
        _ => OrgError::Database(e),
    })
}

pub async fn by_slug(pool: &Db, slug: &str) -> Result<Organization, OrgError> {
    sqlx::query_as("SELECT id, slug, name, datacenter_enabled FROM organizations WHERE slug = $1")
        .bind(slug)
        .fetch_optional(pool)
        .await?
        .ok_or_else(|| OrgError::Unknown(slug.to_owned()))
}

pub async fn set_datacenter_enabled(
    pool: &Db,
    org_id: i64,
    enabled: bool,
) -> Result<(), sqlx::Error> {
    set_datacenter_enabled_on(pool, org_id, enabled).await
}

/// R16: how long before a hold's deadline the order service hears of it.
pub async fn expiry_warning_seconds(
    db: impl PgExecutor<'_>,
    org_id: i64,
) -> Result<i32, sqlx::Error> {
    sqlx::query_scalar("SELECT expiry_warning_seconds FROM organizations WHERE id = $1")
        .bind(org_id)
        .fetch_one(db)
        .await
}

/// Sets it (0 to 3600, the table's check); true when it changed.
pub async fn set_expiry_warning_on(
    db: impl PgExecutor<'_>,
    org_id: i64,
    seconds: i32,
) -> Result<bool, sqlx::Error> {
    let changed = sqlx::query(
        "UPDATE organizations SET expiry_warning_seconds = $2
          WHERE id = $1 AND expiry_warning_seconds IS DISTINCT FROM $2",
    )
    .bind(org_id)
    .bind(seconds)
    .execute(db)
    .await?
    .rows_affected();
    Ok(changed > 0)
}

/// As `set_datacenter_enabled`, on a caller's transaction (the settings page
/// writes its audit row in the same transaction).
pub async fn set_datacenter_enabled_on(
    db: impl PgExecutor<'_>,
    org_id: i64,
    enabled: bool,
) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE organizations SET datacenter_enabled = $2 WHERE id = $1")
        .bind(org_id)
        .bind(enabled)
        .execute(db)
        .await?;
    Ok(())
}

/// R19's cap and R18's repairs segment of one organization, changed from
/// the command line; each change that took effect is audited in the same
/// transaction. `repairs_segment`: `Some(None)` clears it.
pub struct CapacitySettings<'a> {
    pub customer_hold_limit: Option<i32>,
    pub repairs_segment: Option<Option<&'a Segment>>,
}

/// Applies `change` to organization `org_id`, in one transaction with its
/// audit rows; returns what changed, as audited (empty: it already was so).
pub async fn set_capacity_settings(
    pool: &Db,
    org_id: i64,
    change: &CapacitySettings<'_>,
    actor: &str,
) -> Result<Vec<String>, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let mut changed = Vec::new();
    if let Some(limit) = change.customer_hold_limit {
        let n = sqlx::query(
            "UPDATE organizations SET customer_hold_limit = $2
              WHERE id = $1 AND customer_hold_limit IS DISTINCT FROM $2",
        )
        .bind(org_id)
        .bind(limit)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if n > 0 {
            changed.push((
                crate::audit::AuditAction::OrgCustomerHoldLimit,
                format!("{limit}"),
            ));
        }
    }
    if let Some(segment) = change.repairs_segment {
        let segment = segment.map(Segment::as_str);
        let n = sqlx::query(
            "UPDATE organizations SET repairs_segment = $2
              WHERE id = $1 AND repairs_segment IS DISTINCT FROM $2",
        )
        .bind(org_id)
        .bind(segment)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if n > 0 {
            changed.push((
                crate::audit::AuditAction::OrgRepairsSegment,
                segment.unwrap_or("").to_owned(),
            ));
        }
    }
    for (action, detail) in &changed {
        crate::audit::record(
            &mut tx,
            &crate::audit::Entry {
                org_id: Some(org_id),
                actor,
                action: *action,
                object: &format!("org:{org_id}"),
                source_addr: "command line",
                detail: Some(detail),
            },
        )
        .await?;
    }
    tx.commit().await?;
    Ok(changed
        .into_iter()
        .map(|(action, detail)| format!("{action} {detail:?}"))
        .collect())
}

/// R19's cap and R18's repairs segment as they are.
pub async fn capacity_settings(
    pool: &Db,
    org_id: i64,
) -> Result<(i32, Option<String>), sqlx::Error> {
    sqlx::query_as("SELECT customer_hold_limit, repairs_segment FROM organizations WHERE id = $1")
        .bind(org_id)
        .fetch_one(pool)
        .await
}
