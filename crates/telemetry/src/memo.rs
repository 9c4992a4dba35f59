//! The request path's metric handles, remembered by the addresses of their
//! label values.
//!
//! A prometheus `Family` finds a series by hashing its labels' text with
//! SipHash under a lock, about a thousand instructions a lookup and eight
//! lookups a request (callgrind, the bench's chain). The values a request
//! labels its metrics with are shared `Arc<str>`s that live as long as the
//! config, and `&'static str`s, so each thread remembers the handle it found
//! for a set of values by their addresses and lengths, and finds it again
//! with one cheap hash.
//!
//! An entry keeps its values alive, so an address it was found by cannot be
//! reused for other text while it stands. Equal values at other addresses
//! (after a reload) find the same series through the family and are
//! remembered once more; each thread's table is cleared when it grows past
//! [`MAX_ENTRIES`], which bounds the memory the old values hold.

use std::cell::RefCell;
use std::collections::HashMap;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::{Family, MetricConstructor};
use prometheus_client::metrics::histogram::Histogram;

use crate::metrics::{GenAiLabels, RequestLabels, RouteLabels, TokenLabels, TokenUsageLabels, UpstreamLabels};

/// Label values per set at most (`TokenUsageLabels` has five).
const MAX_VALUES: usize = 5;

/// Entries per family and thread before the table starts afresh.
pub(crate) const MAX_ENTRIES: usize = 512;

/// Where each label value is, and how long it is.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(crate) struct Key([(usize, usize); MAX_VALUES]);

impl Key {
    pub(crate) fn of<const N: usize>(values: [&str; N]) -> Key {
        const { assert!(N <= MAX_VALUES) };
        let mut key = [(0, 0); MAX_VALUES];
        for (slot, value) in key.iter_mut().zip(values) {
            *slot = (value.as_ptr() as usize, value.len());
        }
        Key(key)
    }
}

/// One family's remembered handles, on one thread.
pub(crate) struct Remembered<L, M> {
    // The labels are kept for the values they hold alive, not read.
    entries: HashMap<Key, (L, M), foldhash::fast::RandomState>,
}

impl<L, M> Default for Remembered<L, M> {
    fn default() -> Self {
        Self { entries: HashMap::default() }
    }
}

