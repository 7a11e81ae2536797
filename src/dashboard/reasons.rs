//! Why a machine is not a candidate, in words: one label
//! per `allocator::Exclusion::key()`, the same words on every page (machines,
//! why-not) and beside the API's `excluded` keys. The allocator keeps the
//! rules (R7); this module only names them.

use crate::allocator::Exclusion;

/// The key of a candidate, beside `Exclusion::KEYS`.
pub const CANDIDATE: &str = "candidate";

/// The staff-facing label of a reason key (or of `CANDIDATE`).
pub fn label(key: &str) -> &'static str {
    match key {
        "wrong_site" => "at another site",
        "wrong_vendor" => "other vendor",
        "wrong_profile" => "other profile",
        "not_ready" => "not ready",
        "in_service" => "in service",
        "held" => "held",
        CANDIDATE => "candidate",
        _ => "other reason",
    }
}

/// The label of a verdict: `None` is a candidate.
pub fn label_of(exclusion: Option<&Exclusion>) -> &'static str {
    label(exclusion.map_or(CANDIDATE, Exclusion::key))
}

/// Every key in the allocator's order, then the candidates: the rows of the
/// why-not summary.
pub fn keys_with_candidate() -> impl Iterator<Item = &'static str> {
    Exclusion::KEYS.into_iter().chain([CANDIDATE])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_allocator_key_has_its_own_words() {
        let mut seen = std::collections::BTreeSet::new();
        for key in keys_with_candidate() {
            let words = label(key);
            assert_ne!(words, "other reason", "{key} has no label");
            assert!(!words.contains('_'), "{key}: {words} reads like a code");
            assert!(seen.insert(words), "{words} used twice");
        }
        assert_eq!(seen.len(), Exclusion::KEYS.len() + 1);
    }

    #[test]
    fn labels_match_the_issue_words() {
        assert_eq!(label("wrong_site"), "at another site");
        assert_eq!(label_of(Some(&Exclusion::WrongProfile)), "other profile");
        assert_eq!(label_of(None), "candidate");
    }
}
