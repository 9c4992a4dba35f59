//! The controller against the in-memory API server of [`crate::fixtures`]:
//! the leader Lease, the status reconciles and the feed, with no API server
//! process (tests/e2e runs the same code against a real one).

mod leader {
    use std::time::Duration;

    use http::{Method, StatusCode};
    use serde_json::{Value, json};
    use tokio::sync::mpsc;
    use tokio::time::Instant;

    use crate::fixtures::{ApiServerVerifier, lease, mock_client, verified};
    use crate::leader::{Elector, Timing, lead};

    const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/sluice/leases";
    const LEASE: &str = "/apis/coordination.k8s.io/v1/namespaces/sluice/leases/lead";
    /// A time written by another node, whose clock is not ours.
    const LONG_AGO: &str = "2001-01-01T00:00:00.000000Z";
    const FAR_AHEAD: &str = "2101-01-01T00:00:00.000000Z";

    /// `what`, or the test fails after a minute (of the paused clock, which
    /// jumps ahead when every task waits: no real minute passes).
    async fn within<T>(what: &str, future: impl std::future::Future<Output = Option<T>>) -> T {
        let outcome = tokio::time::timeout(Duration::from_secs(60), future).await;
        outcome.unwrap_or_else(|_| panic!("{what}: not within a minute")).unwrap_or_else(|| panic!("{what}: never"))
    }

    fn elector(client: kube::Client) -> Elector {
        Elector::new(client, "sluice", "lead", "replica-a", Timing::DEFAULT.lease_duration)
    }

    fn held_by(holder: &str, transitions: i32, renewed: &str) -> Value {
        json!({"holderIdentity": holder, "leaseDurationSeconds": 15, "acquireTime": LONG_AGO,
               "renewTime": renewed, "leaseTransitions": transitions})
    }

    /// Answers a GET with "not found" and the create that follows with the
    /// Lease created; checks the create is a claim by replica-a.
    async fn create(api: &mut ApiServerVerifier) {
        api.expect(Method::GET, LEASE).await.fail(404, "NotFound");
        let create = api.expect(Method::POST, LEASES).await;
        let spec = &create.body["spec"];
        assert_eq!(create.body["metadata"]["name"], "lead");
        assert_eq!(spec["holderIdentity"], "replica-a");
        assert_eq!(spec["leaseDurationSeconds"], 15);
        assert_eq!(spec["leaseTransitions"], 0);
        assert!(spec["renewTime"].is_string() && spec["acquireTime"] == spec["renewTime"], "{spec}");
        let created = lease("lead", "1", spec.clone());
        create.respond(StatusCode::CREATED, &created);
    }

    #[tokio::test(start_paused = true)]
    async fn a_free_lease_is_created_then_renewed_with_the_version_read() {
        let (client, mut api) = mock_client();
        let verifier = tokio::spawn(async move {
            create(&mut api).await;
            api.expect(Method::GET, LEASE).await.ok(&lease("lead", "1", held_by("replica-a", 0, LONG_AGO)));
            let renew = api.expect(Method::PUT, LEASE).await;
            // The version read: a write in between makes this one fail.
            assert_eq!(renew.body["metadata"]["resourceVersion"], "1");
            let spec = &renew.body["spec"];
            assert_eq!((&spec["holderIdentity"], &spec["leaseTransitions"]), (&json!("replica-a"), &json!(0)));
            assert_eq!(spec["acquireTime"], LONG_AGO, "a renewal is no new acquisition");
            assert_ne!(spec["renewTime"], LONG_AGO, "a renewal moves renewTime");
            let renewed = lease("lead", "2", spec.clone());
            renew.ok(&renewed);
            api
        });
        let mut elector = elector(client);
        let started = Instant::now();
        assert!(elector.try_lead().await.unwrap(), "a free Lease is taken");
        assert_eq!(elector.term_ends(Duration::from_secs(10)), Some(started + Duration::from_secs(10)));
        tokio::time::advance(Duration::from_secs(4)).await;
        let renewed = Instant::now();
        assert!(elector.try_lead().await.unwrap(), "the holder keeps it");
        assert_eq!(elector.term_ends(Duration::from_secs(10)), Some(renewed + Duration::from_secs(10)));
        let api = verified(verifier).await;
        drop(elector);
        api.done().await;
    }

    /// Whether the holder is gone is judged by how long this replica has
    /// seen the Lease unchanged, never by the times written in it by
    /// another node's clock: neither a renewTime long past nor one far ahead
    /// decides anything.
    #[tokio::test(start_paused = true)]
    async fn a_lease_another_holds_is_taken_only_once_unchanged_for_a_lease_duration() {
        let (client, mut api) = mock_client();
        let (step_tx, mut step_rx) = mpsc::channel::<()>(1);
        let verifier = tokio::spawn(async move {
            // Seen first at 0 s, written (by its clock) long ago: not taken.
            api.expect(Method::GET, LEASE).await.ok(&lease("lead", "7", held_by("replica-b", 3, LONG_AGO)));
            step_tx.send(()).await.unwrap();
            // At 10 s the holder has renewed it (its clock far ahead).
            api.expect(Method::GET, LEASE).await.ok(&lease("lead", "8", held_by("replica-b", 3, FAR_AHEAD)));
            step_tx.send(()).await.unwrap();
            // At 24 s: 24 s since first seen, but 14 s since it changed.
            api.expect(Method::GET, LEASE).await.ok(&lease("lead", "8", held_by("replica-b", 3, FAR_AHEAD)));
            step_tx.send(()).await.unwrap();
            // At 25 s it has not changed for 15 s: taken, with the version read.
            api.expect(Method::GET, LEASE).await.ok(&lease("lead", "8", held_by("replica-b", 3, FAR_AHEAD)));
            let take = api.expect(Method::PUT, LEASE).await;
            assert_eq!(take.body["metadata"]["resourceVersion"], "8");
            let spec = &take.body["spec"];
            assert_eq!(spec["holderIdentity"], "replica-a");
            assert_eq!(spec["leaseTransitions"], 4);
            assert_ne!(spec["acquireTime"], LONG_AGO, "a new holder's acquireTime");
            let taken = lease("lead", "9", spec.clone());
            take.ok(&taken);
            api
        });
        let mut elector = elector(client);
        for (at, why) in [(10, "held, just seen"), (14, "just renewed"), (1, "changed 14 s ago")] {
            assert!(!elector.try_lead().await.unwrap(), "{why}");
            step_rx.recv().await.unwrap();
            tokio::time::advance(Duration::from_secs(at)).await;
        }
        assert!(elector.try_lead().await.unwrap(), "unchanged for the whole lease duration");
        let api = verified(verifier).await;
        drop(elector);
        api.done().await;
    }

