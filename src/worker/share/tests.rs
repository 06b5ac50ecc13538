//! The shares' rules, one process's requests at a time.

use super::*;

#[test]
fn an_eighth_of_the_slots_is_kept_for_light_endpoints() {
    for (slots, most, light_below) in [
        (1, 1, 2),
        (2, 2, 2),
        (7, 7, 2),
        (8, 7, 2),
        (16, 14, 2),
        (32, 28, 2),
        (128, 112, 4),
    ] {
        let shares = Shares::new(slots, Wakeup::default());
        assert_eq!(
            (shares.most(), shares.light_below),
            (most, light_below),
            "{slots}"
        );
    }
}

#[test]
fn an_endpoint_is_full_at_its_share_until_a_request_ends() {
    let shares = Arc::new(Shares::new(8, Wakeup::default()));
    let (hog, other) = (Uuid::now_v7(), Uuid::now_v7());
    // Both have answered quickly before: trusted.
    drop(shares.started(hog));
    drop(shares.started(other));
    let mut held: Vec<Held> = (0..7).map(|_| shares.started(hog)).collect();
    let _other = shares.started(other);
    assert_eq!(shares.snapshot_of(hog).room(hog), 0);
    // Holding the kept slot, it would be heavy with a second request: no room.
    assert_eq!(shares.snapshot_of(other).room(other), 0);
    let snapshot = shares.snapshot();
    let mut both = vec![hog, other];
    both.sort();
    assert_eq!(snapshot.full(), both);
    assert_eq!(snapshot.room(hog), 0);
    assert_eq!(
        snapshot.room(Uuid::now_v7()),
        1,
        "a new endpoint: the kept slot"
    );
    assert_eq!(shares.snapshot_of(hog).room(hog), 0);
    assert_eq!(shares.snapshot_of(hog).held.len(), 1);
    held.pop();
    assert!(shares.snapshot_of(hog).room(hog) > 0);
    assert_eq!(shares.snapshot().room(hog), 1);
    held.clear();
    assert!(!shares.snapshot().held.contains_key(&hog));
    assert_eq!(shares.snapshot().room(other), 6);
}

#[test]
fn several_heavy_endpoints_share_what_one_may_hold() {
    // 32 slots: the heavy endpoints hold 28 at most together, light ones hold 1.
    let shares = Arc::new(Shares::new(32, Wakeup::default()));
    let (slow, hanging, fast) = (Uuid::now_v7(), Uuid::now_v7(), Uuid::now_v7());
    for answered in [slow, hanging] {
        drop(shares.started(answered));
    }
    let _slow: Vec<Held> = (0..16).map(|_| shares.started(slow)).collect();
    let mut hung: Vec<Held> = (0..12).map(|_| shares.started(hanging)).collect();
    let snapshot = shares.snapshot();
    assert_eq!(snapshot.heavy, 28);
    assert_eq!(snapshot.room(slow), 0);
    assert_eq!(snapshot.room(hanging), 0);
    assert_eq!(snapshot.room(fast), 1, "the kept slots stay for the others");
    let mut both = vec![slow, hanging];
    both.sort();
    assert_eq!(snapshot.full(), both);
    hung.pop();
    assert_eq!(shares.snapshot().room(slow), 1);
    assert_eq!(shares.snapshot().room(hanging), 1);
}

#[test]
fn one_claim_gives_the_heavy_endpoints_no_more_than_their_share_together() {
    let shares = Arc::new(Shares::new(32, Wakeup::default()));
    let (a, b, c, d) = (
        Uuid::now_v7(),
        Uuid::now_v7(),
        Uuid::now_v7(),
        Uuid::now_v7(),
    );
    for answered in [a, b, c, d] {
        drop(shares.started(answered));
    }
    let _a: Vec<Held> = (0..10).map(|_| shares.started(a)).collect();
    let _c = shares.started(c);
    let snapshot = shares.snapshot();
    // 18 left to the heavy: a takes 8 of them, b (new) becomes heavy with the other 10,
    // c holding one can go heavy only with room left (none), d stays light with one.
    let mut wants = vec![8, 16, 5, 1];
    snapshot.fit(&[a, b, c, d], &mut wants);
    assert_eq!(wants, vec![8, 10, 0, 1]);
    // Room alone would have let both take it.
    assert_eq!((snapshot.room(a), snapshot.room(b)), (18, 18));
}

