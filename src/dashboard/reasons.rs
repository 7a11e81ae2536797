//! Why a machine is not a candidate, in words: the words of each
//! `allocator::ExclusionKey`, the same on every page (machines, why-not)
//! and beside the API's `excluded` keys, plus the candidates' group. The
//! allocator keeps the rules (R7) and their words; this module only adds
//! the group of the candidates.

use crate::allocator::{Exclusion, ExclusionKey};

/// The key of a candidate, beside the `ExclusionKey`s.
pub const CANDIDATE: &str = "candidate";

/// The staff-facing label of a reason key (or of `CANDIDATE`).
pub fn label(key: &str) -> &'static str {
    if key == CANDIDATE {
        return "candidate";
    }
    ExclusionKey::parse(key).map_or("other reason", ExclusionKey::words)
}

/// The label of a verdict: `None` is a candidate.
pub fn label_of(exclusion: Option<&Exclusion>) -> &'static str {
    exclusion.map_or("candidate", |e| e.key().words())
}

/// Every key in the allocator's order, then the candidates: the rows of the
/// why-not summary.
pub fn keys_with_candidate() -> impl Iterator<Item = &'static str> {
    ExclusionKey::ALL
        .iter()
        .map(|k| k.as_str())
        .chain([CANDIDATE])
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
        assert_eq!(seen.len(), ExclusionKey::ALL.len() + 1);
    }

    #[test]
    fn labels_match_the_issue_words() {
        assert_eq!(label("wrong_site"), "at another site");
        assert_eq!(label_of(Some(&Exclusion::WrongProfile)), "other profile");
        assert_eq!(label_of(None), "candidate");
    }
}
