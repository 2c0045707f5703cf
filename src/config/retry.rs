//! Validating `[retry]`: tool names as MCP allows them, and no tool both safe and never.

use super::validate::Validator;
use super::{RawRetry, Retry};

/// The spec's longest tool name.
const MAX_TOOL_NAME: usize = 128;

impl Validator<'_> {
    /// Checks `[retry]`; `None` when a problem was recorded.
    pub(super) fn retry(&mut self, raw: &RawRetry) -> Option<Retry> {
        let mut ok = true;
        for (list, names) in [
            ("retry.idempotent_tools", &raw.idempotent_tools),
            ("retry.never_tools", &raw.never_tools),
        ] {
            for (i, name) in names.iter().enumerate() {
                if name.is_empty() || name.len() > MAX_TOOL_NAME {
                    ok = false;
                    self.fail::<()>(
                        &format!("{list}[{i}]"),
                        format!("a tool name has 1 to {MAX_TOOL_NAME} characters; got {name:?}"),
                    );
                }
            }
        }
        for name in &raw.idempotent_tools {
            if raw.never_tools.contains(name) {
                ok = false;
                self.fail::<()>(
                    "retry.never_tools",
                    format!(
                        "{name:?} is also in retry.idempotent_tools: say once whether it may be called twice"
                    ),
                );
            }
        }
        ok.then(|| Retry {
            enabled: raw.enabled,
            learn_annotations: raw.learn_annotations,
            idempotent_tools: raw.idempotent_tools.clone(),
            never_tools: raw.never_tools.clone(),
        })
    }
}
