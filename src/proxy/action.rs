//! What became of a request, as one value: decided where it happens, read by the access log,
//! the trace and the counting of a 499 (never compared as text).

/// What holdfast did with a request (the access log's `action`, the trace's `holdfast.action`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Action {
    /// The application's answer, passed.
    Passed,
    /// Waited in the hold before it was first sent.
    Held,
    /// Held after meeting the gap, then sent again.
    Replayed,
    /// Sent again on a re-established session.
    Resumed,
    /// A router's answer the client must see as it is.
    RouterPassed,
    /// holdfast's 503 for a missing backend.
    Rewritten,
    /// holdfast's 502: failed after it may have reached the application.
    Failed,
    /// Its client broke its body once the upload had begun (400, 408).
    ClientBody,
    /// Its client went away while it was held: never sent (counted as 499).
    Cancelled,
    /// Its client went away before its answer was ready (499).
    ClientGone,
    /// Still waiting for its answer when holdfast's drain ended (503).
    Shutdown,
    /// Held at this holdfast's shutdown, answered by a peer.
    HandedOff,
    /// A hand-off this holdfast sent itself (421).
    HandoffSelf,
    /// Refused as it came (400).
    BadRequest,
    /// A DELETE whose end the shared store did not take (503).
    SessionStore,
    /// Carried by the era bridge.
    Bridged,
    /// A client's cancellation of a request held here, answered by holdfast.
    CancelTaken,
}

impl Action {
    /// Its name in the access log and the trace.
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Action::Passed => "passed",
            Action::Held => "held",
            Action::Replayed => "replayed",
            Action::Resumed => "resumed",
            Action::RouterPassed => "router_passed",
            Action::Rewritten => "rewritten",
            Action::Failed => "failed",
            Action::ClientBody => "client_body",
            Action::Cancelled => "cancelled",
            Action::ClientGone => "client_gone",
            Action::Shutdown => "shutdown",
            Action::HandedOff => "handed_off",
            Action::HandoffSelf => "handoff_self",
            Action::BadRequest => "bad_request",
            Action::SessionStore => "session_store",
            Action::Bridged => "bridged",
            Action::CancelTaken => "cancel_taken",
        }
    }
}

impl From<super::life::Path> for Action {
    fn from(path: super::life::Path) -> Action {
        match path {
            super::life::Path::Passed => Action::Passed,
            super::life::Path::Held => Action::Held,
            super::life::Path::Replayed => Action::Replayed,
            super::life::Path::Resumed => Action::Resumed,
        }
    }
}
