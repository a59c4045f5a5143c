//! The common session: a core, aggregated backends and the gateway, built with a few knobs.

use super::*;

/// A core, aggregated backends and the gateway in front of them, started by [`ScenarioBuilder`]:
/// the one set-up every end-to-end session with aggregated API servers shares, so that a test
/// says only what its session needs (which backends, which APIServices from where, which policy,
/// which extra flags) and nothing it does not.
///
/// Fields drop in order: the gateway stops before its backends and core, and the scratch
/// directory goes last.
#[derive(Debug)]
pub struct Scenario {
    pub gateway: Gateway,
    /// By the namespace of the Service `api` they serve as, in the order they were declared.
    backends: Vec<(String, FixtureAggregated)>,
    pub core: FixtureCore,
    /// The `--apiservice-dir` of a file source.
    manifests: Option<PathBuf>,
    pub pki: Pki,
}

/// Which APIService source the gateway reads.
#[derive(Debug)]
enum Source {
    /// The core's APIServices (the gateway's default): registered with `kubectl apply`.
    Kube,
    /// An `--apiservice-dir` holding these `(file, manifest)` at start.
    Files(Vec<(String, String)>),
}

/// What a [`Scenario`] starts; see [`Scenario::builder`].
#[derive(Debug)]
pub struct ScenarioBuilder {
    pki: Pki,
    core_args: Vec<String>,
    policy: Option<Value>,
    /// `(namespace, group, versions, extra flags)`.
    backends: Vec<(String, String, String, Vec<String>)>,
    static_services: bool,
    /// `(namespace, name, namespace of the backend)`: more Service names for a backend.
    aliases: Vec<(String, String, String)>,
    config_yaml: String,
    source: Source,
    availability_interval: String,
    gateway_args: Vec<String>,
    /// Return from [`ScenarioBuilder::start`] only once `/readyz` passes (the default).
    wait_ready: bool,
}

impl Scenario {
    /// A scenario with the certificates of [`Pki::new`] (backends serve as `wardle/api`).
    pub fn builder() -> ScenarioBuilder {
        Scenario::with_pki(Pki::new())
    }

    /// A scenario with `pki`, e.g. [`Pki::for_services`] for backends in other namespaces, or
    /// one the test already built APIService manifests from.
    pub fn with_pki(pki: Pki) -> ScenarioBuilder {
        ScenarioBuilder {
            pki,
            core_args: Vec::new(),
            policy: None,
            backends: Vec::new(),
            static_services: true,
            aliases: Vec::new(),
            config_yaml: String::new(),
            source: Source::Kube,
            availability_interval: "1s".to_owned(),
            gateway_args: Vec::new(),
            wait_ready: true,
        }
    }

    /// The most common session: the wardle backend (`wardle.example.com/v1alpha1` as Service
    /// `wardle/api`) behind the gateway, not yet registered.
    pub fn wardle() -> ScenarioBuilder {
        Scenario::builder().backend("wardle", WARDLE_GROUP, "v1alpha1", &[])
    }

    /// The backend serving as Service `api` of `namespace`.
    pub fn backend(&self, namespace: &str) -> &FixtureAggregated {
        self.backends
            .iter()
            .find(|(ns, _)| ns == namespace)
            .map(|(_, backend)| backend)
            .unwrap_or_else(|| panic!("no backend in namespace {namespace}"))
    }

    /// [`Scenario::backend`], to stop it.
    pub fn backend_mut(&mut self, namespace: &str) -> &mut FixtureAggregated {
        self.backends
            .iter_mut()
            .find(|(ns, _)| ns == namespace)
            .map(|(_, backend)| backend)
            .unwrap_or_else(|| panic!("no backend in namespace {namespace}"))
    }

    /// A client certificate for user `name` in `groups`.
    pub fn user(&self, name: &str, groups: &[&str]) -> CertifiedPair {
        self.pki.user(name, groups)
    }