    /// Two candidates writing the same version: the API server lets one
    /// through and answers the other 409, which is not leading (nor an error).
    #[tokio::test(start_paused = true)]
    async fn the_candidate_whose_write_conflicts_does_not_lead() {
        let (client, mut api) = mock_client();
        let verifier = tokio::spawn(async move {
            // Created by another candidate between our GET and our POST.
            api.expect(Method::GET, LEASE).await.fail(404, "NotFound");
            api.expect(Method::POST, LEASES).await.fail(409, "AlreadyExists");
            // Released: free to take, but another candidate writes first.
            let free = json!({"leaseDurationSeconds": 15, "leaseTransitions": 1});
            api.expect(Method::GET, LEASE).await.ok(&lease("lead", "3", free));
            let take = api.expect(Method::PUT, LEASE).await;
            assert_eq!(take.body["metadata"]["resourceVersion"], "3");
            take.fail(409, "Conflict");
            api
        });
        let mut elector = elector(client);
        assert!(!elector.try_lead().await.unwrap(), "the create lost");
        assert!(!elector.try_lead().await.unwrap(), "the take lost");
        assert_eq!(elector.term_ends(Duration::from_secs(10)), None, "never led");
        let api = verified(verifier).await;
        drop(elector);
        api.done().await;
    }

    /// The leader-only work for [`lead`]: it reports each start, and its
    /// stop (the task aborted, so its future dropped) with the time.
    fn work() -> (impl FnMut() -> tokio::task::JoinHandle<()>, mpsc::Receiver<()>, mpsc::Receiver<Instant>) {
        struct Stopped(mpsc::Sender<Instant>);
        impl Drop for Stopped {
            fn drop(&mut self) {
                let _ = self.0.try_send(Instant::now());
            }
        }
        let (started_tx, started_rx) = mpsc::channel(4);
        let (stopped_tx, stopped_rx) = mpsc::channel(4);
        let work = move || {
            let (started, stopped) = (started_tx.clone(), Stopped(stopped_tx.clone()));
            tokio::spawn(async move {
                let _stopped = stopped;
                started.send(()).await.unwrap();
                std::future::pending::<()>().await;
            })
        };
        (work, started_rx, stopped_rx)
    }

    /// A renewal the API server refuses ends the lead at once, and a leader
    /// that is not leading gives nothing up on shutdown.
    #[tokio::test(start_paused = true)]
    async fn a_failed_renewal_stops_the_leaders_work() {
        let (client, mut api) = mock_client();
        let (work, mut started, mut stopped) = work();
        let (shutdown_tx, shutdown_rx) = tokio::sync::oneshot::channel::<()>();
        let leader = tokio::spawn(lead(elector(client), Timing::DEFAULT, work, async move {
            let _ = shutdown_rx.await;
        }));
        create(&mut api).await;
        within("the work starts", started.recv()).await;
        let renewal = api.expect(Method::GET, LEASE).await;
        let failed_at = Instant::now();
        renewal.fail(500, "InternalError");
        let stopped_at = within("the work stops", stopped.recv()).await;
        assert_eq!(stopped_at, failed_at, "stopped on the failure, not later");
        shutdown_tx.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(60), leader).await.expect("lead returns on shutdown").unwrap();
        assert!(started.try_recv().is_err(), "started once");
        api.done().await;
    }

    /// A partition: the renewal hangs, unanswered. The leader stops its work
    /// within the renew deadline of its last successful renewal, before the
    /// others (who count the lease duration from no earlier than that
    /// renewal) may take the Lease.
    #[tokio::test(start_paused = true)]
    async fn a_leader_cut_off_from_the_api_server_stops_before_its_lease_can_expire() {
        let (client, mut api) = mock_client();
        let (work, mut started, mut stopped) = work();
        let (shutdown_tx, shutdown_rx) = tokio::sync::oneshot::channel::<()>();
        let leader = tokio::spawn(lead(elector(client), Timing::DEFAULT, work, async move {
            let _ = shutdown_rx.await;
        }));
        create(&mut api).await;
        within("the work starts", started.recv()).await;
        // One good renewal, 4 s later.
        let renewal = api.expect(Method::GET, LEASE).await;
        let renewed_at = Instant::now();
        renewal.ok(&lease("lead", "1", held_by("replica-a", 0, LONG_AGO)));
        let put = api.expect(Method::PUT, LEASE).await;
        let renewed = lease("lead", "2", put.body["spec"].clone());
        put.ok(&renewed);
        // The next is never answered.
        let _hanging = api.expect(Method::GET, LEASE).await;
        let stopped_at = within("the work stops", stopped.recv()).await;
        let timing = Timing::DEFAULT;
        assert_eq!(stopped_at - renewed_at, timing.renew_deadline, "stopped when the term ended");
        assert!(stopped_at < renewed_at + timing.lease_duration);
        shutdown_tx.send(()).unwrap();
        // No writes while cut off (the GET before this could be the next try).
        let after = tokio::spawn(async move {
            while let Some(exchange) = api.next_if_any().await {
                assert_eq!(exchange.method, Method::GET, "a write after the lead was lost: {}", exchange.path);
                exchange.fail(503, "ServiceUnavailable");
            }
        });
        tokio::time::timeout(Duration::from_secs(60), leader).await.expect("lead returns on shutdown").unwrap();
        after.await.unwrap();
        assert!(started.try_recv().is_err(), "started once");
    }

    /// On shutdown the leader stops its work and clears the holder, so
    /// another replica takes over without waiting for the Lease to expire.
    #[tokio::test(start_paused = true)]
    async fn on_shutdown_the_leader_stops_its_work_and_gives_the_lease_up() {
        let (client, mut api) = mock_client();
        let (work, mut started, mut stopped) = work();
        let (shutdown_tx, shutdown_rx) = tokio::sync::oneshot::channel::<()>();
        let leader = tokio::spawn(lead(elector(client), Timing::DEFAULT, work, async move {
            let _ = shutdown_rx.await;
        }));
        create(&mut api).await;
        within("the work starts", started.recv()).await;
        shutdown_tx.send(()).unwrap();
        api.expect(Method::GET, LEASE).await.ok(&lease("lead", "1", held_by("replica-a", 0, LONG_AGO)));
        let release = api.expect(Method::PUT, LEASE).await;
        assert_eq!(release.body["metadata"]["resourceVersion"], "1");
        assert_eq!(release.body["spec"].get("holderIdentity"), None, "{}", release.body);
        let released = lease("lead", "2", release.body["spec"].clone());
        release.ok(&released);
        tokio::time::timeout(Duration::from_secs(60), leader).await.expect("lead returns on shutdown").unwrap();
        within("the work stops", stopped.recv()).await;
        api.done().await;
    }
}

