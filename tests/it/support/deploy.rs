//! Reading the deployment files (`deploy_compose.rs`, `deploy_kubernetes.rs`): YAML through
//! python3 + PyYAML, and the holdfast values they are checked against.
//!
//! `.ci/run` installs the Python packages; a missing one fails the test, naming the install
//! command, rather than skipping it.

use std::collections::BTreeMap;
use std::process::Command;

use serde_json::Value;

use crate::support::files::{read_repo, repo_path};
use crate::support::process::{finish, Finished};

/// What `.ci/run` installs for these tests (shown when it is missing).
const PIP_INSTALL: &str = "python3 -m pip install kubernetes-validate==1.37.0 PyYAML";

/// Panics with the install command when python3 says a module is missing.
pub fn python_failed(out: &Finished, what: &str) -> ! {
    if out.stderr.contains("No module named") {
        panic!("{what} needs a Python package that is not installed: run `{PIP_INSTALL}` (.ci/run does)\n{out:?}");
    }
    panic!("{what} failed: {out:?}");
}

// ---------------------------------------------------------------------------------------------
// YAML, through python3 + PyYAML.

/// Every document of a YAML file (empty ones dropped), as JSON values.
pub fn yaml_docs(rel: &str) -> Vec<Value> {
    const TO_JSON: &str = "import json, sys, yaml\n\
        with open(sys.argv[1]) as f:\n    \
            docs = [d for d in yaml.safe_load_all(f) if d is not None]\n\
        json.dump(docs, sys.stdout)\n";
    let path = repo_path(rel);
    let mut cmd = Command::new("python3");
    cmd.args(["-c", TO_JSON]).arg(&path);
    let out = finish(cmd, "python3");
    if !out.status.success() {
        python_failed(&out, &format!("reading {rel} as YAML"));
    }
    match serde_json::from_str(&out.stdout) {
        Ok(Value::Array(docs)) => docs,
        other => panic!("{rel}: unexpected YAML reading {other:?}"),
    }
}

/// A string-to-string map written either as a YAML mapping or as a list of `KEY=VALUE` (compose's
/// `environment` and `labels`).
pub fn string_map(v: &Value) -> BTreeMap<String, String> {
    match v {
        Value::Null => BTreeMap::new(),
        Value::Object(m) => m
            .iter()
            .map(|(k, v)| {
                let v = match v {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                (k.clone(), v)
            })
            .collect(),
        Value::Array(items) => items
            .iter()
            .map(|item| {
                let s = item
                    .as_str()
                    .unwrap_or_else(|| panic!("not a string: {item}"));
                let (k, v) = s.split_once('=').unwrap_or((s, ""));
                (k.to_string(), v.to_string())
            })
            .collect(),
        other => panic!("neither a mapping nor a list: {other}"),
    }
}

/// holdfast's drain timeout, from the sample configuration (its values are the defaults).
pub fn default_drain_secs() -> f64 {
    let sample: toml::Value = toml::from_str(&read_repo("config/holdfast.toml")).unwrap();
    toml_secs(&sample["shutdown"]["drain_timeout_secs"])
}

pub fn toml_secs(v: &toml::Value) -> f64 {
    v.as_float()
        .or_else(|| v.as_integer().map(|i| i as f64))
        .unwrap_or_else(|| panic!("not a number of seconds: {v}"))
}

/// `http://HOST:PORT` of an upstream URL.
pub fn host_port(url: &str) -> (&str, u16) {
    let authority = url
        .strip_prefix("http://")
        .unwrap_or_else(|| panic!("not http://: {url}"))
        .trim_end_matches('/');
    let (host, port) = authority
        .split_once(':')
        .unwrap_or_else(|| panic!("name the port: {url}"));
    (host, port.parse().unwrap())
}
