//! (issue 4)
