//! Reservations after creation: read, convert (R10), cancel, and their
//! event timeline. Every transition checks the fence, the state and the
//! deadline (R11) in the same transaction that writes it.
//!
//! Cancel and convert run inside PostgreSQL, each as one statement: the
//! function `transition_request_of` of `sql/transitions.sql` locks the
//! machine row first,
//! then the reservation row (the allocator's order too, so the two never
//! deadlock and a new order can never slip in while a conversion is half
//! done), checks fence, state and deadline in that order, records an
//! overdue hold as expired (R11), and for a conversion writes the service
//! link before the reservation turns converted (R10: promote, never
//! release-then-write). The API calls it through `api_transition_request`, with the
//! token check in the same statement.
//!
//! By concern: `rows` the values and their columns, `reads` the reads,
//! `transitions` cancel and convert of one reservation, `orders` whole
//! orders and extensions, `services` the end of a service link. The
//! callers use the names re-exported here.

mod orders;
mod reads;
mod rows;
mod services;
mod transitions;

pub use orders::{
    Named, OrderAction, OrderAfter, order_transition_changed_on, order_transition_for_token,
    order_transition_on,
};
pub use reads::{by_order_ref, events, get, of_machine, order_of, service_of, services_of_order};
pub use rows::{
    Event, MachineSnapshot, RESERVATION_FIELDS, Reservation, ServiceLink, event_kind_schema,
    from_state_schema, reservation_columns, state_schema,
};
pub use services::{EndServiceError, end_service, end_service_on};
pub use transitions::{
    MAX_REASON_CHARS, Transition, TransitionError, cancel, cancel_on, check_reason, convert,
    convert_on, settle, transition_for_token,
};
