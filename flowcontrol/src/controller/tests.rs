use std::time::Duration;

use prometheus::Registry;

use super::*;
use crate::admission::Admission;
use crate::fairqueuing::queueset::Description;
use crate::request::seats::WorkEstimate;
use gateway_request::identity::UserInfo;
use gateway_request::request_info::RequestInfo;

fn controller(limit: u32) -> Controller {
    Controller::new(limit, Metrics::new(&Registry::new()))
}

fn limits(c: &Controller) -> BTreeMap<String, (u32, u32, u32, u32)> {
    c.levels()
        .into_iter()
        .map(|l| (l.name.to_string(), (l.nominal, l.min, l.max, l.max_seats)))
        .collect()
}

fn level(json: serde_json::Value) -> api::PriorityLevelConfiguration {
    serde_json::from_value(json).unwrap()
}

fn schema(json: serde_json::Value) -> api::FlowSchema {
    serde_json::from_value(json).unwrap()
}

fn queuing_level(name: &str, shares: i32, lendable: i32) -> api::PriorityLevelConfiguration {
    level(serde_json::json!({
        "metadata": {"name": name, "uid": format!("uid-{name}")},
        "spec": {"type": "Limited", "limited": {
            "nominalConcurrencyShares": shares, "lendablePercent": lendable,
            "limitResponse": {"type": "Queue", "queuing": {"queues": 16, "handSize": 4, "queueLengthLimit": 50}}}}
    }))
}

fn user_schema(name: &str, user: &str, level: &str, precedence: i32) -> api::FlowSchema {
    schema(serde_json::json!({
        "metadata": {"name": name, "uid": format!("uid-{name}")},
        "spec": {"priorityLevelConfiguration": {"name": level}, "matchingPrecedence": precedence,
            "distinguisherMethod": {"type": "ByUser"},
            "rules": [{"subjects": [{"kind": "User", "user": {"name": user}}],
                "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}],
                "resourceRules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"], "namespaces": ["*"], "clusterScope": true}]}]}
    }))
}

fn classify(c: &Controller, user: &str) -> String {
    let user = UserInfo {
        name: user.into(),
        groups: vec!["system:authenticated".into()],
        ..Default::default()
    };
    let info = RequestInfo::non_resource(&http::Method::GET, "/version");
    let config = c.current();
    let s = config.classifier.classify(crate::rules::RequestDigest {
        info: &info,
        user: &user,
    });
    s.spec.name.to_string()
}

/// kube-apiserver's figures for its default 400 + 200 in-flight limit (`kubectl get --raw
/// /debug/api_priority_and_fairness/dump_priority_levels` and the `*_limit_seats` metrics of a
/// fresh cluster).
#[test]
fn the_built_in_levels_get_kubes_seats() {
    let c = controller(600);
    let (levels, schemas) = built_in_objects();
    let summary = c.apply(levels, schemas).expect("a change");
    assert!(summary.ignored.is_empty(), "{:?}", summary.ignored);
    let l = limits(&c);
    // (nominal, lower, upper, seats one request may take)
    // exempt may borrow anything: it is never limited.
    assert_eq!(l["exempt"], (0, 0, 600, 0));
    assert_eq!(l["catch-all"], (13, 13, 613, 0));
    assert_eq!(l["system"], (74, 50, 674, 12));
    assert_eq!(l["node-high"], (98, 73, 698, 15));
    assert_eq!(l["leader-election"], (25, 25, 625, 4));
    assert_eq!(l["workload-high"], (98, 49, 698, 15));
    assert_eq!(l["workload-low"], (245, 24, 845, 37));
    assert_eq!(l["global-default"], (49, 24, 649, 8));
    // The same objects again change nothing.
    let (levels, schemas) = built_in_objects();
    assert!(c.apply(levels, schemas).is_none());
}

#[test]
fn the_mandatory_objects_are_there_whatever_the_api_says() {
    let c = controller(100);
    assert_eq!(classify(&c, "alice"), "catch-all");
    let names: Vec<String> = c.levels().iter().map(|l| l.name.to_string()).collect();
    assert_eq!(names, ["catch-all", "exempt"]);
    // A changed catch-all is refused; the built-in one stands.
    let mut bad = bootstrap::mandatory_priority_levels()[1].clone();
    if let Some(l) = bad.spec.limited.as_mut() {
        l.nominal_concurrency_shares = Some(1000);
    }
    let summary = c.apply(vec![bad], Vec::new()).unwrap();
    assert_eq!(summary.ignored.len(), 1);
    assert!(summary.ignored[0].reason.contains("fixed value"));
    assert_eq!(limits(&c)["catch-all"].0, 100);
}

