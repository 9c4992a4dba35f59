//! Which backends a request goes to, in what order, and what the gateway
//! has learned about each: passive health (outlier ejection, `retry-after`
//! cool-downs) and the route's retry budget.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use sluice_core::OutlierPolicy;

/// Milliseconds on the gateway's own monotonic clock (0 is its start).
pub fn now_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// One backend's passive health. Shared by the snapshots that serve the
/// same backend URL on the same route, so a config change does not forget
/// an ejection.
#[derive(Debug, Default)]
pub struct Health {
    consecutive_failures: AtomicU32,
    /// Ejections since the backend last stayed healthy for a while: each
    /// lasts longer than the one before.
    ejections: AtomicU32,
    /// Until when (see [`now_ms`]) the backend takes no traffic; 0: never.
    ejected_until: AtomicU64,
    /// Ejections in all, for `/admin/config`.
    total_ejections: AtomicU64,
}

impl Health {
    /// How much longer the backend is out of rotation, if it is.
    pub fn ejected_for(&self, now: u64) -> Option<Duration> {
        let until = self.ejected_until.load(Ordering::Relaxed);
        (until > now).then(|| Duration::from_millis(until - now))
    }

    pub fn total_ejections(&self) -> u64 {
        self.total_ejections.load(Ordering::Relaxed)
    }

    pub fn consecutive_failures(&self) -> u32 {
        self.consecutive_failures.load(Ordering::Relaxed)
    }

    /// A response that says nothing bad about the backend.
    pub fn success(&self, now: u64, policy: &OutlierPolicy) {
        self.consecutive_failures.store(0, Ordering::Relaxed);
        // Healthy for as long as the longest ejection since the last one
        // ended: the next ejection starts short again.
        let until = self.ejected_until.load(Ordering::Relaxed);
        if self.ejections.load(Ordering::Relaxed) > 0 && now > until.saturating_add(millis(policy.max_ejection)) {
            self.ejections.store(0, Ordering::Relaxed);
        }
    }

    /// A failure of the backend's; returns how long it is ejected for if
    /// this failure ejected it.
    pub fn failure(&self, now: u64, policy: &OutlierPolicy) -> Option<Duration> {
        if policy.consecutive_failures == 0 {
            return None;
        }
        let failures = self.consecutive_failures.fetch_add(1, Ordering::Relaxed) + 1;
        // Exactly at the threshold: of requests failing together, one ejects.
        if failures != policy.consecutive_failures || self.ejected_for(now).is_some() {
            return None;
        }
        let ejections = self.ejections.fetch_add(1, Ordering::Relaxed).saturating_add(1);
        let duration = policy.base_ejection.saturating_mul(ejections).min(policy.max_ejection);
        self.eject(now, duration);
        Some(duration)
    }

    /// Takes the backend out of rotation for `duration` (a `retry-after`
    /// longer than the route waits), unless it is out for longer already.
    pub fn cool_down(&self, now: u64, duration: Duration) {
        let until = now.saturating_add(millis(duration));
        if self.ejected_until.fetch_max(until, Ordering::Relaxed) < now {
            self.total_ejections.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn eject(&self, now: u64, duration: Duration) {
        self.consecutive_failures.store(0, Ordering::Relaxed);
        self.ejected_until.fetch_max(now.saturating_add(millis(duration)), Ordering::Relaxed);
        self.total_ejections.fetch_add(1, Ordering::Relaxed);
    }
}

/// The backends of one priority, and where the next request starts.
#[derive(Debug)]
struct Group {
    members: Vec<usize>,
    /// Running sums of the members' weights.
    cumulative: Vec<u64>,
    next: AtomicUsize,
}

/// A route's backends by priority, for ordering them per request.
#[derive(Debug)]
pub struct Balancer {
    groups: Vec<Group>,
}

impl Balancer {
    /// `backends`: each backend's (priority, weight), in declaration order.
    pub fn new(backends: &[(u32, u32)]) -> Self {
        let mut priorities: Vec<u32> = backends.iter().map(|(p, _)| *p).collect();
        priorities.sort_unstable();
        priorities.dedup();
        let groups = priorities
            .into_iter()
            .map(|priority| {
                let members: Vec<usize> = (0..backends.len()).filter(|&i| backends[i].0 == priority).collect();
                let cumulative = members
                    .iter()
                    .scan(0u64, |sum, &i| {
                        *sum += u64::from(backends[i].1.max(1));
                        Some(*sum)
                    })
                    .collect();
                Group { members, cumulative, next: AtomicUsize::new(0) }
            })
            .collect();
        Self { groups }
    }

    /// The backends to try for one request, best first: each priority's
    /// backends that are not ejected, starting at the one whose turn it is
    /// by weight; lower priorities after. When every backend is ejected,
    /// all of them (a route with no healthy backend still tries).
    pub fn plan(&self, ejected: impl Fn(usize) -> bool) -> Vec<usize> {
        let mut order = Vec::new();
        let mut all = Vec::new();
        for group in &self.groups {
            let total = group.cumulative.last().copied().unwrap_or(0).max(1);
            let turn = group.next.fetch_add(1, Ordering::Relaxed) as u64 % total;
            let first = group.cumulative.partition_point(|&sum| sum <= turn);
            let n = group.members.len();
            for k in 0..n {
                let backend = group.members[(first + k) % n];
                all.push(backend);
                if !ejected(backend) {
                    order.push(backend);
                }
            }
        }
        if order.is_empty() { all } else { order }
    }
}

/// Requests and retries in flight on a route, for its retry budget.
#[derive(Debug, Default)]
pub struct Budget {
    requests: AtomicU32,
    retries: AtomicU32,
}

/// Counts one request or retry in flight until dropped.
#[derive(Debug)]
pub struct InFlight<'a>(&'a AtomicU32);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Budget {
    pub fn request(&self) -> InFlight<'_> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        InFlight(&self.requests)
    }

