use std::task::{Context, Poll, Waker};

use super::*;
use crate::testing::{check, fixed, granted, refused, scope, used};

/// 2024-03-15T00:00:00Z: the start of a UTC day, so of every fixed bucket
/// of a length that divides one.
const T0: u64 = 1_710_460_800_000;

/// What the in-process store's (ready) futures give.
fn ready<T>(mut future: BoxFuture<'_, T>) -> T {
    match future.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(value) => value,
        Poll::Pending => panic!("an in-process call was not ready"),
    }
}

fn store() -> MemoryStore {
    MemoryStore::new(Limits::default())
}

/// Reserves `amount` on `key` (limit `limit`, window `window`) and gives
/// the standing after, or as it stood when refused, and whether granted.
fn reserve_one(store: &MemoryStore, key: &str, window: Window, limit: u64, amount: u64, now: u64) -> (bool, Standing) {
    let checks = [check(key, window, limit, amount)];
    match ready(store.reserve(&scope(), &checks, now)).unwrap() {
        Reserved::Granted { mut standings, .. } => (true, standings.remove(0)),
        Reserved::Refused { mut standings, .. } => (false, standings.remove(0)),
    }
}

#[test]
fn scopes_never_see_each_others_state() {
    let store = store();
    // Pairs that would collide if the names were joined with `/`.
    let pairs = [
        (Scope::new("a", "b/c"), Scope::new("a/b", "c")),
        (Scope::new("ns", "p1"), Scope::new("ns", "p2")),
        (Scope::new("ns1", "p"), Scope::new("ns2", "p")),
        (Scope::new("", "ab"), Scope::new("a", "b")),
    ];
    for (first, second) in &pairs {
        let checks = [check("k", fixed(60), 5, 3)];
        let (_, standings) = granted(ready(store.reserve(first, &checks, T0)));
        assert_eq!(used(&standings), [3]);
        // The same key in another scope is another counter.
        let checks = [check("k", fixed(60), 5, 5)];
        let (_, standings) = granted(ready(store.reserve(second, &checks, T0)));
        assert_eq!(used(&standings), [5]);
        assert_eq!(store.count(first, "k", fixed(60), T0 / 60_000), Some(3));

        ready(store.set(first, "e", b"one", 0, T0)).unwrap();
        assert_eq!(ready(store.get(second, "e", T0)).unwrap(), None);
        assert!(!ready(store.delete(second, "e", T0)).unwrap());
        ready(store.set(second, "e", b"two", 0, T0)).unwrap();
        assert_eq!(ready(store.get(first, "e", T0)).unwrap().as_deref(), Some(&b"one"[..]));
        assert!(ready(store.delete(second, "e", T0)).unwrap());
        assert_eq!(ready(store.get(first, "e", T0)).unwrap().as_deref(), Some(&b"one"[..]));
    }
}

#[test]
fn reserves_are_granted_up_to_the_limit_exactly() {
    let store = store();
    let end = T0 + 60_000;
    for n in 1..=5 {
        let (granted, standing) = reserve_one(&store, "k", fixed(60), 5, 1, T0 + n);
        assert!(granted, "reserve {n}");
        let expected = Standing { key: "k".into(), limit: 5, used: n, remaining: 5 - n, reset_unix_ms: end };
        assert_eq!(standing, expected);
    }
    let (tightest, standings) = refused(ready(store.reserve(&scope(), &[check("k", fixed(60), 5, 1)], T0 + 10)));
    assert_eq!(tightest, 0);
    assert_eq!(standings, [Standing { key: "k".into(), limit: 5, used: 5, remaining: 0, reset_unix_ms: end }]);
    assert_eq!(store.count(&scope(), "k", fixed(60), T0 / 60_000), Some(5));
    // An amount of 0 still passes; an amount past the limit never does.
    assert!(reserve_one(&store, "k", fixed(60), 5, 0, T0 + 11).0);
    let (granted, standing) = reserve_one(&store, "fresh", fixed(60), 5, 6, T0);
    assert!(!granted);
    assert_eq!((standing.used, standing.remaining), (0, 5));
    assert_eq!(store.count(&scope(), "fresh", fixed(60), T0 / 60_000), None);
    // A sum past u64 is past any limit.
    assert!(!reserve_one(&store, "k", fixed(60), u64::MAX, u64::MAX, T0).0);
}

