//! The rmcp client ([`connect`]) and calls of the server's tools through it.

use rmcp::{
    model::CallToolRequestParams,
    service::{ClientInitializeError, Peer, RunningService},
    transport::{
        streamable_http_client::{
            StreamableHttpClient, StreamableHttpClientTransportConfig, StreamableHttpError,
        },
        DynamicTransportError, StreamableHttpClientTransport,
    },
    RoleClient, ServiceError, ServiceExt,
};

/// An rmcp client over Streamable HTTP (reqwest), with no client-side handler.
pub type Client = RunningService<RoleClient, ()>;

/// Connects and initializes an rmcp client with rmcp's default transport settings (re-initialize
/// once on a session 404, background GET stream, DELETE on close).
pub async fn connect(url: &str) -> Result<Client, ClientInitializeError> {
    ().serve(StreamableHttpClientTransport::from_uri(url)).await
}

/// Like [`connect`], with a transport configuration (e.g. `reinit_on_expired_session(false)`).
pub async fn connect_with(
    config: StreamableHttpClientTransportConfig,
) -> Result<Client, ClientInitializeError> {
    ().serve(StreamableHttpClientTransport::from_config(config))
        .await
}

/// Calls `count` and parses the value it returns.
pub async fn call_count(client: &Peer<RoleClient>) -> Result<u64, ServiceError> {
    let text = call_text(client, CallToolRequestParams::new("count")).await?;
    Ok(text
        .parse()
        .unwrap_or_else(|_| panic!("count returned {text:?}")))
}

/// Calls `wait`, which returns once the server releases it.
pub async fn call_wait(client: &Peer<RoleClient>) -> Result<String, ServiceError> {
    call_text(client, CallToolRequestParams::new("wait")).await
}

/// Calls one of the ledger tools (`record`, `lookup`, `put`) with `id`.
pub async fn call_ledger(
    client: &Peer<RoleClient>,
    tool: &'static str,
    id: &str,
) -> Result<String, ServiceError> {
    let arguments = serde_json::json!({ "id": id });
    let arguments = arguments.as_object().expect("an object").clone();
    call_text(
        client,
        CallToolRequestParams::new(tool).with_arguments(arguments),
    )
    .await
}

/// Calls `echo` with `text` and returns what came back.
pub async fn call_echo(client: &Peer<RoleClient>, text: &str) -> Result<String, ServiceError> {
    let arguments = serde_json::json!({ "text": text });
    let arguments = arguments.as_object().expect("an object").clone();
    call_text(
        client,
        CallToolRequestParams::new("echo").with_arguments(arguments),
    )
    .await
}

async fn call_text(
    client: &Peer<RoleClient>,
    params: CallToolRequestParams,
) -> Result<String, ServiceError> {
    let result = client.call_tool(params).await?;
    assert_ne!(result.is_error, Some(true), "tool failed: {result:?}");
    let text = result
        .content
        .first()
        .and_then(|content| content.as_text())
        .unwrap_or_else(|| panic!("no text content in {result:?}"));
    Ok(text.text.clone())
}

/// The streamable HTTP transport error behind a failed call (`ServiceError::TransportSend`),
/// typed, so tests can match `SessionExpired`, `HttpStatus(..)` or `Client(..)`.
pub fn transport_error(
    error: &ServiceError,
) -> Option<&StreamableHttpError<impl std::error::Error + Send + Sync + 'static>> {
    let ServiceError::TransportSend(error) = error else {
        return None;
    };
    // reqwest is not a dependency of ours, so its client type is named by inference: the
    // reqwest transport's constructor is the witness.
    downcast_for(StreamableHttpClientTransport::from_uri, error)
}

fn downcast_for<C: StreamableHttpClient + 'static>(
    _witness: fn(&'static str) -> StreamableHttpClientTransport<C>,
    error: &DynamicTransportError,
) -> Option<&StreamableHttpError<C::Error>> {
    error.error.downcast_ref()
}

/// Whether `error` was caused, somewhere down its chain, by a refused TCP connection.
pub fn is_connection_refused(error: &ServiceError) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = match transport_error(error) {
        // The `Client` variant does not expose its inner error as a source, so start there.
        Some(StreamableHttpError::Client(inner)) => Some(inner),
        _ => Some(error),
    };
    while let Some(current) = cause {
        if let Some(io) = current.downcast_ref::<std::io::Error>() {
            if io.kind() == std::io::ErrorKind::ConnectionRefused {
                return true;
            }
        }
        cause = current.source();
    }
    false
}
