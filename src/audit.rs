//! The audit log of staff actions and logins: who, when, from
//! where, on what. Never a password or a token: callers pass an object name
//! ("user:ana@…", "token:checkout", "reservation:12") and a short detail.

use crate::db::Db;
use chrono::{DateTime, Utc};
use sqlx::PgConnection;

crate::domain::closed_set! {
    /// What an audit row records: its name in the log (the `action` column,
    /// the same whether the dashboard, the API or the command line did it)
    /// and its words for people on the audit page.
    pub enum AuditAction("action") {
        Login = "login", "signed in";
        LoginFailed = "login_failed", "failed to sign in";
        LoginThrottled = "login_throttled", "was refused sign-in: too many failures";
        LoginRefusedSso = "login_refused_sso", "was refused a password sign-in: single sign-on only";
        Logout = "logout", "signed out";
        UserAdd = "user.add", "added a user";
        UserDisable = "user.disable", "disabled a user";
        UserRoleChanged = "user.role_changed", "had their role changed by the provider";
        TokenCreate = "token.create", "created an API token";
        TokenRevoke = "token.revoke", "revoked an API token";
        ReservationCancel = "reservation.cancel", "cancelled a reservation";
        ReservationConvert = "reservation.convert", "converted a reservation";
        ReservationExtend = "reservation.extend", "extended a hold";
        OrderCancel = "order.cancel", "cancelled an order";
        OrderConvert = "order.convert", "converted an order";
        OrderExtend = "order.extend", "extended an order's hold";
        MachineStatus = "machine.status", "changed machines' status";
        OrgDatacenterEnabled = "org.datacenter_enabled", "switched the datacenter module";
        OrgExpiryWarning = "org.expiry_warning", "set the expiry warning";
        OrgCustomerHoldLimit = "org.customer_hold_limit", "set the cap on a customer's holds";
        OrgRepairsSegment = "org.repairs_segment", "set the repairs segment";
        OrgWebhookSet = "org.webhook_set", "set the webhook";
        OrgWebhookSecretRotated = "org.webhook_secret_rotated", "rotated the webhook's secret";
        OrgWebhookRemoved = "org.webhook_removed", "removed the webhook";
        HeadroomSet = "headroom.set", "set a pool's headroom";
        HeadroomRemoved = "headroom.removed", "removed a pool's headroom";
        SubstitutesSet = "substitutes.set", "declared a profile's substitutes";
        SubstitutesRemoved = "substitutes.removed", "removed a profile's substitutes";
        SiteLeadTimeSet = "site.lead_time_set", "set a site's lead time";
        OrgSsoSet = "org.sso_set", "configured single sign-on";
        OrgSsoRemoved = "org.sso_removed", "removed single sign-on";
    }
}

/// One audit row to write.
pub struct Entry<'a> {
    pub org_id: Option<i64>,
    pub actor: &'a str,
    pub action: AuditAction,
    pub object: &'a str,
    pub source_addr: &'a str,
    pub detail: Option<&'a str>,
}

/// Writes `entry` on `conn`, so that a caller holding a transaction makes
/// the audit row commit (or roll back) with the action it records. The
/// actor's name (S1: from their provider's last sign-in) is kept beside
/// the email as it is now, when the actor is a user of the organization
/// that has one.
pub async fn record(conn: &mut PgConnection, entry: &Entry<'_>) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO audit_log (org_id, actor, action, object, source_addr, detail, actor_name)
         VALUES ($1, $2, $3, $4, $5, $6,
                 (SELECT display_name FROM users WHERE email = $2 AND org_id = $1))",
    )
    .bind(entry.org_id)
    .bind(entry.actor)
    .bind(entry.action.as_str())
    .bind(entry.object)
    .bind(entry.source_addr)
    .bind(entry.detail)
    .execute(conn)
    .await?;
    Ok(())
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Row {
    pub id: i64,
    pub at: DateTime<Utc>,
    pub actor: String,
    /// The actor's name when the entry was written, if they had one.
    pub actor_name: Option<String>,
    pub action: String,
    pub object: Option<String>,
    pub source_addr: Option<String>,
    pub detail: Option<String>,
}

/// One page of an organization's audit log, newest first, keyed on the
/// row id (a cursor, so pages do not shift when rows arrive). Returns up to
/// `limit + 1` rows: the extra one says there is a next page.
pub async fn page(
    pool: &Db,
    org_id: i64,
    before: Option<i64>,
    limit: i64,
) -> Result<Vec<Row>, sqlx::Error> {
    sqlx::query_as(
        "SELECT id, at, actor, actor_name, action, object, source_addr, detail
           FROM audit_log
          WHERE org_id = $1 AND ($2::bigint IS NULL OR id < $2)
          ORDER BY id DESC
          LIMIT $3",
    )
    .bind(org_id)
    .bind(before)
    .bind(limit + 1)
    .fetch_all(pool)
    .await
}