#[test]
fn the_tightest_refusal_is_the_one_that_resets_last() {
    let store = store();
    let day_end = T0 + 86_400_000;
    let checks = [check("roomy", fixed(1), 100, 1), check("u", fixed(60), 1, 1), check("u", fixed(86_400), 1, 1)];
    granted(ready(store.reserve(&scope(), &checks, T0)));
    // Both the minute and the day are spent; the client waits for the day.
    let (tightest, standings) = refused(ready(store.reserve(&scope(), &checks, T0 + 1)));
    assert_eq!(tightest, 2);
    assert_eq!(used(&standings), [1, 1, 1]);
    let resets: Vec<u64> = standings.iter().map(|standing| standing.reset_unix_ms).collect();
    assert_eq!(resets, [T0 + 1000, T0 + 60_000, day_end]);
    // In the other order, the other index.
    let reversed = [check("u", fixed(86_400), 1, 1), check("u", fixed(60), 1, 1)];
    assert_eq!(refused(ready(store.reserve(&scope(), &reversed, T0 + 1))).0, 0);
    // A refused check that resets sooner loses to a later one only if that
    // one is refused too: with the minute alone spent, it is the minute.
    let minute_only = [check("v", fixed(86_400), 10, 1), check("v", fixed(60), 1, 1)];
    granted(ready(store.reserve(&scope(), &minute_only, T0)));
    assert_eq!(refused(ready(store.reserve(&scope(), &minute_only, T0 + 1))).0, 1);
    // Ties go to the first.
    let tie = [check("w", fixed(60), 0, 1), check("x", fixed(60), 0, 1)];
    assert_eq!(refused(ready(store.reserve(&scope(), &tie, T0))).0, 0);
}

#[test]
fn a_refused_reserve_adds_nothing_to_any_counter() {
    let store = store();
    let checks = [check("a", fixed(60), 10, 3), check("b", fixed(60), 2, 3), check("c", Window::CalendarMonth, 9, 1)];
    let (tightest, standings) = refused(ready(store.reserve(&scope(), &checks, T0)));
    assert_eq!(tightest, 1);
    assert_eq!(used(&standings), [0, 0, 0]);
    for check in &checks {
        assert_eq!(store.count(&scope(), &check.key, check.window, check.window.bucket(T0).index), None);
    }
    assert_eq!(store.usage(&scope()), Usage::default());
    // All of `a`'s limit is still there.
    assert!(reserve_one(&store, "a", fixed(60), 10, 10, T0).0);
}

#[test]
fn checks_on_one_counter_count_together() {
    let store = store();
    let over = [check("k", fixed(60), 5, 3), check("k", fixed(60), 5, 3)];
    let (tightest, standings) = refused(ready(store.reserve(&scope(), &over, T0)));
    assert_eq!((tightest, used(&standings)), (1, vec![0, 0]));
    let within = [check("k", fixed(60), 5, 2), check("k", fixed(60), 5, 3)];
    let (ticket, standings) = granted(ready(store.reserve(&scope(), &within, T0)));
    assert_eq!(used(&standings), [5, 5]);
    assert_eq!(ticket.amounts().collect::<Vec<_>>(), [2, 3]);
    assert_eq!(store.usage(&scope()).keys, 1);
    // The first check's 2 given back; the second's 3 kept.
    ready(store.commit(&scope(), ticket, &[0])).unwrap();
    assert_eq!(store.count(&scope(), "k", fixed(60), T0 / 60_000), Some(3));
    // One key in two windows is two counters.
    let windows = [check("k", fixed(60), 5, 2), check("k", Window::Sliding { seconds: 60 }, 2, 2)];
    granted(ready(store.reserve(&scope(), &windows, T0)));
    assert_eq!(store.usage(&scope()).keys, 2);
}

#[test]
fn concurrent_reserves_never_pass_the_limit() {
    const LIMIT: u64 = 1000;
    let store = store();
    let granted: u64 = std::thread::scope(|threads| {
        let workers: Vec<_> = (0..8)
            .map(|_| {
                threads.spawn(|| {
                    let checks = [check("k", fixed(3600), LIMIT, 1), check("tokens", fixed(3600), 2 * LIMIT, 2)];
                    let mut granted = 0;
                    for n in 0..250 {
                        if let Reserved::Granted { .. } = ready(store.reserve(&scope(), &checks, T0 + n)).unwrap() {
                            granted += 1;
                        }
                    }
                    granted
                })
            })
            .collect();
        workers.into_iter().map(|worker| worker.join().unwrap()).sum()
    });
    assert_eq!(granted, LIMIT);
    assert_eq!(store.count(&scope(), "k", fixed(3600), T0 / 3_600_000), Some(LIMIT));
    assert_eq!(store.count(&scope(), "tokens", fixed(3600), T0 / 3_600_000), Some(2 * LIMIT));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tasks_share_a_dyn_store() {
    let store: Arc<dyn Store> = Arc::new(store());
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            let store = Arc::clone(&store);
            tokio::spawn(async move {
                let mut granted = 0;
                for _ in 0..50 {
                    let checks = [check("k", fixed(60), 100, 1)];
                    if let Reserved::Granted { ticket, .. } = store.reserve(&scope(), &checks, T0).await.unwrap() {
                        granted += 1;
                        store.commit(&scope(), ticket, &[1]).await.unwrap();
                    }
                }
                granted
            })
        })
        .collect();
    let mut granted = 0;
    for task in tasks {
        granted += task.await.unwrap();
    }
    assert_eq!(granted, 100);
    let (_, standing) = {
        let checks = [check("k", fixed(60), 100, 0)];
        granted_or_refused(store.reserve(&scope(), &checks, T0).await.unwrap())
    };
    assert_eq!(standing.used, 100);
}