mod status {
    use std::sync::Arc;
    use std::time::Duration;

    use http::{Method, StatusCode};
    use k8s_openapi::api::coordination::v1::Lease;
    use kube::Client;
    use kube::runtime::controller::Action;
    use kube::runtime::events::{Recorder, Reporter};
    use kube::runtime::reflector;
    use kube::runtime::watcher::Event;
    use serde_json::{Value, json};
    use sluice_api::AIModelRoute;

    use crate::Tenancy;
    use crate::feed::Stores;
    use crate::fixtures::{ApiServerVerifier, mcp_route, mock_client, object, plugin, route, verified};
    use crate::replica::{Entry, ReplicaReport, Reports};
    use crate::secrets::ReferencedSecrets;
    use crate::status::{Context, error_policy, reconcile_mcp_route, reconcile_plugin, reconcile_route};
    use sluice_core::LoadState;

    const ROUTES: &str = "/apis/sluice.dev/v1alpha1/namespaces/team/aimodelroutes";
    const MCP_ROUTES: &str = "/apis/sluice.dev/v1alpha1/namespaces/team/mcproutes";
    const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/team/events";

    /// A leader's context over these objects, with no replica reporting.
    fn context(client: Client, plugins: &[Value], routes: &[Value]) -> Arc<Context> {
        context_with(client, plugins, routes, &[], None)
    }

