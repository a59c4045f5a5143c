//! Flow control as the request path meets it: classification, seats, queues and refusals.

use std::time::Duration;

use http::Method;
use prometheus::Registry;

use super::*;
use gateway_request::request_info::parse;

fn flow_control(limit: u32) -> FlowControl {
    let fc = FlowControl::new(limit, Duration::from_secs(15), &Registry::new());
    let (levels, schemas) = controller::built_in_objects();
    fc.controller().apply(levels, schemas);
    fc
}

fn user(name: &str, groups: &[&str]) -> Arc<UserInfo> {
    Arc::new(UserInfo::authenticated(
        name.into(),
        String::new(),
        groups.iter().map(|g| (*g).into()).collect(),
        Default::default(),
    ))
}

fn admit(fc: &FlowControl, u: &Arc<UserInfo>, method: Method, target: &str) -> Decision {
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    fc.admit(
        u,
        &Arc::new(parse(&method, path, query).unwrap()),
        query,
        None,
    )
}

/// The experiment in miniature: a user floods, a ServiceAccount asks now and then.
#[tokio::test]
async fn a_flooding_user_is_refused_while_a_quiet_service_account_is_served() {
    let fc = flow_control(30);
    let alice = user("alice", &[]);
    let reader = user(
        "system:serviceaccount:quiet:reader",
        &["system:serviceaccounts", "system:serviceaccounts:quiet"],
    );
    let list = "/api/v1/namespaces/x/configmaps";
    let mut held = Vec::new();
    let mut refused = 0;
    for _ in 0..500 {
        let d = admit(&fc, &alice, Method::GET, list);
        assert_eq!(&*d.schema.spec.name, "global-default");
        match d.admission {
            Admission::Run(seat) => held.push(Some(seat)),
            Admission::Wait(w) => held.push({
                drop_later(w);
                None
            }),
            Admission::Reject(Refusal {
                reason,
                retry_after,
            }) => {
                assert_eq!(reason, RejectReason::QueueFull);
                assert!(retry_after >= 1);
                refused += 1;
            }
        }
    }
    assert!(refused > 100, "refused {refused}");
    // The quiet one: its own level, seats free.
    for _ in 0..10 {
        let d = admit(
            &fc,
            &reader,
            Method::GET,
            "/api/v1/namespaces/quiet/configmaps/c",
        );
        assert_eq!(&*d.schema.spec.name, "service-accounts");
        assert_eq!(&*d.schema.level.name, "workload-low");
        assert!(matches!(d.admission, Admission::Run(_)));
    }
    // The refusal names what kube's headers name.
    let d = admit(&fc, &alice, Method::GET, list);
    assert!(matches!(d.admission, Admission::Reject(_)));
    assert!(!d.schema.schema_uid.is_empty() && !d.schema.level_uid.is_empty());
    drop(held);
}