fn granted_or_refused(reserved: Reserved) -> (bool, Standing) {
    match reserved {
        Reserved::Granted { mut standings, .. } => (true, standings.remove(0)),
        Reserved::Refused { mut standings, .. } => (false, standings.remove(0)),
    }
}

/// A request counter and a token counter, as a quota plugin keeps them.
fn request_and_tokens(tokens: u64) -> [Check; 2] {
    [check("requests", fixed(60), 10, 1), check("tokens", fixed(60), 1000, tokens)]
}

fn counts(store: &MemoryStore) -> (Option<u64>, Option<u64>) {
    let bucket = T0 / 60_000;
    (store.count(&scope(), "requests", fixed(60), bucket), store.count(&scope(), "tokens", fixed(60), bucket))
}

#[test]
fn committing_less_gives_the_rest_back() {
    let store = store();
    let (ticket, _) = granted(ready(store.reserve(&scope(), &request_and_tokens(500), T0)));
    assert_eq!(ticket.amounts().collect::<Vec<_>>(), [1, 500]);
    assert_eq!(ticket.charges()[1].bucket, T0 / 60_000);
    assert_eq!(ticket.charges()[1].expires_unix_ms, T0 + 60_000);
    ready(store.commit(&scope(), ticket, &[1, 120])).unwrap();
    assert_eq!(counts(&store), (Some(1), Some(120)));
    // 880 tokens left.
    let (_, standings) = granted(ready(store.reserve(&scope(), &request_and_tokens(880), T0 + 1)));
    assert_eq!(used(&standings), [2, 1000]);
}

#[test]
fn committing_more_counts_the_extra_past_the_limit() {
    let store = store();
    let (ticket, _) = granted(ready(store.reserve(&scope(), &request_and_tokens(500), T0)));
    ready(store.commit(&scope(), ticket, &[1, 1500])).unwrap();
    assert_eq!(counts(&store), (Some(1), Some(1500)));
    let (tightest, standings) = refused(ready(store.reserve(&scope(), &request_and_tokens(1), T0 + 1)));
    assert_eq!(tightest, 1);
    assert_eq!((standings[1].used, standings[1].remaining), (1500, 0));
    // Past u64, the counter stays at its most.
    let (ticket, _) = granted(ready(store.reserve(&scope(), &[check("big", fixed(60), 10, 1)], T0)));
    ready(store.commit(&scope(), ticket, &[u64::MAX])).unwrap();
    let (ticket, _) = granted(ready(store.reserve(&scope(), &[check("big", fixed(60), u64::MAX, 0)], T0)));
    ready(store.commit(&scope(), ticket, &[u64::MAX])).unwrap();
    assert_eq!(store.count(&scope(), "big", fixed(60), T0 / 60_000), Some(u64::MAX));
}

#[test]
fn releasing_gives_everything_back() {
    let store = store();
    let (ticket, _) = granted(ready(store.reserve(&scope(), &request_and_tokens(1000), T0)));
    assert!(!reserve_one(&store, "tokens", fixed(60), 1000, 1, T0).0);
    ready(store.release(&scope(), ticket)).unwrap();
    assert_eq!(counts(&store), (Some(0), Some(0)));
    assert!(reserve_one(&store, "tokens", fixed(60), 1000, 1000, T0).0);
}

#[test]
fn counters_without_an_actual_keep_their_reservation() {
    let store = store();
    let (ticket, _) = granted(ready(store.reserve(&scope(), &request_and_tokens(500), T0)));
    ready(store.commit(&scope(), ticket, &[0])).unwrap();
    assert_eq!(counts(&store), (Some(0), Some(500)));
    let (ticket, _) = granted(ready(store.reserve(&scope(), &request_and_tokens(100), T0)));
    ready(store.commit(&scope(), ticket, &[])).unwrap();
    assert_eq!(counts(&store), (Some(1), Some(600)));
    // More amounts than counters: an error, and nothing changes.
    let (ticket, _) = granted(ready(store.reserve(&scope(), &request_and_tokens(100), T0)));
    let result = ready(store.commit(&scope(), ticket, &[0, 0, 0]));
    assert_eq!(result, Err(StateError::TooManyAmounts { given: 3, counters: 2 }));
    assert_eq!(counts(&store), (Some(2), Some(700)));
}

