//! CSRF: every POST form carries the session's csrf_token in a hidden field;
//! a missing or wrong one is a 403 page, checked before anything else.

use super::error::DashError;
use super::session::Staff;

/// Constant-time comparison: the time taken says nothing about the token.
pub fn same(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() || a.is_empty() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

pub fn check(staff: &Staff, sent: &str) -> Result<(), DashError> {
    if same(&staff.csrf_token, sent) {
        Ok(())
    } else {
        Err(DashError::forbidden(
            "This form was missing its security token or it did not match your session. \
             Reload the page and try again.",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::same;

    #[test]
    fn tokens_must_match_exactly_and_not_be_empty() {
        assert!(same("abc", "abc"));
        assert!(!same("abc", "abd"));
        assert!(!same("abc", "ab"));
        assert!(!same("", ""));
    }
}
