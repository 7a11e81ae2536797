//! Ending a service link: the machine goes to `provisioning`.

use sqlx::PgConnection;

use super::rows::{LINK_COLUMNS, ServiceLink};
use crate::db::Db;

/// Why ending a service link was refused.
#[derive(Debug, thiserror::Error)]
pub enum EndServiceError {
    #[error("service link not found")]
    NotFound,
    #[error("the service link has already ended")]
    NotLive,
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

/// Ends a live service link; its machine goes to `provisioning` (it must be
/// wiped before it is sold again), so it is not a candidate until the
/// datacenter team says it is ready.
pub async fn end_service(
    pool: &Db,
    org_id: i64,
    id: i64,
    actor: &str,
) -> Result<ServiceLink, EndServiceError> {
    let mut tx = pool.begin().await?;
    let link = end_service_on(&mut tx, org_id, id, actor).await??;
    tx.commit().await?;
    Ok(link)
}

/// `end_service` in the caller's transaction: the database's errors
/// outside, the refusals inside (`NotFound`, `NotLive`: nothing written).
/// A link this same actor ended already is answered as it is (a retry).
pub async fn end_service_on(
    tx: &mut PgConnection,
    org_id: i64,
    id: i64,
    actor: &str,
) -> Result<Result<ServiceLink, EndServiceError>, sqlx::Error> {
    let machine_id: Option<i64> =
        sqlx::query_scalar("SELECT machine_id FROM service_links WHERE id = $1 AND org_id = $2")
            .bind(id)
            .bind(org_id)
            .fetch_optional(&mut *tx)
            .await?;
    let Some(machine_id) = machine_id else {
        return Ok(Err(EndServiceError::NotFound));
    };
    // Machine row first, as everywhere else.
    sqlx::query("SELECT id FROM machines WHERE id = $1 FOR UPDATE")
        .bind(machine_id)
        .execute(&mut *tx)
        .await?;
    let sql = format!(
        "UPDATE service_links SET ended_at = clock_timestamp(), ended_by = $3
          WHERE id = $1 AND org_id = $2 AND ended_at IS NULL
         RETURNING {LINK_COLUMNS}"
    );
    let link: Option<ServiceLink> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(id)
        .bind(org_id)
        .bind(actor)
        .fetch_optional(&mut *tx)
        .await?;
    let Some(link) = link else {
        // F3: the same end again, after an answer that was lost, answers
        // the service as that end left it; an end by anyone else stays
        // refused, so the caller can tell the two apart.
        let sql = format!(
            "SELECT {LINK_COLUMNS} FROM service_links
              WHERE id = $1 AND org_id = $2 AND ended_at IS NOT NULL AND ended_by = $3"
        );
        let ours: Option<ServiceLink> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(id)
            .bind(org_id)
            .bind(actor)
            .fetch_optional(&mut *tx)
            .await?;
        return Ok(ours.ok_or(EndServiceError::NotLive));
    };
    sqlx::query(
        "UPDATE machines SET status = 'provisioning', updated_at = clock_timestamp() WHERE id = $1",
    )
    .bind(machine_id)
    .execute(&mut *tx)
    .await?;
    Ok(Ok(link))
}
