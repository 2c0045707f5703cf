//! The Kubernetes deployment around the image: `deploy/kubernetes/*.yaml` (the image itself:
//! `deploy_image.rs`).
//!
//! The YAML is read with python3 + PyYAML; the manifests are checked against the Kubernetes
//! schemas, offline, by the `kubernetes-validate` PyPI package (it ships them), and the
//! Prometheus Operator's PodMonitor (a CRD the validator has no schema for) field by field here.
//! `.ci/run` installs both Python packages; a missing one fails the test, naming the install
//! command, rather than skipping it.

use std::collections::BTreeMap;
use std::process::Command;

use serde_json::Value;

use crate::deploy_image::{env_of, stages};
use crate::support::deploy::{
    default_drain_secs, host_port, python_failed, string_map, toml_secs, yaml_docs,
};
use crate::support::files::{read_repo, repo_path, TempDir};
use crate::support::process::{finish, holdfast};

/// The oldest Kubernetes with native sidecars on by default (beta in 1.29, GA in 1.33).
const OLDEST_KUBERNETES: &str = "1.29";

const K8S: &str = "deploy/kubernetes/holdfast.yaml";
const GATEWAY: &str = "deploy/kubernetes/holdfast-gateway.yaml";
const PODMONITOR: &str = "deploy/kubernetes/monitoring/podmonitor.yaml";

/// The one document of `kind` in `docs`.
fn kind<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    let found: Vec<&Value> = docs.iter().filter(|d| d["kind"] == kind).collect();
    assert_eq!(found.len(), 1, "one {kind} in {K8S}");
    found[0]
}

/// The document of `kind` named `name` in `docs`.
fn named<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("a {kind} named {name}"))
}

/// The pod spec of the Deployment and its holdfast sidecar.
fn pod_and_sidecar(docs: &[Value]) -> (&Value, &Value) {
    let pod = &kind(docs, "Deployment")["spec"]["template"]["spec"];
    let sidecar = pod["initContainers"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["name"] == "holdfast"))
        .expect("holdfast is an initContainers entry (a native sidecar)");
    (pod, sidecar)
}

/// A manifest's configuration: the file kustomize makes its ConfigMap from, and that
/// ConfigMap's name (the kustomization's generator entry for it; the gateway's is the commented
/// alternative).
fn config_of(manifest: &str) -> (&'static str, &'static str) {
    match manifest {
        K8S => ("deploy/kubernetes/holdfast.toml", "mcp-server-holdfast"),
        GATEWAY => (
            "deploy/kubernetes/holdfast-gateway.toml",
            "mcp-holdfast-gateway",
        ),
        other => panic!("no configuration known for {other}"),
    }
}

/// The holdfast.toml a manifest's pods read.
fn configmap_toml(manifest: &str) -> String {
    read_repo(config_of(manifest).0)
}

/// A container port, by number or by the name of one of `container`'s ports.
fn resolve_port(container: &Value, port: &Value) -> u64 {
    match port {
        Value::Number(n) => n.as_u64().unwrap(),
        Value::String(name) => container["ports"]
            .as_array()
            .and_then(|ports| ports.iter().find(|p| p["name"] == *name))
            .and_then(|p| p["containerPort"].as_u64())
            .unwrap_or_else(|| panic!("no port named {name}")),
        other => panic!("bad port {other}"),
    }
}

#[test]
fn kubernetes_manifests_pass_the_schema_validator() {
    // The oldest Kubernetes with native sidecars, and the newest the validator knows. Strict:
    // an unknown field (a typo) is an error, not silently dropped.
    for (file, version) in [K8S, GATEWAY]
        .into_iter()
        .flat_map(|f| [(f, Some(OLDEST_KUBERNETES)), (f, None)])
    {
        let documents = yaml_docs(file).len();
        let mut cmd = Command::new("python3");
        cmd.args(["-m", "kubernetes_validate", "--strict"]);
        if let Some(v) = version {
            cmd.args(["--kubernetes-version", v]);
        }
        cmd.arg(repo_path(file));
        let out = finish(cmd, "python3 -m kubernetes_validate");
        if !out.status.success() {
            python_failed(&out, "kubernetes-validate");
        }
        let passed = out.stdout.matches(" passed for resource ").count();
        assert_eq!(
            passed, documents,
            "every document validated (a kind without a schema is only a warning): {out:?}"
        );
    }
}