    /// A retry in flight, if the budget has room for one more: at most
    /// `percent` of the requests in flight, or `min_concurrency` if more.
    pub fn retry(&self, percent: u32, min_concurrency: u32) -> Option<InFlight<'_>> {
        let requests = u64::from(self.requests.load(Ordering::Relaxed));
        let allowed = (requests * u64::from(percent) / 100).max(u64::from(min_concurrency));
        let retries = self.retries.fetch_add(1, Ordering::Relaxed);
        if u64::from(retries) < allowed {
            return Some(InFlight(&self.retries));
        }
        self.retries.fetch_sub(1, Ordering::Relaxed);
        None
    }
}

/// A random wait up to `base × 2^(retry − 1)`, at most `max` ("full
/// jitter"): retries of many clients spread out instead of arriving
/// together.
pub fn backoff(retry: u32, base: Duration, max: Duration, random: u64) -> Duration {
    let ceiling = base.saturating_mul(1u32 << retry.saturating_sub(1).min(16)).min(max);
    let ceiling = millis(ceiling);
    if ceiling == 0 {
        return Duration::ZERO;
    }
    Duration::from_millis(random % (ceiling + 1))
}

/// What a `retry-after-ms` (OpenAI's) or `retry-after` (seconds) header
/// asks for. An HTTP date is not followed: it needs a clock the backend
/// and the gateway agree on.
pub fn retry_after(headers: &http::HeaderMap) -> Option<Duration> {
    let number = |name: &str| -> Option<f64> {
        let value = headers.get(name)?.to_str().ok()?.trim().parse::<f64>().ok()?;
        (value.is_finite() && value >= 0.0).then_some(value)
    };
    if let Some(ms) = number("retry-after-ms") {
        return Some(Duration::from_secs_f64((ms / 1000.0).min(86_400.0)));
    }
    number("retry-after").map(|s| Duration::from_secs_f64(s.min(86_400.0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outliers(failures: u32) -> OutlierPolicy {
        OutlierPolicy {
            consecutive_failures: failures,
            base_ejection: Duration::from_secs(10),
            max_ejection: Duration::from_secs(25),
        }
    }

    #[test]
    fn consecutive_failures_eject_for_growing_times_and_a_success_resets_the_count() {
        let health = Health::default();
        let policy = outliers(3);
        assert_eq!(health.failure(0, &policy), None);
        assert_eq!(health.failure(0, &policy), None);
        health.success(0, &policy);
        assert_eq!(health.failure(0, &policy), None);
        assert_eq!(health.failure(0, &policy), None);
        assert_eq!(health.failure(0, &policy), Some(Duration::from_secs(10)));
        assert_eq!(health.ejected_for(4_000), Some(Duration::from_secs(6)));
        assert_eq!(health.ejected_for(10_000), None);
        // Failing again right after: twice as long, then capped.
        for _ in 0..2 {
            assert_eq!(health.failure(10_000, &policy), None);
        }
        assert_eq!(health.failure(10_000, &policy), Some(Duration::from_secs(20)));
        for _ in 0..2 {
            health.failure(30_000, &policy);
        }
        assert_eq!(health.failure(30_000, &policy), Some(Duration::from_secs(25)));
        assert_eq!(health.total_ejections(), 3);
        // Healthy for longer than the longest ejection: short again.
        health.success(55_000 + 25_001, &policy);
        for _ in 0..2 {
            health.failure(90_000, &policy);
        }
        assert_eq!(health.failure(90_000, &policy), Some(Duration::from_secs(10)));
        // Off.
        let off = Health::default();
        assert!((0..100).all(|_| off.failure(0, &outliers(0)).is_none()));
    }

    #[test]
    fn cool_downs_never_shorten_an_ejection() {
        let health = Health::default();
        health.cool_down(1_000, Duration::from_secs(5));
        assert_eq!(health.ejected_for(1_000), Some(Duration::from_secs(5)));
        health.cool_down(1_000, Duration::from_secs(1));
        assert_eq!(health.ejected_for(1_000), Some(Duration::from_secs(5)));
    }

    #[test]
    fn plans_follow_weights_then_priorities_and_skip_ejected_backends() {
        // 0 and 1 at priority 0 (weights 3 and 1), 2 at priority 1.
        let balancer = Balancer::new(&[(0, 3), (0, 1), (1, 1)]);
        let firsts: Vec<usize> = (0..8).map(|_| balancer.plan(|_| false)[0]).collect();
        assert_eq!(firsts, [0, 0, 0, 1, 0, 0, 0, 1]);
        assert_eq!(balancer.plan(|_| false), [0, 1, 2]);
        assert_eq!(balancer.plan(|b| b == 0), [1, 2]);
        assert_eq!(balancer.plan(|b| b < 2), [2]);
        // Everything ejected: everything, in order.
        assert_eq!(balancer.plan(|_| true).len(), 3);
    }

    #[test]
    fn the_budget_admits_a_share_of_requests_in_flight() {
        let budget = Budget::default();
        let requests: Vec<_> = (0..20).map(|_| budget.request()).collect();
        // 20% of 20 is 4; at least 1.
        let retries: Vec<_> = (0..10).filter_map(|_| budget.retry(20, 1)).collect();
        assert_eq!(retries.len(), 4);
        drop(retries);
        let again: Vec<_> = (0..10).filter_map(|_| budget.retry(20, 1)).collect();
        assert_eq!(again.len(), 4);
        drop((again, requests));
        // No requests: the floor.
        let held: Vec<_> = (0..10).filter_map(|_| budget.retry(20, 2)).collect();
        assert_eq!(held.len(), 2);
    }

    #[test]
    fn backoff_is_jittered_under_a_doubling_ceiling() {
        let base = Duration::from_millis(100);
        let max = Duration::from_millis(1000);
        assert_eq!(backoff(1, base, max, 100), Duration::from_millis(100));
        assert_eq!(backoff(1, base, max, 101), Duration::ZERO);
        assert_eq!(backoff(3, base, max, 400), Duration::from_millis(400));
        assert!((0..1000).all(|r| backoff(9, base, max, r * 7919) <= max));
        assert_eq!(backoff(40, base, max, u64::MAX), Duration::from_millis(u64::MAX % 1001));
    }

    #[test]
    fn retry_after_reads_milliseconds_then_seconds() {
        let headers = |pairs: &[(&str, &str)]| -> http::HeaderMap {
            pairs.iter().map(|(n, v)| (n.parse().unwrap(), v.parse().unwrap())).collect()
        };
        assert_eq!(retry_after(&headers(&[("retry-after", "2")])), Some(Duration::from_secs(2)));
        assert_eq!(
            retry_after(&headers(&[("retry-after", "2"), ("retry-after-ms", "150")])),
            Some(Duration::from_millis(150))
        );
        assert_eq!(retry_after(&headers(&[("retry-after", "Wed, 21 Oct 2015 07:28:00 GMT")])), None);
        assert_eq!(retry_after(&headers(&[("retry-after", "-1")])), None);
        assert_eq!(retry_after(&headers(&[("retry-after", "1e300")])), Some(Duration::from_secs(86_400)));
    }
}
