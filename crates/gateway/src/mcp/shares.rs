//! The streams each MCP session holds open on this replica, within its
//! share (`maxStreamsPerSession`).

use std::collections::HashMap;
use std::sync::Arc;

use http::HeaderValue;

/// The streams open per session on this replica. A count, not state: a
/// session's streams on other replicas are theirs to bound.
#[derive(Default)]
pub struct StreamShares {
    open: parking_lot::Mutex<HashMap<Box<str>, usize>>,
}

/// One open stream of a session; the count drops with it.
pub struct StreamShare {
    shares: Arc<StreamShares>,
    key: Box<str>,
}

impl StreamShares {
    /// A place for one more stream of the session `id`, if it has fewer
    /// than `max` open here.
    pub fn take(self: &Arc<Self>, id: &HeaderValue, max: usize) -> Option<StreamShare> {
        // The nonce at its start tells sessions apart.
        let key: Box<str> = String::from_utf8_lossy(&id.as_bytes()[..id.len().min(32)]).into();
        let mut open = self.open.lock();
        let count = open.entry(key.clone()).or_default();
        if *count >= max {
            return None;
        }
        *count += 1;
        Some(StreamShare { shares: self.clone(), key })
    }
}

impl Drop for StreamShare {
    fn drop(&mut self) {
        let mut open = self.shares.open.lock();
        if let Some(count) = open.get_mut(&self.key) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.key);
            }
        }
    }
}
