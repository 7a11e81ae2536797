//! The reservation pages: `list` (`/reservations`: held reservations with a
//! countdown computed by the database, compact rows, 100 a page, filtered by
//! site and deadline, and its CSV); `detail` (`/reservations/{id}`: the
//! timeline and the one-sentence answer); `actions` (cancel, convert and
//! extend, R14, through a GET confirmation page and a POST form). A
//! reservation of an order of several machines (R13) is shown with its
//! order's other machines, and every action on it acts on the whole order.
//! The SQL they read is in `crate::holds` and `crate::reservations`.

mod actions;
mod detail;
mod list;

pub(crate) use actions::{
    cancel, confirm_cancel, confirm_convert, confirm_extend, convert, extend,
};
pub(crate) use detail::detail;
pub(crate) use list::{export, list};