#[test]
fn slow_endpoints_are_heavy_whatever_they_hold() {
    // 32 slots: 28 for the heavy, 4 kept. Each of thirty endpoints holds one request,
    // which counts as light until it has run long enough to make its endpoint slow.
    let slow_after = Duration::from_millis(20);
    let shares = Arc::new(Shares::slow_after(32, Wakeup::default(), slow_after));
    let hanging: Vec<Uuid> = (0..30).map(|_| Uuid::now_v7()).collect();
    let mut held: Vec<Held> = hanging.iter().map(|id| shares.started(*id)).collect();
    let fast = Uuid::now_v7();
    drop(shares.started(fast));
    assert_eq!(shares.snapshot().heavy, 0, "light while young");
    std::thread::sleep(slow_after * 2);
    let snapshot = shares.snapshot();
    assert_eq!(snapshot.heavy, 30, "slow now: all heavy");
    assert_eq!(snapshot.room(hanging[0]), 0);
    assert_eq!(snapshot.full().len(), 30);
    assert_eq!(
        snapshot.room(fast),
        1,
        "a quick endpoint still has the kept slots"
    );
    // Ended slowly, they stay slow with nothing under way: no room while the heavy are
    // over their share, and no light room ever.
    held.truncate(28);
    let snapshot = shares.snapshot();
    assert_eq!(snapshot.heavy, 28);
    assert_eq!(snapshot.room(hanging[29]), 0);
    held.truncate(27);
    assert_eq!(shares.snapshot().room(hanging[29]), 1);
    let mut wants = vec![1, 1, 3];
    shares
        .snapshot()
        .fit(&[hanging[28], hanging[29], fast], &mut wants);
    assert_eq!(
        wants,
        vec![1, 0, 1],
        "one heavy room; the quick one stays light"
    );
    // A request that ends quickly makes its endpoint light again.
    let quick = shares.started(hanging[29]);
    drop(quick);
    assert!(!shares.snapshot().slow.contains(&hanging[29]));
}

#[test]
fn a_claim_outside_the_worker_has_no_share_to_keep() {
    let snapshot = Snapshot::default();
    assert_eq!(snapshot.room(Uuid::now_v7()), u32::MAX);
    assert!(snapshot.full().is_empty());
    let mut wants = vec![64];
    snapshot.fit(&[Uuid::now_v7()], &mut wants);
    assert_eq!(wants, vec![64]);
}

#[test]
fn new_endpoints_that_all_hang_leave_a_quarter_of_the_kept_slots_to_trusted_ones() {
    // 128 slots: the heavy hold 112 at most, the untrusted (new or slow) 124 at most.
    let slow_after = Duration::from_millis(20);
    let shares = Arc::new(Shares::slow_after(128, Wakeup::default(), slow_after));
    let known = Uuid::now_v7();
    drop(shares.started(known));
    // 150 new endpoints with a cap of 3, each claimed in turn while it looks light.
    let new: Vec<Uuid> = (0..150).map(|_| Uuid::now_v7()).collect();
    let mut held = Vec::new();
    for id in &new {
        let room = shares.snapshot().room(*id).min(3);
        held.extend((0..room).map(|_| shares.started(*id)));
    }
    assert_eq!(held.len(), 124, "all but a quarter of the kept eighth");
    let snapshot = shares.snapshot();
    assert_eq!(snapshot.untrusted, 124);
    assert_eq!(
        snapshot.room(Uuid::now_v7()),
        0,
        "no more for the untrusted"
    );
    assert!(
        snapshot.room(known) >= 3,
        "the trusted one keeps its light room"
    );
    assert_eq!(snapshot.only_trusted(), Some(vec![known]));
    // Once they are known slow, the heavy are over their share: still only the trusted.
    std::thread::sleep(slow_after * 2);
    let snapshot = shares.snapshot();
    assert_eq!((snapshot.heavy, snapshot.untrusted), (124, 124));
    assert_eq!(snapshot.room(known), 3);
    assert_eq!(snapshot.only_trusted(), Some(vec![known]));
    // A request that ends (here, slowly) frees room for the untrusted again.
    held.pop();
    let snapshot = shares.snapshot();
    assert_eq!(snapshot.only_trusted(), None);
    assert_eq!(snapshot.room(Uuid::now_v7()), 1);
}

#[test]
fn one_claim_gives_the_untrusted_no_more_than_their_share_together() {
    // 32 slots: the untrusted hold 31 at most. Twenty-nine requests of one new endpoint
    // leave two: two new endpoints wanting one each get them, a third gets none, a trusted
    // one is cut only by the heavy share (and stays light).
    let shares = Arc::new(Shares::new(32, Wakeup::default()));
    let (hog, a, b, c, known) = (
        Uuid::now_v7(),
        Uuid::now_v7(),
        Uuid::now_v7(),
        Uuid::now_v7(),
        Uuid::now_v7(),
    );
    drop(shares.started(known));
    let _hog: Vec<Held> = (0..29).map(|_| shares.started(hog)).collect();
    let snapshot = shares.snapshot();
    let mut wants = vec![1, 1, 1, 1];
    snapshot.fit(&[a, b, c, known], &mut wants);
    assert_eq!(wants, vec![1, 1, 0, 1]);
    assert_eq!((snapshot.room(a), snapshot.room(known)), (1, 1));
    assert_eq!(snapshot.only_trusted(), None);
}