    /// A kubectl 1.32 session as `user`.
    pub fn kubectl(&self, user: &CertifiedPair) -> Kubectl {
        kubectl_as(&self.gateway, KubectlVersion::V1_32, user)
    }

    /// GET `path` as `user` over HTTP/2, the body as JSON (`null` if it is not).
    pub async fn get(
        &self,
        user: &CertifiedPair,
        path: &str,
        headers: &[(&str, &str)],
    ) -> (StatusCode, Value) {
        get_as(&self.gateway, user, path, headers).await
    }

    /// The gateway's logs so far, for failure messages.
    pub fn logs(&self) -> String {
        self.gateway.process.logs()
    }

    /// The `--apiservice-dir` of a scenario with a file source.
    pub fn manifests(&self) -> &Path {
        self.manifests
            .as_deref()
            .expect("the scenario reads APIServices from the core, not from files")
    }

    /// Registers `api` as a user of a file source does: its manifest lands in the directory.
    pub fn register(&self, api: &ApiService) {
        api.write_to(self.manifests(), &format!("{}.yaml", api.name()));
    }
}

impl ScenarioBuilder {
    /// The certificates, e.g. to write a CA file the gateway's flags name.
    pub fn pki(&self) -> &Pki {
        &self.pki
    }

    /// Flags for `fixture-core`.
    pub fn core_args(mut self, args: &[&str]) -> ScenarioBuilder {
        self.core_args.extend(args.iter().map(|a| a.to_string()));
        self
    }

    /// The core authorizes (and authenticates tokens) with `policy` instead of allowing all.
    pub fn core_policy(mut self, policy: Value) -> ScenarioBuilder {
        self.policy = Some(policy);
        self
    }

    /// An aggregated backend serving `group` at `versions` (comma list, first preferred) as
    /// Service `api` of `namespace`, see [`Pki::start_backend`] for `extra` flags.
    pub fn backend(
        mut self,
        namespace: &str,
        group: &str,
        versions: &str,
        extra: &[&str],
    ) -> ScenarioBuilder {
        self.backends.push((
            namespace.to_owned(),
            group.to_owned(),
            versions.to_owned(),
            extra.iter().map(|a| a.to_string()).collect(),
        ));
        self
    }

    /// Leaves the backends out of the static `services:` map: the gateway must find them
    /// through Services and EndpointSlices on the core.
    pub fn without_static_services(mut self) -> ScenarioBuilder {
        self.static_services = false;
        self
    }

    /// Also puts the backend of `backend_namespace` at Service `namespace/name`.
    pub fn service_alias(
        mut self,
        namespace: &str,
        name: &str,
        backend_namespace: &str,
    ) -> ScenarioBuilder {
        self.aliases.push((
            namespace.to_owned(),
            name.to_owned(),
            backend_namespace.to_owned(),
        ));
        self
    }

    /// YAML appended to the gateway's config file.
    pub fn config_yaml(mut self, yaml: &str) -> ScenarioBuilder {
        self.config_yaml.push_str(yaml);
        self
    }

    /// Reads APIServices from an `--apiservice-dir` (empty unless manifests are added).
    pub fn file_source(mut self) -> ScenarioBuilder {
        if let Source::Kube = self.source {
            self.source = Source::Files(Vec::new());
        }
        self
    }

    /// A file in the `--apiservice-dir` at start (implies [`ScenarioBuilder::file_source`]).
    pub fn manifest(mut self, file: &str, yaml: &str) -> ScenarioBuilder {
        self = self.file_source();
        if let Source::Files(files) = &mut self.source {
            files.push((file.to_owned(), yaml.to_owned()));
        }
        self
    }

    /// [`Pki::apiservice`] registered from a manifest at start (implies a file source).
    pub fn apiservice(self, group: &str, version: &str, namespace: &str) -> ScenarioBuilder {
        let api = self.pki.apiservice(group, version, namespace);
        self.manifest(&format!("{}.yaml", api.name()), &api.yaml())
    }

