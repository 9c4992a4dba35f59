//! The host side of `sluice:plugin/state`: a plugin's calls, under its own
//! scope (the store prefixes every key with it), bounded by its deadline.
//! The store's errors and a store that does not answer in time come back to
//! the plugin as `state-error`s, never as traps: the plugin decides, and if
//! it fails, its failure policy does.

use std::sync::Arc;

use sluice_state::{Check, Reserved, StateError, Window};
use wasmtime::component::Resource;

use crate::bindings::v3::sluice::plugin::state as wit;
use crate::granted::{MAX_SETTLEMENTS, Reservation, Settlement, StateAccess};
use crate::host::{PluginState, now_unix_ms};

const NOT_GRANTED: &str = "sluice:plugin/state is not granted to this plugin";
const SETTLED: &str = "this reservation was already committed or released";

fn window(window: wit::Window) -> Window {
    match window {
        wit::Window::Fixed(seconds) => Window::Fixed { seconds },
        wit::Window::Sliding(seconds) => Window::Sliding { seconds },
        wit::Window::CalendarMonth => Window::CalendarMonth,
    }
}

fn standings(standings: Vec<sluice_state::Standing>) -> Vec<wit::Standing> {
    standings
        .into_iter()
        .map(|s| wit::Standing {
            key: s.key,
            limit: s.limit,
            used: s.used,
            remaining: s.remaining,
            reset_unix_ms: s.reset_unix_ms,
        })
        .collect()
}

fn error(error: StateError) -> wit::StateError {
    match error {
        StateError::Unavailable(why) => wit::StateError::Unavailable(why),
        StateError::Timeout => wit::StateError::Unavailable("the state store did not answer in time".into()),
        refused => wit::StateError::Refused(refused.to_string()),
    }
}

/// The plugin's store and scope, if granted (a component that imports
/// state without a grant is refused at load, so this is the second line).
fn access(state: &PluginState) -> Result<Arc<StateAccess>, wit::StateError> {
    state.state.clone().ok_or_else(|| wit::StateError::Refused(NOT_GRANTED.into()))
}

/// A store call, given up at the plugin's deadline.
async fn bounded<T>(
    deadline: std::time::Instant,
    call: sluice_state::BoxFuture<'_, Result<T, StateError>>,
) -> Result<T, wit::StateError> {
    match tokio::time::timeout_at(tokio::time::Instant::from_std(deadline), call).await {
        Ok(result) => result.map_err(error),
        Err(_) => {
            Err(wit::StateError::Unavailable("the state store did not answer within the plugin's deadline".into()))
        }
    }
}

impl PluginState {
    /// Notes a store that did not answer, so a failure that follows in this
    /// call is put down to the store; gives the result back.
    fn noted<T>(&mut self, result: Result<T, wit::StateError>) -> Result<T, wit::StateError> {
        if let Err(wit::StateError::Unavailable(why)) = &result {
            self.state_failed.get_or_insert_with(|| why.clone());
        }
        result
    }
}

macro_rules! access_or_return {
    ($state:expr) => {
        match access($state) {
            Ok(access) => access,
            Err(e) => return Ok(Err(e)),
        }
    };
}

impl wit::Host for PluginState {
    async fn reserve(&mut self, checks: Vec<wit::Check>) -> wasmtime::Result<Result<wit::Reserved, wit::StateError>> {
        let access = access_or_return!(self);
        let checks: Vec<Check> = checks
            .into_iter()
            .map(|c| Check { key: c.key, window: window(c.window), limit: c.limit, amount: c.amount })
            .collect();
        let reserved = bounded(self.deadline, access.store.reserve(&access.scope, &checks, now_unix_ms())).await;
        Ok(match self.noted(reserved) {
            Ok(Reserved::Granted { ticket, standings: after }) => {
                let handle = self.table.push(Reservation { ticket: Some(ticket) })?;
                Ok(wit::Reserved::Granted((handle, standings(after))))
            }
            Ok(Reserved::Refused { tightest, standings: now }) => {
                Ok(wit::Reserved::Refused((u32::try_from(tightest).unwrap_or(u32::MAX), standings(now))))
            }
            Err(e) => Err(e),
        })
    }

