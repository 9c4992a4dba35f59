//! What a plugin was granted of shared state, and the reservations it
//! holds: a file of their own, so the bindings and the store's data can name
//! them without importing the state calls (which import both).

use std::sync::Arc;

use sluice_state::{Scope, Store, Ticket};

/// What a granted plugin's instances reach: the gateway's store, under the
/// plugin's scope.
#[derive(Clone)]
pub struct StateAccess {
    pub store: Arc<dyn Store>,
    pub scope: Scope,
}

/// What a granted `reserve` added, until committed or released. Dropped
/// without either, it stays counted (see the WIT).
pub struct Reservation {
    /// Taken when it is settled: a reservation is settled once.
    pub(crate) ticket: Option<Ticket>,
}
