//! The image: `Dockerfile`, `.dockerignore` and the image's own config file.
//!
//! Docker cannot run here, so the Dockerfile is read for what the image must have (non-root user,
//! healthcheck, ports, admin address, labels) and its build command is compared with the one
//! `.ci/run` runs; the image's environment alone is then shown to start the real binary and pass
//! its HEALTHCHECK.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::support::files::{read_repo, repo_path, TempDir};
use crate::support::http::Reserved;
use crate::support::process::{finish, holdfast, Running};

/// One Dockerfile instruction: its keyword in capitals and its arguments, with continuation lines
/// joined and comment lines dropped (as Docker does).
#[derive(Debug)]
pub(crate) struct Instruction {
    keyword: String,
    args: String,
}

fn instructions(text: &str) -> Vec<Instruction> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some(body) = line.strip_suffix('\\') {
            current.push_str(body);
            current.push(' ');
            continue;
        }
        current.push_str(line);
        let whole = current.trim();
        let (keyword, args) = whole.split_once(char::is_whitespace).unwrap_or((whole, ""));
        out.push(Instruction {
            keyword: keyword.to_ascii_uppercase(),
            args: args.split_whitespace().collect::<Vec<_>>().join(" "),
        });
        current.clear();
    }
    assert!(current.is_empty(), "Dockerfile ends inside a continuation");
    out
}

/// The Dockerfile's stages, each starting with its FROM.
pub(crate) fn stages() -> Vec<Vec<Instruction>> {
    let mut stages: Vec<Vec<Instruction>> = Vec::new();
    for i in instructions(&read_repo("Dockerfile")) {
        match (i.keyword.as_str(), stages.last_mut()) {
            ("FROM", _) => stages.push(vec![i]),
            (_, Some(stage)) => stage.push(i),
            // ARG before the first FROM.
            (_, None) => {}
        }
    }
    assert!(stages.len() >= 2, "a multi-stage build: {stages:?}");
    stages
}

/// The arguments of every `keyword` instruction in a stage.
fn args_of<'a>(stage: &'a [Instruction], keyword: &str) -> Vec<&'a str> {
    stage
        .iter()
        .filter(|i| i.keyword == keyword)
        .map(|i| i.args.as_str())
        .collect()
}

/// The stage's ENV, in both forms (`ENV K=V K2=V2` and the legacy `ENV K V`).
pub(crate) fn env_of(stage: &[Instruction]) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    for args in args_of(stage, "ENV") {
        if args
            .split_whitespace()
            .next()
            .is_some_and(|w| w.contains('='))
        {
            for pair in args.split_whitespace() {
                let (k, v) = pair.split_once('=').unwrap_or_else(|| panic!("ENV {args}"));
                env.insert(k.to_string(), v.trim_matches('"').to_string());
            }
        } else {
            let (k, v) = args.split_once(' ').unwrap_or_else(|| panic!("ENV {args}"));
            env.insert(k.to_string(), v.trim_matches('"').to_string());
        }
    }
    env
}

/// A JSON-array (exec form) argument list.
fn exec_form(args: &str) -> Vec<String> {
    serde_json::from_str(args).unwrap_or_else(|e| {
        panic!("not the exec form (a JSON array; there is no shell) ({e}): {args}")
    })
}

