//! What the figures mean and what limits them: written from the profiles
//! of these runs, kept beside the code that produces the table.

pub const NOTES: &str = "## How it is measured

(to be written)
";
