//! Each layer on its own: a value that a higher layer overrides never reaches validation of the
//! merged configuration, so its type is checked here, in the layer it is written in.

use std::path::Path;

use figment::providers::{Env, Format, Toml};
use figment::Figment;

use super::validate::describe_origin;
use super::{Problem, RawConfig};

/// Type errors in the file (`file`) and environment (`env`) layers, each read alone. What only
/// the merged configuration can say (a missing file, an unknown key, a bad value that nothing
/// overrides) is left to it; reporting it twice would only repeat it.
pub(super) fn hidden_problems(file: Option<&Path>, env: Env) -> Vec<Problem> {
    let mut layers = vec![Figment::from(env)];
    if let Some(path) = file {
        layers.insert(0, Figment::from(Toml::file_exact(path)));
    }
    let mut problems = Vec::new();
    for layer in layers {
        // Every key optional: a layer sets any subset.
        let Err(errors) = layer.extract::<RawConfig>() else {
            continue;
        };
        for e in errors {
            if e.path.is_empty() {
                // The layer itself could not be read: the merged configuration says so.
                continue;
            }
            let key = e.path.join(".");
            problems.push(Problem {
                origin: describe_origin(&key, e.metadata.as_ref()),
                key,
                message: super::messages::describe(&e.kind),
            });
        }
    }
    problems
}

/// Where each value of `fig` that is not at its built-in default came from, key by key (dotted,
/// sorted): what `check-config` prints under the configuration.
pub fn origins(fig: &Figment) -> Vec<(String, String)> {
    let mut keys = Vec::new();
    if let Ok(figment::value::Value::Dict(_, dict)) = fig.find_value("") {
        leaf_keys("", &dict, &mut keys);
    }
    keys.into_iter()
        .filter_map(|key| {
            let origin = describe_origin(&key, fig.find_metadata(&key));
            (origin != super::ORIGIN_DEFAULT).then_some((key, origin))
        })
        .collect()
}

/// The dotted paths of `dict`'s leaves (an array counts as one).
fn leaf_keys(prefix: &str, dict: &figment::value::Dict, out: &mut Vec<String>) {
    for (name, value) in dict {
        let key = if prefix.is_empty() {
            name.clone()
        } else {
            format!("{prefix}.{name}")
        };
        match value {
            figment::value::Value::Dict(_, inner) => leaf_keys(&key, inner, out),
            _ => out.push(key),
        }
    }
}