/// Each manifest's configuration is a file kustomize makes the ConfigMap it mounts from, with
/// the name hash on: an edited file rolls the pods when applied (a ConfigMap edited in place
/// would change nothing until they restarted). No manifest carries a ConfigMap of its own, which
/// kustomize would not hash.
#[test]
fn the_kustomization_makes_each_manifests_configmap_from_its_file_hashed() {
    let text = read_repo("deploy/kubernetes/kustomization.yaml");
    let kustomization = &yaml_docs("deploy/kubernetes/kustomization.yaml")[0];
    let generators = kustomization["configMapGenerator"]
        .as_array()
        .expect("a configMapGenerator");
    let sidecar = generators
        .iter()
        .find(|g| g["name"] == config_of(K8S).1)
        .expect("the sidecar's ConfigMap is generated");
    assert_eq!(sidecar["files"], serde_json::json!(["holdfast.toml"]));
    assert!(
        !text.contains("disableNameSuffixHash"),
        "the name hash is what rolls the pods"
    );
    // The gateway's, the commented alternative, names its own file.
    assert!(
        text.contains("  # - name: mcp-holdfast-gateway\n  #   files:\n  #     - holdfast.toml=holdfast-gateway.toml"),
        "{text}"
    );
    for manifest in [K8S, GATEWAY] {
        let docs = yaml_docs(manifest);
        assert!(
            docs.iter().all(|d| d["kind"] != "ConfigMap"),
            "{manifest} carries a ConfigMap kustomize would not hash"
        );
        assert!(repo_path(config_of(manifest).0).is_file());
    }
}

#[test]
fn the_kustomization_names_where_the_image_lives_for_every_manifest() {
    let kustomization = &yaml_docs("deploy/kubernetes/kustomization.yaml")[0];
    assert_eq!(kustomization["kind"], "Kustomization");
    let resources: Vec<&str> = kustomization["resources"]
        .as_array()
        .expect("resources")
        .iter()
        .map(|r| r.as_str().unwrap())
        .collect();
    assert!(resources.contains(&"holdfast.yaml"), "{resources:?}");
    // The base applies without the Prometheus Operator's CRDs: its PodMonitor is an optional
    // component.
    assert!(
        !resources.iter().any(|r| r.contains("podmonitor")),
        "{resources:?}"
    );
    let component = &yaml_docs("deploy/kubernetes/monitoring/kustomization.yaml")[0];
    assert_eq!(component["kind"], "Component");
    assert_eq!(
        component["resources"],
        serde_json::json!(["podmonitor.yaml"])
    );
    assert!(read_repo("deploy/kubernetes/kustomization.yaml").contains("#   - monitoring"));
    for r in &resources {
        assert!(
            repo_path(&format!("deploy/kubernetes/{r}")).is_file(),
            "{r} is not in deploy/kubernetes"
        );
    }
    let images = kustomization["images"].as_array().expect("images");
    let image = images
        .iter()
        .find(|i| i["name"] == "holdfast")
        .expect("an images entry for holdfast");
    let new_name = image["newName"].as_str().unwrap();
    assert!(new_name.contains('/'), "a registry path: {new_name}");
    assert!(image["newTag"].is_string(), "a tag, quoted");
    // Both manifests name exactly the image the override replaces (no registry, no tag): a
    // copied manifest cannot pull a `holdfast:latest` that no registry serves by accident.
    let docs = yaml_docs(K8S);
    assert_eq!(pod_and_sidecar(&docs).1["image"], "holdfast", "{K8S}");
    let docs = yaml_docs(GATEWAY);
    let pod = &kind(&docs, "Deployment")["spec"]["template"]["spec"];
    assert_eq!(pod["containers"][0]["image"], "holdfast", "{GATEWAY}");
}