#[test]
fn a_commit_after_the_window_moved_on_adjusts_the_bucket_it_was_charged_to() {
    let store = store();
    let (old, new) = (T0 / 60_000, T0 / 60_000 + 1);
    let (ticket, _) = granted(ready(store.reserve(&scope(), &[check("k", fixed(60), 100, 50)], T0 + 59_000)));
    // The next minute: the old bucket is adjusted, the new one not made.
    ready(store.commit(&scope(), ticket, &[20])).unwrap();
    assert_eq!(store.count(&scope(), "k", fixed(60), old), Some(20));
    assert_eq!(store.count(&scope(), "k", fixed(60), new), None);

    // With counts in the new bucket, they are left as they are.
    let (ticket, _) = granted(ready(store.reserve(&scope(), &[check("j", fixed(60), 100, 50)], T0 + 59_000)));
    let (_, standing) = reserve_one(&store, "j", fixed(60), 100, 7, T0 + 61_000);
    assert_eq!(standing.used, 7);
    ready(store.commit(&scope(), ticket, &[90])).unwrap();
    assert_eq!(store.count(&scope(), "j", fixed(60), new), Some(7));
    assert_eq!(reserve_one(&store, "j", fixed(60), 100, 0, T0 + 62_000).1.used, 7);

    // A sliding window still counts the previous bucket: the commit shows.
    let sliding = Window::Sliding { seconds: 60 };
    let (ticket, _) = granted(ready(store.reserve(&scope(), &[check("s", sliding, 100, 50)], T0)));
    // Half of the previous bucket's 50.
    assert_eq!(reserve_one(&store, "s", sliding, 100, 0, T0 + 90_000).1.used, 25);
    ready(store.commit(&scope(), ticket, &[10])).unwrap();
    assert_eq!(reserve_one(&store, "s", sliding, 100, 0, T0 + 90_000).1.used, 5);
    assert_eq!(store.count(&scope(), "s", sliding, new), Some(0));
}

#[test]
fn counters_never_go_below_zero() {
    let store = store();
    let (ticket, _) = granted(ready(store.reserve(&scope(), &[check("k", fixed(60), 100, 50)], T0)));
    // The bucket ends and goes; a clock stepped back makes it again, with less.
    reserve_one(&store, "k", fixed(60), 100, 1, T0 + 60_000);
    assert_eq!(store.count(&scope(), "k", fixed(60), T0 / 60_000), None);
    reserve_one(&store, "k", fixed(60), 100, 3, T0);
    ready(store.commit(&scope(), ticket, &[0])).unwrap();
    assert_eq!(store.count(&scope(), "k", fixed(60), T0 / 60_000), Some(0));
}

#[test]
fn a_commit_for_a_scope_with_no_state_does_nothing() {
    let store = store();
    let (ticket, _) = granted(ready(store.reserve(&scope(), &[check("k", fixed(1), 10, 5)], T0)));
    // Everything of the scope expired and was swept.
    assert_eq!(store.sweep(T0 + 1000), 1);
    ready(store.commit(&scope(), ticket, &[9])).unwrap();
    assert_eq!(store.usage(&scope()), Usage::default());
}

#[test]
fn a_fixed_window_resets_at_its_boundary() {
    let store = store();
    assert!(reserve_one(&store, "k", fixed(60), 2, 1, T0).0);
    assert!(reserve_one(&store, "k", fixed(60), 2, 1, T0 + 30_000).0);
    let (granted, standing) = reserve_one(&store, "k", fixed(60), 2, 1, T0 + 59_999);
    assert!(!granted);
    assert_eq!(standing.reset_unix_ms, T0 + 60_000);
    let (granted, standing) = reserve_one(&store, "k", fixed(60), 2, 1, T0 + 60_000);
    assert!(granted);
    assert_eq!((standing.used, standing.reset_unix_ms), (1, T0 + 120_000));
}

#[test]
fn a_calendar_month_resets_at_the_months_end() {
    let store = store();
    // 2024-02-29T23:59:59.999Z, the last millisecond of a leap February.
    let last = 1_709_251_199_999;
    let march = 1_709_251_200_000;
    assert!(reserve_one(&store, "k", Window::CalendarMonth, 1, 1, 1_706_745_600_000).0);
    let (granted, standing) = reserve_one(&store, "k", Window::CalendarMonth, 1, 1, last);
    assert!(!granted);
    assert_eq!((standing.used, standing.reset_unix_ms), (1, march));
    let (granted, standing) = reserve_one(&store, "k", Window::CalendarMonth, 1, 1, march);
    assert!(granted);
    // 2024-04-01T00:00Z.
    assert_eq!((standing.used, standing.reset_unix_ms), (1, 1_711_929_600_000));
}

