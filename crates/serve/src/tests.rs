//! The bookkeeping behind eviction and the write deadline.

use super::*;

#[test]
fn a_full_listener_evicts_the_oldest_connection_of_the_busiest_peer() {
    let (attacker, kubelet): (IpAddr, IpAddr) = ("10.0.0.7".parse().unwrap(), "10.0.1.1".parse().unwrap());
    let mut open = OpenConnections::default();
    let probe_before = open.add(kubelet);
    let held: Vec<_> = (0..3).map(|_| open.add(attacker)).collect();
    let probe = open.add(kubelet);
    open.evict_one();
    // The attacker's oldest, not the kubelet's older connection.
    let notified = |close: &Arc<Notify>| {
        let waiting = close.notified();
        tokio::pin!(waiting);
        waiting.poll(&mut std::task::Context::from_waker(std::task::Waker::noop())).is_ready()
    };
    assert!(notified(&held[0]));
    assert!(!notified(&held[1]) && !notified(&held[2]));
    assert!(!notified(&probe_before) && !notified(&probe));
    // Closed connections are forgotten: the attacker's new ones are now
    // the most.
    drop(held);
    let again: Vec<_> = (0..3).map(|_| open.add(attacker)).collect();
    open.evict_one();
    assert!(notified(&again[0]));
    assert!(!notified(&probe_before));
}

#[test]
fn peers_are_grouped_by_ipv4_address_and_ipv6_slash_64() {
    let group = |ip: &str| peer_group(ip.parse().unwrap());
    assert_eq!(group("::ffff:10.1.2.3"), group("10.1.2.3"));
    assert_eq!(group("2001:db8::1"), group("2001:db8::ffff:1"));
    assert_ne!(group("2001:db8::1"), group("2001:db8:0:1::1"));
}

#[test]
fn one_stalled_response_is_seen_among_moving_ones() {
    let activity = Arc::new(Activity::new(Duration::from_secs(1)));
    let stalled = activity.begin();
    let moving = activity.begin();
    stalled.owe();
    moving.owe();
    moving.paid();
    assert!(!activity.stalled(Duration::from_millis(50)));
    std::thread::sleep(Duration::from_millis(60));
    moving.owe();
    assert!(activity.stalled(Duration::from_millis(50)), "the stalled stream hides behind the moving one");
    // A response waiting on its own source does not count.
    stalled.paid();
    assert!(!activity.stalled(Duration::from_millis(50)));
    drop(stalled);
    assert_eq!(activity.in_flight(), 1);
}