#[test]
fn kubernetes_deployment_runs_holdfast_as_a_hardened_native_sidecar() {
    let docs = yaml_docs(K8S);
    let (pod, sidecar) = pod_and_sidecar(&docs);

    assert_eq!(sidecar["restartPolicy"], "Always", "a native sidecar");
    assert_eq!(pod["enableServiceLinks"], false);
    let app = pod["containers"]
        .as_array()
        .and_then(|c| c.first())
        .expect("the MCP server container");

    // Probes: on the admin port; readiness is /readyz (503 while draining), the rest /healthz.
    for (probe, path) in [
        ("startupProbe", "/healthz"),
        ("readinessProbe", "/readyz"),
        ("livenessProbe", "/healthz"),
    ] {
        let get = &sidecar[probe]["httpGet"];
        assert_eq!(get["path"], path, "{probe}");
        assert_eq!(
            resolve_port(sidecar, &get["port"]),
            9362,
            "{probe} on the admin port"
        );
    }
    assert_eq!(resolve_port(sidecar, &"http".into()), 8080);
    assert_eq!(resolve_port(sidecar, &"admin".into()), 9362);

    // holdfast's container is hardened on its own; nothing at the pod level hardens the user's
    // container too (runAsNonRoot or a read-only root breaks many Node and Python images).
    let sc = &sidecar["securityContext"];
    assert_eq!(sc["runAsNonRoot"], true);
    assert!(sc["runAsUser"].as_u64().is_some_and(|u| u != 0));
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["capabilities"]["drop"], serde_json::json!(["ALL"]));
    assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault");
    assert!(
        pod["securityContext"].is_null(),
        "no pod-level securityContext"
    );
    assert!(
        app["securityContext"].is_null(),
        "the user's container is theirs to harden"
    );
    // The MCP container is ready only once it accepts connections.
    assert_eq!(
        resolve_port(app, &app["readinessProbe"]["tcpSocket"]["port"]),
        8000
    );

    // Resources.
    for (kind, what) in [
        ("requests", "cpu"),
        ("requests", "memory"),
        ("limits", "memory"),
    ] {
        assert!(
            sidecar["resources"][kind][what].is_string(),
            "resources.{kind}.{what}"
        );
    }

    // The configuration: HOLDFAST_CONFIG -> the mounted ConfigMap's holdfast.toml.
    let env: BTreeMap<&str, &str> = sidecar["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["name"].as_str().unwrap(),
                e["value"].as_str().unwrap_or(""),
            )
        })
        .collect();
    let config_path = env["HOLDFAST_CONFIG"];
    let volume = volume_holding(pod, sidecar, config_path, "holdfast.toml")
        .expect("HOLDFAST_CONFIG is holdfast.toml in a mounted volume");
    assert_eq!(volume["configMap"]["name"], config_of(K8S).1);

    // holdfast forwards to the MCP container on localhost.
    let config: toml::Value = toml::from_str(&configmap_toml(K8S)).unwrap();
    let upstream = config["upstream"].as_str().expect("upstream is set");
    let (host, port) = host_port(upstream);
    assert!(host == "127.0.0.1" || host == "localhost", "{upstream}");
    assert_eq!(resolve_port(app, &"mcp".into()), u64::from(port));

    // The grace period covers the drain (sidecars stop after the main containers).
    let drain = config
        .get("shutdown")
        .and_then(|s| s.get("drain_timeout_secs"))
        .map(toml_secs)
        .unwrap_or_else(default_drain_secs);
    let grace = pod["terminationGracePeriodSeconds"].as_f64().unwrap();
    assert!(
        grace > drain,
        "terminationGracePeriodSeconds {grace} > drain {drain}"
    );

    // The Service sends to holdfast, by number (a sidecar's named port is not resolved by a
    // Service before Kubernetes 1.32).
    let service = named(&docs, "Service", "mcp-server");
    let selector = string_map(&service["spec"]["selector"]);
    let labels = string_map(&kind(&docs, "Deployment")["spec"]["template"]["metadata"]["labels"]);
    assert!(
        selector.iter().all(|(k, v)| labels.get(k) == Some(v)),
        "{selector:?}"
    );
    let ports = service["spec"]["ports"].as_array().unwrap();
    assert!(
        ports.iter().all(|p| p["targetPort"] == 8080),
        "the Service targets holdfast's 8080: {ports:?}"
    );
}

#[test]
fn kubernetes_configmaps_are_accepted_by_check_config() {
    for file in [K8S, GATEWAY] {
        configmap_is_accepted_by_check_config(file);
    }
}

