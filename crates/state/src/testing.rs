//! What the two stores' tests share: one scope, checks, and unwrapping a
//! reserve either way.

use crate::{Check, Reserved, Scope, Standing, StateError, Ticket, Window};

pub(crate) fn scope() -> Scope {
    Scope::new("team-a", "quota")
}

pub(crate) fn fixed(seconds: u32) -> Window {
    Window::Fixed { seconds }
}

pub(crate) fn check(key: &str, window: Window, limit: u64, amount: u64) -> Check {
    Check { key: key.into(), window, limit, amount }
}

#[track_caller]
pub(crate) fn granted(reserved: Result<Reserved, StateError>) -> (Ticket, Vec<Standing>) {
    match reserved {
        Ok(Reserved::Granted { ticket, standings }) => (ticket, standings),
        other => panic!("not granted: {other:?}"),
    }
}

#[track_caller]
pub(crate) fn refused(reserved: Result<Reserved, StateError>) -> (usize, Vec<Standing>) {
    match reserved {
        Ok(Reserved::Refused { tightest, standings }) => (tightest, standings),
        other => panic!("not refused: {other:?}"),
    }
}

/// `used` of each standing.
pub(crate) fn used(standings: &[Standing]) -> Vec<u64> {
    standings.iter().map(|standing| standing.used).collect()
}