impl<L: Clone + std::hash::Hash + Eq, M: Clone> Remembered<L, M> {
    /// The handle of the series `labels` names, from `family` the first time.
    /// `key` must be [`Key::of`] the values `labels` makes.
    pub(crate) fn get<C: MetricConstructor<M>>(
        &mut self,
        key: Key,
        labels: impl FnOnce() -> L,
        family: &Family<L, M, C>,
    ) -> &M {
        // Looked up twice only when full: a hit is one lookup.
        if self.entries.len() >= MAX_ENTRIES && !self.entries.contains_key(&key) {
            self.entries.clear();
        }
        let (_, metric) = self.entries.entry(key).or_insert_with(|| {
            let labels = labels();
            let metric = family.get_or_create_owned(&labels);
            (labels, metric)
        });
        metric
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}

/// The families a request's end records to.
#[derive(Default)]
pub(crate) struct Handles {
    pub requests: Remembered<RequestLabels, Counter>,
    pub request_duration: Remembered<RouteLabels, Histogram>,
    pub upstream_duration: Remembered<UpstreamLabels, Histogram>,
    pub gen_ai_request_duration: Remembered<GenAiLabels, Histogram>,
    pub gen_ai_time_to_first_token: Remembered<GenAiLabels, Histogram>,
    pub gen_ai_token_usage: Remembered<TokenUsageLabels, Histogram>,
    pub tokens: Remembered<TokenLabels, Counter>,
}

thread_local! {
    static HANDLES: RefCell<Handles> = RefCell::default();
}

/// Runs `f` with this thread's handles.
pub(crate) fn with(f: impl FnOnce(&mut Handles)) {
    let mut f = Some(f);
    let _ = HANDLES.try_with(|handles| {
        if let Ok(mut handles) = handles.try_borrow_mut()
            && let Some(f) = f.take()
        {
            f(&mut handles);
        }
    });
    // This thread's table is gone (a request ending as the thread exits)
    // or in use: a table for this call alone, found through the families.
    if let Some(f) = f {
        f(&mut Handles::default());
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    type Routes = Remembered<RouteLabels, Counter>;

    fn count(memo: &mut Routes, family: &Family<RouteLabels, Counter>, route: &Arc<str>, model: &Arc<str>, n: u64) {
        let labels = || RouteLabels { route: route.clone(), model: model.clone() };
        memo.get(Key::of([route, model]), labels, family).inc_by(n);
    }

    fn counted(family: &Family<RouteLabels, Counter>, route: &str, model: &str) -> u64 {
        family.get_or_create(&RouteLabels { route: route.into(), model: model.into() }).get()
    }

    #[test]
    fn equal_text_at_another_address_finds_the_same_series() {
        let family = Family::default();
        let mut memo = Routes::default();
        let model: Arc<str> = "m".into();
        let (a, b) = (Arc::<str>::from("default/chat"), Arc::<str>::from("default/chat"));
        assert!(!std::ptr::eq(a.as_ptr(), b.as_ptr()));
        count(&mut memo, &family, &a, &model, 1);
        count(&mut memo, &family, &b, &model, 1);
        count(&mut memo, &family, &a, &model, 1);
        // Two entries, one series: the family decides what is equal.
        assert_eq!(memo.len(), 2);
        assert_eq!(counted(&family, "default/chat", "m"), 3);
    }

    #[test]
    fn other_text_finds_its_own_series() {
        let family = Family::default();
        let mut memo = Routes::default();
        let model: Arc<str> = "m".into();
        let (a, b) = (Arc::<str>::from("default/chat"), Arc::<str>::from("default/chat-2"));
        count(&mut memo, &family, &a, &model, 1);
        count(&mut memo, &family, &b, &model, 5);
        // The same values in another label are another key.
        count(&mut memo, &family, &model, &a, 7);
        assert_eq!(counted(&family, "default/chat", "m"), 1);
        assert_eq!(counted(&family, "default/chat-2", "m"), 5);
        assert_eq!(counted(&family, "m", "default/chat"), 7);
        // A prefix of a value, at its address, is another key.
        assert_ne!(Key::of([&b[..12]]), Key::of([&b]));
    }

    #[test]
    fn a_call_while_the_table_is_in_use_still_counts() {
        let family: Family<RequestLabels, Counter> = Family::default();
        let labels = RequestLabels {
            route: "r".into(),
            model: "m".into(),
            backend: "b".into(),
            status_class: "2xx",
            error_code: "",
        };
        let count = |handles: &mut Handles| {
            let l = &labels;
            let key = Key::of([&l.route, &l.model, &l.backend, l.status_class, l.error_code]);
            handles.requests.get(key, || labels.clone(), &family).inc();
        };
        with(|outer| {
            count(outer);
            with(count);
        });
        with(count);
        assert_eq!(family.get_or_create(&labels).get(), 3);
    }

    #[test]
    fn the_table_starts_afresh_past_its_bound_and_keeps_counting() {
        let family = Family::default();
        let mut memo = Routes::default();
        let model: Arc<str> = "m".into();
        let routes: Vec<Arc<str>> = (0..MAX_ENTRIES + 10).map(|i| Arc::from(format!("r{i}"))).collect();
        for route in routes.iter().chain(routes.iter()) {
            count(&mut memo, &family, route, &model, 1);
            assert!(memo.len() <= MAX_ENTRIES);
        }
        for route in &routes {
            assert_eq!(counted(&family, route, "m"), 2, "{route}");
        }
    }
}