fn configmap_is_accepted_by_check_config(file: &str) {
    let toml_text = configmap_toml(file);
    let dir = TempDir::new("deploy-container");
    let path = dir.write("holdfast.toml", &toml_text);

    // As in the pod: the image's ENV, plus HOLDFAST_CONFIG.
    let stages = stages();
    // The session keys come from the Secret, mounted where the ConfigMap says
    // ([`session_keys_come_from_the_recipes_secret`]); here a real key stands in for its
    // placeholder.
    let keys = dir.write(
        "session-keys",
        &format!("{}\n", "0123456789abcdef".repeat(4)),
    );
    let mut cmd = holdfast(&["check-config"]);
    cmd.envs(env_of(stages.last().unwrap()))
        .env("HOLDFAST_CONFIG", &path)
        .env("HOLDFAST_SESSIONS__KEY_FILE", &keys);
    let out = finish(cmd, "holdfast check-config");
    assert!(
        out.status.success(),
        "{file}: the ConfigMap's holdfast.toml: {out:?}"
    );

    let printed: toml::Value = toml::from_str(&out.stdout).unwrap();
    let ours: toml::Value = toml::from_str(&toml_text).unwrap();
    assert_eq!(printed["upstream"], ours["upstream"]);
    assert_eq!(
        printed["admin"].as_str(),
        Some("0.0.0.0:9362"),
        "probes and Prometheus reach the admin listener"
    );
    // No router sits between holdfast and a sidecar's (or a Service's) server.
    assert_eq!(
        printed["routes"]["behind_router"].as_bool(),
        Some(false),
        "{file}"
    );
}

/// The volume of `pod` that `container` mounts so that `path` is its entry `entry`.
fn volume_holding<'a>(
    pod: &'a Value,
    container: &Value,
    path: &str,
    entry: &str,
) -> Option<&'a Value> {
    let mount = container["volumeMounts"].as_array()?.iter().find(|m| {
        m["mountPath"]
            .as_str()
            .and_then(|dir| path.strip_prefix(dir))
            .and_then(|rest| rest.strip_prefix('/'))
            == Some(entry)
    })?;
    pod["volumes"]
        .as_array()?
        .iter()
        .find(|v| v["name"] == mount["name"])
}

/// Every replica of both recipes reads the same session keys: the ConfigMap's
/// `sessions.key_file` is the `session-keys` entry of a Secret the recipe ships, mounted into
/// holdfast; its placeholder is refused until a real key replaces it.
#[test]
fn session_keys_come_from_the_recipes_secret() {
    for file in [K8S, GATEWAY] {
        let docs = yaml_docs(file);
        let config: toml::Value = toml::from_str(&configmap_toml(file)).unwrap();
        let key_file = config["sessions"]["key_file"]
            .as_str()
            .unwrap_or_else(|| panic!("{file}: sessions.key_file"));
        let deployment = kind(&docs, "Deployment");
        let pod = &deployment["spec"]["template"]["spec"];
        let holdfast = pod["initContainers"]
            .as_array()
            .into_iter()
            .chain(pod["containers"].as_array())
            .flatten()
            .find(|c| c["name"] == "holdfast")
            .expect("the holdfast container");
        let volume = volume_holding(pod, holdfast, key_file, "session-keys")
            .unwrap_or_else(|| panic!("{file}: {key_file} is session-keys in a mounted volume"));
        let secret = kind(&docs, "Secret");
        assert_eq!(
            volume["secret"]["secretName"], secret["metadata"]["name"],
            "{file}"
        );
        let placeholder = secret["stringData"]["session-keys"].as_str().unwrap();
        let refused = holdfast::config::parse_session_keys(placeholder).unwrap_err();
        assert!(refused.contains("line 1"), "{file}: {refused}");
        assert!(
            deployment["spec"]["replicas"].as_u64().unwrap() >= 2,
            "{file}: several replicas"
        );
    }
}