#[test]
fn a_trusted_endpoint_that_hangs_is_no_longer_trusted() {
    let slow_after = Duration::from_millis(20);
    let shares = Arc::new(Shares::slow_after(32, Wakeup::default(), slow_after));
    let endpoint = Uuid::now_v7();
    drop(shares.started(endpoint));
    assert!(shares.trusts(endpoint));
    let hanging = shares.started(endpoint);
    std::thread::sleep(slow_after * 2);
    let snapshot = shares.snapshot();
    assert!(!shares.trusts(endpoint) && snapshot.slow.contains(&endpoint));
    assert_eq!(snapshot.untrusted, 1);
    drop(hanging);
    assert!(!shares.trusts(endpoint), "it ended slowly");
    drop(shares.started(endpoint));
    assert!(shares.trusts(endpoint), "a quick answer trusts it again");
}

#[test]
fn a_claim_names_at_most_a_thousand_trusted_endpoints_the_latest_seen() {
    let shares = Arc::new(Shares::new(8, Wakeup::default()));
    let ids: Vec<Uuid> = (0..1_200).map(|_| Uuid::now_v7()).collect();
    for id in &ids {
        drop(shares.started(*id));
    }
    let listed = shares.trusted();
    assert_eq!(listed.len(), 1_000);
    let latest = ids.last().expect("ids");
    assert!(listed.contains(latest));
}

#[test]
fn a_slot_reserved_for_a_claim_at_submit_counts_until_dropped() {
    let shares = Arc::new(Shares::new(32, Wakeup::default()));
    let endpoint = Uuid::now_v7();
    assert_eq!(shares.snapshot_of(endpoint).room(endpoint), 28);
    let reserved = shares.reserved(endpoint);
    assert_eq!(shares.snapshot_of(endpoint).room(endpoint), 27);
    assert_eq!(shares.snapshot().untrusted, 1);
    // Its request started: it counts as under way instead, and ending quickly trusts it.
    let running = shares.started(endpoint);
    drop(reserved);
    assert_eq!(shares.snapshot().held.get(&endpoint), Some(&1));
    drop(running);
    assert!(shares.trusts(endpoint));
    // Dropped unused, a reservation changes nothing of the endpoint's standing.
    let other = Uuid::now_v7();
    drop(shares.reserved(other));
    assert!(!shares.trusts(other) && shares.snapshot().held.is_empty());
}

#[test]
fn while_an_endpoint_waits_for_heavy_room_the_heavy_share_is_split_evenly() {
    // 16 slots: the heavy endpoints hold 14 at most together, light ones hold 1.
    let shares = Arc::new(Shares::new(16, Wakeup::default()));
    let (hog, quick) = (Uuid::now_v7(), Uuid::now_v7());
    for answered in [hog, quick] {
        drop(shares.started(answered));
    }
    let mut hogged: Vec<Held> = (0..14).map(|_| shares.started(hog)).collect();
    hogged.pop();
    // Nobody waits: the room a request frees goes back to whoever takes it.
    assert_eq!(shares.snapshot().room(hog), 1);
    // The quick endpoint was left work for want of room: an even split, 7 each.
    shares.waiting(&[quick]);
    let snapshot = shares.snapshot();
    assert_eq!(snapshot.room(hog), 0, "over its even share");
    assert!(snapshot.full().contains(&hog));
    assert_eq!(snapshot.room(quick), 1, "its light slot");
    hogged.truncate(7);
    let snapshot = shares.snapshot();
    assert_eq!(snapshot.room(hog), 0, "at its even share");
    assert_eq!(snapshot.room(quick), 7, "the other half");
    // Holding its half, the quick one counts among the contenders once heavy.
    let _quick: Vec<Held> = (0..7).map(|_| shares.started(quick)).collect();
    let snapshot = shares.snapshot();
    assert_eq!(snapshot.room(quick), 0);
    assert_eq!(snapshot.room(hog), 0);
    // A third endpoint waiting, with the heavy share taken (7 and 7): its light slot.
    let third = Uuid::now_v7();
    shares.waiting(&[third]);
    assert_eq!(shares.snapshot().room(third), 1);
    // The hog's requests end: the waiting one may take half, and the hog, come back, a
    // third (14 / 3) while the other two contend.
    drop(hogged);
    let snapshot = shares.snapshot();
    assert_eq!(snapshot.room(third), 7);
    assert_eq!(snapshot.room(hog), 4);
}

#[test]
fn a_light_endpoint_at_its_limit_beside_a_full_heavy_share_is_woken_when_a_request_ends() {
    // 16 slots: the heavy endpoints hold 14 at most together, light ones hold 1.
    let wakeup = Wakeup::default();
    let shares = Arc::new(Shares::new(16, wakeup.clone()));
    let (hog, quick) = (Uuid::now_v7(), Uuid::now_v7());
    for answered in [hog, quick] {
        drop(shares.started(answered));
    }
    let _hogged: Vec<Held> = (0..14).map(|_| shares.started(hog)).collect();
    let light = shares.started(quick);
    assert_eq!(shares.snapshot().room(quick), 0, "no room at all");
    while wakeup.take_hint() {}
    // Its request ends: it may start another at once, not at the next poll.
    drop(light);
    assert!(wakeup.take_hint(), "the claiming loop is woken");
    assert_eq!(shares.snapshot().room(quick), 1);
}