#[test]
fn broken_objects_are_ignored_and_their_fix_takes_effect() {
    let c = controller(100);
    let (mut levels, mut schemas) = built_in_objects();
    schemas.push(user_schema("alice", "alice", "team", 500));
    let summary = c.apply(levels.clone(), schemas.clone()).unwrap();
    assert_eq!(summary.ignored.len(), 1);
    assert_eq!(summary.ignored[0].name, "alice");
    assert!(
        summary.ignored[0].reason.contains("\"team\""),
        "{:?}",
        summary.ignored
    );
    assert_eq!(classify(&c, "alice"), "global-default");

    // The level appears, broken: still ignored, and the schema with it.
    let mut broken = queuing_level("team", 10, 0);
    broken.spec.limited.as_mut().unwrap().lendable_percent = Some(200);
    levels.push(broken);
    let summary = c.apply(levels.clone(), schemas.clone()).unwrap();
    assert_eq!(summary.ignored.len(), 2);
    assert_eq!(classify(&c, "alice"), "global-default");

    // Fixed.
    levels.pop();
    levels.push(queuing_level("team", 10, 0));
    let summary = c.apply(levels, schemas).unwrap();
    assert!(summary.ignored.is_empty(), "{:?}", summary.ignored);
    assert_eq!(classify(&c, "alice"), "alice");
    assert_eq!(classify(&c, "bob"), "global-default");
}

fn description(c: &Controller, name: &str) -> Description {
    let config = c.current();
    let schema = config
        .classifier
        .schemas()
        .iter()
        .find(|s| &*s.spec.name == name)
        .unwrap();
    Description {
        flow: schema.flow.clone(),
        schema: schema.spec.name.clone(),
        distinguisher: None,
        user: Arc::new(UserInfo::default()),
        info: Arc::new(RequestInfo::default()),
    }
}

fn level_of(c: &Controller, name: &str) -> LevelView {
    c.levels().into_iter().find(|l| &*l.name == name).unwrap()
}

/// A level that keeps its seats and its queues full borrows what an idle one lends.
#[tokio::test(start_paused = true)]
async fn a_busy_level_borrows_what_an_idle_one_lends() {
    let c = controller(100);
    let mut levels = vec![queuing_level("busy", 50, 50), queuing_level("idle", 50, 50)];
    levels.extend(bootstrap::mandatory_priority_levels());
    let schemas = vec![
        user_schema("busy", "busy", "busy", 100),
        user_schema("idle", "idle", "idle", 200),
    ];
    c.apply(levels, schemas);
    let before = level_of(&c, "busy");
    assert_eq!((before.nominal, before.min), (48, 24));
    let idle = level_of(&c, "idle");

    // Busy holds every seat it has and keeps twice that waiting, for a whole period.
    let mut held = Vec::new();
    for i in 0..150u64 {
        match before.level.start(
            i,
            WorkEstimate::seats(1),
            description(&c, "busy"),
            Duration::from_secs(60),
        ) {
            Admission::Run(seat) => held.push(Ok(seat)),
            Admission::Wait(w) => held.push(Err(w)),
            Admission::Reject(r) => panic!("{r:?}"),
        }
    }
    tokio::time::advance(BORROWING_PERIOD).await;
    c.adjust_borrowing();
    let busy = level_of(&c, "busy");
    let idle_after = level_of(&c, "idle");
    assert!(
        busy.current > before.nominal,
        "busy {} ≤ nominal {}",
        busy.current,
        before.nominal
    );
    assert!(busy.current <= busy.max);
    assert_eq!(
        idle_after.current, idle.min,
        "the idle level keeps what it may not lend"
    );
    // The seats it borrowed went to requests that waited.
    assert_eq!(busy.level.lock().executing(), busy.current);
    drop(held);
}

#[tokio::test(start_paused = true)]
async fn a_removed_level_drains_before_it_goes() {
    let c = controller(10);
    let mut levels = vec![queuing_level("team", 10, 0)];
    levels.extend(bootstrap::mandatory_priority_levels());
    let schemas = vec![user_schema("team", "alice", "team", 100)];
    c.apply(levels.clone(), schemas.clone());
    let team = level_of(&c, "team");
    let seat = match team.level.start(
        1,
        WorkEstimate::seats(1),
        description(&c, "team"),
        Duration::from_secs(60),
    ) {
        Admission::Run(s) => s,
        _ => panic!("no seat"),
    };
    // The level and its schema go from the API.
    c.apply(bootstrap::mandatory_priority_levels(), Vec::new());
    assert_eq!(classify(&c, "alice"), "catch-all");
    let quiescing = level_of(&c, "team");
    assert!(quiescing.quiescing);
    assert!(Arc::ptr_eq(&quiescing.level, &team.level));
    // It comes back while still busy: the same level, queues and all.
    c.apply(levels.clone(), schemas.clone());
    let back = level_of(&c, "team");
    assert!(!back.quiescing && Arc::ptr_eq(&back.level, &team.level));
    c.apply(bootstrap::mandatory_priority_levels(), Vec::new());
    drop(seat);
    tokio::time::advance(BORROWING_PERIOD).await;
    c.adjust_borrowing();
    assert!(c.levels().iter().all(|l| &*l.name != "team"));
}