#[test]
fn podmonitor_scrapes_the_holdfast_admin_port() {
    // A CRD: kubernetes-validate has no schema for it, so its required fields are checked here.
    let docs = yaml_docs(PODMONITOR);
    assert_eq!(docs.len(), 1);
    let monitor = &docs[0];
    assert_eq!(monitor["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(monitor["kind"], "PodMonitor");
    assert!(monitor["metadata"]["name"]
        .as_str()
        .is_some_and(|n| !n.is_empty()));

    let k8s = yaml_docs(K8S);
    let labels = string_map(&kind(&k8s, "Deployment")["spec"]["template"]["metadata"]["labels"]);
    let selector = string_map(&monitor["spec"]["selector"]["matchLabels"]);
    assert!(!selector.is_empty(), "spec.selector.matchLabels");
    assert!(
        selector.iter().all(|(k, v)| labels.get(k) == Some(v)),
        "the selector matches the pods: {selector:?} vs {labels:?}"
    );

    let (_, sidecar) = pod_and_sidecar(&k8s);
    let endpoints = monitor["spec"]["podMetricsEndpoints"]
        .as_array()
        .expect("spec.podMetricsEndpoints");
    assert_eq!(endpoints.len(), 1);
    let endpoint = &endpoints[0];
    assert_eq!(resolve_port(sidecar, &endpoint["port"]), 9362);
    assert_eq!(endpoint["path"], "/metrics");
}

#[test]
fn kubernetes_gateway_runs_hardened_replicas_in_front_of_the_mcp_service() {
    let docs = yaml_docs(GATEWAY);
    let deployment = kind(&docs, "Deployment");
    assert!(deployment["spec"]["replicas"].as_u64().unwrap() >= 2);
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["enableServiceLinks"], false);
    let container = &pod["containers"][0];
    assert_eq!(container["name"], "holdfast");
    let sc = &container["securityContext"];
    assert_eq!(sc["runAsNonRoot"], true);
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["capabilities"]["drop"], serde_json::json!(["ALL"]));
    assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault");
    for (probe, path) in [("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")] {
        let get = &container[probe]["httpGet"];
        assert_eq!(get["path"], path, "{probe}");
        assert_eq!(
            resolve_port(container, &get["port"]),
            9362,
            "{probe} on the admin port"
        );
    }

    // holdfast reaches the MCP server through its Service, by name: a missing pod is a refused
    // connection to it, which holdfast holds.
    let config: toml::Value = toml::from_str(&configmap_toml(GATEWAY)).unwrap();
    let upstream = config["upstream"].as_str().unwrap();
    let (host, _) = host_port(upstream);
    assert!(
        !host.starts_with("127.") && host != "localhost",
        "the gateway forwards to a Service, not to its own pod: {upstream}"
    );
    // Not ready at once but still accepting, while the Service's endpoints drop the pod; the
    // accept grace and the drain together fit the grace period.
    let accept = toml_secs(&config["shutdown"]["accept_grace_secs"]);
    assert!(accept >= 2.0, "shutdown.accept_grace_secs {accept}");
    let drain = toml_secs(&config["shutdown"]["drain_timeout_secs"]);
    let grace = pod["terminationGracePeriodSeconds"].as_f64().unwrap();
    assert!(
        accept + drain < grace,
        "the accept grace and the drain ({accept} + {drain} s) fit the grace period ({grace} s)"
    );

    let labels = &deployment["spec"]["template"]["metadata"]["labels"];
    let service = named(&docs, "Service", "mcp");
    assert_eq!(&service["spec"]["selector"], labels);
    let target = &service["spec"]["ports"][0]["targetPort"];
    assert_eq!(resolve_port(container, target), 8080);
    // Any replica carries any session (a shared key): no affinity.
    assert!(service["spec"]["sessionAffinity"].is_null());
    let budget = kind(&docs, "PodDisruptionBudget");
    assert_eq!(&budget["spec"]["selector"]["matchLabels"], labels);
}

