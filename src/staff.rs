//! Staff users: argon2id password hashes, roles.

use argon2::Argon2;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use sqlx::PgPool;

use crate::domain::{Email, Role};

#[derive(Debug, thiserror::Error)]
pub enum StaffError {
    #[error("a user with email {0} already exists")]
    Exists(String),
    #[error("the password must be at least 8 characters")]
    WeakPassword,
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
    pool: &PgPool,
    org_id: i64,
    email: &Email,
    role: Role,
    password: &str,
) -> Result<i64, StaffError> {
    if password.chars().count() < 8 {
        return Err(StaffError::WeakPassword);
    }
    let hash = hash_password(password)?;
    sqlx::query_scalar("INSERT INTO users (org_id, email, role, password_hash) VALUES ($1, $2, $3, $4) RETURNING id")
        .bind(org_id)
        .bind(email.as_str())
        .bind(role.as_str())
        .bind(hash)
        .fetch_one(pool)
        .await
        .map_err(|e| match crate::db::violated_unique(&e) {
            Some("users_email_unique") => StaffError::Exists(email.as_str().to_owned()),
            _ => StaffError::Database(e),
        })
}