#[test]
fn a_sliding_window_counts_the_weighted_previous_bucket() {
    let store = store();
    let window = Window::Sliding { seconds: 10 };
    assert!(reserve_one(&store, "k", window, 10, 8, T0 + 1000).0);
    // The next bucket's first millisecond: all 8 still count.
    let (granted, standing) = reserve_one(&store, "k", window, 10, 3, T0 + 10_000);
    assert!(!granted);
    assert_eq!((standing.used, standing.reset_unix_ms), (8, T0 + 20_000));
    assert!(reserve_one(&store, "k", window, 10, 2, T0 + 10_000).0);
    // Halfway: 2 + 8/2.
    let (granted, standing) = reserve_one(&store, "k", window, 10, 5, T0 + 15_000);
    assert!(!granted);
    assert_eq!((standing.used, standing.remaining), (6, 4));
    assert!(reserve_one(&store, "k", window, 10, 4, T0 + 15_000).0);
    // Three quarters of the way: 6 + 8/4.
    assert_eq!(reserve_one(&store, "k", window, 10, 0, T0 + 17_500).1.used, 8);
    // A bucket on: the 6 are the previous bucket's, at full weight.
    assert_eq!(reserve_one(&store, "k", window, 10, 0, T0 + 20_000).1.used, 6);
    // Two on: nothing counts.
    assert_eq!(reserve_one(&store, "k", window, 10, 0, T0 + 30_000).1.used, 0);
}

#[test]
fn dead_counters_go_and_free_their_share() {
    let limits = Limits { max_keys_per_plugin: 2, ..Limits::default() };
    let store = MemoryStore::new(limits);
    let sliding = Window::Sliding { seconds: 60 };
    assert!(reserve_one(&store, "s", sliding, 10, 1, T0).0);
    assert!(reserve_one(&store, "f", fixed(60), 10, 1, T0).0);
    assert_eq!(store.usage(&scope()), Usage { keys: 2, bytes: 2 * (1 + 8) });
    // Full: a third counter is refused, and nothing counted.
    let result = ready(store.reserve(&scope(), &[check("x", fixed(60), 10, 1)], T0));
    assert_eq!(result, Err(StateError::TooManyKeys { max: 2 }));
    assert_eq!(store.count(&scope(), "x", fixed(60), T0 / 60_000), None);
    // A minute on, the fixed bucket is dead; the sliding one is the
    // previous bucket and still counts.
    assert!(reserve_one(&store, "x", fixed(60), 10, 1, T0 + 60_000).0);
    assert_eq!(store.count(&scope(), "f", fixed(60), T0 / 60_000), None);
    assert_eq!(store.count(&scope(), "s", sliding, T0 / 60_000), Some(1));
    // Two minutes on, it goes when its key is next reserved.
    assert!(reserve_one(&store, "s", sliding, 10, 1, T0 + 120_000).0);
    assert_eq!(store.count(&scope(), "s", sliding, T0 / 60_000), None);
    assert_eq!(store.usage(&scope()).keys, 2);
}

#[test]
fn reserves_with_bad_checks_are_errors_and_add_nothing() {
    let limits = Limits { max_checks_per_call: 2, max_key_bytes: 4, ..Limits::default() };
    let store = MemoryStore::new(limits);
    let ok = check("k", fixed(60), 10, 1);
    let three = [ok.clone(), ok.clone(), ok.clone()];
    assert_eq!(ready(store.reserve(&scope(), &three, T0)), Err(StateError::TooManyChecks { given: 3, max: 2 }));
    let long = [ok.clone(), check("12345", fixed(60), 10, 1)];
    assert_eq!(ready(store.reserve(&scope(), &long, T0)), Err(StateError::KeyTooLong { len: 5, max: 4 }));
    let window = [ok.clone(), check("k", fixed(0), 10, 1)];
    assert_eq!(ready(store.reserve(&scope(), &window, T0)), Err(StateError::InvalidWindow(fixed(0))));
    assert_eq!(store.usage(&scope()), Usage::default());
    let (_, standings) = granted(ready(store.reserve(&scope(), &[ok], T0)));
    assert_eq!(used(&standings), [1]);
}