    /// A leader's context over these objects, with replica `replica-a`
    /// reporting `report` if there is one.
    fn context_with(
        client: Client,
        plugins: &[Value],
        routes: &[Value],
        mcp_routes: &[Value],
        report: Option<ReplicaReport>,
    ) -> Arc<Context> {
        fn store<K>(objects: &[Value]) -> reflector::Store<K>
        where
            K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned,
        {
            let (store, mut writer) = reflector::store::<K>();
            for o in objects {
                writer.apply_watcher_event(&Event::Apply(object(o.clone())));
            }
            store
        }
        let (secret_metadata, _) = reflector::store();
        let secrets = Arc::new(ReferencedSecrets::new(client.clone(), secret_metadata));
        let stores = Stores::new(store(plugins), store(routes), store(mcp_routes), secrets, Arc::default());
        let (replicas, mut replica_writer) = reflector::store::<Lease>();
        let reports = Arc::new(Reports::new(replicas, "sluice"));
        if let Some(report) = report {
            // A heartbeat just renewed, its whole report in part 0.
            let lease: Lease = object(json!({
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": crate::replica::lease_name("replica-a"), "namespace": "sluice",
                             "annotations": {crate::replica::REPORT_ANNOTATION: serde_json::to_string(&report).unwrap()}},
                "spec": {"holderIdentity": "replica-a", "leaseDurationSeconds": 30,
                         "renewTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
                             k8s_openapi::jiff::Timestamp::now())},
            }));
            replica_writer.apply_watcher_event(&Event::Apply(lease.clone()));
            assert!(reports.observe(&lease), "the report is read");
        }
        let reporter = Reporter { controller: "sluice-gateway".into(), instance: Some("replica-a".into()) };
        let recorder = Recorder::new(client.clone(), reporter);
        let tenancy = Arc::new(Tenancy::default().resolved("team"));
        Arc::new(Context::new(client, stores, reports, recorder, tenancy))
    }

    fn shared<K: serde::de::DeserializeOwned>(value: Value) -> Arc<K> {
        Arc::new(object(value))
    }

    fn valid_route() -> Value {
        route("r1", 3, json!({"models": ["m"], "backends": [{"url": "http://upstream.example:1/v1"}]}))
    }

    /// `(type, status, reason)` of each condition, all at `generation`.
    fn conditions(status: &Value, generation: i64) -> Vec<(String, String, String)> {
        let conditions = status["conditions"].as_array().expect("conditions");
        conditions
            .iter()
            .map(|c| {
                assert_eq!(c["observedGeneration"], generation, "{c}");
                assert!(c["lastTransitionTime"].is_string(), "{c}");
                let text = |field: &str| c[field].as_str().unwrap().to_string();
                (text("type"), text("status"), text("reason"))
            })
            .collect()
    }

    fn expected(list: &[(&str, &str, &str)]) -> Vec<(String, String, String)> {
        list.iter().map(|(t, s, r)| (t.to_string(), s.to_string(), r.to_string())).collect()
    }

    /// Takes the status patch of `kind`/`name`: a server-side apply of the
    /// status subresource, by the gateway's field manager, forced; answers it
    /// with the object as patched and returns the status sent.
    async fn status_patch(api: &mut ApiServerVerifier, path: &str, kind: &str, mut object: Value) -> Value {
        let patch = api.expect(Method::PATCH, path).await;
        assert_eq!(patch.query.get("fieldManager").map(String::as_str), Some("sluice-gateway"));
        assert_eq!(patch.query.get("force").map(String::as_str), Some("true"));
        assert_eq!(patch.content_type.as_deref(), Some("application/apply-patch+yaml"));
        assert_eq!((&patch.body["apiVersion"], &patch.body["kind"]), (&json!("sluice.dev/v1alpha1"), &json!(kind)));
        let status = patch.body["status"].clone();
        object["status"] = status.clone();
        patch.ok(&object);
        status
    }

    #[tokio::test]
    async fn reconciling_a_route_applies_its_conditions_to_the_status_subresource() {
        let (client, mut api) = mock_client();
        let ctx = context(client, &[], &[valid_route()]);
        let verifier = tokio::spawn(async move {
            let status = status_patch(&mut api, &format!("{ROUTES}/r1/status"), "AIModelRoute", valid_route()).await;
            assert_eq!(status["observedGeneration"], 3);
            assert_eq!(status["loaded"], "0/0");
            assert_eq!(
                conditions(&status, 3),
                expected(&[
                    ("Accepted", "True", "Accepted"),
                    ("ResolvedRefs", "True", "ResolvedRefs"),
                    ("Ready", "Unknown", "NoReplicas"),
                ])
            );
            // Ready Unknown is no transition worth an Event: nothing more.
            api
        });
        let action = reconcile_route(shared(valid_route()), ctx.clone()).await.unwrap();
        assert_eq!(action, Action::requeue(Duration::from_secs(30)));
        let api = verified(verifier).await;
        drop(ctx);
        api.done().await;
    }

    #[tokio::test]
    async fn a_route_naming_a_missing_plugin_is_not_ready_and_a_warning_is_recorded() {
        let (client, mut api) = mock_client();
        let spec = json!({"models": ["m"], "backends": [{"url": "http://upstream.example:1/v1"}],
                          "plugins": [{"name": "auth"}]});
        let broken = route("r1", 2, spec);
        let ctx = context(client, &[], std::slice::from_ref(&broken));
        let verifier = tokio::spawn({
            let broken = broken.clone();
            async move {
                let status = status_patch(&mut api, &format!("{ROUTES}/r1/status"), "AIModelRoute", broken).await;
                assert_eq!(
                    conditions(&status, 2),
                    expected(&[
                        ("Accepted", "True", "Accepted"),
                        ("ResolvedRefs", "False", "PluginNotFound"),
                        ("Ready", "False", "PluginNotFound"),
                    ])
                );
                let event = api.expect(Method::POST, EVENTS).await;
                let body = event.body.clone();
                assert_eq!((&body["type"], &body["reason"]), (&json!("Warning"), &json!("PluginNotFound")));
                assert_eq!(
                    (&body["regarding"]["kind"], &body["regarding"]["name"]),
                    (&json!("AIModelRoute"), &json!("r1"))
                );
                assert_eq!(body["reportingController"], "sluice-gateway");
                let note = body["note"].as_str().unwrap();
                assert!(note.contains("GatewayPlugin team/auth does not exist"), "{note}");
                event.respond(StatusCode::CREATED, &body);
                api
            }
        });
        reconcile_route(shared(broken), ctx.clone()).await.unwrap();
        let api = verified(verifier).await;
        drop(ctx);
        api.done().await;
    }

    /// The status as last applied is not applied again: a pass over
    /// unchanged objects sends nothing.
    #[tokio::test]
    async fn an_unchanged_status_is_not_written_again() {
        let (client, mut api) = mock_client();
        let ctx = context(client, &[], &[valid_route()]);
        let verifier = tokio::spawn(async move {
            let status = status_patch(&mut api, &format!("{ROUTES}/r1/status"), "AIModelRoute", valid_route()).await;
            (api, status)
        });
        reconcile_route(shared(valid_route()), ctx.clone()).await.unwrap();
        let (mut api, status) = verified(verifier).await;
        let mut applied = valid_route();
        applied["status"] = status;
        // A request now would be answered by no one: this verifier fails on
        // it, and the reconcile fails with it.
        let verifier = tokio::spawn(async move {
            if let Some(exchange) = api.next_if_any().await {
                panic!("an unexpected request: {} {} {}", exchange.method, exchange.path, exchange.body);
            }
        });
        reconcile_route(shared(applied), ctx.clone()).await.expect("nothing to write");
        drop(ctx);
        verified(verifier).await;
    }

    /// A refused status write (here a conflict) fails the reconcile; the
    /// controller retries it with a backoff that doubles per failure and
    /// starts over after a success.
    #[tokio::test]
    async fn a_refused_status_write_is_retried_with_a_doubling_backoff() {
        let (client, mut api) = mock_client();
        let ctx = context(client, &[], &[valid_route()]);
        let route: Arc<AIModelRoute> = shared(valid_route());
        let path = format!("{ROUTES}/r1/status");
        let mut refused = None;
        for delay in [1, 2, 4] {
            let verifier = tokio::spawn({
                let path = path.clone();
                async move {
                    api.expect(Method::PATCH, &path).await.fail(409, "Conflict");
                    api
                }
            });
            let error = reconcile_route(route.clone(), ctx.clone()).await.expect_err("the write was refused");
            assert!(matches!(&error, crate::Error::Kube(kube::Error::Api(status)) if status.code == 409), "{error}");
            assert_eq!(error.metric_label(), "api_error");
            assert_eq!(error_policy(route.clone(), &error, ctx.clone()), Action::requeue(Duration::from_secs(delay)));
            api = verified(verifier).await;
            refused = Some(error);
        }
        let verifier = tokio::spawn(async move {
            status_patch(&mut api, &path, "AIModelRoute", valid_route()).await;
            api
        });
        reconcile_route(route.clone(), ctx.clone()).await.unwrap();
        let api = verified(verifier).await;
        let error = refused.unwrap();
        assert_eq!(error_policy(route, &error, ctx.clone()), Action::requeue(Duration::from_secs(1)), "starts over");
        drop(ctx);
        api.done().await;
    }

    #[tokio::test]
    async fn reconciling_a_plugin_reports_a_missing_secret_on_its_status() {
        let (client, mut api) = mock_client();
        let spec = json!({"source": {"oci": "r.example/p:1"},
                          "configFrom": [{"path": "/key", "secretKeyRef": {"name": "missing", "key": "k"}}]});
        let p = plugin("p", 4, spec);
        let ctx = context(client, std::slice::from_ref(&p), &[]);
        let verifier = tokio::spawn({
            let p = p.clone();
            async move {
                let path = "/apis/sluice.dev/v1alpha1/namespaces/team/gatewayplugins/p/status";
                let status = status_patch(&mut api, path, "GatewayPlugin", p).await;
                assert_eq!((&status["observedGeneration"], &status["loaded"]), (&json!(4), &json!("0/0")));
                assert_eq!(
                    conditions(&status, 4),
                    expected(&[
                        ("Accepted", "True", "Accepted"),
                        ("ResolvedRefs", "False", "SecretNotFound"),
                        ("Ready", "False", "SecretNotFound"),
                    ])
                );
                let event = api.expect(Method::POST, EVENTS).await;
                assert_eq!(event.body["reason"], "SecretNotFound");
                assert_eq!(event.body["regarding"]["kind"], "GatewayPlugin");
                let body = event.body.clone();
                event.respond(StatusCode::CREATED, &body);
                api
            }
        });
        reconcile_plugin(shared(p), ctx.clone()).await.unwrap();
        let api = verified(verifier).await;
        drop(ctx);
        api.done().await;
    }

    fn mcp(name: &str, generation: i64, created: &str, path: &str) -> Value {
        let mut route = mcp_route(
            name,
            generation,
            json!({"path": path, "servers": [{"name": "tools", "url": "http://tools.example:8000/mcp"}]}),
        );
        route["metadata"]["creationTimestamp"] = created.into();
        route
    }

    /// What replica-a reports of MCP routes: `(key, generation, state)`.
    fn mcp_report(entries: &[(&str, i64, LoadState)]) -> ReplicaReport {
        let mut report = ReplicaReport::default();
        for (key, generation, state) in entries {
            let entry = Entry { generation: *generation, state: state.clone(), ejected_backends: vec![] };
            report.mcp_routes.insert(key.to_string(), entry);
        }
        report
    }

    /// A replica reporting the route's generation ready (the gateway's
    /// `LoadReport.mcp_routes`) makes it Ready, with the generation observed
    /// and the replica counted; the transition is an Event.
    #[tokio::test]
    async fn an_mcp_route_every_replica_serves_is_ready() {
        let (client, mut api) = mock_client();
        let route = mcp("tools", 4, "2026-01-01T00:00:00Z", "/mcp");
        let served = mcp_report(&[("team/tools", 4, LoadState::ready(None))]);
        let ctx = context_with(client, &[], &[], std::slice::from_ref(&route), Some(served));
        let verifier = tokio::spawn({
            let route = route.clone();
            async move {
                let status = status_patch(&mut api, &format!("{MCP_ROUTES}/tools/status"), "MCPRoute", route).await;
                assert_eq!((&status["observedGeneration"], &status["loaded"]), (&json!(4), &json!("1/1")));
                assert_eq!(
                    conditions(&status, 4),
                    expected(&[
                        ("Accepted", "True", "Accepted"),
                        ("ResolvedRefs", "True", "ResolvedRefs"),
                        ("Ready", "True", "Loaded"),
                    ])
                );
                assert_eq!(status["replicas"], json!([{"name": "replica-a", "generation": 4, "ready": true}]));
                let event = api.expect(Method::POST, EVENTS).await;
                assert_eq!((&event.body["type"], &event.body["reason"]), (&json!("Normal"), &json!("Loaded")));
                assert_eq!(event.body["regarding"]["kind"], "MCPRoute");
                let body = event.body.clone();
                event.respond(StatusCode::CREATED, &body);
                api
            }
        });
        reconcile_mcp_route(shared(route), ctx.clone()).await.unwrap();
        let api = verified(verifier).await;
        drop(ctx);
        api.done().await;
    }

    /// A replica that could not load the route (its chain's plugins not
    /// loaded) says why, and the route is not Ready; a replica still on an
    /// older generation is progress, not readiness.
    #[tokio::test]
    async fn a_replica_failing_an_mcp_route_or_behind_keeps_it_from_ready() {
        let failed = LoadState::failed("ChainNotReady", "plugin team/auth is not loaded", None);
        for (state, generation, ready) in
            [(failed, 2, ("False", "ChainNotReady")), (LoadState::ready(None), 1, ("Unknown", "Progressing"))]
        {
            let (client, mut api) = mock_client();
            let route = mcp("tools", 2, "2026-01-01T00:00:00Z", "/mcp");
            let served = mcp_report(&[("team/tools", generation, state)]);
            let ctx = context_with(client, &[], &[], std::slice::from_ref(&route), Some(served));
            let verifier = tokio::spawn({
                let route = route.clone();
                async move {
                    let path = format!("{MCP_ROUTES}/tools/status");
                    let status = status_patch(&mut api, &path, "MCPRoute", route).await;
                    assert_eq!(status["loaded"], "0/1");
                    let (_, status_of_ready, reason) = conditions(&status, 2).pop().unwrap();
                    assert_eq!((status_of_ready.as_str(), reason.as_str()), ready);
                    if ready.0 == "False" {
                        let message = status["conditions"][2]["message"].as_str().unwrap();
                        assert!(message.contains("replica replica-a: plugin team/auth is not loaded"), "{message}");
                        api.expect(Method::POST, EVENTS).await.respond(StatusCode::CREATED, &json!({}));
                    }
                    api
                }
            });
            reconcile_mcp_route(shared(route), ctx.clone()).await.unwrap();
            let api = verified(verifier).await;
            drop(ctx);
            api.done().await;
        }
    }

    /// Of two MCPRoutes on one path the younger is refused: Accepted and
    /// Ready False with PathConflict, naming the older, which stays Ready.
    #[tokio::test]
    async fn the_younger_of_two_mcp_routes_on_one_path_has_a_path_conflict() {
        let (client, mut api) = mock_client();
        let older = mcp("older", 1, "2026-01-01T00:00:00Z", "/mcp");
        let younger = mcp("younger", 1, "2026-02-01T00:00:00Z", "/mcp");
        // The data plane never sees the younger: the feed leaves it out.
        let served = mcp_report(&[("team/older", 1, LoadState::ready(None))]);
        let ctx = context_with(client, &[], &[], &[older.clone(), younger.clone()], Some(served));
        let verifier = tokio::spawn({
            let (older, younger) = (older.clone(), younger.clone());
            async move {
                let status = status_patch(&mut api, &format!("{MCP_ROUTES}/younger/status"), "MCPRoute", younger).await;
                assert_eq!(
                    conditions(&status, 1),
                    expected(&[
                        ("Accepted", "False", "PathConflict"),
                        ("ResolvedRefs", "Unknown", "NotChecked"),
                        ("Ready", "False", "PathConflict"),
                    ])
                );
                let message = status["conditions"][0]["message"].as_str().unwrap();
                assert!(message.contains("`/mcp`") && message.contains("team/older"), "{message}");
                let event = api.expect(Method::POST, EVENTS).await;
                assert_eq!((&event.body["type"], &event.body["reason"]), (&json!("Warning"), &json!("PathConflict")));
                let body = event.body.clone();
                event.respond(StatusCode::CREATED, &body);

                let status = status_patch(&mut api, &format!("{MCP_ROUTES}/older/status"), "MCPRoute", older).await;
                let ready = conditions(&status, 1).pop().unwrap();
                assert_eq!((ready.1.as_str(), ready.2.as_str()), ("True", "Loaded"));
                api.expect(Method::POST, EVENTS).await.respond(StatusCode::CREATED, &json!({}));
                api
            }
        });
        reconcile_mcp_route(shared(younger), ctx.clone()).await.unwrap();
        reconcile_mcp_route(shared(older), ctx.clone()).await.unwrap();
        let api = verified(verifier).await;
        drop(ctx);
        api.done().await;
    }
}

