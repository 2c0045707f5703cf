//! The tools [`super::McpServer`] serves: `count`, `echo`, `wait`, and the ledger tools.

use std::sync::{
    atomic::{AtomicU64, Ordering},
    Arc, Mutex,
};

#[allow(deprecated)] // SetLevelRequestParams: see Tools::set_level
use rmcp::{
    handler::server::wrapper::Parameters,
    model::{ErrorData, ServerCapabilities, ServerConfig, SetLevelRequestParams},
    service::RequestContext,
    tool, tool_handler, tool_router, RoleServer, ServerHandler,
};
use tokio::sync::Semaphore;

/// The server's tools; one instance per session, all sharing the counter and the gate.
#[derive(Clone, Debug)]
pub struct Tools {
    calls: Arc<AtomicU64>,
    gate: Arc<Semaphore>,
    levels: Arc<Mutex<Vec<String>>>,
    ledger: Arc<Mutex<Vec<String>>>,
}

/// Arguments of the ledger tools (`record`, `lookup`, `put`).
#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
pub struct IdArgs {
    /// The caller's id for this call, written to the ledger.
    pub id: String,
}

/// Arguments of the `echo` tool.
#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
pub struct EchoArgs {
    /// The text to send back.
    pub text: String,
}

#[tool_router]
impl Tools {
    pub(super) fn new(
        calls: Arc<AtomicU64>,
        gate: Arc<Semaphore>,
        levels: Arc<Mutex<Vec<String>>>,
        ledger: Arc<Mutex<Vec<String>>>,
    ) -> Self {
        Self {
            calls,
            gate,
            levels,
            ledger,
        }
    }

    fn write(&self, tool: &str, id: String) -> String {
        self.ledger
            .lock()
            .expect("ledger lock")
            .push(format!("{tool}:{id}"));
        id
    }

    /// Records one run of `id` in the ledger; no annotations, so never safe to run twice.
    #[tool(description = "Record a call in the ledger")]
    fn record(&self, Parameters(IdArgs { id }): Parameters<IdArgs>) -> String {
        self.write("record", id)
    }

    /// Announced read-only (it writes the ledger only so the test can count its runs).
    #[tool(description = "Look something up", annotations(read_only_hint = true))]
    fn lookup(&self, Parameters(IdArgs { id }): Parameters<IdArgs>) -> String {
        self.write("lookup", id)
    }

    /// Announced idempotent.
    #[tool(description = "Set a value", annotations(idempotent_hint = true))]
    fn put(&self, Parameters(IdArgs { id }): Parameters<IdArgs>) -> String {
        self.write("put", id)
    }

    /// Increments the shared counter and returns its new value as text.
    #[tool(description = "Increment a counter and return its new value")]
    fn count(&self) -> String {
        (self.calls.fetch_add(1, Ordering::SeqCst) + 1).to_string()
    }

    /// Holds the call open until the test calls [`McpServer::release_waits`]: a request in
    /// flight, for tests that break a connection mid-response.
    #[tool(description = "Wait until released, then return \"released\"")]
    async fn wait(&self) -> String {
        self.gate.acquire().await.expect("never closed").forget();
        "released".to_owned()
    }

    /// Returns `text` unchanged.
    #[tool(description = "Return the given text")]
    fn echo(&self, Parameters(EchoArgs { text }): Parameters<EchoArgs>) -> String {
        text
    }
}

#[tool_handler]
impl ServerHandler for Tools {
    #[allow(deprecated)] // enable_logging: see set_level
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_logging()
                .build(),
        )
    }

    /// Records the level, so a test can see it set again on a re-established session. (Logging
    /// is deprecated by SEP-2577, but servers and clients of the revisions holdfast carries
    /// sessions for still use it.)
    #[allow(deprecated)]
    async fn set_level(
        &self,
        request: SetLevelRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let level = serde_json::to_value(request.level).expect("a level serializes");
        let level = level.as_str().expect("a level is a string").to_owned();
        self.levels.lock().expect("levels lock").push(level);
        Ok(())
    }
}