    async fn get(&mut self, key: String) -> wasmtime::Result<Result<Option<Vec<u8>>, wit::StateError>> {
        let access = access_or_return!(self);
        let result = bounded(self.deadline, access.store.get(&access.scope, &key, now_unix_ms())).await;
        Ok(self.noted(result))
    }

    async fn set(&mut self, key: String, value: Vec<u8>, ttl_ms: u64) -> wasmtime::Result<Result<(), wit::StateError>> {
        let access = access_or_return!(self);
        let result = bounded(self.deadline, access.store.set(&access.scope, &key, &value, ttl_ms, now_unix_ms())).await;
        Ok(self.noted(result))
    }

    async fn compare_and_set(
        &mut self,
        key: String,
        expected: Option<Vec<u8>>,
        value: Vec<u8>,
        ttl_ms: u64,
    ) -> wasmtime::Result<Result<bool, wit::StateError>> {
        let access = access_or_return!(self);
        let now = now_unix_ms();
        let call = access.store.compare_and_set(&access.scope, &key, expected.as_deref(), &value, ttl_ms, now);
        let result = bounded(self.deadline, call).await;
        Ok(self.noted(result))
    }

    async fn delete(&mut self, key: String) -> wasmtime::Result<Result<bool, wit::StateError>> {
        let access = access_or_return!(self);
        let result = bounded(self.deadline, access.store.delete(&access.scope, &key, now_unix_ms())).await;
        Ok(self.noted(result))
    }

    async fn settle_at_end(
        &mut self,
        reservation: Resource<Reservation>,
        weights: Vec<wit::UsageWeights>,
    ) -> wasmtime::Result<Result<(), wit::StateError>> {
        let access = access_or_return!(self);
        // Owned: the handle is the plugin's no more, whatever follows (a
        // ticket dropped here stays counted, as the WIT says).
        let Some(ticket) = self.table.delete(reservation)?.ticket else {
            return Ok(Err(wit::StateError::Refused(SETTLED.into())));
        };
        let refused = |why: String| Ok(Err(wit::StateError::Refused(why)));
        if self.serving.is_none() {
            return refused("settle-at-end is for the request hook; commit the reservation instead".into());
        }
        if self.settlements.len() >= MAX_SETTLEMENTS {
            return refused(format!(
                "a plugin may leave at most {MAX_SETTLEMENTS} reservations to settle in one request"
            ));
        }
        let weights: Vec<_> = weights
            .into_iter()
            .map(|w| sluice_state::UsageWeights { request: w.request, input: w.input, output: w.output })
            .collect();
        if let Err(e) = sluice_state::check_weights(&weights, &ticket) {
            return Ok(Err(error(e)));
        }
        self.settlements.push(Settlement { access, plugin: self.plugin.clone(), ticket, weights });
        Ok(Ok(()))
    }
}

impl wit::HostReservation for PluginState {
    async fn commit(
        &mut self,
        this: Resource<Reservation>,
        actual: Vec<u64>,
    ) -> wasmtime::Result<Result<(), wit::StateError>> {
        let access = access_or_return!(self);
        // Taken first: a reservation is settled once, whatever the store says.
        let Some(ticket) = self.table.get_mut(&this)?.ticket.take() else {
            return Ok(Err(wit::StateError::Refused(SETTLED.into())));
        };
        let result = bounded(self.deadline, access.store.commit(&access.scope, ticket, &actual)).await;
        Ok(self.noted(result))
    }

    async fn release(&mut self, this: Resource<Reservation>) -> wasmtime::Result<Result<(), wit::StateError>> {
        let access = access_or_return!(self);
        let Some(ticket) = self.table.get_mut(&this)?.ticket.take() else {
            return Ok(Err(wit::StateError::Refused(SETTLED.into())));
        };
        let result = bounded(self.deadline, access.store.release(&access.scope, ticket)).await;
        Ok(self.noted(result))
    }

    async fn drop(&mut self, this: Resource<Reservation>) -> wasmtime::Result<()> {
        // Unsettled, it stays counted as reserved: nothing to do.
        self.table.delete(this)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests;