/// The sidecar recipe orders a pod's shutdown so that no call meets a server going away: the
/// MCP container sleeps in its preStop while the pod leaves the endpoints, then stops; holdfast,
/// a native sidecar, stops after it, with an accept grace; all of it within the grace period.
/// A disruption budget and a spread over nodes keep one replica serving through a node drain.
#[test]
fn the_sidecar_recipe_orders_a_pods_shutdown_and_keeps_a_replica_serving() {
    let docs = yaml_docs(K8S);
    let (pod, _) = pod_and_sidecar(&docs);
    let app = &pod["containers"][0];
    let sleep = app["lifecycle"]["preStop"]["sleep"]["seconds"]
        .as_f64()
        .expect("the MCP container sleeps in its preStop");
    // Endpoints leave kube-proxy, ingress controllers and meshes 0.5-2 s after the pod
    // turns Terminating.
    assert!(sleep >= 5.0, "a preStop sleep of {sleep} s");
    let config: toml::Value = toml::from_str(&configmap_toml(K8S)).unwrap();
    let shutdown = &config["shutdown"];
    let grace = shutdown
        .get("accept_grace_secs")
        .map(toml_secs)
        .expect("an accept grace");
    assert!(grace > 0.0);
    let drain = shutdown
        .get("drain_timeout_secs")
        .map(toml_secs)
        .unwrap_or_else(default_drain_secs);
    let period = pod["terminationGracePeriodSeconds"].as_f64().unwrap();
    assert!(
        period > sleep + grace + drain,
        "terminationGracePeriodSeconds {period} covers the sleep {sleep}, the grace {grace} and \
         the drain {drain}"
    );

    let budget = kind(&docs, "PodDisruptionBudget");
    assert_eq!(budget["spec"]["minAvailable"], 1);
    let labels = string_map(&kind(&docs, "Deployment")["spec"]["template"]["metadata"]["labels"]);
    let selects = string_map(&budget["spec"]["selector"]["matchLabels"]);
    assert!(selects.iter().all(|(k, v)| labels.get(k) == Some(v)));
    let spread = pod["topologySpreadConstraints"]
        .as_array()
        .expect("a topology spread");
    assert!(spread
        .iter()
        .any(|c| c["topologyKey"] == "kubernetes.io/hostname"));
}

/// Each recipe names its replicas to each other (`peers.dns`) by a headless Service in the same
/// manifest that selects the recipe's own pods on holdfast's proxy port: a pod that is shutting
/// down hands what it holds to a ready one (tests/it/rollout.rs is the behaviour).
#[test]
fn each_recipe_names_its_replicas_as_peers_by_a_headless_service() {
    for manifest in [K8S, GATEWAY] {
        let docs = yaml_docs(manifest);
        let config: toml::Value = toml::from_str(&configmap_toml(manifest)).unwrap();
        let dns = config["peers"]["dns"]
            .as_str()
            .unwrap_or_else(|| panic!("{manifest}: peers.dns is set"));
        let (host, port) = dns.rsplit_once(':').expect("peers.dns is host:port");
        let port: u64 = port.parse().expect("peers.dns's port is a number");
        let peers = named(&docs, "Service", host);
        // Headless: the name resolves to the pods themselves (ready ones only, the default),
        // not to a virtual IP that might pick the terminating pod again.
        assert_eq!(peers["spec"]["clusterIP"], "None", "{manifest}: {host}");
        assert!(peers["spec"]["publishNotReadyAddresses"] != true);
        let deployment = kind(&docs, "Deployment");
        let labels = string_map(&deployment["spec"]["template"]["metadata"]["labels"]);
        let selector = string_map(&peers["spec"]["selector"]);
        assert!(
            !selector.is_empty() && selector.iter().all(|(k, v)| labels.get(k) == Some(v)),
            "{manifest}: {host} selects the recipe's pods: {selector:?}"
        );
        // The port named in peers.dns is holdfast's proxy port, reached on the pod itself.
        let pod = &deployment["spec"]["template"]["spec"];
        let holdfast = pod["initContainers"]
            .as_array()
            .into_iter()
            .chain(pod["containers"].as_array())
            .flatten()
            .find(|c| c["name"] == "holdfast")
            .expect("a holdfast container");
        let service_port = peers["spec"]["ports"]
            .as_array()
            .and_then(|ports| ports.iter().find(|p| p["port"] == port))
            .unwrap_or_else(|| panic!("{manifest}: {host} has port {port}"));
        assert_eq!(
            resolve_port(holdfast, &service_port["targetPort"]),
            8080,
            "{manifest}: the peers' port is holdfast's proxy port"
        );
        // A headless Service's port is the pod's: the one in peers.dns is the one connected to.
        assert_eq!(port, 8080, "{manifest}: {dns}");
    }
}