#[test]
fn entries_are_set_read_and_deleted() {
    let store = store();
    let scope = scope();
    assert_eq!(ready(store.get(&scope, "k", T0)).unwrap(), None);
    // Reading made no state.
    assert_eq!(store.usage(&scope), Usage::default());
    ready(store.set(&scope, "k", b"one", 0, T0)).unwrap();
    assert_eq!(ready(store.get(&scope, "k", T0)).unwrap(), Some(b"one".to_vec()));
    ready(store.set(&scope, "k", b"three", 0, T0)).unwrap();
    assert_eq!(ready(store.get(&scope, "k", T0)).unwrap(), Some(b"three".to_vec()));
    assert_eq!(store.usage(&scope), Usage { keys: 1, bytes: 1 + 5 });
    ready(store.set(&scope, "", b"", 0, T0)).unwrap();
    assert_eq!(ready(store.get(&scope, "", T0)).unwrap(), Some(Vec::new()));
    assert!(ready(store.delete(&scope, "k", T0)).unwrap());
    assert_eq!(ready(store.get(&scope, "k", T0)).unwrap(), None);
    assert!(!ready(store.delete(&scope, "k", T0)).unwrap());
    assert_eq!(store.usage(&scope), Usage { keys: 1, bytes: 0 });
}

#[test]
fn entries_expire_at_their_ttl() {
    let limits = Limits { max_ttl_ms: 10_000, ..Limits::default() };
    let store = MemoryStore::new(limits);
    let scope = scope();
    ready(store.set(&scope, "short", b"v", 1000, T0)).unwrap();
    ready(store.set(&scope, "default", b"v", 0, T0)).unwrap();
    ready(store.set(&scope, "long", b"v", u64::MAX, T0)).unwrap();
    assert_eq!(ready(store.get(&scope, "short", T0 + 999)).unwrap(), Some(b"v".to_vec()));
    assert_eq!(ready(store.get(&scope, "short", T0 + 1000)).unwrap(), None);
    assert_eq!(store.usage(&scope).keys, 2);
    // A TTL of 0, or past the most, is the most.
    for key in ["default", "long"] {
        assert_eq!(ready(store.get(&scope, key, T0 + 9_999)).unwrap(), Some(b"v".to_vec()), "{key}");
        assert_eq!(ready(store.get(&scope, key, T0 + 10_000)).unwrap(), None, "{key}");
    }
    assert_eq!(store.usage(&scope), Usage::default());
    // An expired entry is not there to delete.
    ready(store.set(&scope, "k", b"v", 5, T0)).unwrap();
    assert!(!ready(store.delete(&scope, "k", T0 + 5)).unwrap());
}

#[test]
fn compare_and_set_sets_only_over_what_was_expected() {
    let store = store();
    let scope = scope();
    let cas = |expected: Option<&[u8]>, value: &[u8], now| {
        ready(store.compare_and_set(&scope, "k", expected, value, 1000, now)).unwrap()
    };
    let get = |now| ready(store.get(&scope, "k", now)).unwrap();
    // Absent, as expected.
    assert!(cas(None, b"one", T0));
    assert_eq!(get(T0), Some(b"one".to_vec()));
    // Present, where absence was expected; another value was expected.
    assert!(!cas(None, b"two", T0));
    assert!(!cas(Some(b"uno"), b"two", T0));
    assert!(!cas(Some(b""), b"two", T0));
    assert_eq!(get(T0), Some(b"one".to_vec()));
    // The value expected.
    assert!(cas(Some(b"one"), b"two", T0 + 1));
    assert_eq!(get(T0 + 1), Some(b"two".to_vec()));
    // Expired is absent (the set above gave it 1000 ms more).
    assert!(!cas(Some(b"two"), b"three", T0 + 1001));
    assert!(cas(None, b"three", T0 + 1001));
    assert_eq!(get(T0 + 1001), Some(b"three".to_vec()));
    assert_eq!(store.usage(&scope), Usage { keys: 1, bytes: 1 + 5 });
}

#[test]
fn entries_past_a_cap_are_refused_and_nothing_is_stored() {
    let limits = Limits { max_key_bytes: 4, max_value_bytes: 8, ..Limits::default() };
    let store = MemoryStore::new(limits);
    let scope = scope();
    assert_eq!(ready(store.set(&scope, "12345", b"v", 0, T0)), Err(StateError::KeyTooLong { len: 5, max: 4 }));
    assert_eq!(ready(store.get(&scope, "12345", T0)), Err(StateError::KeyTooLong { len: 5, max: 4 }));
    assert_eq!(ready(store.delete(&scope, "12345", T0)), Err(StateError::KeyTooLong { len: 5, max: 4 }));
    assert_eq!(ready(store.set(&scope, "k", b"123456789", 0, T0)), Err(StateError::ValueTooLarge { len: 9, max: 8 }));
    let cas = ready(store.compare_and_set(&scope, "k", None, b"123456789", 0, T0));
    assert_eq!(cas, Err(StateError::ValueTooLarge { len: 9, max: 8 }));
    assert_eq!(store.usage(&scope), Usage::default());
    assert_eq!(ready(store.get(&scope, "k", T0)).unwrap(), None);
    ready(store.set(&scope, "1234", b"12345678", 0, T0)).unwrap();
    assert_eq!(store.usage(&scope), Usage { keys: 1, bytes: 12 });
}

