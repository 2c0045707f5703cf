//! How a server says it has forgotten a session, and how holdfast makes sure before acting on it.
//!
//! The transport specification says 404. What servers people deploy say differs
//! (docs/compatibility.md has the measured matrix):
//! - 404: the TypeScript SDK's own transport (`-32001 Session not found`), the Python SDK and
//!   FastMCP (`-32600 Session not found`), rmcp (plain text, no Content-Type);
//! - 400: the TypeScript SDK's example servers and the reference "everything" server
//!   (`-32000 Bad Request: No valid session ID provided`, id null): the application keeps one
//!   transport per session in a map and answers before any transport sees the request. Most
//!   TypeScript servers are copied from those examples.
//!
//! Neither status says "forgotten" alone: a 400 is also what a request's own fault gets (bad
//! JSON, a wrong header), and a 404 what a server with no GET stream may send. So an answer
//! with one of these statuses is only a *suspicion*; holdfast then asks the server about the
//! session itself with a `ping` on it ([`ping_says`]): a server answers a ping on a session it
//! knows with a result. The ping is trusted only while it is a witness: after a
//! re-establishment, the ping on the session just opened must be answered
//! ([`new_session_ping_holds`]); a server that refuses a ping even there (it never answers
//! pings properly) would otherwise turn every refused request into a new session, so holdfast
//! stops suspecting for a while ([`PING_DOUBT`]).
//!
//! Everything here is pure: the proxy sends, this module decides.

use std::sync::Mutex;
use std::time::Duration;

use http::StatusCode;
use tokio::time::Instant;

/// How long holdfast stops suspecting forgotten sessions after a server refused a ping on a
/// session it had just opened: the server's answers cannot tell a forgotten session from a
/// request's own fault, so each suspicion would cost a new session for nothing. Long enough
/// that a broken server costs one wasted re-establishment an hour, short enough that a fixed
/// server is trusted again without a restart of holdfast.
pub const PING_DOUBT: Duration = Duration::from_secs(3600);

/// Whether an application answer with `status`, to a request on a session holdfast carries,
/// may mean the server forgot the session: 404 (the specification) or 400 (the TypeScript
/// SDK's examples and every server copied from them). Other client errors (401, 403, 405, 406,
/// 409, 410, 413, 415, 421, 422, 429) say something else about the request and never suspect
/// the session: no surveyed server uses them for a session it does not know.
pub fn suspects(status: StatusCode) -> bool {
    status == StatusCode::NOT_FOUND || status == StatusCode::BAD_REQUEST
}

/// What the ping on the suspected session says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PingSays {
    /// Refused the same way as the request: the session is gone.
    Forgotten,
    /// Answered otherwise: the session is alive, and the request's answer was its own.
    Alive,
}

/// Judges the ping sent on the session after the request was answered `request_status`: the
/// session is forgotten only when the ping is refused exactly as the request was (same
/// status, no JSON-RPC result). A ping answered with a result, a 2xx, or a different refusal
/// shows a server that knows the session: the request's answer passes unchanged and nothing is
/// sent twice.
pub fn ping_says(
    request_status: StatusCode,
    ping_status: StatusCode,
    ping_result: bool,
) -> PingSays {
    if suspects(request_status) && ping_status == request_status && !ping_result {
        PingSays::Forgotten
    } else {
        PingSays::Alive
    }
}

/// Whether the ping on the session holdfast just opened confirms that pings witness: it is
/// answered, with a 2xx and not refused the way the forgotten session was. A server that
/// refuses it (`refused_with`'s status again) refuses every ping, so the earlier ping proved
/// nothing.
pub fn new_session_ping_holds(
    refused_with: StatusCode,
    ping_status: StatusCode,
    ping_result: bool,
) -> bool {
    ping_says(refused_with, ping_status, ping_result) == PingSays::Alive
        && (ping_status.is_success() || ping_result)
}

/// Whether holdfast doubts the server's pings: until when, after one refused a ping on a session
/// it had just opened. Owned by [`super::Table`]; the time is the caller's, so the rule is
/// tested without a clock.
#[derive(Debug, Default)]
pub struct Doubt {
    until: Mutex<Option<Instant>>,
}

impl Doubt {
    /// Pings are doubted from `now` for [`PING_DOUBT`].
    pub fn begin(&self, now: Instant) {
        *self.until.lock().expect("doubt lock") = Some(now + PING_DOUBT);
    }

    /// Whether pings are doubted at `now`: suspicions are then not followed.
    pub fn holds(&self, now: Instant) -> bool {
        let mut until = self.until.lock().expect("doubt lock");
        match *until {
            Some(end) if now < end => true,
            Some(_) => {
                *until = None;
                false
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_doubt_lasts_its_time_then_ends() {
        let doubt = Doubt::default();
        let start = Instant::now();
        assert!(!doubt.holds(start));
        doubt.begin(start);
        assert!(doubt.holds(start));
        assert!(doubt.holds(start + PING_DOUBT - Duration::from_secs(1)));
        assert!(!doubt.holds(start + PING_DOUBT));
        // Ended for good: an earlier instant does not bring it back.
        assert!(!doubt.holds(start));
    }

    const OK: StatusCode = StatusCode::OK;
    const BAD: StatusCode = StatusCode::BAD_REQUEST;
    const GONE: StatusCode = StatusCode::NOT_FOUND;

    #[test]
    fn only_the_statuses_real_servers_use_are_suspected() {
        assert!(suspects(GONE));
        assert!(suspects(BAD));
        for other in [
            200, 202, 401, 403, 405, 406, 409, 410, 413, 415, 421, 422, 429, 500, 503,
        ] {
            let status = StatusCode::from_u16(other).unwrap();
            assert!(!suspects(status), "{other} suspected");
        }
    }

    #[test]
    fn a_ping_refused_the_same_way_says_forgotten() {
        assert_eq!(ping_says(GONE, GONE, false), PingSays::Forgotten);
        assert_eq!(ping_says(BAD, BAD, false), PingSays::Forgotten);
    }

    #[test]
    fn a_ping_answered_any_other_way_says_alive() {
        // The request's own 400 (bad params, a bad header): the session answers its ping.
        assert_eq!(ping_says(BAD, OK, true), PingSays::Alive);
        // Refused differently: not the same cause, so not proof.
        assert_eq!(ping_says(BAD, GONE, false), PingSays::Alive);
        assert_eq!(ping_says(GONE, BAD, false), PingSays::Alive);
        // A result, whatever the status, is an answer.
        assert_eq!(ping_says(BAD, BAD, true), PingSays::Alive);
        // A status that is never suspected never leads to forgotten.
        let conflict = StatusCode::CONFLICT;
        assert_eq!(ping_says(conflict, conflict, false), PingSays::Alive);
    }

    #[test]
    fn the_new_sessions_ping_must_be_answered() {
        assert!(new_session_ping_holds(BAD, OK, true));
        // A 2xx without a readable result (an SSE answer cut short) still is no refusal.
        assert!(new_session_ping_holds(GONE, OK, false));
        // Refused like the forgotten session: pings prove nothing on this server.
        assert!(!new_session_ping_holds(BAD, BAD, false));
        assert!(!new_session_ping_holds(GONE, GONE, false));
        // Refused in another way: no witness either.
        assert!(!new_session_ping_holds(
            BAD,
            StatusCode::METHOD_NOT_ALLOWED,
            false
        ));
    }
}
