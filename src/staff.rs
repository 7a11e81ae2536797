//! Staff users: argon2id password hashes, roles.

use crate::db::Db;
use argon2::Argon2;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgExecutor};

use crate::domain::{Email, Role};

#[derive(Debug, thiserror::Error)]
pub enum StaffError {
    #[error("a user with email {0} already exists")]
    Exists(String),
    #[error("the password must be at least 8 characters")]
    WeakPassword,
    #[error("the password must be at most 1024 bytes")]
    LongPassword,
    #[error("hashing the password failed: {0}")]
    Hash(String),
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

pub fn hash_password(password: &str) -> Result<String, StaffError> {
    let salt = SaltString::generate(&mut argon2::password_hash::rand_core::OsRng);
    Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .map(|h| h.to_string())
        .map_err(|e| StaffError::Hash(e.to_string()))
}

/// Constant-time verification of `password` against a stored PHC string.
pub fn verify_password(stored: &str, password: &str) -> bool {
    PasswordHash::new(stored).is_ok_and(|h| {
        Argon2::default()
            .verify_password(password.as_bytes(), &h)
            .is_ok()
    })
}

pub async fn create(
    pool: &Db,
    org_id: i64,
    email: &Email,
    role: Role,
    password: &str,
) -> Result<i64, StaffError> {
    create_on(pool, org_id, email, role, password).await
}

/// As `create`, on a caller's transaction (the users page writes its audit
/// row in the same transaction) or on the database: one statement.
pub async fn create_on(
    db: impl PgExecutor<'_>,
    org_id: i64,
    email: &Email,
    role: Role,
    password: &str,
) -> Result<i64, StaffError> {
    if password.chars().count() < 8 {
        return Err(StaffError::WeakPassword);
    }
    if password.len() > 1024 {
        return Err(StaffError::LongPassword);
    }
    let hash = hash_password(password)?;
    sqlx::query_scalar("INSERT INTO users (org_id, email, role, password_hash) VALUES ($1, $2, $3, $4) RETURNING id")
        .bind(org_id)
        .bind(email.as_str())
        .bind(role.as_str())
        .bind(hash)
        .fetch_one(db)
        .await
        .map_err(|e| match crate::db::violated_unique(&e) {
            Some("users_email_unique") => StaffError::Exists(email.as_str().to_owned()),
            _ => StaffError::Database(e),
        })
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct User {
    pub id: i64,
    pub email: String,
    pub role: String,
    pub created_at: DateTime<Utc>,
    pub disabled_at: Option<DateTime<Utc>>,
}

/// An organization's users, enabled first, then by email.
pub async fn list(pool: &Db, org_id: i64) -> Result<Vec<User>, sqlx::Error> {
    sqlx::query_as(
        "SELECT id, email, role, created_at, disabled_at FROM users WHERE org_id = $1
          ORDER BY disabled_at IS NOT NULL, email",
    )
    .bind(org_id)
    .fetch_all(pool)
    .await
}

/// Disables a user of `org_id` and revokes every session they hold, in the
/// caller's transaction. Returns the user's email, or None when there is no
/// such user in this organization (another org's user is absent) or the
/// user was already disabled.
pub async fn disable_on(
    conn: &mut PgConnection,
    org_id: i64,
    user_id: i64,
) -> Result<Option<String>, sqlx::Error> {
    let email: Option<String> = sqlx::query_scalar(
        "UPDATE users SET disabled_at = clock_timestamp()
          WHERE id = $1 AND org_id = $2 AND disabled_at IS NULL RETURNING email",
    )
    .bind(user_id)
    .bind(org_id)
    .fetch_optional(&mut *conn)
    .await?;
    if email.is_some() {
        sqlx::query("UPDATE sessions SET revoked_at = clock_timestamp() WHERE user_id = $1 AND revoked_at IS NULL")
            .bind(user_id)
            .execute(&mut *conn)
            .await?;
    }
    Ok(email)
}