thread_local! {
    static PARKED: std::cell::RefCell<Vec<Waiting>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Keeps a waiting request queued for the rest of the test.
fn drop_later(w: Waiting) {
    PARKED.with(|p| p.borrow_mut().push(w));
}

#[tokio::test(start_paused = true)]
async fn a_queued_request_runs_when_a_seat_frees_or_is_refused_at_its_wait_limit() {
    let fc = FlowControl::new(1, Duration::from_secs(4), &Registry::new());
    let levels = vec![serde_json::from_value(serde_json::json!({
        "metadata": {"name": "one", "uid": "u1"},
        "spec": {"type": "Limited", "limited": {"nominalConcurrencyShares": 100,
            "limitResponse": {"type": "Queue", "queuing": {"queues": 1, "handSize": 1, "queueLengthLimit": 10}}}}
    }))
    .unwrap()];
    let schemas = vec![serde_json::from_value(serde_json::json!({
        "metadata": {"name": "everyone", "uid": "u2"},
        "spec": {"priorityLevelConfiguration": {"name": "one"}, "matchingPrecedence": 100,
            "rules": [{"subjects": [{"kind": "Group", "group": {"name": "system:authenticated"}}],
                "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}]}]}
    }))
    .unwrap()];
    fc.controller().apply(levels, schemas);
    let u = user("u", &[]);
    let first = match admit(&fc, &u, Method::GET, "/version").admission {
        Admission::Run(s) => s,
        _ => panic!("the first request runs"),
    };
    let mut second = match admit(&fc, &u, Method::GET, "/version").admission {
        Admission::Wait(w) => w,
        _ => panic!("the second waits"),
    };
    assert!(futures::poll!(&mut second).is_pending());
    drop(first);
    let seat = second.await.expect("dispatched when the seat freed");
    // With the seat held, the next one waits out its limit.
    let third = match admit(&fc, &u, Method::GET, "/version").admission {
        Admission::Wait(w) => w,
        _ => panic!("the third waits"),
    };
    let started = tokio::time::Instant::now();
    assert_eq!(third.await.unwrap_err(), RejectReason::TimeOut);
    assert_eq!(started.elapsed(), Duration::from_secs(4));
    // A client that goes away leaves the queue.
    let fourth = match admit(&fc, &u, Method::GET, "/version").admission {
        Admission::Wait(w) => w,
        _ => panic!("the fourth waits"),
    };
    drop(fourth);
    let levels = fc.dump_priority_levels();
    let row = levels.lines().find(|l| l.starts_with("one,")).unwrap();
    let cells: Vec<&str> = row.split(',').map(str::trim).collect();
    // Name, active queues, idle, quiescing, waiting, executing, dispatched, rejected, timed out,
    // cancelled.
    assert_eq!(
        cells,
        ["one", "0", "false", "false", "0", "1", "2", "2", "1", "1"]
    );
    drop(seat);
}

#[tokio::test]
async fn system_masters_and_probes_are_never_limited() {
    let fc = flow_control(1);
    let admin = user("admin", &["system:masters"]);
    let anonymous = Arc::new(UserInfo::anonymous());
    let mut held = Vec::new();
    for _ in 0..50 {
        let d = admit(&fc, &admin, Method::GET, "/api/v1/pods");
        assert_eq!(&*d.schema.spec.name, "exempt");
        let Admission::Run(seat) = d.admission else {
            panic!("exempt requests run");
        };
        held.push(seat);
        let d = admit(&fc, &anonymous, Method::GET, "/readyz");
        assert_eq!(&*d.schema.spec.name, "probes");
        let Admission::Run(seat) = d.admission else {
            panic!("probes run");
        };
        held.push(seat);
    }
}

#[tokio::test]
async fn the_dumps_show_waiting_and_executing_requests() {
    let fc = flow_control(30);
    let alice = user("alice", &[]);
    let mut held = Vec::new();
    for _ in 0..30 {
        match admit(&fc, &alice, Method::GET, "/api/v1/namespaces/x/configmaps").admission {
            Admission::Run(s) => held.push(s),
            Admission::Wait(w) => drop_later(w),
            Admission::Reject(_) => {}
        }
    }
    let requests = fc.dump_requests(true);
    let mut lines = requests.lines();
    let header = lines.next().unwrap();
    assert!(
        header.starts_with("PriorityLevelName, FlowSchemaName,"),
        "{header}"
    );
    assert!(header.ends_with("SubResource"), "{header}");
    let row = lines
        .find(|l| l.starts_with("global-default,"))
        .expect("a global-default request");
    let cells: Vec<&str> = row
        .split(",\t")
        .flat_map(|c| c.split(','))
        .map(str::trim)
        .collect();
    assert_eq!(cells[1], "global-default");
    assert_eq!(cells[4], "alice");
    assert!(cells.contains(&"/api/v1/namespaces/x/configmaps"), "{row}");
    let queues = fc.dump_queues();
    assert_eq!(
        queues
            .lines()
            .filter(|l| l.starts_with("global-default,"))
            .count(),
        128
    );
}

/// A FlowSchema whose rules are edited in place changes classification, so it is a change the
/// log says (one line per change), as a new or removed schema is.
#[test]
fn editing_a_flowschemas_rules_in_place_is_a_change() {
    let fc = FlowControl::new(10, Duration::from_secs(15), &Registry::new());
    let (levels, mut schemas) = controller::built_in_objects();
    assert!(fc
        .controller()
        .apply(levels.clone(), schemas.clone())
        .is_some());
    assert!(fc
        .controller()
        .apply(levels.clone(), schemas.clone())
        .is_none());
    let edited = schemas
        .iter_mut()
        .find(|s| s.metadata.name.as_deref() == Some("global-default"))
        .expect("the built-in global-default schema");
    edited.spec.distinguisher_method = None;
    assert!(
        fc.controller().apply(levels, schemas).is_some(),
        "an edited schema was not reported as a change"
    );
}

/// Classifications are remembered per thread, but never across configurations: a FlowSchema
/// that starts to match a caller takes its next request at once, as kube classifies every
/// request against the configuration in force.
#[tokio::test]
async fn a_new_configuration_classifies_the_next_request_though_the_last_was_remembered() {
    let fc = flow_control(30);
    let alice = user("alice", &["system:authenticated"]);
    let target = "/api/v1/namespaces/x/configmaps/c";
    for _ in 0..3 {
        let d = admit(&fc, &alice, Method::GET, target);
        assert_eq!(&*d.schema.spec.name, "global-default");
    }
    assert!(remembered::remembered() >= 1, "nothing was remembered");

    // A schema for alice's reads, ahead of global-default.
    let (levels, mut schemas) = controller::built_in_objects();
    let mut mine = schemas
        .iter()
        .find(|s| s.metadata.name.as_deref() == Some("global-default"))
        .unwrap()
        .clone();
    mine.metadata.name = Some("alice-reads".into());
    mine.metadata.uid = Some("alice-reads-uid".into());
    let spec = &mut mine.spec;
    spec.matching_precedence = Some(100);
    let rule = &mut spec.rules.as_mut().unwrap()[0];
    rule.subjects = vec![serde_json::from_value(serde_json::json!(
        {"kind": "User", "user": {"name": "alice"}}
    ))
    .unwrap()];
    schemas.push(mine);
    fc.controller().apply(levels.clone(), schemas.clone());
    let d = admit(&fc, &alice, Method::GET, target);
    assert_eq!(&*d.schema.spec.name, "alice-reads");
    // Another caller, and another verb, are their own keys.
    let bob = user("bob", &["system:authenticated"]);
    assert_eq!(
        &*admit(&fc, &bob, Method::GET, target).schema.spec.name,
        "global-default"
    );

    // And back: the schema goes, alice's next request is global-default's again.
    schemas.retain(|s| s.metadata.name.as_deref() != Some("alice-reads"));
    fc.controller().apply(levels, schemas);
    assert_eq!(
        &*admit(&fc, &alice, Method::GET, target).schema.spec.name,
        "global-default"
    );
}

/// The memory of one thread is bounded whatever the variety of callers and paths, and a key
/// too long to be worth keeping is not kept.
#[tokio::test]
async fn remembered_classifications_are_bounded() {
    let fc = flow_control(4096);
    for i in 0..(remembered::CAPACITY * 2 + 7) {
        let u = user(&format!("user-{i}"), &["system:authenticated"]);
        drop(admit(
            &fc,
            &u,
            Method::GET,
            "/api/v1/namespaces/x/configmaps",
        ));
        assert!(remembered::remembered() <= remembered::CAPACITY);
    }
    let long = user(&"x".repeat(remembered::MAX_KEY_BYTES), &[]);
    let before = remembered::remembered();
    drop(admit(
        &fc,
        &long,
        Method::GET,
        "/api/v1/namespaces/x/configmaps",
    ));
    drop(admit(
        &fc,
        &long,
        Method::GET,
        "/api/v1/namespaces/x/configmaps",
    ));
    assert!(remembered::remembered() <= before);
}
