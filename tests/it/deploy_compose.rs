//! The Traefik deployment around the image: `deploy/traefik/*.yaml` (docker compose), read with
//! python3 + PyYAML (the image itself: `deploy_image.rs`).

use std::collections::BTreeMap;

use serde_json::Value;

use crate::support::deploy::{default_drain_secs, host_port, string_map, yaml_docs};
use crate::support::files::{read_repo, repo_path};

/// The strings of a YAML list (empty when absent).
fn strings(v: &Value) -> Vec<&str> {
    v.as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// Seconds in a compose duration such as `30s`, `1m` or `1m30s`.
fn compose_secs(s: &str) -> f64 {
    let mut total = 0.0;
    let mut number = String::new();
    for c in s.chars() {
        match c {
            '0'..='9' | '.' => number.push(c),
            'h' | 'm' | 's' => {
                let n: f64 = number
                    .parse()
                    .unwrap_or_else(|_| panic!("bad duration {s:?}"));
                total += n * match c {
                    'h' => 3600.0,
                    'm' => 60.0,
                    _ => 1.0,
                };
                number.clear();
            }
            _ => panic!("bad duration {s:?}"),
        }
    }
    assert!(number.is_empty(), "duration {s:?} lacks a unit");
    total
}

// ---------------------------------------------------------------------------------------------
// Traefik (docker compose).

/// The services of a compose file.
fn compose_services(rel: &str) -> serde_json::Map<String, Value> {
    let docs = yaml_docs(rel);
    assert_eq!(docs.len(), 1, "{rel}: one document");
    docs[0]["services"]
        .as_object()
        .unwrap_or_else(|| panic!("{rel}: no services"))
        .clone()
}

/// Checks what every compose holdfast service needs: built from this repository's Dockerfile, a
/// stop grace period longer than the drain, and the Traefik-404 signature left on.
fn check_compose_holdfast(rel: &str, holdfast: &Value) -> BTreeMap<String, String> {
    let dir = repo_path(rel).parent().unwrap().to_path_buf();
    let context = holdfast["build"]["context"]
        .as_str()
        .or_else(|| holdfast["build"].as_str())
        .unwrap_or_else(|| panic!("{rel}: holdfast is built from this repository"));
    assert_eq!(
        dir.join(context).canonicalize().unwrap(),
        repo_path("").canonicalize().unwrap(),
        "{rel}: the build context is the repository root (where the Dockerfile is)"
    );

    let env = string_map(&holdfast["environment"]);
    let drain = env
        .get("HOLDFAST_SHUTDOWN__DRAIN_TIMEOUT_SECS")
        .map(|s| s.parse().unwrap())
        .unwrap_or_else(default_drain_secs);
    let grace = holdfast["stop_grace_period"]
        .as_str()
        .unwrap_or_else(|| panic!("{rel}: holdfast needs stop_grace_period (docker: 10 s)"));
    assert!(
        compose_secs(grace) > drain,
        "{rel}: stop_grace_period {grace} must exceed the {drain} s drain"
    );
    // The recipe's presets, or holdfast's default ones when it sets none: either way
    // Traefik's route-missing 404 is recognised.
    let presets = env
        .get("HOLDFAST_ROUTES__PRESETS")
        .cloned()
        .unwrap_or_else(|| {
            holdfast::config::RawConfig::default()
                .routes
                .presets
                .join(",")
        });
    assert!(presets.contains("traefik-404"), "{rel}: presets {presets}");
    env
}

/// Ports a compose service exposes to the others (`expose`), as numbers.
fn exposed(service: &Value) -> Vec<u16> {
    service["expose"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|p| match p {
                    Value::String(s) => s.parse().unwrap(),
                    other => other.as_u64().unwrap() as u16,
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Traefik's `--entrypoints.NAME.address=:PORT` ports.
fn entrypoint_ports(traefik: &Value) -> Vec<u16> {
    strings(&traefik["command"])
        .into_iter()
        .filter(|a| a.starts_with("--entrypoints."))
        .filter_map(|a| a.split_once(".address=:"))
        .map(|(_, port)| port.parse().unwrap())
        .collect()
}

fn check_traefik_docker_provider(rel: &str, traefik: &Value) {
    let command = strings(&traefik["command"]);
    assert!(
        command.contains(&"--providers.docker=true"),
        "{rel}: Traefik's Docker provider: {command:?}"
    );
    assert!(
        strings(&traefik["volumes"])
            .iter()
            .any(|v| v.starts_with("/var/run/docker.sock:")),
        "{rel}: Traefik reads the Docker socket"
    );
}

#[test]
fn traefik_compose_routes_to_holdfast_which_reaches_the_backend_by_service_name() {
    let rel = "deploy/traefik/compose.yaml";
    let services = compose_services(rel);
    let (traefik, holdfast, backend) = (
        &services["traefik"],
        &services["holdfast"],
        &services["mcp"],
    );
    check_traefik_docker_provider(rel, traefik);

    // Traefik's route is holdfast's (its labels never vanish), on the proxy port.
    let labels = string_map(&holdfast["labels"]);
    assert_eq!(
        labels.get("traefik.enable").map(String::as_str),
        Some("true")
    );
    assert!(
        labels
            .iter()
            .any(|(k, v)| k.starts_with("traefik.http.routers.")
                && k.ends_with(".rule")
                && v.contains("Host(")),
        "{rel}: a Host rule on holdfast: {labels:?}"
    );
    let port: Vec<&String> = labels
        .iter()
        .filter(|(k, _)| k.ends_with(".loadbalancer.server.port"))
        .map(|(_, v)| v)
        .collect();
    assert_eq!(
        port,
        ["8080"],
        "{rel}: Traefik sends to holdfast's proxy port"
    );

    // The backend has no route of its own: only holdfast reaches it, by service name.
    let backend_labels = string_map(&backend["labels"]);
    assert!(
        !backend_labels.keys().any(|k| k.starts_with("traefik.")),
        "{rel}: the backend must not be routed by Traefik: {backend_labels:?}"
    );
    let env = check_compose_holdfast(rel, holdfast);
    assert_eq!(
        env.len(),
        4,
        "{rel}: the upstream, the topology, whom to trust and the session key are all the \
         image needs: {env:?}"
    );
    // The session key, as a compose secret from a file beside the recipe that git ignores: a
    // recreated holdfast container carries the clients' sessions on.
    let key_path = "/run/secrets/holdfast-session-keys";
    assert_eq!(env["HOLDFAST_SESSIONS__KEY_FILE"], key_path, "{rel}");
    assert_eq!(
        holdfast["secrets"],
        serde_json::json!(["holdfast-session-keys"]),
        "{rel}"
    );
    let secret = &yaml_docs(rel)[0]["secrets"]["holdfast-session-keys"];
    assert_eq!(secret["file"], "./holdfast-session-keys", "{rel}");
    assert!(
        read_repo(".gitignore").contains("deploy/traefik/holdfast-session-keys"),
        "the key file is never committed"
    );
    // holdfast reaches the server directly: no router's answer can come back to it.
    assert_eq!(env["HOLDFAST_ROUTES__BEHIND_ROUTER"], "false", "{rel}");
    // Traefik, in front, is trusted: the server sees the real client in X-Forwarded-For. And
    // only Traefik can be: holdfast publishes no port.
    assert!(
        env["HOLDFAST_FORWARDED__TRUSTED_PROXIES"].contains("172.16.0.0/12"),
        "{rel}: Docker's networks are trusted"
    );
    assert!(
        holdfast.get("ports").is_none(),
        "{rel}: holdfast publishes no port"
    );
    let (host, port) = host_port(&env["HOLDFAST_UPSTREAM"]);
    assert_eq!(host, "mcp", "{rel}: the backend's service name");
    assert!(
        exposed(backend).contains(&port),
        "{rel}: the backend exposes {port}"
    );
}

#[test]
fn traefik_compose_with_holdfast_in_front_forwards_to_traefik_with_the_host_kept() {
    let rel = "deploy/traefik/compose.holdfast-in-front.yaml";
    let services = compose_services(rel);
    let (traefik, holdfast, backend) = (
        &services["traefik"],
        &services["holdfast"],
        &services["mcp"],
    );
    check_traefik_docker_provider(rel, traefik);

    // Clients reach holdfast; Traefik is not published.
    assert!(
        strings(&holdfast["ports"])
            .iter()
            .any(|p| p.ends_with(":8080")),
        "{rel}: holdfast publishes its proxy port"
    );
    assert!(
        traefik["ports"].is_null(),
        "{rel}: only holdfast is published"
    );

    // holdfast -> Traefik's entrypoint, Host preserved so Traefik's Host rules match.
    let env = check_compose_holdfast(rel, holdfast);
    let (host, port) = host_port(&env["HOLDFAST_UPSTREAM"]);
    assert_eq!(host, "traefik");
    assert!(
        entrypoint_ports(traefik).contains(&port),
        "{rel}: Traefik listens on {port}"
    );
    assert_ne!(
        env.get("HOLDFAST_CLIENT__HOST_HEADER").map(String::as_str),
        Some("upstream"),
        "{rel}: Traefik routes by the client's Host"
    );
    // Traefik sits between holdfast and the server: its route-missing 404 must be recognised.
    assert_eq!(
        env.get("HOLDFAST_ROUTES__BEHIND_ROUTER")
            .map(String::as_str),
        Some("true"),
        "{rel}"
    );

    // The backend's labels make the route that vanishes with it.
    let labels = string_map(&backend["labels"]);
    assert_eq!(
        labels.get("traefik.enable").map(String::as_str),
        Some("true")
    );
    let port: Vec<u16> = labels
        .iter()
        .filter(|(k, _)| k.ends_with(".loadbalancer.server.port"))
        .map(|(_, v)| v.parse().unwrap())
        .collect();
    assert_eq!(port.len(), 1, "{rel}: {labels:?}");
    assert!(exposed(backend).contains(&port[0]));
}