    /// `--apiservice-availability-interval` (1 s unless set).
    pub fn availability_interval(mut self, interval: &str) -> ScenarioBuilder {
        self.availability_interval = interval.to_owned();
        self
    }

    /// More gateway flags.
    pub fn gateway_args(mut self, args: &[&str]) -> ScenarioBuilder {
        self.gateway_args.extend(args.iter().map(|a| a.to_string()));
        self
    }

    /// [`ScenarioBuilder::start`] returns as soon as the gateway serves, ready or not (for
    /// tests of readiness itself).
    pub fn without_waiting_for_readiness(mut self) -> ScenarioBuilder {
        self.wait_ready = false;
        self
    }

    /// Starts the core, the backends and the gateway, and returns once the gateway is ready.
    pub async fn start(self) -> Scenario {
        let ScenarioBuilder {
            pki,
            mut core_args,
            policy,
            backends: specs,
            static_services,
            aliases,
            config_yaml,
            source,
            availability_interval,
            gateway_args,
            wait_ready,
        } = self;
        if let Some(policy) = policy {
            let file = pki.write("policy.json", &policy.to_string());
            core_args.extend(["--policy".to_owned(), path_arg(&file)]);
        }
        let core_args: Vec<&str> = core_args.iter().map(String::as_str).collect();
        let core = FixtureCore::start(&core_args).await.unwrap();
        let mut backends = Vec::new();
        for (namespace, group, versions, extra) in &specs {
            let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
            let backend = pki.start_backend(group, versions, &extra).await;
            backends.push((namespace.clone(), backend));
        }
        let backend_of = |namespace: &str| {
            backends
                .iter()
                .find(|(ns, _)| ns == namespace)
                .map(|(_, backend)| backend)
                .unwrap_or_else(|| panic!("no backend in namespace {namespace}"))
        };
        let mut services: Vec<(&str, &str, &FixtureAggregated)> = Vec::new();
        if static_services {
            services.extend(backends.iter().map(|(ns, b)| (ns.as_str(), "api", b)));
        }
        for (namespace, name, backend) in &aliases {
            services.push((namespace, name, backend_of(backend)));
        }
        let config = pki.gateway_config(&services, &config_yaml);
        let mut args = vec![
            "--apiservice-availability-interval".to_owned(),
            availability_interval,
        ];
        let manifests = match source {
            Source::Kube => None,
            Source::Files(files) => {
                let dir = pki.dir().join("apiservices");
                std::fs::create_dir(&dir).unwrap();
                for (file, yaml) in files {
                    std::fs::write(dir.join(file), yaml).unwrap();
                }
                args.extend([
                    "--apiservice-source".to_owned(),
                    "file".to_owned(),
                    "--apiservice-dir".to_owned(),
                    path_arg(&dir),
                ]);
                Some(dir)
            }
        };
        args.extend(gateway_args);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let gateway = if wait_ready {
            pki.start_gateway(&core, &config, &args).await
        } else {
            pki.spawn_gateway(&core, &config, &args).await
        };
        Scenario {
            gateway,
            backends,
            core,
            manifests,
            pki,
        }
    }
}

/// A core and the gateway in front of it alone, as it runs without any of the scenario's
/// certificates: its own generated serving certificate, no client CA, no proxy identity, and
/// no APIServices (`--apiservice-source none`); `gateway_args` come after. Returns as soon as
/// the gateway serves, ready or not.
pub async fn core_and_gateway(gateway_args: &[&str]) -> (FixtureCore, Gateway) {
    let core = FixtureCore::start(&[]).await.expect("fixture core starts");
    let args = ["--apiservice-source", "none"].iter().chain(gateway_args);
    let gateway = Gateway::start(GatewayOptions::new(core.url()).args(args.copied()))
        .await
        .expect("gateway starts");
    (core, gateway)
}
