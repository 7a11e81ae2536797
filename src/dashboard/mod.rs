//! The staff dashboard (issue 5).
