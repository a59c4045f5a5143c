//! The gateway against a real kube-apiserver and a real aggregated API server
//! (k8s.io/sample-apiserver), with kube-apiserver's own aggregator as the oracle.
//!
//! Runs when `KUBEBUILDER_ASSETS` names a directory holding `kube-apiserver` and `etcd`, and
//! `SAMPLE_APISERVER` names the `sample-apiserver` binary (`e2e::real`); otherwise each test prints
//! `SKIPPED ...` and passes, so CI, which has no such binaries, runs the fixture suite only.
//!
//! One control plane serves the whole session, because it takes seconds and most of two cores to
//! start: [`session_against_the_real_control_plane`] starts etcd, kube-apiserver and
//! sample-apiserver once, then runs its checks in order, each on its own (one failing check does
//! not hide the next), and fails naming every check that failed. The order is the order of a
//! cluster's life: the `file` source routes sample-apiserver before kube-apiserver knows of it
//! ([`file_source`]); then the APIService is registered on kube-apiserver and the gateway watches
//! it ([`discovery`], [`openapi_v2_proto`], [`flunders`], [`status`]); then the changes users
//! make to a cluster (CRDs, [`crds`]; protobuf clients, [`protobuf`]; the chart, [`chart`]).
//!
//! `REAL_CHECKS=<text>` runs only the checks whose name contains the text (the set-up still runs).
//!
//! Deliberate differences from kube-apiserver are stated where they are checked (and in the
//! README's "Against a real kube-apiserver").

mod chart;
mod crds;
mod discovery;
mod file_source;
mod flood;
mod flowcontrol;
mod flunders;
mod leader_election;
mod openapi_v2_proto;
mod protobuf;
mod quiet_backend;
mod session;
mod status;
mod structured_authentication;
mod trust;
mod watches;

use std::time::Instant;

use e2e::checks;
use e2e::real::RealBinaries;
use e2e::table::run_checks;
use session::Real;

const LABEL: &str = "real control plane";
const ONLY: &str = "REAL_CHECKS";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_against_the_real_control_plane() {
    let Some(binaries) = RealBinaries::or_skip("session_against_the_real_control_plane") else {
        return;
    };
    let started = Instant::now();
    let real = Real::start(&binaries).await;
    eprintln!(
        "real control plane: etcd, kube-apiserver and sample-apiserver ready after {:.1?}",
        started.elapsed()
    );

    // Before kube-apiserver knows of wardle.example.com: the file source alone routes it.
    let mut failures = run_checks(
        LABEL,
        ONLY,
        &real,
        checks![
            "file source routes sample-apiserver that kube-apiserver does not know" =>
                file_source::routes_what_kube_apiserver_does_not_know,
            "an unprivileged user gets sample-apiserver's own 403, naming the caller" =>
                file_source::sample_apiserver_authorizes_the_caller,
        ],
    )
    .await;

    // The APIService on kube-apiserver, the gateway watching it there.
    real.register_wardle().await;
    failures.extend(
        run_checks(
            LABEL,
            ONLY,
            &real,
            checks![
                "/apis (legacy) equals kube-apiserver's" => discovery::legacy_apis,
                "/apis (aggregated v2) equals kube-apiserver's" => discovery::aggregated_apis,
                "/apis (aggregated v2beta1) answered as kube-apiserver answers it" =>
                    discovery::aggregated_v2beta1,
                "/api equals kube-apiserver's" => discovery::core_api,
                "/apis/<group> and /apis/<group>/<version> equal kube-apiserver's" =>
                    discovery::group_documents,
                "the /openapi/v3 root lists what kube-apiserver lists" => discovery::openapi_root,
                "the merged /openapi/v2 lists what kube-apiserver's lists" => discovery::openapi_v2,
                "/openapi/v2 protobuf encoded from kube-apiserver's JSON equals kube-apiserver's" =>
                    openapi_v2_proto::encode_equals_kube_apiserver,
                "kubectl api-versions equals kube-apiserver's" => discovery::api_versions,
                "kubectl api-resources equals kube-apiserver's" => discovery::api_resources,
                "kubectl explain flunders.spec equals kube-apiserver's" => flunders::explain,
                "flunders created, listed, watched, patched and deleted" => flunders::crud_and_watch,
                "a 403 for flunders reads as kube-apiserver's" => flunders::forbidden_like_kube,
                "kubectl get apiservices shows the status written" => status::get_apiservices,
                "priority and fairness classifies as kube-apiserver, from its FlowSchemas" =>
                    flowcontrol::classifies_as_kube_apiserver,
                "priority and fairness: a flood beside kube-apiserver's starves no one" =>
                    flood::a_flood_starves_no_one,
                "the gateway and kube-apiserver do not fight over status" => status::no_status_fight,
                "two replicas elect one Lease holder, and hand over when it is killed" =>
                    leader_election::one_holder_and_a_handover,
                "sample-apiserver trusts a gateway kube-apiserver never heard of" =>
                    trust::sample_apiserver_trusts_a_gateway_kube_never_heard_of,
                "a CRD and its resource in one kubectl apply, repeatedly" => crds::crd_and_resource_in_one_apply,
                "protobuf requests and watches pass unchanged" => protobuf::passes_unchanged,
                "120 watches of one client and a write beside them, as directly" =>
                    watches::a_hundred_watches_beside_a_write,
                "watch-list (sendInitialEvents) streams the same events and bookmark, unbuffered" =>
                    watches::watch_list_streams_as_directly,
                "200 watches ended by their timeout on one HTTP/2 connection, each cleanly, as \
                 directly" => watches::ended_watches_leave_the_connection_open,
                "helm install, upgrade and uninstall of the chart" => chart::install_upgrade_uninstall,
                "the chart's APIService CRD validates like kube-aggregator" => chart::apiservice_crd,
                // Last: it kills sample-apiserver.
                "sample-apiserver frozen, then killed, with no requests: noticed beside \
                 kube-aggregator (issue 27)" => quiet_backend::frozen_then_killed,
            ],
        )
        .await,
    );
    eprintln!("real control plane: session took {:.1?}", started.elapsed());
    if !failures.is_empty() {
        eprintln!("{}", real.logs());
    }
    assert!(
        failures.is_empty(),
        "{} check(s) of the real control plane session failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