mod feed {
    use std::sync::Arc;
    use std::time::Duration;

    use futures_util::Stream;
    use http::Method;
    use k8s_openapi::api::core::v1::Secret;
    use kube::core::PartialObjectMeta;
    use kube::runtime::watcher::{self, Event};
    use parking_lot::Mutex;
    use serde_json::{Value, json};
    use sluice_api::{AIModelRoute, GatewayPlugin, MCPRoute};
    use sluice_core::{ApiKeySource, ConfigUpdate, DesiredConfig};
    use tokio::sync::{mpsc, watch};

    use crate::Tenancy;
    use crate::feed::{Feed, Published};
    use crate::fixtures::{ApiServerVerifier, mcp_route, mock_client, object, plugin, route};

    type Sender<K> = mpsc::Sender<Result<Event<K>, watcher::Error>>;

    /// A watch the test writes the events of.
    fn watch_stream<K: Send + 'static>() -> (Sender<K>, impl Stream<Item = Result<Event<K>, watcher::Error>> + Send) {
        let (tx, rx) = mpsc::channel(16);
        let stream = futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|e| (e, rx)) });
        (tx, stream)
    }

    async fn list<K>(tx: &Sender<K>, objects: Vec<K>) {
        tx.send(Ok(Event::Init)).await.unwrap();
        for object in objects {
            tx.send(Ok(Event::InitApply(object))).await.unwrap();
        }
        tx.send(Ok(Event::InitDone)).await.unwrap();
    }

    /// Returns once the feed has taken every event sent on `tx` and gone
    /// back to waiting: the test runtime has one thread, so the test runs
    /// again only when the feed waits, and a publish it would make on these
    /// events has been made.
    async fn taken<K>(tx: &Sender<K>) {
        while tx.capacity() < tx.max_capacity() {
            tokio::task::yield_now().await;
        }
    }

    fn secret_metadata(version: &str) -> PartialObjectMeta<Secret> {
        object(json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
                      "metadata": {"name": "key", "namespace": "team", "resourceVersion": version}}))
    }

    /// Answers the feed's fetch of the Secret `key` with `value` as its `token`.
    async fn serve_secret(api: &mut ApiServerVerifier, version: &str, value: &str) {
        let get = api.expect(Method::GET, "/api/v1/namespaces/team/secrets/key").await;
        use k8s_openapi::ByteString;
        let data = json!({"token": ByteString(value.as_bytes().to_vec())});
        get.ok(&json!({"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "data": data,
                       "metadata": {"name": "key", "namespace": "team", "resourceVersion": version}}));
    }

    async fn next(updates: &mut watch::Receiver<Option<ConfigUpdate>>) -> DesiredConfig {
        tokio::time::timeout(Duration::from_secs(10), updates.changed())
            .await
            .expect("a desired config published")
            .unwrap();
        match updates.borrow_and_update().clone() {
            Some(ConfigUpdate::Desired(desired)) => desired,
            other => panic!("{other:?}"),
        }
    }

    fn r1(generation: i64, model: &str) -> Value {
        route(
            "r1",
            generation,
            json!({"models": [model], "backends": [{"url": "http://upstream.example:1/v1",
                   "apiKeySecretRef": {"name": "key", "key": "token"}}]}),
        )
    }

    fn api_key(desired: &DesiredConfig, route: &str) -> String {
        let route = desired.routes.iter().find(|r| r.key.name == route).unwrap();
        match &route.backends[0].api_key {
            Some(ApiKeySource::Value(secret)) => secret.expose().to_string(),
            other => panic!("{other:?}"),
        }
    }

    /// What the watches hold, Secrets' data fetched, becomes the desired
    /// config: once every watch has listed, and again on each change.
    #[tokio::test]
    async fn the_watched_objects_become_the_desired_config() {
        let (client, mut api) = mock_client();
        let (plugins_tx, plugins) = watch_stream::<GatewayPlugin>();
        let (routes_tx, routes) = watch_stream::<AIModelRoute>();
        let (mcp_routes_tx, mcp_routes) = watch_stream::<MCPRoute>();
        let (secrets_tx, secrets) = watch_stream::<PartialObjectMeta<Secret>>();
        let tenancy = Arc::new(Tenancy::default().resolved("team"));
        let feed = Feed::from_watches(&client, tenancy, plugins, routes, mcp_routes, secrets);
        drop(client);
        let (updates_tx, mut updates) = watch::channel(None);
        let (changed_tx, changed) = watch::channel(0u64);
        let published = Arc::new(Mutex::new(Published::default()));
        let task = tokio::spawn(feed.run(updates_tx, published.clone(), changed_tx));

        let auth = plugin("auth", 5, json!({"source": {"oci": "r.example/auth:1"}}));
        let r2 = route(
            "r2",
            1,
            json!({"models": ["n"], "backends": [{"url": "http://other.example:1/v1"}], "plugins": [{"name": "auth"}]}),
        );
        // Listed one after another, each taken in by the feed before the
        // next: a publish on a partial view would show as a revision past 1.
        list(&routes_tx, vec![object(r1(1, "m")), object(r2)]).await;
        taken(&routes_tx).await;
        list(&plugins_tx, vec![object(auth)]).await;
        taken(&plugins_tx).await;
        list(&mcp_routes_tx, vec![]).await;
        taken(&mcp_routes_tx).await;
        list(&secrets_tx, vec![secret_metadata("5")]).await;
        serve_secret(&mut api, "5", "sk-one").await;
        let desired = next(&mut updates).await;
        assert_eq!((desired.revision, *changed.borrow()), (1, 1), "one publish, of the whole view");
        let names = |desired: &DesiredConfig| -> Vec<String> {
            desired.routes.iter().map(|r| format!("{}/{}", r.key.namespace, r.key.name)).collect()
        };
        assert_eq!(names(&desired), ["team/r1", "team/r2"]);
        assert_eq!(desired.plugins.iter().map(|p| p.key.name.as_str()).collect::<Vec<_>>(), ["auth"]);
        let r1_decl = &desired.routes[0];
        assert_eq!(
            (r1_decl.models.as_slice(), r1_decl.backends[0].url.as_str()),
            (&["m".to_string()][..], "http://upstream.example:1/v1")
        );
        assert_eq!(api_key(&desired, "r1"), "sk-one");
        let r2_plugins: Vec<&str> = desired.routes[1].plugins.iter().map(|k| k.name.as_str()).collect();
        assert_eq!(r2_plugins, ["auth"]);
        let generations = published.lock().generations(1).expect("revision 1's generations");
        assert_eq!(generations.plugins.values().copied().collect::<Vec<_>>(), [5]);
        assert_eq!(generations.routes.len(), 2);

        // The Secret changes: its data is fetched again and served.
        secrets_tx.send(Ok(Event::Apply(secret_metadata("6")))).await.unwrap();
        serve_secret(&mut api, "6", "sk-two").await;
        let desired = next(&mut updates).await;
        assert_eq!((desired.revision, api_key(&desired, "r1")), (2, "sk-two".to_string()));

        // A new generation of a route.
        routes_tx.send(Ok(Event::Apply(object(r1(2, "m2"))))).await.unwrap();
        let desired = next(&mut updates).await;
        assert_eq!(desired.revision, 3);
        assert_eq!(desired.routes[0].models, ["m2"]);
        assert_eq!(published.lock().generations(3).unwrap().routes.values().copied().max(), Some(2));

        // The plugin goes: the route that names it can no longer be served
        // as it is declared, so its last good version stays.
        let gone = plugin("auth", 5, json!({"source": {"oci": "r.example/auth:1"}}));
        plugins_tx.send(Ok(Event::Delete(object(gone)))).await.unwrap();
        let desired = next(&mut updates).await;
        assert_eq!(desired.revision, 4);
        assert!(desired.plugins.is_empty());
        assert_eq!(names(&desired), ["team/r1", "team/r2"]);

        // A route deleted.
        routes_tx.send(Ok(Event::Delete(object(r1(2, "m2"))))).await.unwrap();
        let desired = next(&mut updates).await;
        assert_eq!((desired.revision, names(&desired)), (5, vec!["team/r2".to_string()]));

        drop(updates);
        tokio::time::timeout(Duration::from_secs(10), task).await.expect("the feed ends with its data plane").unwrap();
        api.done().await;
    }

    /// The feed over test watches, running: the senders of each watch, the
    /// published configs and generations, and the API server's verifier.
    struct Running {
        plugins: Sender<GatewayPlugin>,
        routes: Sender<AIModelRoute>,
        mcp_routes: Sender<MCPRoute>,
        secrets: Sender<PartialObjectMeta<Secret>>,
        updates: watch::Receiver<Option<ConfigUpdate>>,
        published: Arc<Mutex<Published>>,
        api: ApiServerVerifier,
    }

    fn start() -> Running {
        let (client, api) = mock_client();
        let (plugins_tx, plugins) = watch_stream::<GatewayPlugin>();
        let (routes_tx, routes) = watch_stream::<AIModelRoute>();
        let (mcp_routes_tx, mcp_routes) = watch_stream::<MCPRoute>();
        let (secrets_tx, secrets) = watch_stream::<PartialObjectMeta<Secret>>();
        let tenancy = Arc::new(Tenancy::default().resolved("team"));
        let feed = Feed::from_watches(&client, tenancy, plugins, routes, mcp_routes, secrets);
        let (updates_tx, updates) = watch::channel(None);
        let published = Arc::new(Mutex::new(Published::default()));
        tokio::spawn(feed.run(updates_tx, published.clone(), watch::channel(0u64).0));
        Running {
            plugins: plugins_tx,
            routes: routes_tx,
            mcp_routes: mcp_routes_tx,
            secrets: secrets_tx,
            updates,
            published,
            api,
        }
    }

    fn mcp(name: &str, created: &str, path: &str, server: Value) -> MCPRoute {
        let mut route = mcp_route(name, 1, json!({"path": path, "servers": [server], "plugins": [{"name": "auth"}]}));
        route["metadata"]["creationTimestamp"] = created.into();
        object(route)
    }

    /// MCPRoutes become the desired config's `mcp_routes`, Secrets resolved;
    /// of two on one path only the older is published, and the younger
    /// takes the path when the older goes.
    #[tokio::test]
    async fn mcp_routes_become_the_desired_configs_and_the_older_keeps_a_path() {
        let mut feed = start();
        let server = json!({"name": "tools", "url": "http://tools.example:8000/mcp"});
        let keyed = json!({"name": "tools", "url": "http://tools.example:8000/mcp",
                           "apiKeySecretRef": {"name": "key", "key": "token"}});
        let older = mcp("older", "2026-01-01T00:00:00Z", "/mcp", keyed);
        let younger = mcp("younger", "2026-02-01T00:00:00Z", "/mcp", server.clone());
        let other = mcp("other", "2026-03-01T00:00:00Z", "/other", server);
        list(&feed.plugins, vec![object(plugin("auth", 1, json!({"source": {"oci": "r.example/auth:1"}})))]).await;
        list(&feed.routes, vec![]).await;
        list(&feed.mcp_routes, vec![younger, older.clone(), other]).await;
        list(&feed.secrets, vec![secret_metadata("5")]).await;
        serve_secret(&mut feed.api, "5", "sk-mcp").await;
        let desired = next(&mut feed.updates).await;
        let names =
            |desired: &DesiredConfig| -> Vec<String> { desired.mcp_routes.iter().map(|r| r.key.to_string()).collect() };
        assert_eq!(names(&desired), ["team/older", "team/other"]);
        assert!(
            matches!(&desired.mcp_routes[0].servers[0].api_key, Some(ApiKeySource::Value(k)) if k.expose() == "sk-mcp")
        );
        assert_eq!(desired.mcp_routes[1].plugins[0].to_string(), "team/auth");
        let generations = feed.published.lock().generations(desired.revision).unwrap();
        let mut published: Vec<String> = generations.mcp_routes.keys().map(ToString::to_string).collect();
        published.sort();
        assert_eq!(published, ["team/older", "team/other"], "no load report is read for the loser");

        feed.mcp_routes.send(Ok(Event::Delete(older))).await.unwrap();
        let desired = next(&mut feed.updates).await;
        assert_eq!(names(&desired), ["team/other", "team/younger"]);
    }

    /// A cluster whose MCPRoute CRD (or RBAC) is missing, as after an
    /// upgrade that left CRDs alone, still gets the rest of its config.
    #[tokio::test]
    async fn a_cluster_without_the_mcp_route_crd_serves_the_other_kinds() {
        let mut feed = start();
        list(&feed.plugins, vec![]).await;
        list(
            &feed.routes,
            vec![object(route(
                "r",
                1,
                json!({"models": ["m"],
            "backends": [{"url": "http://upstream.example:1/v1"}]}),
            ))],
        )
        .await;
        list(&feed.secrets, vec![]).await;
        taken(&feed.secrets).await;
        assert!(!feed.updates.has_changed().unwrap(), "nothing before the MCPRoute watch has listed or failed");
        let missing = kube::core::Status::failure("the server could not find the requested resource", "NotFound");
        let error = watcher::Error::InitialListFailed(kube::Error::Api(missing.with_code(404).boxed()));
        feed.mcp_routes.send(Err(error)).await.unwrap();
        let desired = next(&mut feed.updates).await;
        assert_eq!((desired.routes.len(), desired.mcp_routes.len()), (1, 0));
    }
}

mod wiring {
    use std::sync::Arc;

    use tokio::sync::watch;

    use crate::fixtures::mock_client;
    use crate::{Options, Tenancy};

    /// The gateway spawns [`crate::run`], which hands its loop to
    /// [`crate::leader::lead`]: the whole must stay `Send + 'static`. Checked
    /// when this compiles; the future is never polled.
    #[tokio::test]
    async fn run_can_be_spawned() {
        fn spawnable(_: impl std::future::Future<Output = ()> + Send + 'static) {}
        let (client, _api) = mock_client();
        let options = Options {
            namespace: Some("team".into()),
            lease_namespace: "sluice".into(),
            replica: "replica-a".into(),
            tenancy: Tenancy::default(),
        };
        let (updates, _) = watch::channel(None);
        let (_, reports) = watch::channel(Arc::new(sluice_core::LoadReport::default()));
        spawnable(crate::run(client, options, updates, reports, async {}));
    }
}