#[test]
fn a_plugin_holds_no_more_keys_than_its_cap() {
    let limits = Limits { max_keys_per_plugin: 3, ..Limits::default() };
    let store = MemoryStore::new(limits);
    let scope = scope();
    for key in ["a", "b"] {
        ready(store.set(&scope, key, b"v", 0, T0)).unwrap();
    }
    assert!(reserve_one(&store, "c", fixed(60), 10, 1, T0).0);
    assert_eq!(ready(store.set(&scope, "d", b"v", 0, T0)), Err(StateError::TooManyKeys { max: 3 }));
    let cas = ready(store.compare_and_set(&scope, "d", None, b"v", 0, T0));
    assert_eq!(cas, Err(StateError::TooManyKeys { max: 3 }));
    assert_eq!(ready(store.get(&scope, "d", T0)).unwrap(), None);
    // Keys it holds may change.
    ready(store.set(&scope, "a", b"new", 0, T0)).unwrap();
    assert!(reserve_one(&store, "c", fixed(60), 10, 1, T0).0);
    assert_eq!(store.usage(&scope).keys, 3);
    // Another plugin has its own.
    ready(store.set(&Scope::new("team-b", "quota"), "d", b"v", 0, T0)).unwrap();
    // A scope's own cap, if lower, holds.
    let mut small = Scope::new("team-c", "cache");
    small.max_keys = Some(1);
    ready(store.set(&small, "a", b"v", 0, T0)).unwrap();
    assert_eq!(ready(store.set(&small, "b", b"v", 0, T0)), Err(StateError::TooManyKeys { max: 1 }));
}

#[test]
fn a_plugin_holds_no_more_bytes_than_its_cap() {
    let limits = Limits { max_bytes_per_plugin: 20, ..Limits::default() };
    let store = MemoryStore::new(limits);
    let scope = scope();
    ready(store.set(&scope, "a", b"123456789", 0, T0)).unwrap();
    ready(store.set(&scope, "b", b"123456789", 0, T0)).unwrap();
    assert_eq!(store.usage(&scope).bytes, 20);
    let refused = ready(store.set(&scope, "c", b"", 0, T0));
    assert_eq!(refused, Err(StateError::PluginBytesExceeded { needed: 21, max: 20 }));
    // Replacing a value counts its bytes once.
    ready(store.set(&scope, "a", b"987654321", 0, T0)).unwrap();
    assert_eq!(store.usage(&scope), Usage { keys: 2, bytes: 20 });
    let refused = ready(store.set(&scope, "a", b"1234567890", 0, T0));
    assert_eq!(refused, Err(StateError::PluginBytesExceeded { needed: 21, max: 20 }));
    assert_eq!(ready(store.get(&scope, "a", T0)).unwrap(), Some(b"987654321".to_vec()));
    // Shrinking is fine; a counter's key and 8 bytes fit then.
    ready(store.set(&scope, "a", b"1", 0, T0)).unwrap();
    assert_eq!(store.usage(&scope).bytes, 12);
    let counter = ready(store.reserve(&scope, &[check("k", fixed(60), 1, 1)], T0));
    assert_eq!(counter, Err(StateError::PluginBytesExceeded { needed: 21, max: 20 }));
    ready(store.delete(&scope, "a", T0)).unwrap();
    assert!(reserve_one(&store, "k", fixed(60), 1, 1, T0).0);
    assert_eq!(store.usage(&scope), Usage { keys: 2, bytes: 10 + 9 });
    // A scope's own cap, if lower, holds.
    let mut small = Scope::new("team-c", "cache");
    small.max_bytes = Some(4);
    let refused = ready(store.set(&small, "a", b"1234", 0, T0));
    assert_eq!(refused, Err(StateError::PluginBytesExceeded { needed: 5, max: 4 }));
}

#[test]
fn expired_entries_free_their_share() {
    let limits = Limits { max_keys_per_plugin: 2, max_bytes_per_plugin: 100, ..Limits::default() };
    let store = MemoryStore::new(limits);
    let scope = scope();
    ready(store.set(&scope, "a", &[0; 40], 100, T0)).unwrap();
    ready(store.set(&scope, "b", &[0; 40], 200, T0)).unwrap();
    assert_eq!(ready(store.set(&scope, "c", b"v", 0, T0 + 99)), Err(StateError::TooManyKeys { max: 2 }));
    // `a` expired, unread: swept to make room.
    ready(store.set(&scope, "c", &[0; 50], 0, T0 + 100)).unwrap();
    assert_eq!(store.usage(&scope), Usage { keys: 2, bytes: 41 + 51 });
    assert_eq!(ready(store.get(&scope, "a", T0 + 100)).unwrap(), None);
    // Overwriting an expired entry makes no new key.
    ready(store.set(&scope, "b", b"v", 0, T0 + 200)).unwrap();
    assert_eq!(store.usage(&scope), Usage { keys: 2, bytes: 51 + 2 });
}