/// Every shell command in `text` that runs `cargo build`, with its environment assignments
/// (`RUSTFLAGS=...`) and whitespace normalized; a RUN's own flags (`--mount=...`) and comment
/// lines are left out.
fn cargo_builds(text: &str) -> Vec<String> {
    text.lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .flat_map(|l| l.split(['&', '|', ';']))
        .filter(|command| command.contains("cargo build"))
        .map(|command| {
            command
                .split_whitespace()
                .skip_while(|w| {
                    ["--mount=", "--network=", "--security="]
                        .iter()
                        .any(|flag| w.starts_with(flag))
                })
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect()
}

/// Where `cargo build` puts the release binary: `target/[TRIPLE/]release/holdfast`, the triple
/// as the shell writes it (`"$(uname -m)-unknown-linux-gnu"` stays unexpanded).
fn built_binary(command: &str) -> String {
    let Some((_, rest)) = command.split_once("--target ") else {
        return "target/release/holdfast".to_string();
    };
    let triple = match rest.strip_prefix('"') {
        Some(quoted) => quoted.split('"').next().unwrap(),
        None => rest.split(' ').next().unwrap(),
    };
    format!("target/{triple}/release/holdfast")
}

/// Where the final stage installs the binary, from `COPY --from=... SRC DEST`.
fn installed_binary(last: &[Instruction]) -> String {
    let copies = args_of(last, "COPY");
    let copy = copies
        .iter()
        .find(|a| a.starts_with("--from="))
        .unwrap_or_else(|| panic!("the final stage copies the binary from the build: {last:?}"));
    let dest = copy.split_whitespace().last().unwrap();
    assert!(dest.ends_with("/holdfast"), "COPY {copy}");
    dest.to_string()
}

#[test]
fn dockerfile_final_stage_is_minimal_non_root_with_healthcheck_ports_and_admin() {
    let stages = stages();
    let last = stages.last().unwrap();

    let base = &last[0].args;
    assert!(
        base.starts_with("gcr.io/distroless/") || base == "scratch",
        "a minimal final image (distroless or scratch): FROM {base}"
    );

    // USER: set, numeric (Kubernetes' runAsNonRoot can only verify a number) and not root.
    let users = args_of(last, "USER");
    let user = users.last().expect("the final stage sets USER");
    let uid = user.split(':').next().unwrap();
    let uid: u32 = uid
        .parse()
        .unwrap_or_else(|_| panic!("USER {user}: use a numeric uid"));
    assert_ne!(uid, 0, "USER {user} is root");

    // EXPOSE: the proxy and the admin port.
    let exposed: Vec<&str> = args_of(last, "EXPOSE")
        .into_iter()
        .flat_map(str::split_whitespace)
        .map(|p| p.trim_end_matches("/tcp"))
        .collect();
    for port in ["8080", "9362"] {
        assert!(exposed.contains(&port), "EXPOSE {port}: {exposed:?}");
    }

    // The admin listener must be reachable from outside the container (probes, Prometheus):
    // the image's own config file says so, not an ENV that would beat a file the user mounts.
    let env = env_of(last);
    assert!(
        !env.contains_key("HOLDFAST_ADMIN"),
        "no ENV HOLDFAST_ADMIN: it would override a mounted file's admin"
    );
    assert_eq!(image_config()["admin"].as_str(), Some("0.0.0.0:9362"));
    assert!(
        !env.contains_key("HOLDFAST_UPSTREAM"),
        "the upstream is the user's to set"
    );

    // ENTRYPOINT and HEALTHCHECK both run the installed binary, in exec form (no shell).
    let binary = installed_binary(last);
    let entrypoint = exec_form(args_of(last, "ENTRYPOINT").last().expect("ENTRYPOINT"));
    assert_eq!(entrypoint, std::slice::from_ref(&binary));
    let healthcheck = *args_of(last, "HEALTHCHECK").last().expect("HEALTHCHECK");
    let (_, cmd) = healthcheck
        .split_once("CMD ")
        .unwrap_or_else(|| panic!("HEALTHCHECK {healthcheck}"));
    assert_eq!(exec_form(cmd), [binary, "healthcheck".to_string()]);
    // A restarted container becomes healthy (and routable by Traefik) within about a second,
    // not after the 10 s interval.
    assert!(
        healthcheck.contains("--start-interval=1s"),
        "HEALTHCHECK {healthcheck}"
    );
}

#[test]
fn dockerfile_build_command_is_the_one_ci_runs() {
    let stages = stages();
    let docker: Vec<String> = stages
        .iter()
        .flat_map(|stage| args_of(stage, "RUN"))
        .flat_map(cargo_builds)
        .collect();
    let ci = cargo_builds(&read_repo(".ci/run"));
    assert_eq!(
        docker.len(),
        1,
        "one cargo build in the Dockerfile: {docker:?}"
    );
    assert_eq!(ci.len(), 1, "one cargo build in .ci/run: {ci:?}");
    assert_eq!(docker[0], ci[0], "the Dockerfile builds what CI builds");
    for flag in ["--release", "--locked"] {
        assert!(
            docker[0].split(' ').any(|w| w == flag),
            "{flag}: {}",
            docker[0]
        );
    }
    // What the build stage copies out is what that command produces.
    let binary = built_binary(&docker[0]);
    assert!(
        stages
            .iter()
            .flat_map(|stage| args_of(stage, "RUN"))
            .any(|run| run.contains(&binary)),
        "the build stage takes {binary}"
    );
}

/// A stage's `LABEL key="value" ...` pairs (values may hold spaces inside their quotes).
fn labels_of(stage: &[Instruction]) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    for args in args_of(stage, "LABEL") {
        let mut rest = args.trim();
        while let Some((key, after)) = rest.split_once('=') {
            let (value, tail) = match after.strip_prefix('"') {
                Some(quoted) => quoted.split_once('"').expect("a closing quote"),
                None => after.split_once(' ').unwrap_or((after, "")),
            };
            labels.insert(key.trim().to_owned(), value.to_owned());
            rest = tail.trim();
        }
    }
    labels
}

#[test]
fn the_image_carries_oci_labels_and_the_commit_it_was_built_from() {
    let stages = stages();
    let labels = labels_of(stages.last().unwrap());
    let label = |key: &str| {
        labels
            .get(&format!("org.opencontainers.image.{key}"))
            .unwrap_or_else(|| panic!("LABEL org.opencontainers.image.{key}: {labels:?}"))
            .clone()
    };
    assert_eq!(label("title"), "holdfast");
    assert_eq!(label("version"), env!("CARGO_PKG_VERSION"));
    assert_eq!(label("licenses"), env!("CARGO_PKG_LICENSE"));
    assert_eq!(label("description"), env!("CARGO_PKG_DESCRIPTION"));
    assert_eq!(label("revision"), "${HOLDFAST_COMMIT}");
    // The build argument reaches build.rs (no .git in the context) and the last stage's label.
    for stage in [&stages[0], stages.last().unwrap()] {
        assert!(
            args_of(stage, "ARG").contains(&"HOLDFAST_COMMIT"),
            "ARG HOLDFAST_COMMIT in every stage that uses it"
        );
    }
    assert_eq!(
        env_of(&stages[0])
            .get("HOLDFAST_COMMIT")
            .map(String::as_str),
        Some("${HOLDFAST_COMMIT}")
    );
    assert!(read_repo("build.rs").contains("std::env::var(\"HOLDFAST_COMMIT\")"));
}

/// Whether `path` (relative to the repository) is sent to Docker as part of the build context:
/// `.dockerignore` leaves it out unless a later `!` line lets it back in (the last matching line
/// decides, as Docker reads the file).
fn in_build_context(path: &str) -> bool {
    let ignore = read_repo(".dockerignore");
    let covers =
        |pattern: &str, path: &str| path == pattern || path.starts_with(&format!("{pattern}/"));
    ignore
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .rev()
        .find_map(|line| match line.strip_prefix('!') {
            Some(back) if covers(back, path) => Some(true),
            None if covers(line, path) => Some(false),
            _ => None,
        })
        .unwrap_or(true)
}

/// Every file a stage copies from the build context is in it: not left out by
/// `.dockerignore` (or let back in by a `!` line).
#[test]
fn the_build_context_holds_every_file_the_dockerfile_copies() {
    assert!(
        !in_build_context("target/release/holdfast"),
        "the rule itself"
    );
    for stage in stages() {
        for copy in args_of(&stage, "COPY") {
            if copy.starts_with("--from") {
                continue;
            }
            let words: Vec<&str> = copy.split_whitespace().collect();
            for source in &words[..words.len() - 1] {
                if *source != "." {
                    assert!(
                        in_build_context(source),
                        "COPY {source}: left out by .dockerignore"
                    );
                }
            }
        }
    }
}

/// Where the release build's profile lies (`benches/pgo.sh` makes it), and what made it.
const PROFILE: &str = "pgo/holdfast.profdata";
const PROFILE_MADE_WITH: &str = "pgo/made-with";

/// The release binary, CI's and the image's, is built with the committed profile, which is in
/// the build context, is an indexed LLVM profile, and was made by the Rust the image is built
/// with: a profile belongs to one LLVM (an older compiler cannot read a newer one's, a newer one
/// may read an older one's but its functions have moved on), so a new `RUST_VERSION` needs
/// `benches/pgo.sh` run again.
#[test]
fn the_release_build_uses_the_profile_made_by_the_images_rust() {
    let ci = cargo_builds(&read_repo(".ci/run"));
    let flag = format!("-Cprofile-use=$PWD/{PROFILE}");
    assert!(
        ci[0].split([' ', '"', '\'']).any(|w| w == flag),
        "{flag}: {}",
        ci[0]
    );
    assert!(
        in_build_context(PROFILE),
        "{PROFILE}: left out by .dockerignore"
    );
    let profile = std::fs::read(repo_path(PROFILE)).expect(PROFILE);
    assert_eq!(
        profile.get(..8),
        Some(&b"\xfflprofi\x81"[..]),
        "{PROFILE}: not an indexed LLVM profile"
    );

    let made_with = read_repo(PROFILE_MADE_WITH);
    let rustc = made_with.lines().next().unwrap_or_default();
    let version = rustc
        .strip_prefix("rustc ")
        .and_then(|v| v.split_whitespace().next())
        .unwrap_or_else(|| panic!("{PROFILE_MADE_WITH}: no `rustc -V` line first: {made_with}"));
    let pinned = instructions(&read_repo("Dockerfile"))
        .into_iter()
        .find_map(|i| {
            let value = i.args.strip_prefix("RUST_VERSION=")?.to_owned();
            (i.keyword == "ARG").then_some(value)
        })
        .expect("ARG RUST_VERSION in the Dockerfile");
    assert!(
        version == pinned || version.starts_with(&format!("{pinned}.")),
        "{PROFILE} was made by rustc {version}, the image builds with {pinned}: run benches/pgo.sh"
    );
}

/// The image's own config file: copied by the Dockerfile to where its `HOLDFAST_CONFIG` points.
const IMAGE_CONFIG: &str = "deploy/docker/holdfast.toml";

/// The image's config file, after checking that the Dockerfile installs it where
/// `HOLDFAST_CONFIG` says.
fn image_config() -> toml::Value {
    let stages = stages();
    let last = stages.last().unwrap();
    let path = env_of(last)
        .remove("HOLDFAST_CONFIG")
        .expect("ENV HOLDFAST_CONFIG");
    assert!(
        args_of(last, "COPY")
            .iter()
            .any(|copy| *copy == format!("{IMAGE_CONFIG} {path}")),
        "COPY {IMAGE_CONFIG} {path}"
    );
    toml::from_str(&read_repo(IMAGE_CONFIG)).expect("the image's config is TOML")
}

#[test]
fn image_environment_and_an_upstream_alone_run_holdfast_and_pass_its_healthcheck() {
    let stages = stages();
    let last = stages.last().unwrap();
    let image_env = env_of(last);
    let healthcheck = *args_of(last, "HEALTHCHECK").last().unwrap();
    let probe_args: Vec<String> = exec_form(healthcheck.split_once("CMD ").unwrap().1)
        .into_iter()
        .skip(1)
        .collect();

    // The container's environment: the image's ENV plus HOLDFAST_UPSTREAM, nothing else. Only
    // the ports change to 0 (never fixed ports in tests); the admin keeps the image's unspecified
    // address, which the healthcheck must turn into loopback. The proxy's own default is
    // 0.0.0.0:8080; loopback here.
    let image_admin = image_config()["admin"].as_str().unwrap().to_owned();
    let admin_ip = image_admin.rsplit_once(':').unwrap().0;
    // The image's file where HOLDFAST_CONFIG points, with the admin port 0.
    let dir = TempDir::new("image-config");
    let file = dir.write(
        "holdfast.toml",
        &read_repo(IMAGE_CONFIG).replace(&image_admin, &format!("{admin_ip}:0")),
    );
    let mut image_env = image_env;
    image_env.insert("HOLDFAST_CONFIG".into(), file.to_str().unwrap().into());
    // An upstream that refuses connections (a port of ours nothing listens on).
    let refusing = Reserved::new();
    let mut cmd = holdfast(&[]);
    cmd.envs(&image_env)
        .env("HOLDFAST_LISTEN", "127.0.0.1:0")
        .env("HOLDFAST_LOG_FORMAT", "json")
        .env("HOLDFAST_UPSTREAM", refusing.url());
    let mut proxy = Running::start(&mut cmd);
    let line = proxy.wait_for_line("holdfast proxying");
    let event: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
    let admin = event["admin"]
        .as_str()
        .unwrap_or_else(|| panic!("no admin address in {line}"))
        .to_string();
    assert!(admin.starts_with(admin_ip), "{admin}");

    // The HEALTHCHECK's command, with the container's environment (its admin port as bound).
    let probe = || {
        let mut cmd = holdfast(&probe_args.iter().map(String::as_str).collect::<Vec<_>>());
        cmd.envs(&image_env).env("HOLDFAST_ADMIN", &admin);
        finish(cmd, "holdfast healthcheck")
    };
    let ready = probe();
    assert!(ready.status.success(), "healthcheck while ready: {ready:?}");

    let (status, stderr) = proxy.terminate();
    assert_eq!(status.code(), Some(0), "stderr:\n{}", stderr.join("\n"));
    let gone = probe();
    assert_eq!(
        gone.status.code(),
        Some(1),
        "healthcheck with nothing listening: {gone:?}"
    );
}