#[test]
fn idle_state_is_swept() {
    let store = store();
    let idle = Scope::new("team-b", "cache");
    ready(store.set(&idle, "k", b"v", 2000, T0)).unwrap();
    assert!(reserve_one(&store, "k", fixed(1), 10, 1, T0).0);
    ready(store.set(&scope(), "old", b"v", 1, T0)).unwrap();
    ready(store.set(&scope(), "kept", b"v", 0, T0)).unwrap();
    // Calls on the plugin sweep all of it, in time: `old`, never read,
    // and the counter go.
    for _ in 0..SWEEP_EVERY {
        ready(store.get(&scope(), "other", T0 + 1000)).unwrap();
    }
    assert_eq!(store.usage(&scope()), Usage { keys: 1, bytes: 5 });
    // A sweep of the whole store takes idle plugins' too.
    assert_eq!(store.usage(&idle).keys, 1);
    assert_eq!(store.sweep(T0 + 2000), 1);
    assert_eq!(store.usage(&idle), Usage::default());
    assert_eq!(store.usage(&scope()).keys, 1);
    assert_eq!(store.sweep(T0 + 2000), 0);
}

/// The store's memory is one budget: one namespace's plugins, however many,
/// hold at most its share, the others keep theirs, and what a namespace
/// frees (deleted, expired or swept) is its room again.
#[test]
fn a_namespace_holds_only_its_share_of_the_store() {
    let limits = Limits { max_bytes_total: 100, namespace_percent: 50, ..Limits::default() };
    let store = MemoryStore::new(limits);
    let share = StateError::ShareExceeded { what: "bytes", namespace: 50, store: 100 };
    // Two plugins of team-a: together at most 50 bytes.
    let (first, second) = (Scope::new("team-a", "one"), Scope::new("team-a", "two"));
    ready(store.set(&first, "a", &[0; 29], 0, T0)).unwrap();
    ready(store.set(&second, "b", &[0; 19], 100, T0)).unwrap();
    assert_eq!(ready(store.set(&second, "c", &[0; 2], 0, T0)), Err(share.clone()));
    assert_eq!(ready(store.reserve(&second, &[check("k", fixed(60), 10, 1)], T0)).err(), Some(share.clone()));
    assert_eq!(ready(store.get(&second, "c", T0)).unwrap(), None, "nothing stored past the share");
    // Another namespace's share is its own...
    let other = Scope::new("team-b", "one");
    ready(store.set(&other, "a", &[0; 49], 0, T0)).unwrap();
    // ...and the store's total holds for a third.
    let third = Scope::new("team-c", "one");
    assert_eq!(ready(store.set(&third, "a", &[0; 1], 0, T0)), Err(share));
    // Rewriting in place within the share works; what team-a frees is its
    // room again: by delete, and by expiry once swept.
    ready(store.set(&first, "a", &[1; 29], 0, T0)).unwrap();
    assert!(ready(store.delete(&first, "a", T0)).unwrap());
    ready(store.set(&second, "c", &[0; 20], 0, T0)).unwrap();
    assert_eq!(store.sweep(T0 + 100), 1);
    ready(store.set(&first, "d", &[0; 9], 0, T0 + 100)).unwrap();
    assert_eq!(store.usage(&first).bytes + store.usage(&second).bytes, 10 + 21);
}

/// Keys cost the store's maps memory beyond their bytes: their number is
/// shared the same way.
#[test]
fn a_namespace_holds_only_its_share_of_the_stores_keys() {
    let limits = Limits { max_keys_total: 4, namespace_percent: 50, ..Limits::default() };
    let store = MemoryStore::new(limits);
    let (first, second) = (Scope::new("team-a", "one"), Scope::new("team-a", "two"));
    ready(store.set(&first, "a", b"", 0, T0)).unwrap();
    ready(store.set(&second, "b", b"", 0, T0)).unwrap();
    let share = StateError::ShareExceeded { what: "keys", namespace: 2, store: 4 };
    assert_eq!(ready(store.set(&second, "c", b"", 0, T0)), Err(share.clone()));
    assert_eq!(ready(store.reserve(&first, &[check("k", fixed(60), 10, 1)], T0)).err(), Some(share));
    let other = Scope::new("team-b", "one");
    ready(store.set(&other, "a", b"", 0, T0)).unwrap();
    ready(store.set(&other, "b", b"", 0, T0)).unwrap();
}
